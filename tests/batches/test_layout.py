"""Layout (daskfeed.batches._layout): the blocksize a run reads with, rows per window, largest sizes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daskfeed.batches._layout import (
    MIN_WINDOWS,
    blocksize_for,
    largest_block,
    planned_window_bytes,
    window_rows_for,
)
from daskfeed.manifest import Manifest

MiB = 2**20


def manifest(rows_per_block=(1000, 4000, 2500), *, bytes_per_row=50, blocksize=None) -> Manifest:
    parts = [{"path": f"f{i}.csv", "offset": 0, "length": n * bytes_per_row, "rows": n, "raw_rows": n}
             for i, n in enumerate(rows_per_block)]
    return Manifest(fingerprint="0" * 32, label="y", task="binary", num_classes=2, columns={},
                    blocks=parts, rows=sum(rows_per_block), label_missing=0,
                    nbytes=sum(rows_per_block) * bytes_per_row,
                    read_options={} if blocksize is None else {"blocksize": blocksize})


BUDGET = SimpleNamespace(blocksize=64 * MiB)


# -- blocksize ---------------------------------------------------------------------------------
def test_a_blocksize_asked_for_wins_and_says_what_the_budget_gives():
    said: list[str] = []
    assert blocksize_for(32 * MiB, BUDGET, manifest(blocksize=128 * MiB), True, said.append) == 32 * MiB
    assert said == ["blocks of 32.00 MiB (blocksize / daskfeed.blocksize; the budget alone gives "
                    "64.00 MiB)"]
    said.clear()
    assert blocksize_for(64 * MiB, BUDGET, None, True, said.append) == 64 * MiB
    assert said == []  # the budget's own: nothing to say


@pytest.mark.parametrize(("reused", "cache", "expected"), [
    (128 * MiB, True, 128 * MiB),  # a cache holds the parsed blocks: reused whatever the budget
    (128 * MiB, "/tmp/c", 128 * MiB),
    (128 * MiB, False, 64 * MiB),  # no cache: its blocks must fit this budget's parse peak
    (16 * MiB, False, 16 * MiB),
    (None, True, 64 * MiB),  # a manifest that does not say: the budget's
])
def test_a_reused_manifest_keeps_its_blocks_where_they_fit(reused, cache, expected):
    said: list[str] = []
    assert blocksize_for(None, BUDGET, manifest(blocksize=reused), cache, said.append) == expected
    assert said == []


def test_without_a_manifest_the_budget_decides():
    assert blocksize_for(None, BUDGET, None, False, print) == 64 * MiB
    assert blocksize_for(0, BUDGET, None, True, print) == 64 * MiB  # 0: not asked


# -- largest block and window ---------------------------------------------------------------------
def test_the_largest_block_is_its_rows_times_bytes_per_row():
    m = manifest((1000, 4000, 2500), bytes_per_row=50)
    assert m.bytes_per_row == 50 and largest_block(m) == 200_000
    assert largest_block(manifest(())) == 0


def test_the_planned_window_is_the_largest_of_a_window_and_a_block_over_sequences():
    m = manifest((1000, 4000, 2500), bytes_per_row=50)
    small = SimpleNamespace(window_rows=100, manifest=m)  # smaller than a block: a block
    big = SimpleNamespace(window_rows=10_000, manifest=m)
    assert planned_window_bytes(small) == 200_000
    assert planned_window_bytes(small, None, big) == 500_000
    assert planned_window_bytes(None, small) == 200_000


# -- rows per window -------------------------------------------------------------------------------
def test_rows_per_window_given_are_kept_but_never_below_a_batch():
    m = manifest()
    assert window_rows_for(5000, 1, m, 8, 1, batch_size=64) == 5000
    assert window_rows_for(10, 10**9, m, 8, 10**9, batch_size=64) == 64


def test_rows_per_window_from_window_bytes():
    m = manifest((100_000,) * 10, bytes_per_row=100)  # 1M rows
    assert window_rows_for(None, 5_000_000, m, encoded_row_bytes=40, prefetch_bytes=10**9,
                           batch_size=256) == 50_000


def test_two_windows_and_a_next_one_fit_the_prefetch_budget():
    m = manifest((100_000,) * 10, bytes_per_row=100)
    assert window_rows_for(None, 5_000_000, m, encoded_row_bytes=40, prefetch_bytes=1_200_000,
                           batch_size=256) == 10_000


def test_an_epoch_has_at_least_min_windows():
    m = manifest((1000,) * 4, bytes_per_row=100)  # 4000 rows
    assert MIN_WINDOWS == 8
    assert window_rows_for(None, 10**9, m, 40, 10**12, batch_size=100) == 500
    assert window_rows_for(None, 10**9, manifest((1001,)), 40, 10**12, batch_size=1) == 126  # ceil


@given(rows=st.lists(st.integers(0, 10**6), min_size=1, max_size=20), bpr=st.integers(1, 10**4),
       window_bytes=st.integers(1, 2**34), enc=st.integers(1, 10**4), prefetch=st.integers(0, 2**36),
       batch_size=st.integers(1, 10**5))
def test_rows_per_window_hold_a_batch_and_otherwise_every_bound(rows, bpr, window_bytes, enc, prefetch,
                                                                 batch_size):
    m = manifest(tuple(rows), bytes_per_row=bpr)
    got = window_rows_for(None, window_bytes, m, enc, prefetch, batch_size)
    assert got >= max(batch_size, 1)
    if got > batch_size:  # the bounds decided
        assert got <= window_bytes / m.bytes_per_row
        assert 3 * got * enc <= prefetch
        assert got * MIN_WINDOWS < m.rows + MIN_WINDOWS
