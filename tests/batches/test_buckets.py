"""The buckets' build (daskfeed.batches._buckets) on a real LocalCluster: what the files hold.

Data with missing labels in some rows (left out of the buckets) and ids per row, so each
bucket file can be compared with what the pure dealing (``bucket_members``) says it holds.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import daskfeed
from daskfeed.batches._buckets import ROOM_MARGIN, build_room
from daskfeed.batches._order import block_offsets, bucket_members
from daskfeed.cache import clear
from daskfeed.cache._scatter import block_order
from daskfeed.cluster import WindowCancelled
from daskfeed.core import DataError


def _sequence(data, client, cache, **kw):
    return daskfeed.DaskSequence(data, label="cleared", client=client, cache=cache, batch_size=50,
                                 features=["uid", "level"], seed=3, **kw)


@pytest.mark.parametrize("merged", [False, True], ids=["runs-gathered", "runs-merged-twice"])
def test_each_bucket_file_holds_its_dealt_rows_traced_to_block_and_row(data, client, tmp_path,
                                                                       monkeypatch, merged):
    """Also when the runs are merged before the gather (60 runs of 50 rows, 4 at a time: two
    levels), with their text columns' dictionaries decoded and encoded again."""
    import daskfeed.batches._buckets as build

    if merged:
        monkeypatch.setattr(build, "task_rows", lambda *_: 50)
        monkeypatch.setattr(build, "FAN_IN", 4)
    import glob

    regions = {}
    for path in sorted(glob.glob(data)):
        frame = pd.read_csv(path, keep_default_na=False)
        regions.update(zip(frame["uid"].tolist(), frame["region"].tolist(), strict=True))
    with _sequence(data, client, tmp_path / "c") as seq:
        buckets = seq.stream.buckets
        files = buckets.files
        counts = seq.manifest.counts
        k = buckets.count
        assert k == 2 and sum(buckets.sizes) == sum(counts) == 12 * 214  # 36 of 250 unlabelled
        ids = seq.stream.data.cache.block_ids(len(counts))
        offsets = block_offsets(ids, k)
        for b in range(k):
            table = files.read_bucket(b)
            js, _ = bucket_members(counts, offsets, k, b, ids)
            # __block: the block's id (as int64), the same in every data set holding the block
            assert table.column("__block").to_pylist() == ids.view(np.int64)[js].tolist()
            # __row: the row's place among all the block's rows in stored order (labelled or not)
            traced = []
            for j, block_rows in zip(js.tolist(), table.column("__row").to_pylist(), strict=True):
                file_row = block_order(seq.stream.data.cache.block_id(j), 250)[block_rows]
                traced.append(j * 1000 + int(file_row))
            assert table.column("uid").to_pylist() == traced
            assert table.column("cleared").null_count == 0 and table.num_rows == buckets.sizes[b]
            assert table.column("region").to_pylist() == [regions[u] for u in traced]
            blocks = table.column("__block").to_numpy()  # canonical order: block id, then row
            # (compared, not np.diff: ids are 64-bit hashes, whose differences overflow int64)
            assert len(js) == table.num_rows and np.all(blocks[1:] >= blocks[:-1])


