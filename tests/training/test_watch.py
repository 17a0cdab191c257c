"""Watching a run: the daskfeed page, status.json and daskfeed_* series answer while fit runs.

Real clusters (a LocalCluster and separate ``dask scheduler`` / ``dask worker`` processes),
real HTTP against the dashboard port, a real ``model.fit`` on the demo data.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from live_probe import POLL, check_probe, fit_watched, get, live

from daskfeed.adapters._sequence import DaskSequence

BIN = Path(sys.executable).parent
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
# the task prefixes of a scan's span
# the fit ends when the probe has read what it came for (stop_when_done), never by running out of
# epochs first (on a busy machine 40 epochs could end before the page was read)
EPOCHS = 1000
# its scan tasks (each part's record is merged on the trainer), then the buckets of the global
# order dealt from the parse cache (once per data set: a check, two steps, the marker)
SCAN_PREFIXES = ["daskfeed-buckets-check", "daskfeed-buckets-deal", "daskfeed-buckets-gather",
                 "daskfeed-buckets-seal", "daskfeed-scan"]


# -- helpers -----------------------------------------------------------------------------
def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus samples by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def spans_on_scheduler(client: Any, by: str = "name") -> dict[str, list[str]]:
    """Span name (the latest of that name) or id -> task prefixes of its groups, as the
    scheduler's spans extension holds them."""
    def read(dask_scheduler):
        ext = dask_scheduler.extensions["spans"]
        return {("/".join(s.name) if by == "name" else s.id): sorted({tg.prefix.name for tg in s.groups})
                for s in ext.spans.values()}

    return client.run_on_scheduler(read)


# -- tests -------------------------------------------------------------------------------
def test_status_from_events_rates_eta_hit_rate_and_runs():
    from daskfeed.dashboard._status import Status

    st = Status()
    assert st.snapshot(now=10.0)["state"] == "waiting"
    st.apply("daskfeed", {"kind": "scan", "name": "train", "state": "running", "bytes_total": 1000}, now=0.0)
    st.apply("daskfeed-scan-abc", {"task": 0, "block": 0, "rows": 30, "bytes": 250, "worker": "w"}, now=1.0)
    st.apply("daskfeed-scan-abc", {"task": 4, "block": 5, "rows": 30, "bytes": 250}, now=2.0)
    scan = st.snapshot(now=2.0)["scans"]["train"]
    assert (scan["rows"], scan["bytes"], scan["state"]) == (60, 500, "running")
    assert scan["bytes_per_s"] == pytest.approx(250.0) and scan["eta_seconds"] == pytest.approx(2.0)
    st.apply("daskfeed", {"kind": "scan", "name": "train", "state": "done", "seconds": 2.5}, now=2.5)
    assert st.snapshot(now=9.0)["scans"]["train"]["rows_per_s"] == pytest.approx(24.0)
    assert not st.apply("other-topic", {"rows": 1}) and not st.apply("daskfeed", "not a dict")

    run = {"kind": "run", "run": "a", "epochs": 3, "batches": 10, "budget_bytes": 100}
    st.apply("daskfeed", run, now=3.0)
    st.apply("daskfeed", {"kind": "progress", "state": "training", "epoch": 1, "batch": 4,
                          "logs": {"loss": float("nan"), "acc": 0.5}, "rss_bytes": 25}, now=4.0)
    st.apply("daskfeed-cache", {"hits": 3, "misses": 1, "worker": "w"}, now=4.0)
    st.apply("daskfeed", {"kind": "epoch", "epoch": 1, "loss": 0.7}, now=5.0)
    st.apply("daskfeed", {"kind": "epoch", "epoch": 1, "loss": 0.6}, now=5.5)  # an epoch fitted again
    snap = st.snapshot(now=6.0)
    assert snap["logs"] == {"loss": None, "acc": 0.5}  # NaN is not JSON
    json.dumps(snap, allow_nan=False)
    assert snap["memory"]["budget_fraction"] == 0.25 and snap["cache"]["hit_rate"] == 0.75
    assert [r["loss"] for r in snap["history"]] == [0.6] and snap["age_seconds"] == 0.5
    st.apply("daskfeed", {"kind": "run", "run": "a", "epochs": 3}, now=7.0)  # the same run's next fit
    assert st.snapshot()["history"] and st.snapshot()["batch"] == 4
    st.apply("daskfeed", {"kind": "run", "run": "b", "epochs": 2}, now=8.0)  # a new run
    snap = st.snapshot(now=8.0)
    assert snap["history"] == [] and snap["batch"] is None and snap["cache"]["hits"] == 0
    assert snap["scans"]["train"]["rows"] == 60  # the scan came before the run: kept


