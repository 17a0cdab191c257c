"""Properties of ``daskfeed.batches._plan.make_plan`` for random inputs (hypothesis).

For any partition row counts (zeros included), batch size, window target, shard, seed, epoch,
shuffle and drop_remainder: each shard delivers each of its rows exactly once per epoch (all of
them, or all but the short remainder with ``drop_remainder``), every batch but the last holds
exactly ``batch_size`` rows, shards are disjoint and together deliver every row, the same inputs
give the same plan, and shuffled epochs do not all repeat one order.

Rows are named by global id (partition ``p``'s rows follow those of partitions ``< p``) and
rebuilt from the plan's public meaning only: a window's rows, permuted as the worker permutes
them, sliced by ``plan.batch(i)``. :func:`window_rows` is the one place that knows what a
window is made of.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.batches._plan import make_plan
from daskfeed.batches._read import permute
from daskfeed.core import SettingError
from daskfeed.manifest._encoding import WindowData

EPOCHS_FOR_ORDER = 32  # epochs compared when checking that shuffled epochs change the order


def window_rows(plan, w: int, counts) -> np.ndarray:
    """Global ids of window ``w``'s rows, in the order the worker delivers them (its partitions'
    rows in order, then the worker's row shuffle with the window's seed)."""
    win = plan.windows[w]
    starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    ids = np.concatenate([np.arange(starts[p], starts[p + 1]) for p in win.blocks]
                         or [np.arange(0)])
    assert len(ids) == win.rows, f"window {w} holds {len(ids)} rows, says {win.rows}"
    return permute(WindowData(ids, ids), plan.seed_of(w)).y  # the worker's shuffle


def delivered(plan, counts) -> list[np.ndarray]:
    """The global row ids of every batch of ``plan``, in order."""
    rows = [window_rows(plan, w, counts) for w in range(len(plan.windows))]
    out = []
    for i in range(len(plan)):
        batch = np.concatenate([rows[s.window][s.start:s.stop] for s in plan.batch(i)])
        assert len(batch) == plan.batch_rows(i), (i, len(batch), plan.batch_rows(i))
        out.append(batch)
    return out


def shard_rows(counts, shard) -> np.ndarray:
    """Global ids of the rows of the partitions of ``shard = (i, n)``: ``p % n == i``."""
    starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    index, n = shard
    return np.concatenate([np.arange(starts[p], starts[p + 1]) for p in range(len(counts))
                           if p % n == index] or [np.arange(0)])


counts_st = st.lists(st.one_of(st.just(0), st.integers(0, 60)), max_size=12)
shard_st = st.integers(1, 4).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n)))
options_st = st.fixed_dictionaries({
    "batch_size": st.integers(1, 70),
    "window_rows": st.one_of(st.none(), st.integers(1, 200)),
    "seed": st.integers(0, 2**32 - 1),
    "epoch": st.integers(0, 10_000),
    "shuffle": st.booleans(),
    "drop_remainder": st.booleans(),
})
SETTINGS = settings(max_examples=200, deadline=None)


@SETTINGS
@given(counts=counts_st, shard=shard_st, opts=options_st)
def test_each_row_of_the_shard_exactly_once_in_full_batches(counts, shard, opts):
    plan = make_plan(counts, shard=shard, **opts)
    batches = delivered(plan, counts)
    mine = shard_rows(counts, shard)
    bs = opts["batch_size"]
    got = np.concatenate(batches) if batches else np.arange(0)
    assert len(np.unique(got)) == len(got), "a row delivered twice"
    assert set(got.tolist()) <= set(mine.tolist()), "a row of another shard delivered"
    if opts["drop_remainder"]:  # all but the short tail: full batches only
        assert len(plan) == len(mine) // bs == plan.num_batches
        assert len(got) == plan.rows == len(mine) // bs * bs
        assert all(len(b) == bs for b in batches)
    else:  # every row of the shard
        assert len(plan) == -(-len(mine) // bs)
        assert sorted(got.tolist()) == mine.tolist() and plan.rows == len(mine)
        assert all(len(b) == bs for b in batches[:-1])
        assert not batches or 1 <= len(batches[-1]) <= bs
    if not opts["shuffle"]:  # file order: partitions, then rows, as they are in the files
        assert got.tolist() == mine[: len(got)].tolist()
    with pytest.raises(IndexError):
        plan.batch(len(plan))


@SETTINGS
@given(counts=counts_st, n=st.integers(1, 4), opts=options_st)
def test_shards_are_disjoint_and_together_deliver_every_row(counts, n, opts):
    opts = {**opts, "drop_remainder": False}
    per_shard = [np.concatenate(delivered(make_plan(counts, shard=(i, n), **opts), counts)
                                or [np.arange(0)]) for i in range(n)]
    union = np.concatenate(per_shard)
    assert len(np.unique(union)) == len(union), "a row delivered by two shards"
    assert sorted(union.tolist()) == list(range(sum(counts)))


@SETTINGS
@given(counts=counts_st, shard=shard_st, opts=options_st)
def test_same_inputs_same_plan(counts, shard, opts):
    a = make_plan(counts, shard=shard, **opts)
    b = make_plan(list(counts), shard=shard, **opts)
    assert a == b
    assert [a.batch(i) for i in range(len(a))] == [b.batch(i) for i in range(len(b))]
    assert [x.tolist() for x in delivered(a, counts)] == [x.tolist() for x in delivered(b, counts)]


@SETTINGS
@given(counts=counts_st, shard=shard_st, opts=options_st)
def test_shuffled_epochs_do_not_all_repeat_one_order(counts, shard, opts):
    """With shuffle, some two epochs deliver the rows in a different order (when at least two
    rows are delivered) and group them into batches differently (when there are at least two
    batches): partition order and row permutations are drawn per epoch, and 32 epochs all
    alike would be a 2**-31 coincidence at worst. Without shuffle every epoch is the same."""
    orders, groupings = set(), set()
    for epoch in range(EPOCHS_FOR_ORDER if opts["shuffle"] else 4):
        plan = make_plan(counts, shard=shard, **{**opts, "epoch": epoch})
        batches = delivered(plan, counts)
        orders.add(tuple(np.concatenate(batches or [np.arange(0)]).tolist()))
        groupings.add(tuple(frozenset(b.tolist()) for b in batches))
        if len(orders) > 1 and len(groupings) > 1:
            break  # shown: the rest of the epochs cannot undo it
    if not opts["shuffle"]:
        assert len(orders) == len(groupings) == 1
        return
    if plan.rows >= 2:
        assert len(orders) > 1, f"{EPOCHS_FOR_ORDER} shuffled epochs in one order"
    if len(plan) >= 2:
        assert len(groupings) > 1, f"{EPOCHS_FOR_ORDER} shuffled epochs, the same batches"


@SETTINGS
@given(counts=counts_st, shard=shard_st, opts=options_st)
def test_shuffled_epochs_reorder_the_partitions(counts, shard, opts):
    """With shuffle and two or more non-empty partitions in the shard, the partitions ranked by
    the mean position of their rows in the epoch are not in the same order in every epoch (the
    partition order is drawn per epoch, not only the rows within a window)."""
    opts = {**opts, "shuffle": True, "drop_remainder": False}
    starts = np.cumsum(counts, dtype=np.int64)
    rankings = set()
    for epoch in range(EPOCHS_FOR_ORDER):
        plan = make_plan(counts, shard=shard, **{**opts, "epoch": epoch})
        rows = np.concatenate(delivered(plan, counts) or [np.arange(0)])
        parts = np.searchsorted(starts, rows, side="right")  # the partition of each row
        mean = {p: np.flatnonzero(parts == p).mean() for p in set(parts.tolist())}
        rankings.add(tuple(sorted(mean, key=lambda p: (mean[p], p))))
        if len(rankings) > 1:
            break  # shown
    index, n = shard
    if sum(1 for p, c in enumerate(counts) if c and p % n == index) >= 2:
        assert len(rankings) > 1, f"{EPOCHS_FOR_ORDER} epochs rank the partitions alike"


def test_bad_arguments_are_refused():
    with pytest.raises(SettingError, match="batch_size"):
        make_plan([3], batch_size=0)
    with pytest.raises(SettingError, match="shard"):
        make_plan([3], batch_size=1, shard=(2, 2))