def test_a_set_is_built_once_and_again_when_cut_short_or_damaged(data, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(data, client, cache) as seq:
        files = seq.stream.buckets.files
        first = [x["uid"].copy() for x, _ in (seq[i] for i in range(len(seq)))]
    assert len(files.generations) == 1  # a first build: one generation
    marker = os.path.join(files.parts_of()[0].path, "set.json")
    written = os.stat(files.bucket_path(0)).st_ino  # a rebuild renames a new file into place
    assert not [n for n in os.listdir(files.parts_of()[0].path) if n.startswith("runs-")]
    with _sequence(data, client, cache, window_rows=100) as seq:  # another window: same set
        assert os.stat(files.bucket_path(0)).st_ino == written
        with open(marker, encoding="utf-8") as f:
            assert json.load(f)["buckets"] == 2
        again = [x["uid"].copy() for x, _ in (seq[i] for i in range(len(seq)))]
    assert [a.tolist() for a in again] == [a.tolist() for a in first]
    os.remove(files.bucket_path(1))  # damaged: the window says so, the set is marked incomplete
    with _sequence(data, client, cache) as seq, pytest.raises(DataError) as err:
        for i in range(len(seq)):
            seq[i]
    assert "Cannot read bucket 1 of the global order" in str(err.value)
    assert "Hint: run again" in str(err.value) and not os.path.exists(marker)
    with _sequence(data, client, cache) as seq:  # built again, the same batches
        rebuilt = [x["uid"].copy() for x, _ in (seq[i] for i in range(len(seq)))]
    assert [a.tolist() for a in rebuilt] == [a.tolist() for a in first]
    assert os.path.exists(marker)


def test_clearing_the_cache_removes_its_bucket_sets(data, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(data, client, cache) as seq:
        path = seq.stream.buckets.files.path
    assert os.path.isdir(path)
    clear(cache)
    assert not os.path.exists(path)


def test_a_bucket_reads_only_the_columns_asked_for(data, client, tmp_path):
    with _sequence(data, client, tmp_path / "c") as seq:
        table = seq.stream.buckets.files.read_bucket(0, ["level"])
    assert table.column_names == ["level"] and isinstance(table, pa.Table)


def _disk_full(full: bool) -> None:
    """On a worker: each bucket run is written, then fails as on a full disk (ENOSPC); or not."""
    import errno

    from daskfeed.cache import BucketSet

    if full:
        BucketSet._written = BucketSet.write_run  # type: ignore[attr-defined]

        def write_run(self, *args, **kwargs):  # the run written, then the disk full
            BucketSet._written(self, *args, **kwargs)  # type: ignore[attr-defined]
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        BucketSet.write_run = write_run  # type: ignore[method-assign]
    elif hasattr(BucketSet, "_written"):
        BucketSet.write_run = BucketSet._written  # type: ignore[method-assign]
        del BucketSet._written


def test_a_disk_that_fills_up_while_the_buckets_are_written_falls_back_to_windows_of_blocks(
        data, client, tmp_path, monkeypatch):
    """The room was there when the deal began; the disk filled up meanwhile (others write to
    it): what was written is removed, the run says so and reads windows of blocks, every row.

    With less than twice the room the build needs free, it is built before the epoch is
    planned (not in the background), so that this fallback is still open."""
    import daskfeed.batches._buckets as build

    free = shutil.disk_usage(tmp_path).free  # (the workers' disk: this one)
    monkeypatch.setattr(build, "ROOM_MARGIN", int(free * 0.6))  # free / need: about 1.6
    client.run(_disk_full, True)
    try:
        with pytest.warns(UserWarning, match=r"the disk filled up while the global order's "
                                             r"buckets were written .*No space left on device.*"
                                             r"Their files are removed; rows are shuffled within "
                                             r"windows of blocks") as caught:
            with _sequence(data, client, tmp_path / "c") as seq:
                assert seq.stream.buckets is None and not seq.stream.global_order
                rows = sum(len(seq[i][1]) for i in range(len(seq)))
    finally:
        client.run(_disk_full, False)
    assert rows == sum(seq.manifest.counts)
    assert any("Hint: free disk room there" in str(w.message) for w in caught)
    left = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "c") if "buckets" in d for f in fs]
    assert not left, left  # (no run nor bucket file of the build cut short)


def test_a_disk_that_fills_up_while_the_buckets_are_built_in_the_background_is_an_error(
        data, client, tmp_path):
    """With room to spare the epoch is planned on the buckets while they are built: a disk
    that fills up all the same is said at the first batch (why, and what to do), with the
    build's files removed; no warning promises windows of blocks."""
    client.run(_disk_full, True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*shuffled within windows of blocks")
            with _sequence(data, client, tmp_path / "c") as seq:
                assert seq.stream.global_order  # (planned before the build ended)
                for i in (0, 1):  # (the same error each time)
                    with pytest.raises(daskfeed.ClusterError, match=r"(?s)Expected the global "
                                       r"order's buckets written .*No space left on device.*Their "
                                       r"files are removed, after this run's epochs were planned"
                                       r".*Hint: free disk room there"):
                        seq[i]
    finally:
        client.run(_disk_full, False)
    left = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "c") if "buckets" in d for f in fs]
    assert not left, left


