"""Buckets through growth (daskfeed.batches._buckets) on a real LocalCluster.

A data set that grows keeps its ``K`` (a power of two) and its buckets: only the new parts'
rows are dealt, into a new generation; the youngest generations are merged while they are
about the size of the one before them, and never more than ``MAX_GENERATIONS`` are read. Every
check compares with a fresh build of the same files in another cache root: the same rows in
every bucket, in the same order, so the same batches.
"""

from __future__ import annotations

import itertools
import os
import shutil

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed.batches._buckets import MAX_GENERATIONS, merge_plan

pytestmark = pytest.mark.filterwarnings("ignore:.*rows have no value in label")


def _labelled(rows):
    return rows - len(range(4, rows, 9))


def _write(folder, first_uid, rows, seed):
    """One CSV file of ``rows`` rows (uids from ``first_uid``), every 9th row unlabelled."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    label = rng.integers(0, 2, rows).astype(float)
    label[np.arange(rows) % 9 == 4] = np.nan
    pd.DataFrame({"uid": np.arange(rows) + first_uid, "level": rng.integers(1, 60, rows),
                  "region": rng.choice(["north", "south", "Île"], rows),
                  "cleared": label}).to_csv(os.path.join(folder, f"f{first_uid}.csv"), index=False)


def _sequence(root, client, cache):
    # each folder is a part of its own (parts are cut where the directory changes)
    return daskfeed.DaskSequence(str(root / "**" / "*.csv"), label="cleared", client=client,
                                 cache=cache, batch_size=100, features=["uid", "level", "region"],
                                 seed=7, window_rows=1_000)


def _epoch(seq):
    return [seq[i][0]["uid"].tolist() for i in range(len(seq))]


def _buckets(seq):
    files = seq.stream.buckets.files
    return [files.read_bucket(b, ["uid"]).column("uid").to_pylist()
            for b in range(seq.stream.buckets.count)]


def _fresh(root, client, tmp_path, name):
    with _sequence(root, client, tmp_path / name) as seq:
        assert len(seq.stream.buckets.files.generations) == 1
        return _epoch(seq), _buckets(seq)


@pytest.fixture()
def grown(tmp_path):
    root = tmp_path / "data"
    for d in range(4):  # 4 parts of 1,500 rows: 5,332 labelled, K = 4
        _write(root / f"day{d}", d * 10_000, 1_500, d)
    return root


def test_new_files_are_dealt_into_the_buckets_kept_and_the_order_is_a_fresh_builds(
        grown, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(grown, client, cache) as seq:
        first = seq.stream.buckets.files
        assert first.buckets == 4 and len(first.generations) == 1
        kept = first.parts_of()[0]
        inode = os.stat(kept.bucket_path(0)).st_ino
    _write(grown / "day4", 40_000, 600, 4)  # a new day: 533 labelled rows more, K still 4
    with _sequence(grown, client, cache) as seq:
        files = seq.stream.buckets.files
        assert files.buckets == 4 and files.generations[0] == first.generations[0]
        assert len(files.generations) == 2  # 5,332 rows kept, 533 new: no merge
        assert os.stat(kept.bucket_path(0)).st_ino == inode  # the old rows were not dealt again
        assert "533 rows of 1 part(s) dealt into the 1 generation(s) kept" in seq.stream.order_line()
        epoch, buckets = _epoch(seq), _buckets(seq)
        labelled = seq.manifest.counts
    uids = [u for batch in epoch for u in batch]
    assert len(uids) == len(set(uids)) == sum(labelled) == 4 * _labelled(1_500) + _labelled(600)
    assert {u // 10_000 for u in uids} == {0, 1, 2, 3, 4}
    fresh_epoch, fresh_buckets = _fresh(grown, client, tmp_path, "fresh")
    assert buckets == fresh_buckets and epoch == fresh_epoch  # whatever the history


def test_files_appended_to_a_folder_deal_their_rows_alone_and_keep_the_order_a_fresh_builds(
        grown, client, tmp_path):
    """A file added to the last day's folder extends that folder's part: its rows alone are
    dealt, the part's earlier rows stay in the generation kept, and the order is a fresh build's."""
    cache = tmp_path / "c"
    with _sequence(grown, client, cache) as seq:
        first = seq.stream.buckets.files
        kept = first.parts_of()[0]
        inode = os.stat(kept.bucket_path(0)).st_ino
        entries = seq.cache.entries
    _write(grown / "day3", 39_000, 600, 9)  # f39000.csv sorts after day3's f30000.csv
    with _sequence(grown, client, cache) as seq:
        assert seq.cache.entries[:-1] == entries and len(seq.cache.entries) == len(entries) + 1
        files = seq.stream.buckets.files
        assert files.generations[0] == first.generations[0] and len(files.generations) == 2
        assert os.stat(kept.bucket_path(0)).st_ino == inode  # day 3's earlier rows not dealt again
        assert "533 rows of 1 part(s) dealt into the 1 generation(s) kept" in seq.stream.order_line()
        epoch, buckets = _epoch(seq), _buckets(seq)
    uids = [u for batch in epoch for u in batch]
    assert len(uids) == len(set(uids)) == 4 * _labelled(1_500) + _labelled(600)
    fresh_epoch, fresh_buckets = _fresh(grown, client, tmp_path, "fresh")
    assert buckets == fresh_buckets and epoch == fresh_epoch


def test_small_days_are_merged_together_never_into_the_big_past(grown, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(grown, client, cache) as seq:
        (base,) = seq.stream.buckets.files.generations
    counts = []
    for day in range(4, 9):  # five small days: 150 rows (133 labelled) each
        _write(grown / f"day{day}", day * 10_000, 150, day)
        with _sequence(grown, client, cache) as seq:
            files = seq.stream.buckets.files
            assert files.generations[0] == base  # the big past is never dealt again
            counts.append(len(files.generations))
            epoch, buckets = _epoch(seq), _buckets(seq)
    # 5,332 | 133; 133 + 133 merged: 266; + 133: 399; | 133 (399 > 2 x 133): three; then
    # 133 + 133 = 266 and 399 <= 2 x 266: one young generation of 665 rows again
    assert counts == [2, 2, 2, 3, 2]
    fresh_epoch, fresh_buckets = _fresh(grown, client, tmp_path, "fresh")
    assert buckets == fresh_buckets and epoch == fresh_epoch


def test_a_changed_or_removed_file_deals_its_generations_parts_again_not_the_others(
        grown, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(grown, client, cache) as seq:
        base = seq.stream.buckets.files.generations[0]
    _write(grown / "day4", 40_000, 600, 4)
    with _sequence(grown, client, cache) as seq:
        assert seq.stream.buckets.files.generations[0] == base
    shutil.rmtree(grown / "day1")  # a part of the first generation went
    with _sequence(grown, client, cache) as seq:
        files = seq.stream.buckets.files
        assert base not in files.generations  # not read: it holds rows that are gone
        epoch, buckets = _epoch(seq), _buckets(seq)
    uids = [u for batch in epoch for u in batch]
    assert len(uids) == len(set(uids)) and not {u for u in uids if 10_000 <= u < 20_000}
    fresh_epoch, fresh_buckets = _fresh(grown, client, tmp_path, "fresh")
    assert buckets == fresh_buckets and epoch == fresh_epoch


def test_data_that_doubles_gets_twice_the_buckets_from_a_fresh_deal(grown, client, tmp_path):
    cache = tmp_path / "c"
    with _sequence(grown, client, cache) as seq:
        assert seq.stream.buckets.count == 4
    for d in range(4, 8):
        _write(grown / f"day{d}", d * 10_000, 1_500, d)  # 10,664 rows: K = 8
    with _sequence(grown, client, cache) as seq:
        files = seq.stream.buckets.files
        assert files.buckets == 8 and len(files.generations) == 1
        epoch = _epoch(seq)
    assert len({u for b in epoch for u in b}) == sum(len(b) for b in epoch) == 8 * _labelled(1_500)


def test_the_merge_plan_keeps_generations_shrinking_and_bounded():
    assert merge_plan([1000]) == 0 and merge_plan([]) == 0
    assert merge_plan([1000, 10]) == 0  # a small day beside a big past: kept apart
    assert merge_plan([1000, 10, 10]) == 2  # two alike: merged
    assert merge_plan([1000, 30, 10, 10]) == 3  # 20 merged, then 30 <= 2 * 20: merged too
    assert merge_plan([100, 100]) == 2
    rows = []
    merges = 0
    for day in range(1, 2_000):  # a day of growth at a time, for years
        rows.append(1 if day > 1 else 10_000)
        take = merge_plan(rows)
        if take:
            rows = [*rows[:-take], sum(rows[-take:])]
            merges += take
        assert len(rows) <= MAX_GENERATIONS
        assert all(a > 2 * b for a, b in itertools.pairwise(rows))  # shrinking
    assert merges < 2_000 * 12  # each day's rows rewritten about log2(days) times, not days


def test_planning_generations_at_1_4_million_blocks_costs_a_few_passes_over_the_blocks():
    """The seed's 100 GB in 1,000-row files: 1.4M blocks in 1,400 parts, 8 generations on disk
    and a new day. Each generation costs a mask of the blocks and its buckets' sizes from its
    own blocks: memory a few times the blocks' own arrays, time about two passes over them."""
    import time  # (this thread's CPU time: the session's cluster has threads in this process)
    import tracemalloc

    from daskfeed.batches._buckets import Planner
    from daskfeed.batches._order import block_offsets, bucket_count
    from daskfeed.cache import digest

    blocks, per_part = 1_400_000, 1_000
    counts = np.full(blocks, 1000, dtype=np.int64)
    k = bucket_count(int(counts.sum()))
    offsets = block_offsets(np.arange(blocks, dtype=np.uint64) * 7919, k)
    names = [f"p{i:05d}" for i in range(blocks // per_part)]
    parts = {p: (i * per_part, (i + 1) * per_part) for i, p in enumerate(names)}
    planner = Planner(counts, offsets, k, parts)
    # 8 generations, each more than twice the next (1,149, 127, 63, 31, 15, 7, 3, 1 parts)
    cuts = [0, 1149, 1276, 1339, 1370, 1385, 1392, 1395, 1396]
    found = []
    for lo, hi in itertools.pairwise(cuts):
        g = planner.generation(frozenset(names[lo:hi]))
        found.append({"name": g.name, "parts": names[lo:hi], "sizes": digest(g.sizes),
                      "rows": g.rows, "build": "b"})
    del g
    tracemalloc.start()
    t0 = time.thread_time()
    kept, new, plan = planner.plan(found)
    planned = time.thread_time() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(kept) == 8 and new is not None and len(new.parts) == 4
    # 4 new parts: merged with the 7 youngest (a binary counter's carry: 4 + 1 + 3 + 7 + ...)
    assert new.rows == 4 * per_part * 1000 and plan == 8
    # a mask of a byte a block for each of the 9 generations kept; one generation's blocks'
    # rows and offsets and bucket_sizes' temporaries at a time (about 6 int64 arrays); measured:
    # 41 bytes a block
    assert peak < (6 * 8 + 9 * 1) * blocks, peak
    t0 = time.thread_time()
    for _ in range(3):  # a pass that touches the blocks' arrays as bucket_sizes does
        np.add.at(np.zeros(k + 1, dtype=np.int64), offsets % k, 1)
    touch = max((time.thread_time() - t0) / 3, 1e-3)
    # the generations found hold each block once: about two passes of bucket_sizes (4 such
    # touches each) over the blocks in all; measured: 4 touches
    assert planned < 16 * touch, (planned, touch)
