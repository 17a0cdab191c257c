"""The global order (daskfeed.batches._order, make_order_plan): pure properties.

Blocks are stand-in tables of row ids, dealt into buckets as the build does
(:func:`daskfeed.batches._order.bucket_members`); what a window reads is what the worker-side
code does with its buckets (:func:`daskfeed.batches._order.window_index`), without a cluster.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.batches._order import (
    BUCKET_ROWS,
    GlobalOrder,
    block_offsets,
    bucket_count,
    bucket_members,
    bucket_of,
    bucket_sizes,
    window_index,
)
from daskfeed.batches._plan import make_order_plan
from daskfeed.batches._skips import Skips, kept_batch, kept_before

COUNTS = st.lists(st.integers(0, 400), min_size=1, max_size=12).filter(lambda c: sum(c) > 0)


def _buckets(counts, k=None):
    """Each bucket's row ids (block b's row i: b * 10_000 + i) in canonical order, and sizes."""
    k = k or bucket_count(sum(counts))
    offsets = block_offsets(np.arange(len(counts)) * 7919 + 3, k)
    sizes = bucket_sizes(counts, offsets, k)
    ids = []
    for b in range(k):
        js, rows = bucket_members(counts, offsets, k, b)
        ids.append(js * 10_000 + rows)
    return ids, sizes


def _batches(counts, *, batch_size, seed, epoch, window_rows, shard=(0, 1), origin=0, k=None,
             skips=()):
    """Every batch of one trainer's plan, as lists of row ids (read window by window)."""
    ids, sizes = _buckets(counts, k)
    order = GlobalOrder.of(sizes, seed, epoch)
    plan = make_order_plan(order, batch_size=batch_size, window_rows=window_rows, shard=shard,
                           origin=origin, skips=skips)
    windows = []
    for w in plan.windows:
        units = order.window(*w.units)
        rows = np.concatenate([ids[b] for b, _, _ in units])
        windows.append(rows[window_index(units, w.span, plan.lanes)])
        assert len(windows[-1]) == w.rows
    out = []
    for j in range(plan.num_batches):
        out.append([int(i) for s in plan.batch(j) for i in windows[s.window][s.start:s.stop]])
    return plan, out


@settings(max_examples=60, deadline=None)
@given(counts=COUNTS, k=st.integers(1, 40))
def test_buckets_deal_every_row_once_in_sizes_known_from_the_counts(counts, k):
    ids, sizes = _buckets(counts, k)
    assert [len(b) for b in ids] == sizes.tolist()
    every = np.sort(np.concatenate(ids))
    assert every.tolist() == sorted(b * 10_000 + i for b, n in enumerate(counts) for i in range(n))
    assert sizes.max() - sizes.min() <= len(counts)  # each block gives each bucket n // K, +1


@settings(max_examples=60, deadline=None)
@given(counts=COUNTS, k=st.integers(1, 40))
def test_each_rows_bucket_over_blocks_at_once_is_the_definitions_and_the_members(counts, k):
    """``bucket_of`` over every block at once: row ``i`` of block ``j`` in ``(i + o_j) mod K``,
    and bucket ``b``'s rows are what :func:`bucket_members` lists for it."""
    offsets = block_offsets(np.arange(len(counts)) * 7919 + 3, k)
    got = bucket_of(offsets, np.asarray(counts), k)
    assert got.tolist() == [(i + int(o)) % k for o, n in zip(offsets, counts, strict=True)
                            for i in range(n)]
    firsts = np.cumsum(counts) - np.asarray(counts)
    for b in range(k):
        js, rows = bucket_members(counts, offsets, k, b)
        assert sorted((firsts[js] + rows).tolist()) == np.flatnonzero(got == b).tolist()


@settings(max_examples=60, deadline=None)
@given(counts=COUNTS, batch_size=st.integers(1, 50), seed=st.integers(0, 99),
       windows=st.lists(st.integers(1, 2000), min_size=2, max_size=2))