@pytest.fixture
def held_deal(monkeypatch):
    """The deal of a build held until the test lets it go: (dealing, go) events."""
    import daskfeed.batches._buckets as build

    dealing, go = threading.Event(), threading.Event()
    deal = build._deal_generation

    def held(*args, **kwargs):
        dealing.set()
        abandon = args[-1]  # (a closed reader's build stops here as at its tasks)
        deadline = time.monotonic() + 60
        while not go.wait(0.01):
            if abandon() is not None:
                raise abandon()
            assert time.monotonic() < deadline, "the test never let the deal go on"
        return deal(*args, **kwargs)

    monkeypatch.setattr(build, "_deal_generation", held)
    yield dealing, go
    go.set()


def test_the_epoch_is_planned_and_its_model_built_while_its_buckets_are_dealt(
        data, client, tmp_path, held_deal):
    """The sequence is made, its length known and its epoch planned while the deal still
    runs; the first batch waits for the buckets (not a window's timeout), then every row."""
    dealing, go = held_deal
    with _sequence(data, client, tmp_path / "c", timeout=1) as seq:
        assert dealing.wait(60)
        assert seq.stream.buckets.building and seq.stream.global_order
        assert len(seq) == -(-sum(seq.manifest.counts) // 50)
        assert "being dealt from the parse cache" in seq.stream.order_line()
        got: list[object] = []
        first = threading.Thread(target=lambda: got.append(seq[0]))
        first.start()
        first.join(2)  # (longer than the windows' 1 s timeout: the wait is not a window's)
        assert first.is_alive() and not got
        go.set()
        first.join(60)
        assert len(got) == 1 and not seq.stream.buckets.building
        rows = sum(len(seq[i][1]) for i in range(len(seq)))
    assert rows == sum(seq.manifest.counts)
    assert "dealt from the parse cache in" in seq.stream.order_line()


def test_an_epoch_resumed_while_its_buckets_are_dealt_starts_no_window_before_them(
        data, client, tmp_path, held_deal):
    """A checkpoint's place in epoch 0 set while the build runs (the windows before it marked
    served): no window is sent before the files exist, and the rest of the epoch is what a
    stream whose buckets were built first serves."""
    dealing, go = held_deal
    go.set()  # (the first sequence builds the set; the second one's own build is held)
    with _sequence(data, client, tmp_path / "first", window_rows=500) as built_first:
        whole = [built_first[i][0]["uid"] for i in range(len(built_first))]
    go.clear()
    dealing.clear()
    with _sequence(data, client, tmp_path / "c", window_rows=500) as seq:
        assert dealing.wait(60)
        first = seq.stream.plan.windows[0]
        assert first.rows < 30 * 50  # (batch 30 is past the first window: it is served)
        submitted: list[int] = []
        real = seq.stream._windows.submit
        seq.stream._windows.submit = lambda c, plan, w: submitted.append(w) or real(c, plan, w)
        seq.set_epoch(0, 30)
        assert not submitted and seq.stream.buckets.building
        go.set()
        rest = [seq[i][0]["uid"] for i in range(len(seq))]
    assert submitted and len(rest) == len(whole) - 30
    for a, b in zip(rest, whole[30:], strict=True):
        assert np.array_equal(a, b)


def test_closing_a_sequence_ends_a_wait_for_its_buckets(data, client, tmp_path, held_deal):
    dealing, go = held_deal
    seq = _sequence(data, client, tmp_path / "c")
    try:
        assert dealing.wait(60)
        errors: list[BaseException] = []

        def read() -> None:
            try:
                seq[0]
            except BaseException as err:  # (what the reader is told)
                errors.append(err)

        reader = threading.Thread(target=read)
        reader.start()
        seq.close()
        reader.join(60)
        assert not reader.is_alive() and len(errors) == 1
        assert "closed" in str(errors[0])
        assert not isinstance(errors[0], KeyboardInterrupt)  # (not the process's stop)
    finally:
        go.set()
        seq.close()


def test_closing_a_sequence_stops_its_build_releases_its_tasks_and_ends_its_thread(
        data, client, tmp_path, monkeypatch):
    """The deal's tasks held on the workers (a distributed Event): closing the sequence ends
    the build's thread and releases its tasks (the scheduler forgets them; one already
    running on a worker finishes there, its result unused)."""
    import uuid

    from distributed import Event

    import daskfeed.batches._buckets as build

    gate = Event(f"test-deal-{uuid.uuid4().hex}", client=client)
    name, real = gate.name, build.deal

    def held_on_worker(*args, **kwargs):  # (pickled by value: runs on the workers)
        from distributed import Event

        Event(name).wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "deal", held_on_worker)

    def build_tasks(dask_scheduler=None):
        return [str(k) for k in dask_scheduler.tasks if "daskfeed-buckets-deal" in str(k)]

    try:
        seq = _sequence(data, client, tmp_path / "c")
        buckets = seq.stream.buckets
        assert buckets.building
        deadline = time.monotonic() + 60
        while not client.run_on_scheduler(build_tasks):  # (the deal submitted, held)
            assert time.monotonic() < deadline, "the build never submitted its deal"
        seq.close()
        assert not buckets._thread.is_alive() and not buckets.building
        with pytest.raises(WindowCancelled, match="closed"):  # (not Aborted: no stop asked)
            buckets.wait()
        deadline = time.monotonic() + 60
        while left := client.run_on_scheduler(build_tasks):  # (released: forgotten)
            assert time.monotonic() < deadline, left
    finally:
        gate.set()


