"""The live charts: the samples the scheduler keeps, the Bokeh document they fill, and the document
served by a real scheduler's dashboard to a real Bokeh client session."""

from __future__ import annotations

import html
import json
import math
import re
import time

from bokeh.document import Document
from live_probe import get

from daskfeed.dashboard._charts import charts_document
from daskfeed.dashboard._status import CHART_SERIES, SERIES_LIMIT, TOPIC, Status

GIB = 2**30


class Holder:
    """What the charts read: the plugin's ``status``."""

    def __init__(self) -> None:
        self.status = Status()


def _run(status: Status, run: str = "r1", t: float = 0.0) -> None:
    status.apply(TOPIC, {"kind": "run", "run": run, "epochs": 3, "batches": 10,
                         "budget_bytes": 4 * GIB}, now=t)


def _progress(status: Status, epoch: int, batch: int, t: float, loss: float | None = 0.5,
              wait: float | None = 0.25) -> None:
    msg = {"kind": "progress", "state": "training", "epoch": epoch, "epochs": 3, "batch": batch,
           "batches": 10, "rows_per_s": 1000.0 * batch, "rss_bytes": GIB, "budget_bytes": 4 * GIB}
    if loss is not None:
        msg["logs"] = {"loss": loss}
    if wait is not None:
        msg["data_wait"] = wait
    status.apply(TOPIC, msg, now=t)


def _values(doc: Document, name: str, column: str) -> list[float]:
    return list(doc.get_model_by_name(name).data[column])


def test_progress_events_become_samples_on_one_batch_axis_across_epochs():
    status = Status()
    _run(status)
    _progress(status, 1, 4, t=1.0)
    _progress(status, 2, 3, t=2.0, loss=0.4, wait=None)
    status.apply(TOPIC, {"kind": "progress", "state": "validating", "epoch": 2, "batch": 10}, now=3.0)
    status.apply(TOPIC, {"kind": "epoch", "epoch": 1, "loss": 0.45, "val_loss": 0.5}, now=3.5)
    version, whole, seen, series, epochs = status.chart_data(-1, 0)
    assert whole and seen == 2  # validating adds no sample
    assert series["loss"] == {"x": [4, 13], "y": [0.5, 0.4]}
    assert series["rows_per_s"] == {"x": [1.0, 2.0], "y": [4000.0, 3000.0]}
    assert series["data_wait"] == {"x": [1.0], "y": [0.25]}  # the second sample has none: no point
    assert epochs == [{"epoch": 1, "loss": 0.45, "val_loss": 0.5, "step": 10}]
    _progress(status, 2, 5, t=4.0)
    again = status.chart_data(version, seen)
    assert again[:3] == (version, False, 3) and again[3]["loss"] == {"x": [15], "y": [0.5]}


def _epoch_as_sent(status: Status, epoch: int, t: float) -> float:
    """One epoch's events as WatchCallback sends them: its start (no rate, data wait nor loss yet),
    batches (one without data wait: the sequence's figures were already the next epoch's; one with
    a NaN loss), validation, its end and its record. Returns the time after them."""
    base = {"kind": "progress", "epoch": epoch, "epochs": 3, "batches": 10, "budget_bytes": 4 * GIB}
    memory = {"rss_bytes": GIB + epoch * 1000, "peak_rss_bytes": GIB + epoch * 1000}
    events = [
        {**base, **memory, "state": "training", "batch": 0, "rows": 0},
        {**base, **memory, "state": "training", "batch": 3, "rows": 768, "rows_per_s": 900.0,
         "data_wait": 0.1, "logs": {"loss": 0.6 / epoch}},
        {**base, **memory, "state": "training", "batch": 6, "rows": 1536, "rows_per_s": 950.0,
         "logs": {"loss": 0.55 / epoch}},
        {**base, **memory, "state": "training", "batch": 8, "rows": 2048, "rows_per_s": 960.0,
         "data_wait": 0.0, "logs": {"loss": float("nan")}},
        {**base, **memory, "state": "validating", "batch": 10, "rows": 2560, "rows_per_s": 970.0,
         "data_wait": 0.0},
        {**base, **memory, "state": "epoch-end", "batch": 10, "rows": 2560, "rows_per_s": 975.0,
         "data_wait": 0.05, "logs": {"loss": 0.5 / epoch, "val_loss": 0.52 / epoch}},
        {"kind": "epoch", "epoch": epoch, "loss": 0.5 / epoch, "val_loss": 0.52 / epoch},
    ]
    for msg in events:
        status.apply(TOPIC, msg, now=t)
        t += 0.5
    return t