def test_page_status_and_metrics_live_during_fit_on_a_local_cluster(client, demo_data, tmp_path):
    import dask.config

    # a cache of its own: the scan runs here (another test's scan of the same demo files in this
    # process would be reused from the session's cache, and the page would say "reused"); the
    # workers read the windows, as on a cluster of other machines (on this machine's cluster the
    # trainer reads them itself, and no window task shows in the spans)
    with dask.config.set({"daskfeed.window-reads": "workers"}):
        probe, watch, history, manifest = fit_watched(client, demo_data, seen=live(2, history=1),
                                                      epochs=EPOCHS, spans=True,
                                                      cache=str(tmp_path / "cache"))
    assert manifest.rows == demo_data.train_rows
    s = check_probe(probe)
    # status.json: live figures of epoch 2 while it trains
    assert s["epochs"] == EPOCHS and s["batches"] == math.ceil(demo_data.train_rows / 256)
    assert 0 < s["batch"] <= s["batches"] and s["rows_per_s"] > 0 and 0 <= s["data_wait"] <= 1
    assert 0 < s["rows"] <= demo_data.train_rows and s["rows_trained"] > demo_data.train_rows
    assert s["memory"]["budget_bytes"] == 4_000_000_000 and s["memory"]["rss_bytes"] > 100e6
    assert s["memory"]["workers"] == 2 and s["memory"]["workers_bytes"] > 0
    first = s["history"][0]
    assert first["epoch"] == 1 and first["rows"] == demo_data.train_rows and first["rows_per_s"] > 0
    assert 0 < first["loss"] < 5 and 0 < first["val_loss"] < 5 and 0 <= first["val_accuracy"] <= 1
    assert s["bad_rows"]["train"] == {"malformed": 0, "label_missing": 0}
    scan = s["scans"]["train"]  # its tasks' events, settled to the manifest's figures when it is done
    assert (scan["state"], scan["rows"], scan["bytes"]) == ("done", manifest.rows, manifest.nbytes)
    assert s["scans"]["validation"]["rows"] == demo_data.validate_rows
    assert s["cache"]["status"].startswith("cache:")
    # the page shows the same run
    m = re.search(rf"Epoch <b>(\d+)</b> of {EPOCHS:,}", probe.page)
    assert m and int(m.group(1)) >= 2, probe.page[:2000]
    assert re.search(r"Batch <b>[\d,]+</b> of " + f"{s['batches']:,}", probe.page)
    assert "rows/s" in probe.page and "val_loss" in probe.page and "setInterval" in probe.page
    # /metrics: the same figures as daskfeed_* series, next to distributed's own
    m = series(probe.metrics)
    assert m[("daskfeed_epoch", ())] >= 2 and m[("daskfeed_batch", ())] > 0
    assert m[("daskfeed_batches", ())] == s["batches"] and m[("daskfeed_rows_per_second", ())] > 0
    assert 0 < m[("daskfeed_metric", (("name", "loss"),))] < 5
    assert m[("daskfeed_memory_budget_bytes", ())] == 4e9
    assert m[("daskfeed_process_tree_memory_bytes", ())] > 100e6
    assert m[("daskfeed_rows_trained_total", ())] > demo_data.train_rows
    assert m[("daskfeed_scan_rows_total", (("data", "train"),))] == demo_data.train_rows
    assert m[("daskfeed_bad_rows", (("data", "train"), ("kind", "malformed")))] == 0
    assert any(name.startswith("dask_scheduler_") for name, _ in m)
    # fit stopped because the probe had its figures, not because it ran out of epochs
    assert 2 <= len(history.epoch) < EPOCHS and watch.reports > 10
    # the first windows (submitted when the sequences were made) in the span of epoch 1, not in
    # the scan's; epoch 2's in epoch 2's (each window is its own task group)
    spans = spans_on_scheduler(client)
    assert "daskfeed-window" in spans.get("daskfeed/epoch 1", []), spans
    assert "daskfeed-window" in spans.get("daskfeed/epoch 2", []), spans
    # the scan's tasks and the buckets' build in the scan's span (only the check where an earlier
    # test of this session built the same data set's buckets in the shared cache)
    scan_span = spans["daskfeed/scan train"]
    assert scan_span in (SCAN_PREFIXES, ["daskfeed-buckets-check", "daskfeed-scan"]), spans
    assert watch.spans is watch.sequence.spans is watch.validation.spans
    # after fit: the page says it ended, status.json keeps the run
    done = json.loads(get(watch.links.status))
    assert done["state"] == "stopped" and len(done["history"]) == len(history.epoch)
    # the fit's own History as history.png: loss and accuracy, training and validation
    from PIL import Image

    from daskfeed.training._summary import history_plot

    with Image.open(history_plot(history, tmp_path / "history.png")) as img:
        assert len(img.convert("RGB").getcolors(1 << 24)) > 50


