"""The /daskfeed page and daskfeed_* series as pure functions of a snapshot (daskfeed.dashboard._render).

Snapshots come from :class:`daskfeed.dashboard._status.Status`, fed the events a run sends, so
the figures rendered are the ones status.json serves.
"""

from __future__ import annotations

import re

import pytest

from daskfeed.dashboard._render import REFRESH_MS, metric_families, render_body, render_page
from daskfeed.dashboard._status import Status

GiB = 2**30


def running_snapshot() -> dict:
    st = Status()
    st.apply("daskfeed", {"kind": "scan", "name": "train<b>", "state": "running", "bytes_total": 4000},
             now=0.0)
    st.apply("daskfeed-scan-1", {"task": 0, "block": 0, "rows": 1500, "bytes": 1000}, now=1.0)
    st.apply("daskfeed", {"kind": "run", "run": "r", "epochs": 40, "batches": 5000, "budget_bytes": 4 * GiB,
                          "cache": "cache: 12 blocks on the workers", "rows_per_epoch": 1_280_000,
                          "bad_rows": {"train": {"malformed": 3, "label_missing": 7}}}, now=2.0)
    st.apply("daskfeed", {"kind": "progress", "state": "training", "epoch": 2, "batch": 1234,
                          "rows": 315_904, "rows_trained": 1_595_904, "rows_per_s": 12_345.6,
                          "data_wait": 0.125, "rss_bytes": int(3.6 * GiB), "peak_rss_bytes": 3 * GiB,
                          "logs": {"loss": 0.25, "accuracy": 0.875, "<i>": 1.0}}, now=3.0)
    st.apply("daskfeed-cache", {"hits": 3, "misses": 1}, now=3.0)
    st.apply("daskfeed", {"kind": "epoch", "epoch": 1, "loss": 0.5, "val_loss": 0.625, "accuracy": 0.75,
                          "val_accuracy": 0.7, "rows_per_s": 11_000, "data_wait": 0.2,
                          "label_spread": 1.0234, "peak_rss_bytes": GiB, "seconds": 3725}, now=3.5)
    st.apply("daskfeed", {"kind": "epoch", "epoch": 2, "loss": 0.4, "val_loss": 0.5, "accuracy": 0.8,
                          "val_accuracy": 0.78, "seconds": 59.6}, now=4.0)
    return st.snapshot(now=4.0, workers={"workers": 1, "workers_bytes": GiB, "workers_limit_bytes": 2 * GiB})


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def test_the_page_wraps_the_body_and_refetches_it():
    page = render_page("<p>figures</p>")
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>")
    assert '<div id="daskfeed"><p>figures</p></div>' in page
    assert f"}}, {REFRESH_MS});" in page and '"?part=body"' in page


def test_a_page_before_any_run_says_what_it_waits_for():
    body = render_body(Status().snapshot(now=10.0))
    text = text_of(body)
    assert "waiting" in text and "no figures yet: waiting for a run" in text
    assert "Epoch — of —" in text and "Batch — of —" in text
    assert "no scan reported — manifest reused?" in text
    assert "hit rate: not reported yet" in text and "bad rows: —" in text
    assert "no epoch finished yet" in text and "<svg" not in body
    assert set(re.findall(r"width:([\d.]+)%", body)) == {"0.0"}  # every bar empty


def test_a_running_fit_shows_progress_speed_memory_scan_data_and_epochs():
    body = render_body(running_snapshot())
    text = text_of(body)
    assert "training" in text and "updated 0 s ago · run time 2s" in text
    assert "Epoch 2 of 40" in text and "Batch 1,234 of 5,000" in text
    assert 'style="width:5.0%"' in body and 'style="width:24.7%"' in body  # 2/40, 1234/5000
    assert "12,346 rows/s" in text and "waiting for data: 12.5% of training time" in text
    assert "rows this epoch: 315,904 of 1,280,000 · trained in this run: 1,595,904" in text
    assert "trainer's process tree: 3.60 GiB of 4.00 GiB budget (90.0%) · peak 3.00 GiB" in text
    assert '<div class="bar hot"><span style="width:90.0%">' in body  # over 85 %: hot
    assert "1 worker (scheduler's view): 1.00 GiB of 2.00 GiB (50.0%)" in text
    assert "hit rate 75.0% (3 of 4 blocks)" in text and "cache: 12 blocks on the workers" in text
    assert "<td>train</td><td>3</td><td>7</td>" in body
    assert "loss 0.25 0.4 0.5 accuracy 0.875 0.8 0.78" in text  # now, last epoch, validation
    # epochs: loss first, then the other metrics, validation after; times as h/m/s
    assert ("epoch loss accuracy val_loss val_accuracy rows/s data wait shuffle vs iid peak memory "
            "time") in text
    assert "1 0.5 0.75 0.625 0.7 11,000 20.0% 1.02x 1.00 GiB 1h 02m" in text
    assert "2 0.4 0.8 0.5 0.78 — — — — 1m 00s" in text
    assert body.count("<polyline") == 2 and ">loss</text>" in body and ">val_loss</text>" in body