def test_the_order_is_the_same_whatever_the_window_and_every_row_comes_once(counts, batch_size,
                                                                            seed, windows):
    plans = [_batches(counts, batch_size=batch_size, seed=seed, epoch=1, window_rows=w, k=5)
             for w in windows]
    (_, first), (_, second) = plans
    assert first == second  # the budget decides only how much is in memory at once
    every = [i for b in first for i in b]
    assert sorted(every) == sorted(b * 10_000 + k for b, n in enumerate(counts) for k in range(n))
    assert all(len(b) == batch_size for b in first[:-1]) and 0 < len(first[-1]) <= batch_size
    other = _batches(counts, batch_size=batch_size, seed=seed, epoch=2, window_rows=windows[0],
                     k=5)[1]
    # another epoch, another order: where the rows have so many orders that two epochs' drawing
    # the same one is out of reach (3 rows have 6: seed 1 drew the same order twice)
    assert len(first) < 2 or len(every) < 20 or other != first


@settings(max_examples=60, deadline=None)
@given(counts=COUNTS, batch_size=st.integers(1, 30), seed=st.integers(0, 99),
       layouts=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 1500), st.integers(0, 6)),
                        min_size=1, max_size=5))
def test_resumes_under_changing_world_sizes_and_windows_train_each_row_once(counts, batch_size,
                                                                          seed, layouts):
    """A position carried across layouts (world size, window, steps taken in each) gives the
    single trainer's batches, each once (a last single trainer finishes the epoch)."""
    _, alone = _batches(counts, batch_size=batch_size, seed=seed, epoch=0, window_rows=10**6, k=4)
    position, trained = 0, []
    for world, window_rows, steps in [*layouts, (1, 10**6, 10**9)]:  # a last trainer finishes
        ranks = [_batches(counts, batch_size=batch_size, seed=seed, epoch=0, k=4,
                          window_rows=window_rows, shard=(r, world), origin=position % world)
                 for r in range(world)]
        start = position // world
        left = ranks[0][0].num_batches - start
        assert len({p.num_batches for p, _ in ranks}) == 1
        for j in range(start, start + max(min(steps, left), 0)):
            for r, (_, batches) in enumerate(ranks):
                g = position % world + r + j * world
                assert batches[j] == alone[g]
                trained.append(g)
        position = position % world + (start + max(min(steps, left), 0)) * world
    assert trained == list(range(len(alone)))  # each batch of the epoch once, in order


def test_batches_of_label_sorted_data_are_iid_grade():
    """Blocks sorted by label (each block all 0 or all 1): every batch's label mean spreads as
    an iid sample's does (the buckets are stratified samples of all blocks)."""
    counts = [1000] * 200
    labels = np.repeat((np.arange(200) >= 100).astype(float), 1000)  # block b: 0 below 100
    _, batches = _batches(counts, batch_size=256, seed=0, epoch=0, window_rows=20_000)
    means = np.array([labels[[(i // 10_000) * 1000 + i % 10_000 for i in b]].mean()
                      for b in batches[:-1]])
    iid = np.sqrt(0.25 / 256)
    assert means.std() / iid < 1.1


def test_a_bucket_holds_up_to_65536_rows_and_no_more_than_about_8_mb_of_csv():
    """K is a power of two: buckets of half to all of BUCKET_ROWS, kept until the rows double."""
    assert bucket_count(190_000_000, 13_330_000_000) == 4096  # 2,900 at most 65,536: 46,387 rows
    assert bucket_count(1_000_000, 8_000 * 1_000_000) == 1024  # 8 KB rows: ~977 rows (≤ 8 MB)
    assert bucket_count(1_000, 10**9) == 1  # never fewer than 1,024 rows a bucket (or one)
    assert bucket_count(20_000) == 16 and bucket_count(10**6) == 64  # small data: several
    for rows in (70_000, 10**6, 5 * 10**6, 190_000_000, 1_400_000_000):
        k = bucket_count(rows)
        assert k & (k - 1) == 0 and rows / k <= BUCKET_ROWS
        assert rows / k > BUCKET_ROWS / 2 or k == 64  # at most twice the buckets needed
        assert bucket_count(int(rows * 1.9)) in (k, 2 * k)  # growth: K kept until it doubles


def test_planning_an_epoch_of_1_4_million_blocks_costs_its_buckets_not_its_blocks():
    """The seed's 100 GB in 1,000-row files: 1.4M blocks, 1.4B rows. Sizes come from the counts
    in O(blocks + K) (two int64 arrays of the blocks: ~23 MB), an epoch's plan in O(K) (K =
    32,768 buckets): bounded by a few times the blocks' own arrays."""
    blocks = 1_400_000
    counts = np.full(blocks, 1000, dtype=np.int64)
    tracemalloc.start()
    t0 = time.process_time()
    k = bucket_count(int(counts.sum()), 100 * 10**9)
    sizes = bucket_sizes(counts, block_offsets(np.arange(blocks, dtype=np.uint64), k), k)
    sized = time.process_time() - t0
    order = GlobalOrder.of(sizes, seed=0, epoch=3)
    plan = make_order_plan(order, batch_size=1024, window_rows=4 * int(sizes.max()))
    planned = time.process_time() - t0 - sized
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert k == 32_768 and int(sizes.sum()) == blocks * 1000  # 21,363 buckets' worth: 2**15
    assert plan.rows == blocks * 1000 and -(-k // 5) <= len(plan.windows) <= -(-k // 4)
    per_block = counts.nbytes  # one int64 per block
    assert peak < 6 * per_block + 2000 * k * 8  # the blocks' arrays, then K-sized ones
    # time: a few vectorized passes over the blocks; the plan a Python loop over K / 4 windows.
    # Compared with one pass that touches the blocks' array, so the bound holds on a busy host.
    t0 = time.process_time()
    np.sort(np.random.default_rng(0).integers(0, k, blocks))
    touch = max(time.process_time() - t0, 1e-3)
    assert sized < 20 * touch and planned < 40 * touch


SKIPS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), max_size=4)


@settings(max_examples=80, deadline=None)
@given(counts=COUNTS, batch_size=st.integers(1, 30), seed=st.integers(0, 99), cuts=SKIPS,
       layouts=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 1500), st.integers(0, 6)),
                        min_size=1, max_size=5))