def test_a_resumed_epoch_is_shown_with_the_run_s_numbers(client, demo_data):
    from daskfeed.training._model import default_model
    from daskfeed.training._watch import WatchCallback

    with DaskSequence(demo_data.train_glob, label="cleared", batch_size=256, client=client) as seq:
        seq.set_epoch(1, start=100)  # what --resume does: epoch 2 of 3 from batch 101
        watch = WatchCallback(client, seq, epochs=3, every_seconds=0.0)
        model = default_model(seq.manifest, features=seq.features)
        model.fit(seq, initial_epoch=1, epochs=2, shuffle=False, verbose=0, callbacks=[watch])
    s = json.loads(get(watch.links.status))
    batches = math.ceil(demo_data.train_rows / 256)
    assert (s["state"], s["epoch"], s["epochs"], s["batch"], s["batches"]) == ("done", 2, 3, batches, batches)
    [rec] = s["history"]
    assert rec["epoch"] == 2 and rec["rows"] == demo_data.train_rows - 100 * 256 == s["rows_trained"]


def test_cache_hits_reported_from_the_workers(demo_data, tmp_path):
    from distributed import Client, LocalCluster

    from daskfeed.dashboard._plugin import install, report_cache

    # a cluster of its own: windows of other tests' sequences would report too
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        links = install(client)
        report_cache(5, 5)  # not on a worker: nothing
        with DaskSequence(demo_data.train_glob, label="cleared", batch_size=4096, client=client,
                          cache=tmp_path / "c", shuffle=False) as seq:
            for i in range(len(seq)):  # every window of the epoch: read from the scan's cache
                seq[i]
            parts = len(seq.source.blocks)
        deadline = time.monotonic() + 30
        while (cache := json.loads(get(links.status))["cache"])["hits"] < parts:
            assert time.monotonic() < deadline, f"cache counts never reached the page: {cache}"
            time.sleep(POLL)  # polling interval: the event travels on the worker's batched stream
    assert (cache["hits"], cache["misses"]) == (parts, 0)
    assert cache["hit_rate"] == 1.0


def test_cache_hits_reported_by_a_trainer_reading_its_windows_itself(demo_data, tmp_path):
    from distributed import Client, LocalCluster

    from daskfeed.dashboard._plugin import install

    # a cluster of this machine: the trainer reads the global order's bucket files itself and
    # sends the counts through its client (a cluster of its own: other tests' windows report too)
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        links = install(client)
        with DaskSequence(demo_data.train_glob, label="cleared", batch_size=4096, client=client,
                          cache=tmp_path / "c") as seq:
            assert seq.stream.global_order
            for i in range(len(seq)):  # every window of the epoch: each bucket read once
                seq[i]
            assert seq.stream._windows.here is not None  # (decided once the buckets were built)
            buckets = seq.stream.units
        deadline = time.monotonic() + 30
        while (cache := json.loads(get(links.status))["cache"])["hits"] < buckets:
            assert time.monotonic() < deadline, f"cache counts never reached the page: {cache}"
            time.sleep(POLL)  # polling interval: the event travels on the client's batched stream
    # every bucket once, and the next epoch's first windows, read ahead while this one ends
    assert cache["misses"] == 0 and buckets <= cache["hits"] < 2 * buckets, cache


