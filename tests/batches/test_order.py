"""The global order (daskfeed.batches._order, make_order_plan, assemble): pure properties.

Blocks are stand-in tables of row ids; what a window reads is what the worker-side code
(:func:`daskfeed.batches._read.assemble`) gives, without a cluster.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.batches._order import GlobalOrder, unit_count
from daskfeed.batches._plan import make_order_plan
from daskfeed.batches._read import assemble

COUNTS = st.lists(st.integers(0, 400), min_size=1, max_size=12).filter(lambda c: sum(c) > 0)


def _tables(counts):
    """Block b's stored rows: ids b * 10_000 + k (any order: the reader takes positions)."""
    return [pa.table({"id": np.arange(n, dtype=np.int64) + b * 10_000}) for b, n in enumerate(counts)]


def _batches(counts, *, batch_size, seed, epoch, window_rows, shard=(0, 1), origin=0):
    """Every batch of one trainer's plan, as lists of row ids (read window by window)."""
    order = GlobalOrder.of(counts, unit_count(sum(counts), batch_size), seed, epoch)
    plan = make_order_plan(order, batch_size=batch_size, window_rows=window_rows, shard=shard,
                           origin=origin)
    tables = _tables(counts)
    windows = []
    for w in plan.windows:
        parts, index = assemble(order, w.units, w.span, plan.lanes,
                                lambda j: (j, tables[order.blocks[j]], 0, order.counts[j]),
                                lambda j, rows: np.arange(rows.num_rows))
        ids = pa.concat_tables(parts).column("id").to_numpy() if parts else np.zeros(0, np.int64)
        windows.append(ids[index])
        assert len(windows[-1]) == w.rows
    out = []
    for j in range(plan.num_batches):
        out.append([int(i) for s in plan.batch(j) for i in windows[s.window][s.start:s.stop]])
    return plan, out


@settings(max_examples=60, deadline=None)
@given(counts=COUNTS, batch_size=st.integers(1, 50), seed=st.integers(0, 99),
       windows=st.lists(st.integers(1, 2000), min_size=2, max_size=2))
def test_the_order_is_the_same_whatever_the_window_and_every_row_comes_once(counts, batch_size,
                                                                            seed, windows):
    plans = [_batches(counts, batch_size=batch_size, seed=seed, epoch=1, window_rows=w)
             for w in windows]
    (_, first), (_, second) = plans
    assert first == second  # the budget decides only how much is in memory at once
    every = [i for b in first for i in b]
    assert sorted(every) == sorted(b * 10_000 + k for b, n in enumerate(counts) for k in range(n))
    assert all(len(b) == batch_size for b in first[:-1]) and 0 < len(first[-1]) <= batch_size
    other = _batches(counts, batch_size=batch_size, seed=seed, epoch=2, window_rows=windows[0])[1]
    assert len(first) < 2 or len(every) < 3 or other != first  # another epoch, another order


@settings(max_examples=60, deadline=None)
@given(counts=COUNTS, batch_size=st.integers(1, 30), seed=st.integers(0, 99),
       layouts=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 1500), st.integers(0, 6)),
                        min_size=1, max_size=5))
def test_resumes_under_changing_world_sizes_and_windows_train_each_row_once(counts, batch_size,
                                                                          seed, layouts):
    """A position carried across layouts (world size, window, steps taken in each) gives the
    single trainer's batches, each once (a last single trainer finishes the epoch)."""
    _, alone = _batches(counts, batch_size=batch_size, seed=seed, epoch=0, window_rows=10**6)
    position, trained = 0, []
    for world, window_rows, steps in [*layouts, (1, 10**6, 10**9)]:  # a last trainer finishes
        ranks = [_batches(counts, batch_size=batch_size, seed=seed, epoch=0,
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
