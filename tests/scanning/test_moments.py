"""Moments merge exactly: however a data set's blocks are grouped into tables and merges, the
statistics are the same to the last bit, and as accurate as a two-pass computation."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.scanning._stats import StatsAccumulator, merge_stats

_BLOCKS = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 2**32 - 1),
                             st.sampled_from([1e-3, 1.0, 1e6, 1e12])), min_size=1, max_size=12)


def _block(rows: int, seed: int, scale: float) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=scale, scale=scale, size=rows)
    n = rng.integers(-5, 10**6, size=rows)
    mask = rng.random(rows) < 0.1
    return pa.table({"x": pa.array(x, mask=mask), "n": pa.array(n), "y": pa.array(n % 2)})


def _grouped(tables: list[pa.Table], cuts: list[int]) -> dict:
    """Blocks added in runs parsed together (one table with each block's bounds), merged in order."""
    acc, out, lo = StatsAccumulator("y"), [], 0
    for hi in sorted({min(c, len(tables)) for c in cuts} | {len(tables)}):
        if hi <= lo:
            continue
        run = tables[lo:hi]
        bounds = np.cumsum([0] + [t.num_rows for t in run])
        acc.add(pa.concat_tables(run), None, bounds)
        out.append(acc.flush())
        acc, lo = StatsAccumulator("y"), hi
    return merge_stats(*out)


@settings(max_examples=60, deadline=None)
@given(blocks=_BLOCKS, cuts=st.lists(st.integers(0, 12), max_size=5),
       again=st.lists(st.integers(0, 12), max_size=5))
def test_any_grouping_of_blocks_gives_the_same_bits(blocks, cuts, again):
    tables = [_block(*b) for b in blocks]
    one = _grouped(tables, [])
    assert _grouped(tables, cuts) == one == _grouped(tables, again)
    per_block = merge_stats(*(_grouped([t], []) for t in tables))  # a part merged block by block
    assert per_block == one
    x = np.concatenate([t.column("x").to_numpy(zero_copy_only=False) for t in tables])
    x = x[~np.isnan(x)]
    if len(x):
        assert one["x"]["count"] == len(x)
        assert np.isclose(one["x"]["mean"], x.mean(), rtol=1e-12, atol=1e-12 * np.abs(x).max())
        var = ((x - x.mean()) ** 2).sum()
        assert np.isclose(one["x"]["m2"], var, rtol=1e-9, atol=1e-9 * max(var, 1e-300))
        assert one["x"]["min"] == x.min() and one["x"]["max"] == x.max()


def test_large_offsets_keep_the_variance():
    """Values of 1e9 + small noise: the naive sum-of-squares formula loses the variance; the
    exact sums keep it."""
    rng = np.random.default_rng(1)
    x = 1e9 + rng.normal(size=20_000)
    acc = StatsAccumulator("y")
    acc.add(pa.table({"x": x, "y": np.zeros(len(x))}), None, np.array([0, 7_000, 13_000, 20_000]))
    stats = acc.flush()["x"]
    assert np.isclose(stats["m2"] / len(x), x.var(), rtol=1e-6)