def test_page_and_metrics_with_a_separate_dask_scheduler(demo_data, tmp_path, stop_process_groups):
    from distributed import Client

    sf = str(tmp_path / "scheduler.json")
    dask = str(BIN / "dask")
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--dashboard-address", "127.0.0.1:0", "--scheduler-file", sf],
                              env=ENV, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        procs.append(subprocess.Popen(
            [dask, "worker", "--scheduler-file", sf, "--host", "127.0.0.1", "--nworkers", "1",
             "--nthreads", "1", "--memory-limit", "1.5GiB", "--dashboard-address", "127.0.0.1:0"],
            env=ENV, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(scheduler_file=sf, timeout=60) as c:
            c.wait_for_workers(1, timeout=60)
            probe, _, history, manifest = fit_watched(c, demo_data, seen=live(1), epochs=20, cache=False)
            s = check_probe(probe)
            assert s["epoch"] >= 1 and s["batch"] > 0 and s["rows_per_s"] > 0 and s["logs"]["loss"] > 0
            assert s["memory"]["workers"] == 1 and s["memory"]["workers_limit_bytes"] == 1.5 * 2**30
            # the scan tasks' own events reached the separate scheduler (else: "reused")
            scan = s["scans"]["train"]
            assert (scan["state"], scan["rows"]) == ("done", manifest.rows) and scan["bytes"] > 0
            assert "Epoch <b>" in probe.page and "daskfeed" in probe.page
            m = series(probe.metrics)
            assert m[("daskfeed_batch", ())] > 0 and m[("daskfeed_rows_per_second", ())] > 0
            assert m[("daskfeed_metric", (("name", "loss"),))] > 0
            assert "daskfeed/scan train" in spans_on_scheduler(c)
            assert len(history.epoch) < 20
    finally:
        stop_process_groups(procs)


def test_a_scan_is_its_own_span_while_other_tasks_wait_on_the_scheduler(client, id_data):
    """The scheduler files tasks into spans by task group: a scan submitted while tasks of the
    groups it would share (another scan's, any ``getitem``) are on the scheduler, e.g. the
    training scan's last ones released while the validation scan starts, joined their span."""
    import operator

    from distributed import span, wait

    from daskfeed.dashboard._plugin import scan_span
    from daskfeed.scanning._scan import scan

    with span("elsewhere"):  # held on the scheduler in another span while the scan runs
        held = [client.submit(operator.getitem, [1], 0, pure=False),
                client.submit(int, 1, key=f"daskfeed-scan-0-{'5e' * 16}"),
                client.submit(operator.getitem, [2], 0, key=("daskfeed-scan-stats-" + "7a" * 16, 0))]
        wait(held)
    for name in ("train", "validation"):
        with scan_span(client, name=name) as span_id:
            manifest = scan(id_data.train_glob, label="cleared", client=client)
        assert manifest.rows == id_data.train_rows
        by_id = spans_on_scheduler(client, by="id")
        assert by_id[span_id] == ["daskfeed-scan"], (name, spans_on_scheduler(client))
    assert all(f.result() in (1, 2) for f in held)


def test_epoch_spans_are_one_per_epoch_from_any_thread(client):
    from daskfeed.dashboard._plugin import EpochSpans

    spans = EpochSpans()
    assert spans.id(0) == spans.id(0) != spans.id(1)

    def submit(epoch: int, i: int) -> None:
        with spans(epoch):
            # a span holds task groups; ('name', i) keys group by name (not "daskfeed-probe")
            client.submit(lambda x: x, i, key=f"('daskfeed-probe-{epoch}', {i})").result()

    threads = [threading.Thread(target=submit, args=(e, i)) for e in (0, 1) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    ids = (spans.id(0), spans.id(1))

    def read(dask_scheduler):
        ext = dask_scheduler.extensions["spans"]
        return [(ext.spans[i].name, sorted(tg.name for tg in ext.spans[i].groups)) for i in ids]

    (name0, groups0), (name1, groups1) = client.run_on_scheduler(read)
    assert name0 == ("daskfeed", "epoch 1") and name1 == ("daskfeed", "epoch 2")
    assert (groups0, groups1) == (["daskfeed-probe-0"], ["daskfeed-probe-1"])


def test_history_plot_and_closing_summary(tmp_path):
    from PIL import Image

    from daskfeed.training._summary import history_plot, summary_lines

    hist = [{"epoch": e, "loss": 0.7 - 0.1 * e, "accuracy": 0.6 + 0.05 * e, "val_loss": 0.72 - 0.08 * e,
             "val_accuracy": 0.58 + 0.05 * e, "rows": 40_000, "seconds": 8.0, "rows_per_s": 5000.0,
             "data_wait_seconds": 2.0, "data_wait_fraction": 0.25, "peak_rss_bytes": 900_000_000}
            for e in range(3)]
    path = history_plot(hist, tmp_path / "history.png")
    with Image.open(path) as img:
        assert img.size[0] >= 800 and len(img.convert("RGB").getcolors(1 << 24)) > 50
    keras_like = {"loss": [0.5, 0.4], "val_loss": [0.6, 0.5]}  # a Keras History's dict
    with Image.open(history_plot(keras_like, tmp_path / "k.png")) as img:
        assert len(img.convert("RGB").getcolors(1 << 24)) > 10

    lines = summary_lines(hist, seconds=30.0, budget_bytes=2_000_000_000, peak_rss_bytes=1_500_000_000,
                          bad_rows={"policy": "skip", "train": 3, "validation": 0})
    text = "\n".join(lines)
    assert "3 epochs, 120,000 rows trained in 30.0s wall time" in text
    assert "(4,000 rows/s overall, 5,000 rows/s while training)" in text
    assert "final: loss 0.5000, accuracy 0.7000, val_loss 0.5600, val_accuracy 0.6800" in text
    assert "data wait: 25.0% of training time" in text
    assert "peak memory of the process tree: 1.40 GiB of the 1.86 GiB budget (75%)" in text
    assert "bad rows skipped: train 3, validation 0 (bad_lines=skip)" in text
    # early stopping restored epoch 2's weights: its figures are the final ones, named
    from daskfeed.training._fit import saved_record

    stopping = {"restored_best_weights": True, "best_epoch": 1}
    restored = saved_record(hist, stopping)
    assert restored is hist[1] and saved_record(hist, None) is hist[-1]
    assert saved_record(hist, {**stopping, "restored_best_weights": False}) is hist[-1]
    text = "\n".join(summary_lines(hist, seconds=30.0, restored=restored))
    assert ("final (epoch 2, the best, restored by early stopping: the weights model.keras holds): "
            "loss 0.6000, accuracy 0.6500, val_loss 0.6400, val_accuracy 0.6300") in text
    assert "last epoch (3), not kept: loss 0.5000, accuracy 0.7000" in text
    assert "final: " not in text
    assert "final: loss 0.5000" in "\n".join(summary_lines(hist, seconds=30.0, restored=hist[-1]))


def test_report_is_quiet_once_the_client_is_closed(client):
    from distributed import Client

    from daskfeed.dashboard._plugin import report

    with Client(client.scheduler.address) as other:
        assert report(other, {"kind": "ping"})
    assert other.status == "closed" and not report(other, {"kind": "progress"})
    assert not report(None, {"kind": "progress"})


def test_page_under_a_dashboard_prefix_and_metrics_of_the_scheduler_still_running(client):
    from distributed import Client, LocalCluster

    from daskfeed.dashboard._plugin import install, report

    session = install(client)
    with LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address="127.0.0.1:0",
                      scheduler_kwargs={"host": "127.0.0.1", "http_prefix": "/feed"}) as cluster, \
            Client(cluster) as c:
        links = install(c)
        assert links.page.endswith("/feed/daskfeed") and links.dashboard.endswith("/feed/status")
        report(c, {"kind": "progress", "state": "training", "epoch": 1, "batch": 7})
        assert json.loads(get(links.status))["batch"] == 7
        assert "Batch <b>7</b>" in get(links.page) and "Batch <b>7</b>" in get(links.page + "?part=body")
        assert "daskfeed_batch 7.0" in get(links.metrics)
        with pytest.raises(urllib.error.HTTPError):
            get(links.page.replace("/feed/", "/"))
    # one collector per process: once this scheduler closed, the other one's series are back
    assert "daskfeed_cache_hits_total" in get(session.metrics)
