"""Pure plan tests: exactly-once, fixed batch sizes, determinism, windows, shards."""

from __future__ import annotations

import numpy as np
import pytest

from daskfeed.batches._plan import make_plan
from daskfeed.core import SettingError


def rows_of(plan, counts):
    """Global (partition, row) identities in the order the plan delivers them."""
    offsets = np.concatenate([[0], np.cumsum(counts)])
    win_rows = {}
    for w in plan.windows:
        ids = np.concatenate([np.arange(offsets[p], offsets[p + 1]) for p in w.blocks])
        if plan.shuffle:
            ids = ids[np.random.default_rng(list(plan.seed_of(w.index))).permutation(len(ids))]
        win_rows[w.index] = ids
    out = []
    for i in range(len(plan)):
        batch = np.concatenate([win_rows[s.window][s.start:s.stop] for s in plan.batch(i)])
        assert len(batch) == plan.batch_rows(i)
        out.append(batch)
    return out


@pytest.mark.parametrize("counts", [[700] * 19 + [0, 300], [1], [5, 0, 0, 3], [1000, 1, 999, 2048]])
@pytest.mark.parametrize("batch_size", [1, 64, 1000, 5000])
@pytest.mark.parametrize("window_rows", [None, 1500, 10**9])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_row_exactly_once_and_fixed_batch_size(counts, batch_size, window_rows, shuffle):
    total = sum(counts)
    for epoch in range(3):
        plan = make_plan(counts, batch_size=batch_size, epoch=epoch, seed=7, shuffle=shuffle,
                         window_rows=window_rows)
        batches = rows_of(plan, counts)
        assert len(plan) == -(-total // batch_size)
        assert all(len(b) == batch_size for b in batches[:-1])
        assert 1 <= len(batches[-1]) <= batch_size
        delivered = np.concatenate(batches)
        assert len(delivered) == total
        assert np.array_equal(np.sort(delivered), np.arange(total))


def test_drop_remainder_drops_only_the_short_tail():
    plan = make_plan([700, 700, 301], batch_size=256, drop_remainder=True)
    assert len(plan) == 1701 // 256
    batches = rows_of(plan, [700, 700, 301])
    assert all(len(b) == 256 for b in batches)
    assert len(np.unique(np.concatenate(batches))) == len(plan) * 256


def test_deterministic_and_new_order_each_epoch():
    counts = [500] * 40
    a = make_plan(counts, batch_size=128, epoch=1, seed=3, window_rows=2000)
    b = make_plan(counts, batch_size=128, epoch=1, seed=3, window_rows=2000)
    assert a == b
    assert [s for i in range(len(a)) for s in a.batch(i)] == [s for i in range(len(b)) for s in b.batch(i)]
    c = make_plan(counts, batch_size=128, epoch=2, seed=3, window_rows=2000)
    d = make_plan(counts, batch_size=128, epoch=1, seed=4, window_rows=2000)
    order = lambda p: [w.blocks for w in p.windows]  # noqa: E731
    assert order(a) != order(c)
    assert order(a) != order(d)
    assert not np.array_equal(np.concatenate(rows_of(a, counts)), np.concatenate(rows_of(c, counts)))


def test_unshuffled_plan_keeps_file_order_and_is_epoch_independent():
    counts = [10, 20, 30]
    a = make_plan(counts, batch_size=7, shuffle=False, epoch=0)
    b = make_plan(counts, batch_size=7, shuffle=False, epoch=5)
    assert np.array_equal(np.concatenate(rows_of(a, counts)), np.arange(60))
    assert a.same_batches(b)


def test_batches_span_partition_and_window_edges():
    plan = make_plan([100, 100, 100], batch_size=64, shuffle=False, window_rows=1)
    assert len(plan.windows) == 3
    spanning = [i for i in range(len(plan)) if len(plan.batch(i)) > 1]
    assert spanning, "no batch crosses a window edge"
    assert plan.batch(1) == [type(plan.batch(1)[0])(0, 64, 100), type(plan.batch(1)[0])(1, 0, 28)]


def test_windows_follow_window_rows_and_mix_partitions():
    plan = make_plan([100] * 10, batch_size=10, window_rows=250, seed=1)
    assert [w.rows for w in plan.windows] == [300, 300, 300, 100]
    assert all(len(w.blocks) == 3 for w in plan.windows[:3])
    assert plan.batches_of(0) == range(0, 30)


def test_shards_are_disjoint_and_cover_everything():
    counts = [50] * 9
    seen = []
    for k in range(3):
        plan = make_plan(counts, batch_size=16, shard=(k, 3), seed=2, epoch=4)
        seen.extend(p for w in plan.windows for p in w.blocks)
    assert sorted(seen) == list(range(9))


def test_bad_arguments():
    with pytest.raises(SettingError, match="batch_size"):
        make_plan([1], batch_size=0)
    with pytest.raises(SettingError, match="shard"):
        make_plan([1], batch_size=1, shard=(3, 2))
    with pytest.raises(IndexError):
        make_plan([10], batch_size=4).batch(3)