def test_skipped_batches_are_left_out_alike_under_any_layout_and_resume(counts, batch_size, seed,
                                                                       cuts, layouts):
    """Skipped batches are never trained, the others each once, in order, whatever the world
    sizes and windows a position is carried across (as a resume state carries it: a batch of
    the order), every trainer of a layout taking the same number of steps; the epoch's rows are
    trained, skipped or left out by the tail policy, and counted so."""
    skips = Skips.of((0, a, a + n) for a, n in cuts)
    ranges = skips.epoch(0)
    _, alone = _batches(counts, batch_size=batch_size, seed=seed, epoch=0, window_rows=10**6, k=4)
    cut = [g for g in range(len(alone)) if any(a <= g <= b for a, b in ranges)]
    total = sum(counts)
    for world in (1, 3):  # one layout's counts: trained + skipped + tail = the epoch's rows
        plans = [_batches(counts, batch_size=batch_size, seed=seed, epoch=0, k=4, window_rows=50,
                          shard=(r, world), skips=ranges)[0] for r in range(world)]
        assert sum(p.rows for p in plans) + plans[0].dropped + plans[0].skipped == total
        full = len(alone) if world == 1 else total // batch_size
        assert plans[0].skipped_batches == len([g for g in cut if g < full])
    position, trained = 0, []
    for world, window_rows, steps in [*layouts, (1, 10**6, 10**9)]:  # a last trainer finishes
        kept = int(kept_before(ranges, position))
        ranks = [_batches(counts, batch_size=batch_size, seed=seed, epoch=0, k=4, skips=ranges,
                          window_rows=window_rows, shard=(r, world), origin=kept % world)
                 for r in range(world)]
        start = kept // world
        assert len({p.num_batches for p, _ in ranks}) == 1  # every trainer the same steps
        taken = max(min(steps, ranks[0][0].num_batches - start), 0)
        for j in range(start, start + taken):
            for plan, batches in ranks:
                g = plan.lanes.global_batch(j)
                assert g not in cut and batches[j] == alone[g]
                trained.append(g)
        position = kept_batch(ranges, kept % world + (start + taken) * world)
    assert sorted(trained) == trained  # in the order's order
    assert trained == [g for g in range(len(alone)) if g not in cut]  # the rest, each once
