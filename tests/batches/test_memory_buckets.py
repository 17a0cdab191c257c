"""The global order's buckets held in the trainer (a small data set): the rows the files hold.

On a real LocalCluster of this machine, data with missing labels in some rows and text
columns (a dictionary per file): every bucket, every batch of two epochs and a resumed epoch
are the same whether the buckets are held in memory or dealt to files.
"""

from __future__ import annotations

import os
import pickle

import dask.config
import pytest

import daskfeed
from daskfeed.batches import _buckets, _memory_buckets

# the held rows taken and encoded whole (the data are smaller than a run) and in runs of 1,024,
# by the trainer itself (taken by a worker: tests/batches/test_held_aside.py)
RUNS = pytest.mark.parametrize("take_bytes", [_memory_buckets.TAKE_BYTES, 1], ids=["whole", "runs"])


def _sequence(data, client, cache, in_memory, **kw):
    with dask.config.set({"daskfeed.buckets-in-memory": in_memory}):
        return daskfeed.DaskSequence(data, label="cleared", client=client, cache=cache,
                                     batch_size=50, features=["uid", "level", "region"], seed=3,
                                     window_rows=600, **kw)


def _epoch(seq):
    return [(x["uid"].tolist(), x["region"].tolist(), y.tolist())
            for x, y in (seq[i] for i in range(len(seq)))]


