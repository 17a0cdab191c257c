"""One big CSV whose quoted fields hold line breaks, read in many blocks through the real thing:
the scan on a LocalCluster, the parse cache, a DaskSequence epoch, predict. Every row once."""

from __future__ import annotations

import io
import random

import numpy as np
import pyarrow.csv as pacsv
import pytest
from helpers import in_process_budget

import daskfeed

_MISLEAD = "\n".join(f"{k},plain,1.5,0" for k in range(12_000))  # 150 kB, no quote: looks like rows


def _write(path, n: int, mislead: bool) -> np.ndarray:
    """``n`` rows (id, note, x, y); every 9th note holds quoted line breaks; y's sum is returned."""
    r = random.Random(0)
    lines, ys = ["id,note,x,y"], []
    for i in range(n):
        note = f'"said ""hi""\nthen, {i}"' if i % 9 == 0 else f"plain {i}"
        if mislead and i == 100:
            note = f'"{_MISLEAD}"'
        y = int(r.random() < 0.4)
        ys.append(y)
        lines.append(f"{i},{note},{r.random():.4f},{y}")
    path.write_text("\n".join(lines) + "\n")
    return np.asarray(ys)


def _epoch_ids(seq) -> list[int]:
    ids: list[int] = []
    for i in range(len(seq)):
        x, _ = seq[i][:2]
        ids += np.asarray(x["id"]).astype(int).ravel().tolist()
    return ids


@pytest.mark.parametrize("mislead", [False, True], ids=["speculated", "decided-exactly"])
def test_a_file_with_quoted_line_breaks_is_scanned_cached_and_served_in_many_blocks(
        tmp_path, client, mislead):
    path = tmp_path / "notes.csv"
    ys = _write(path, 6000, mislead)
    whole = pacsv.read_csv(io.BytesIO(path.read_bytes()),
                           parse_options=pacsv.ParseOptions(newlines_in_values=True))
    assert whole.num_rows == 6000

    kw = {"label": "y", "client": client, "batch_size": 256, "blocksize": 16 * 1024,
          "cache": tmp_path / "c", "features": ["id", "x"], "shuffle": False}
    with daskfeed.DaskSequence(str(path), **kw) as seq:
        assert len(seq.source.blocks) >= 8
        m = seq.manifest
        assert m.rows == 6000 and m.label_counts == {"0": int((ys == 0).sum()), "1": int(ys.sum())}
        assert bool(m.splits) is mislead  # decided exactly only where the speculation failed
        assert sorted(_epoch_ids(seq)) == list(range(6000))  # every row once, from the cache
        manifest = m

    with daskfeed.DaskSequence(str(path), manifest=manifest, **{**kw, "cache": False}) as seq:
        assert sorted(_epoch_ids(seq)) == list(range(6000))  # from the CSV, at the same starts


def test_predict_reads_a_file_whose_speculated_starts_fail_in_input_order(tmp_path):
    from daskfeed.inference._predict import predict
    from daskfeed.training._train import train

    train_path, new_path = tmp_path / "train.csv", tmp_path / "new.csv"
    _write(train_path, 3000, mislead=False)
    _write(new_path, 3000, mislead=True)
    out = str(tmp_path / "out")
    train(str(train_path), label="y", features=["x"], epochs=1, memory_limit="3GB", nworkers=1,
          output=out, cache=False, verbose=0, echo=lambda _line: None)
    df = predict(out, str(new_path), keep=["id"], memory_limit=in_process_budget(), nworkers=1,
                 blocksize="16KiB", echo=lambda _line: None)
    assert df["id"].tolist() == list(range(3000))
