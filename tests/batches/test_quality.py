"""Shuffle quality: the batch label-mean spread against iid, measured and reached on sorted data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed.batches._quality import LabelSpread


def _spread(batches, classes=0):
    spread = LabelSpread(len(batches[0]), classes)
    for y in batches:
        spread.add(y)
    return spread.summary()


def test_iid_batches_measure_about_one_and_sorted_ones_far_more():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 50_000)
    iid = _spread(np.split(rng.permutation(y), 1000))
    assert 0.9 < iid["label_spread"] < 1.1 and iid["inside_iid"] >= 0.97
    assert iid["spread_batches"] == 1000
    ordered = _spread(np.split(y, 1000))  # every batch all 0 or all 1
    assert ordered["label_spread"] > 9.9 and ordered["inside_iid"] == 0.0  # sqrt(100) x iid
    target = rng.normal(size=100_000)  # a regression target: the batch means of the target
    assert 0.9 < _spread(np.split(target, 1000))["label_spread"] < 1.1
    assert _spread(np.split(np.sort(target), 1000))["label_spread"] > 5


def test_several_classes_are_measured_by_their_shares():
    rng = np.random.default_rng(1)
    y = np.repeat([0, 1, 2, 3], [40_000, 30_000, 20_000, 10_000])
    iid = _spread(np.split(rng.permutation(y), 500), classes=4)
    assert 0.9 < iid["label_spread"] < 1.1 and iid["inside_iid"] >= 0.97
    ordered = _spread(np.split(y, 500), classes=4)
    assert ordered["label_spread"] > 10 and ordered["inside_iid"] < 0.05


def test_short_batches_and_too_few_batches_are_left_out():
    spread = LabelSpread(4)
    spread.add(np.array([1, 0, 1, 0]))
    spread.add(np.array([1, 0]))  # the epoch's short last batch
    assert spread.summary() is None  # one full batch: no spread to measure
    assert LabelSpread(4).summary() is None


@pytest.fixture(scope="module")
def sorted_data(tmp_path_factory):
    """20,000 rows in 40 files: the first 20 files label 0, the last 20 label 1."""
    root = tmp_path_factory.mktemp("sorted")
    rng = np.random.default_rng(2)
    for f in range(40):
        n = 500
        pd.DataFrame({"level": rng.integers(1, 60, n), "gold": rng.normal(100, 20, n).round(2),
                      "cleared": np.full(n, int(f >= 20))}).to_csv(root / f"part-{f:02d}.csv", index=False)
    return str(root / "*.csv")


def test_the_global_order_mixes_label_sorted_data_like_an_iid_shuffle(sorted_data, client, tmp_path):
    """The issue's figure on small data: with the parse cache the spread is iid-grade (the
    window size does not matter); windows of blocks (no cache) stay far from it."""
    kw = {"label": "cleared", "client": client, "batch_size": 64, "seed": 1}
    for window_rows in (640, 5000):
        with daskfeed.DaskSequence(sorted_data, window_rows=window_rows, cache=tmp_path / "c",
                                   **kw) as seq:
            assert seq.global_order
            for _ in range(2):
                for i in range(len(seq)):
                    seq[i]
                stats = seq.epoch_stats()
                assert stats["label_spread"] < 1.2 and stats["inside_iid"] >= 0.95, stats
                seq.on_epoch_end()
    with daskfeed.DaskSequence(sorted_data, window_rows=640, cache=False, **kw) as seq:
        assert not seq.global_order
        for i in range(len(seq)):
            seq[i]
        stats = seq.epoch_stats()
        assert stats["label_spread"] > 3 and stats["inside_iid"] < 0.5, stats


def test_the_scan_tells_ordered_data_and_windows_of_blocks_warn_of_them(sorted_data, client, tmp_path):
    kw = {"label": "cleared", "client": client, "batch_size": 64, "seed": 1, "window_rows": 640}
    with daskfeed.DaskSequence(sorted_data, cache=tmp_path / "c", **kw) as seq:  # no warning
        assert seq.manifest.looks_ordered and seq.manifest.label_order > 100
        line = seq.stream.order_line()
        assert line.startswith("rows in one global order per epoch: 16 buckets, each a stratified "
                               "sample of all 40 blocks, read in 16 windows of ~1,250 rows"), line
        manifest = seq.manifest
    with pytest.warns(UserWarning, match=r"rows shuffled within 20 windows of ~1,000 rows, not in one "
                                         r"global order \(the parse cache is off\): a batch draws "
                                         r"from the blocks of one window, ~5% of the data\. The "
                                         r"label.s mean varies from block to block .*x more than rows "
                                         r"in random order give: the data look ordered"):
        daskfeed.DaskSequence(sorted_data, cache=False, manifest=manifest, **kw).close()


def test_rows_in_random_order_do_not_look_ordered(tmp_path, client):
    rng = np.random.default_rng(3)
    for f in range(20):
        pd.DataFrame({"level": rng.integers(1, 60, 300), "cleared": rng.integers(0, 2, 300)}).to_csv(
            tmp_path / f"p{f}.csv", index=False)
    with daskfeed.DaskSequence(str(tmp_path / "*.csv"), label="cleared", client=client,
                               batch_size=32, cache=False) as seq:
        assert seq.manifest.label_order < 4 and not seq.manifest.looks_ordered