def test_held_buckets_serve_every_batch_the_bucket_files_serve(data, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(data, client, cache, True) as held:
        buckets = held.stream.buckets
        assert buckets.held > 0 and buckets.count > 1
        assert "its buckets held in the trainer's memory" in held.stream.order_line()
        memory = [_epoch(held)]
        # taken while the sequence was made, as files dealt in the background: said at the end
        assert "its buckets held in the trainer's memory, taken from the parse cache in" \
            in held.stream.built_line()
        held.on_epoch_end()
        memory.append(_epoch(held))
    assert not os.path.exists(os.path.join(str(cache), "buckets"))  # none written
    with _sequence(data, client, cache, False) as dealt:
        assert dealt.stream.buckets.held == 0
        files = [_epoch(dealt)]
        dealt.on_epoch_end()
        files.append(_epoch(dealt))
    assert memory == files and memory[0] != memory[1]  # two epochs, two orders, the same rows
    rows = sorted(u for b in memory[0] for u in b[0])
    assert len(rows) == len(set(rows)) == 12 * 214  # every labelled row once (36 of 250 not)


def test_each_held_bucket_is_its_file(data, client, tmp_path):
    """Row for row, in canonical order, with the text as it reads, also in a pickled copy."""
    cache = tmp_path / "c"
    with _sequence(data, client, cache, False) as dealt:
        files = dealt.stream.buckets.files
        k = dealt.stream.buckets.count
        on_disk = [files.read_bucket(b, ["uid", "region", "cleared"]) for b in range(k)]
    with _sequence(data, client, cache, True) as held:
        memory = held.stream.buckets.files
        copy = pickle.loads(pickle.dumps(memory))
        for b in range(k):
            for source in (memory, copy):
                table = source.read_bucket(b, ["uid", "region", "cleared"])
                assert table.column_names == ["uid", "region", "cleared"]
                for name in table.column_names:
                    assert table.column(name).to_pylist() == on_disk[b].column(name).to_pylist()


def test_a_copy_of_a_held_sequence_reads_its_windows_itself(data, client, tmp_path):
    """Unpickled (a process of its own would), it takes the rows again and reads here: a window
    sent to a worker would take them all for a few buckets."""
    with _sequence(data, client, tmp_path / "c", True) as held:
        first = _epoch(held)
        copy = pickle.loads(pickle.dumps(held))
        try:
            assert _epoch(copy) == first
            assert copy.stream._windows.here is not None
        finally:
            copy.close()


def test_a_resumed_epoch_continues_as_the_files_would(data, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(data, client, cache, False) as dealt:
        whole = _epoch(dealt)
    with _sequence(data, client, cache, True) as held:
        state = held.stream.state(0, 7)
    with _sequence(data, client, cache, True) as resumed:
        resumed.stream.set_position(0, state.position)
        rest = [(x["uid"].tolist(), x["region"].tolist(), y.tolist())
                for x, y in (resumed[i] for i in range(len(whole) - 7))]
    assert rest == whole[7:]


def test_data_beyond_half_the_prefetch_bytes_are_dealt_to_files(data, client, tmp_path):
    # 2,568 rows of 3 features, a label and a place: ~100 KiB held against 64 KiB of prefetch
    with _sequence(data, client, tmp_path / "c", True, prefetch_bytes="64KiB") as seq:
        assert seq.stream.buckets.held == 0
        assert os.path.isfile(seq.stream.buckets.files.bucket_path(0))
        assert "held in the trainer's memory" not in seq.stream.order_line()


@RUNS
def test_blocks_of_one_file_and_blocks_in_pieces_are_held_as_the_files_deal_them(
        client, tmp_path, monkeypatch, take_bytes):
    """Small files (one cache file holds their blocks, its labels read once), a file split into
    several blocks and a gzip file (a block in pieces, a table of its own), rows without a
    label at random: the same rows in every bucket, and the same batches, as a matrix too."""
    import gzip

    import numpy as np
    import pandas as pd

    monkeypatch.setattr(_memory_buckets, "TAKE_BYTES", take_bytes)
    monkeypatch.setattr(_buckets, "can_take_aside", lambda client, estimate: False)  # (here)
    rng = np.random.default_rng(11)
    src = tmp_path / "src"
    src.mkdir()
    for f, n in enumerate((3000, 2200, 2500, *[120] * 10)):
        label = rng.integers(0, 2, n).astype(float)
        label[rng.random(n) < 0.2] = np.nan  # rows without a label, in every block
        text = pd.DataFrame({"uid": np.arange(n) + f * 10_000, "level": rng.integers(1, 60, n),
                             "region": rng.choice(["north", "south", "東"], n),
                             "cleared": label}).to_csv(index=False)
        if f == 2:
            with gzip.open(src / "part-2.csv.gz", "wt") as out:
                out.write(text)
        else:
            (src / f"part-{f}.csv").write_text(text)
    kw = {"blocksize": "16KiB"}
    with _sequence(str(src / "*.csv*"), client, tmp_path / "c", False, **kw) as dealt:
        blocks = len(dealt.stream.data.manifest.counts)
        assert blocks > 6  # (several blocks a file)
        cache = dealt.stream.data.cache
        assert any(len(cache.lookup(i)) > 1 for i in range(blocks))  # (a block in pieces)
        k = dealt.stream.buckets.count
        on_disk = [dealt.stream.buckets.files.read_bucket(b, ["uid", "cleared"]) for b in range(k)]
        dealt_epoch = _epoch(dealt)
    with _sequence(str(src / "*.csv*"), client, tmp_path / "c", True, **kw) as held:
        assert held.stream.buckets.held > 0
        assert _epoch(held) == dealt_epoch  # (the windows: the encoded rows gathered)
        memory = held.stream.buckets.files
        for b in range(k):
            table = memory.read_bucket(b, ["uid", "cleared"])
            assert table.column("uid").to_pylist() == on_disk[b].column("uid").to_pylist()
    uids = [u for t in on_disk for u in t.column("uid").to_pylist()]
    assert len(uids) == len(set(uids)) > 0.7 * 8900  # each labelled row once
    epochs = []
    for in_memory in (False, True):
        with dask.config.set({"daskfeed.buckets-in-memory": in_memory}), daskfeed.DaskSequence(
                str(src / "*.csv*"), label="cleared", client=client, cache=tmp_path / "c",
                batch_size=50, features=["uid", "level"], as_matrix=True, seed=3,
                window_rows=600, **kw) as seq:
            assert (seq.stream.buckets.held > 0) == in_memory
            epochs.append([(x.dtype.str, x.tolist(), y.tolist())
                           for x, y in (seq[i] for i in range(len(seq)))])
    assert epochs[0] == epochs[1]


@RUNS
def test_a_held_window_is_the_files_buckets_encoded_with_weights_class_names_and_a_share(
        client, tmp_path, monkeypatch, take_bytes):
    """``MemoryBuckets.window`` against the bucket files' rows encoded as ``read_buckets``
    encodes them: a text label (rows without one), a weight column, buckets in another order,
    every row, a trainer's share of them (several trainers) and none."""
    import dask.config
    import numpy as np
    import pandas as pd

    from daskfeed.batches._read import _encode_buckets

    rng = np.random.default_rng(4)
    src = tmp_path / "src"
    src.mkdir()
    for f in range(6):
        n = 900
        pd.DataFrame({"uid": np.arange(n) + f * 1000, "level": rng.integers(1, 60, n),
                      "region": rng.choice(["north", "south", "東"], n),
                      "w": rng.random(n) + 0.5,
                      "medal": rng.choice(["gold", "silver", "bronze", ""], n)}
                     ).to_csv(src / f"part-{f}.csv", index=False)

    def sequence(in_memory):
        with dask.config.set({"daskfeed.buckets-in-memory": in_memory}):
            return daskfeed.DaskSequence(str(src / "*.csv"), label="medal", weight="w",
                                         client=client, cache=tmp_path / "c", batch_size=50,
                                         features=["uid", "level", "region"], seed=3,
                                         window_rows=600)

    def batches(seq):
        return [(b[0]["uid"].tolist(), b[1].tolist(), b[2].tolist())
                for b in (seq[i] for i in range(len(seq)))]

    with sequence(False) as dealt:
        assert dealt.stream.buckets.held == 0
        files, enc = dealt.stream.buckets.files, dealt.stream.data.encoding
        k = dealt.stream.buckets.count
        tables = [files.read_bucket(b, list(enc.names)) for b in range(k)]
        dealt_epoch = batches(dealt)
    monkeypatch.setattr(_memory_buckets, "TAKE_BYTES", take_bytes)
    monkeypatch.setattr(_buckets, "can_take_aside", lambda client, estimate: False)  # (here)
    with sequence(True) as held:
        memory = held.stream.buckets.files
        assert held.stream.buckets.held > 0 and k > 1
        assert batches(held) == dealt_epoch
        window = [(b, tables[b].num_rows, ()) for b in reversed(range(k))]
        total = sum(rows for _, rows, _ in window)
        pick = np.random.default_rng(0)
        for index in (pick.permutation(total), np.sort(pick.choice(total, total // 3, replace=False)),
                      np.zeros(0, dtype=np.int64)):
            got = memory.window(window, index)
            want = _encode_buckets([tables[b] for b, _, _ in window], index, enc)
            assert len(got) == len(index) == len(want)
            assert got.y.dtype == want.y.dtype and np.array_equal(got.y, want.y)
            assert got.w is not None and np.array_equal(got.w, want.w)
            assert sorted(got.x) == sorted(want.x)
            for name in got.x:
                assert got.x[name].dtype == want.x[name].dtype
                assert np.array_equal(got.x[name], want.x[name]), name
