"""The live charts: the samples the scheduler keeps, the Bokeh document they fill, and the document
served by a real scheduler's dashboard to a real Bokeh client session."""

from __future__ import annotations

import math
import time

from bokeh.document import Document

from daskfeed.dashboard._charts import charts_document
from daskfeed.dashboard._status import SERIES_LIMIT, TOPIC, Status

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
    version, whole, samples, epochs = status.chart_data(-1, 0)
    assert whole and [s["step"] for s in samples] == [4, 13]  # validating adds no point
    assert [s["t"] for s in samples] == [1.0, 2.0] and samples[1]["data_wait"] is None
    assert epochs == [{"epoch": 1, "loss": 0.45, "val_loss": 0.5, "step": 10}]
    _progress(status, 2, 5, t=4.0)
    again = status.chart_data(version, 2)
    assert again[0] == version and not again[1] and [s["step"] for s in again[2]] == [15]


def test_samples_are_thinned_not_dropped_when_full_and_a_new_run_starts_over():
    status = Status()
    _run(status)
    for i in range(SERIES_LIMIT + 1):
        _progress(status, 1 + i // 10, i % 10 + 1, t=float(i))
    version, whole, samples, _ = status.chart_data(0, 0)
    assert whole and len(samples) == SERIES_LIMIT // 4 + SERIES_LIMIT // 2 + 1
    assert samples[0]["t"] == 0.0 and samples[-1]["t"] == float(SERIES_LIMIT)  # the whole run
    _run(status, "r2", t=100.0)
    assert status.chart_data(version, len(samples))[1:3] == (True, [])


def test_the_document_streams_new_points_and_redraws_for_a_new_run():
    holder = Holder()
    _run(holder.status)
    _progress(holder.status, 1, 2, t=1.0, loss=0.7)
    doc = Document()
    charts_document(holder, doc)
    assert _values(doc, "daskfeed-series", "loss") == [0.7]
    assert _values(doc, "daskfeed-series", "data_wait_pct") == [25.0]
    assert _values(doc, "daskfeed-series", "rss_gib") == [1.0]
    assert _values(doc, "daskfeed-series", "budget_gib") == [4.0]
    assert {r.name for r in doc.roots[0].children[1:]} == {"daskfeed-loss", "daskfeed-speed",
                                                           "daskfeed-memory"}
    (update,) = [cb.callback for cb in doc.session_callbacks]

    _progress(holder.status, 1, 6, t=2.0, loss=0.6, wait=None)
    holder.status.apply(TOPIC, {"kind": "epoch", "epoch": 1, "loss": 0.55, "val_loss": 0.58})
    update()
    assert _values(doc, "daskfeed-series", "step") == [2, 6]
    assert math.isnan(_values(doc, "daskfeed-series", "data_wait_pct")[1])  # a gap, not a zero
    assert _values(doc, "daskfeed-epochs", "val_loss") == [0.58]
    assert _values(doc, "daskfeed-epochs", "step") == [10]

    _run(holder.status, "r2", t=10.0)
    _progress(holder.status, 1, 1, t=11.0, loss=0.9)
    update()
    assert _values(doc, "daskfeed-series", "loss") == [0.9]
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
        series = session.document.get_model_by_name("daskfeed-series")
        assert list(series.data["loss"]) == [0.42] and list(series.data["step"]) == [3]
        assert session.document.title == "daskfeed: charts"