def test_each_series_is_one_unbroken_line_across_epochs_and_updates():
    status = Status()
    _run(status)
    held = {name: {"x": [], "y": []} for name in CHART_SERIES}
    version, seen, t = -1, 0, 1.0
    for epoch in (1, 2, 3):  # the charts ask after each epoch, as the periodic update does
        t = _epoch_as_sent(status, epoch, t)
        version, whole, seen, series, _ = status.chart_data(version, seen)
        assert whole == (epoch == 1)
        for name, points in series.items():
            held[name]["x"] += points["x"]
            held[name]["y"] += points["y"]
    assert held == status.chart_data(-1, 0)[3]  # the updates add up to the whole
    for name, points in held.items():  # finite points in order: nothing that breaks a line
        assert len(points["x"]) == len(points["y"]), name
        assert all(math.isfinite(v) for v in points["x"] + points["y"]), (name, points)
        assert points["x"] == sorted(points["x"]), (name, points)
    # a point for each sample with the figure, across the epochs' starts (which have none of it)
    assert held["loss"]["x"] == [3, 6, 10, 13, 16, 20, 23, 26, 30]
    assert len(held["rows_per_s"]["x"]) == 12 and len(held["data_wait"]["x"]) == 9
    assert len(held["rss_bytes"]["x"]) == len(held["budget_bytes"]["x"]) == 15
    assert held["data_wait"]["y"] == [0.1, 0.0, 0.05] * 3


def test_samples_are_thinned_not_dropped_when_full_and_a_new_run_starts_over():
    status = Status()
    _run(status)
    for i in range(SERIES_LIMIT + 1):
        _progress(status, 1 + i // 10, i % 10 + 1, t=float(i))
    version, whole, seen, series, _ = status.chart_data(0, 0)
    assert whole and seen == len(series["rss_bytes"]["x"]) == SERIES_LIMIT // 4 + SERIES_LIMIT // 2 + 1
    t = series["rows_per_s"]["x"]
    assert t[0] == 0.0 and t[-1] == float(SERIES_LIMIT)  # the whole run
    _run(status, "r2", t=100.0)
    _, whole, seen, series, _ = status.chart_data(version, seen)
    assert whole and seen == 0 and all(s == {"x": [], "y": []} for s in series.values())


def test_the_document_streams_new_points_and_redraws_for_a_new_run():
    holder = Holder()
    _run(holder.status)
    _progress(holder.status, 1, 2, t=1.0, loss=0.7)
    doc = Document()
    charts_document(holder, doc)
    assert _values(doc, "daskfeed-series-loss", "y") == [0.7]
    assert _values(doc, "daskfeed-series-data_wait", "y") == [25.0]
    assert _values(doc, "daskfeed-series-rss_bytes", "y") == [1.0]
    assert _values(doc, "daskfeed-series-budget_bytes", "y") == [4.0]
    assert {r.name for r in doc.roots[0].children[1:]} == {"daskfeed-loss", "daskfeed-speed",
                                                           "daskfeed-memory"}
    (update,) = [cb.callback for cb in doc.session_callbacks]

    _progress(holder.status, 1, 6, t=2.0, loss=0.6, wait=None)
    holder.status.apply(TOPIC, {"kind": "epoch", "epoch": 1, "loss": 0.55, "val_loss": 0.58})
    update()
    assert _values(doc, "daskfeed-series-loss", "x") == [2, 6]
    assert _values(doc, "daskfeed-series-rss_bytes", "x") == [1.0, 2.0]
    assert _values(doc, "daskfeed-series-data_wait", "x") == [1.0]  # no point: no gap, no zero
    assert _values(doc, "daskfeed-epochs", "val_loss") == [0.58]
    assert _values(doc, "daskfeed-epochs", "step") == [10]

    _run(holder.status, "r2", t=10.0)
    _progress(holder.status, 1, 1, t=11.0, loss=0.9)
    update()
    assert _values(doc, "daskfeed-series-loss", "y") == [0.9]
    assert _values(doc, "daskfeed-epochs", "epoch") == []


def test_a_scheduler_serves_the_charts_to_a_bokeh_session(client):
    from bokeh.client import pull_session

    from daskfeed.dashboard._plugin import install, report

    links = install(client)
    assert links is not None and links.charts.endswith("/daskfeed-charts")
    report(client, {"kind": "run", "run": f"served-{time.monotonic_ns()}", "epochs": 2, "batches": 10,
                    "budget_bytes": GIB})
    report(client, {"kind": "progress", "state": "training", "epoch": 1, "batch": 3, "batches": 10,
                    "rows_per_s": 500.0, "logs": {"loss": 0.42}, "rss_bytes": GIB // 2})

    def arrived(dask_scheduler) -> int:
        from daskfeed.dashboard._http import PLUGIN_NAME

        return len(dask_scheduler.plugins[PLUGIN_NAME].status.series)

    deadline = time.monotonic() + 30
    while client.run_on_scheduler(arrived) < 1:  # events travel on the client's batched stream
        assert time.monotonic() < deadline, "the events never reached the scheduler"
        time.sleep(0.05)  # polling interval
    with pull_session(url=links.charts) as session:
        loss = session.document.get_model_by_name("daskfeed-series-loss")
        assert list(loss.data["y"]) == [0.42] and list(loss.data["x"]) == [3]
        assert session.document.title == "daskfeed: charts"

    # the page itself carries the document with its points: drawn at load, before the websocket
    page = get(links.charts)
    found = re.search(r'<script type="application/json" id="daskfeed-first-paint">(.*?)</script>', page, re.S)
    assert found, page
    (doc_json,) = json.loads(html.unescape(found.group(1))).values()
    drawn = Document.from_json(doc_json)
    assert list(drawn.get_model_by_name("daskfeed-series-loss").data["y"]) == [0.42]
    assert list(drawn.get_model_by_name("daskfeed-series-rss_bytes").data["y"]) == [0.5]
