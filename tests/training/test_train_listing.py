"""train() lists its files while the cluster starts: what the listing says is said once, and the
held-out split and the validation data read the files as listed."""

from __future__ import annotations

import warnings

import numpy as np


def _write(directory, files, rows, seed):
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    for i in range(files):
        x = rng.normal(size=(rows, 2))
        y = (x[:, 0] + 0.3 * rng.normal(size=rows) > 0).astype(int)
        w = rng.uniform(0.5, 2.0, size=rows)
        lines = ["x1,x2,w,cleared", *(f"{a:.4f},{b:.4f},{c:.3f},{d}"
                                      for (a, b), c, d in zip(x, w, y, strict=True))]
        (directory / f"part-{i:02d}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (directory / "README.txt").write_text("how these logs were made\n", encoding="utf-8")


def _left_out(caught):
    return [str(w.message) for w in caught if "Left out 1 .txt file(s)" in str(w.message)]


def _train(data, tmp_path, **settings):
    from daskfeed.training._train import train

    lines: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning recorded, however often it is made
        result = train(str(data), label="cleared", epochs=1, batch_size=64, memory_limit="2GB",
                       nworkers=1, dashboard_address="127.0.0.1:0", output=tmp_path / "out",
                       verbose=0, echo=lines.append, **settings)
    return result, caught


def test_validation_files_are_listed_once_and_their_note_said_once(tmp_path):
    _write(tmp_path / "train", files=4, rows=300, seed=0)
    _write(tmp_path / "valid", files=2, rows=200, seed=1)
    # a weight column: train() reads the validation header first (_has_column), then scans it
    result, caught = _train(tmp_path / "train", tmp_path, validation=str(tmp_path / "valid"),
                            weight="w")
    notes = _left_out(caught)
    for name in ("valid", "train"):  # each directory's note once
        assert len([m for m in notes if f"directory '{tmp_path / name}'" in m]) == 1, notes
    assert result.manifest.rows == 1200
    assert "val_loss" in result.final


def test_the_held_out_split_reads_the_training_files_as_listed(tmp_path):
    _write(tmp_path / "train", files=8, rows=250, seed=2)
    result, caught = _train(tmp_path / "train", tmp_path, validation_split=0.25, seed=3)
    assert len(_left_out(caught)) == 1, _left_out(caught)  # the training and held-out scans: once
    split = result.manifest.split or {}
    held = len(split["validation_partitions"])
    assert 0 < held < 8
    assert result.manifest.rows == (8 - held) * 250
    assert "val_loss" in result.final