def test_a_sequence_collected_unclosed_stops_its_build_too(data, client, tmp_path, held_deal):
    import gc

    dealing, go = held_deal
    seq = _sequence(data, client, tmp_path / "c")
    buckets = seq.stream.buckets
    try:
        assert dealing.wait(60) and buckets.building
        del seq
        gc.collect()
        buckets._thread.join(60)
        assert not buckets._thread.is_alive() and not buckets.building
        with pytest.raises(WindowCancelled, match="closed"):  # (not Aborted: no stop asked)
            buckets.wait()
    finally:
        go.set()


def test_without_disk_room_for_the_buckets_the_run_says_so_and_uses_windows_of_blocks(
        data, client, tmp_path, monkeypatch):
    import daskfeed.batches._buckets as build

    monkeypatch.setattr(build, "ROOM_MARGIN", 10**18)  # more than any disk has free
    with pytest.warns(UserWarning, match=r"needs its buckets written beside the parse cache: "
                                         r"about .* free under .*Received: .* free\. Rows are "
                                         r"shuffled within windows of blocks") as caught:
        with _sequence(data, client, tmp_path / "c") as seq:
            assert seq.stream.buckets is None and not seq.stream.global_order
            assert seq.stream.order_line().startswith("rows shuffled within")
            rows = sum(len(seq[i][1]) for i in range(len(seq)))
    assert rows == sum(seq.manifest.counts)
    assert any("Hint: free disk room there" in str(w.message) for w in caught)