def test_names_from_the_run_are_escaped():
    body = render_body(running_snapshot())
    assert "<td>train&lt;b&gt;</td>" in body and "<td>&lt;i&gt;</td>" in body
    assert "<i>" not in body


def test_a_scan_row_shows_bytes_of_the_total_and_its_eta():
    text = text_of(render_body(running_snapshot()))
    # 1000 of 4000 bytes in 4 s: 250 B/s, 3000 bytes left: 12 s
    assert "train&lt;b&gt; running 1,500 0.98 kiB of 3.91 kiB 375 12s" in text


def test_one_epoch_draws_no_chart():
    st = Status()
    st.apply("daskfeed", {"kind": "run", "run": "r", "epochs": 3, "batches": 10}, now=0.0)
    st.apply("daskfeed", {"kind": "epoch", "epoch": 1, "loss": 0.5}, now=1.0)
    body = render_body(st.snapshot(now=1.0))
    assert "<svg" not in body and "<td>1</td><td>0.5</td>" in body


def families(snapshot: dict) -> dict[str, list[tuple[tuple, float]]]:
    """Family name -> sorted ((label, value) pairs, sample value)."""
    return {f.name: sorted((tuple(sorted(x.labels.items())), x.value) for x in f.samples)
            for f in metric_families(snapshot)}


def test_series_of_a_running_fit():
    fam = families(running_snapshot())
    gauge = {name: samples[0][1] for name, samples in fam.items() if len(samples) == 1 and not samples[0][0]}
    assert len(gauge) == 15  # every gauge of _GAUGES, rows trained, cache hits and misses
    assert gauge["daskfeed_process_tree_peak_memory_bytes"] == 3 * GiB
    assert gauge["daskfeed_last_report_timestamp_seconds"] == 4.0
    assert gauge["daskfeed_epoch"] == 2 and gauge["daskfeed_epochs"] == 40
    assert gauge["daskfeed_batch"] == 1234 and gauge["daskfeed_batches"] == 5000
    assert gauge["daskfeed_rows_per_second"] == pytest.approx(12_345.6)
    assert gauge["daskfeed_data_wait_ratio"] == 0.125
    assert gauge["daskfeed_process_tree_memory_bytes"] == int(3.6 * GiB)
    assert gauge["daskfeed_memory_budget_bytes"] == 4 * GiB
    assert gauge["daskfeed_workers_memory_bytes"] == GiB
    assert gauge["daskfeed_cache_hit_ratio"] == 0.75
    assert gauge["daskfeed_rows_trained"] == 1_595_904
    assert gauge["daskfeed_cache_hits"] == 3 and gauge["daskfeed_cache_misses"] == 1
    assert fam["daskfeed_metric"] == [((("name", "<i>"),), 1.0), ((("name", "accuracy"),), 0.875),
                                      ((("name", "loss"),), 0.25)]
    assert fam["daskfeed_scan_rows"] == [((("data", "train<b>"),), 1500.0)]
    assert fam["daskfeed_scan_bytes"] == [((("data", "train<b>"),), 1000.0)]
    assert fam["daskfeed_bad_rows"] == [((("data", "train"), ("kind", "label_missing")), 7.0),
                                        ((("data", "train"), ("kind", "malformed")), 3.0)]


def test_figures_not_known_yet_are_no_series():
    fam = families(Status().snapshot(now=0.0))
    assert "daskfeed_epoch" not in fam and "daskfeed_rows_trained" not in fam
    assert "daskfeed_process_tree_memory_bytes" not in fam
    assert fam["daskfeed_metric"] == [] and fam["daskfeed_scan_rows"] == [] and fam["daskfeed_bad_rows"] == []
    assert fam["daskfeed_cache_hits"] == [((), 0.0)]