def test_the_room_asked_for_covers_two_copies_with_trace_columns_and_plain_text():
    """The soak that filled a disk: 13.36 GB of CSV, 237M rows, 42 GB free after the parse cache
    (more than 41 GB were written before the disk filled). "3x the cache" let it start."""
    csv, rows = 13_355_306_039, 237_000_000
    need = build_room(csv, csv, rows, rows)  # an uncompressed cache: about the CSV's size
    assert need - ROOM_MARGIN == 2 * (csv + 16 * rows) + csv
    assert need > 42e9 and need > 3 * csv + ROOM_MARGIN
    # a build of the new rows only (data that grew) asks for their share
    quarter = build_room(csv, csv, rows, rows // 4) - ROOM_MARGIN
    assert quarter == pytest.approx((2 * (csv + 16 * rows) + csv) / 4, rel=1e-9)


def test_a_run_holds_each_blocks_labelled_rows_in_stored_order_sorted_by_bucket(tmp_path):
    """The deal against the definition, with no cluster: blocks sharing a cache file, a block in
    two pieces, a block in a file of its own and one not cached (parsed by the deal), rows
    without a label left out. Each run row: its block's stored row (the piece's rows permuted by
    ``block_order``), the rows with a label counted in that order, dealt to bucket
    ``(i + offset) mod K`` (stable), traced to its block id and stored place."""
    from daskfeed.batches._buckets import deal
    from daskfeed.cache import BlockCache, BucketSet
    from daskfeed.manifest import Encoding
    from daskfeed.reading import Block, ReadOptions

    rng = np.random.default_rng(5)

    def piece(n, base):
        y = rng.integers(0, 2, n).astype(float)
        y[rng.random(n) < 0.2] = np.nan
        return pd.DataFrame({"x": np.arange(base, base + n),
                             "t": [f"v{v}" for v in rng.integers(0, 7, n)],
                             "y": pd.array(y).astype("Float64")})

    cache = BlockCache(str(tmp_path / "c"))
    os.makedirs(cache.path, exist_ok=True)
    pieces = {0: [piece(40, 0)], 1: [piece(30, 100)], 2: [piece(25, 200), piece(15, 300)],
              3: [piece(20, 400)]}
    w = cache.writer(0)  # blocks 0-2 in one file, block 2 in two pieces
    for i in (0, 1, 2):
        for p in pieces[i]:
            w.add(i, pa.Table.from_pandas(p, preserve_index=False))
    w.commit()
    w = cache.writer(3)  # block 3 in a file of its own
    w.add(3, pa.Table.from_pandas(pieces[3][0], preserve_index=False))
    w.commit()
    pieces[4] = [piece(33, 500)]  # block 4: a CSV the cache does not have
    csv = tmp_path / "b4.csv"
    pieces[4][0].to_csv(csv, index=False)
    blocks = {i: Block(str(tmp_path / "absent.csv"), 0, -1, 0) for i in range(4)}  # never read
    blocks[4] = Block(str(csv), 0, -1, 0)  # the whole file

    k, offsets = 8, {0: 3, 1: 0, 2: 7, 3: 5, 4: 2}
    expected, buckets = [], []
    for i in range(5):
        block_id = cache.block_id(i)
        stored = pd.concat([p.iloc[block_order(block_id, len(p), n)] for n, p in enumerate(pieces[i])],
                           ignore_index=True)
        at = np.flatnonzero(stored["y"].notna().to_numpy())
        rows = stored.iloc[at].assign(__block=np.int64(block_id), __row=at)
        expected.append(rows)
        buckets.append((np.arange(len(at)) + offsets[i]) % k)  # the definition
    order = np.argsort(np.concatenate(buckets), kind="stable")
    want = pd.concat(expected, ignore_index=True).iloc[order].reset_index(drop=True)

    files = BucketSet(cache.root, "golden", k)
    encoding = Encoding(label="y", label_dtype="float32", columns=())
    dealt = [(i, blocks[i], offsets[i], int(pieces[i][0]["y"].notna().sum()
                                            + sum(p["y"].notna().sum() for p in pieces[i][1:])),
              cache.block_id(i)) for i in range(5)]
    assert deal(files, "t", "r0", dealt, ReadOptions(), cache, encoding) == len(want)
    run, starts = files.read_run("t", "r0", 0, k)
    got = run.to_pandas()
    got["t"] = got["t"].astype(str)
    assert got["x"].tolist() == want["x"].tolist()
    assert got["t"].tolist() == want["t"].tolist()
    assert got["y"].tolist() == want["y"].astype(float).tolist()
    assert got["__block"].tolist() == want["__block"].tolist()
    assert got["__row"].tolist() == want["__row"].tolist()
    assert np.diff(starts).tolist() == np.bincount(np.concatenate(buckets), minlength=k).tolist()
    assert cache.has(4)  # the block the deal parsed is cached on the way
