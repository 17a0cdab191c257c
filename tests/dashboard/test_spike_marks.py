"""Loss spikes on the dashboard: kept by the scheduler (bounded), listed on the page with their
``daskfeed rows`` command, marked on the loss chart with the command in the tooltip, in
status.json; checked on the pure status and on a real scheduler's dashboard."""

from __future__ import annotations

import json
import time

from bokeh.document import Document
from bokeh.models import HoverTool
from helpers import wait_for
from live_probe import get

from daskfeed.dashboard._charts import charts_document
from daskfeed.dashboard._render import render_body
from daskfeed.dashboard._status import SPIKES_LIMIT, TOPIC, Status


def _mark(epoch: int, step: int, batch: int, loss: float = 15.0) -> dict:
    return {"epoch": epoch, "step": step, "batch": batch, "loss": loss, "median": 0.01,
            "threshold": 0.05, "steps": 1, "command": f"daskfeed rows run --epoch {epoch} --step {step}"}


def _status(run: str = "r1") -> Status:
    status = Status()
    status.apply(TOPIC, {"kind": "run", "run": run, "epochs": 2, "batches": 10}, now=0.0)
    return status


def test_spikes_come_with_progress_events_and_are_kept_as_marks_on_the_batch_axis():
    status = _status()
    status.apply(TOPIC, {"kind": "progress", "state": "training", "epoch": 2, "batch": 4, "batches": 10,
                         "logs": {"loss": 0.5}, "spikes": [_mark(1, 7, 3), _mark(2, 2, 4)]}, now=1.0)
    status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(2, 2, 4, loss=16.0), "junk", {"epoch": 1}]},
                 now=2.0)
    snap = status.snapshot(now=3.0)
    assert "spikes" not in status.progress  # the marks are not a progress figure
    assert [(m["epoch"], m["step"], m["loss"]) for m in snap["spikes"]] == [(1, 7, 15.0), (2, 2, 16.0)]
    assert snap["spikes"][1]["command"] == "daskfeed rows run --epoch 2 --step 2"
    assert snap["spikes_seen"] == 3  # the same step again (a resume's) replaces its mark
    version, marks = status.spike_marks()
    assert [m["x"] for m in marks] == [3, 14]  # (epoch - 1) * batches + the trainer's batch
    assert status.spike_marks()[0] == version
    status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(2, 9, 9)]}, now=4.0)
    assert status.spike_marks()[0] != version


def test_epochs_of_different_counts_put_the_marks_and_the_loss_on_one_axis():
    """Batches skipped in epoch 1 (7 left of 10): epoch 2's batch 4 is step 11, for the loss
    series and for a mark alike."""
    status = _status()
    for epoch, batch, batches in ((1, 7, 7), (2, 4, 10)):
        status.apply(TOPIC, {"kind": "progress", "state": "training", "epoch": epoch, "batch": batch,
                             "batches": batches, "logs": {"loss": 0.5}}, now=float(epoch))
    status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(1, 7, 7), _mark(2, 5, 4)]}, now=3.0)
    status.apply(TOPIC, {"kind": "epoch", "epoch": 1, "loss": 0.4, "val_loss": 0.5}, now=4.0)
    assert [p["step"] for p in status.series] == [7, 11]
    assert [m["x"] for m in status.spike_marks()[1]] == [7, 11]
    assert [r["step"] for r in status.chart_data(-1, 0)[4]] == [7]  # epoch 1 ends at its 7th batch


def test_the_marks_are_bounded_and_a_new_run_starts_without_them():
    status = _status()
    for i in range(SPIKES_LIMIT + 50):
        status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(1, i + 1, 1)]}, now=1.0)
    snap = status.snapshot(now=2.0)
    assert len(snap["spikes"]) == SPIKES_LIMIT and snap["spikes"][0]["step"] == 51
    assert snap["spikes_seen"] == SPIKES_LIMIT + 50
    assert len(json.dumps(snap["spikes"])) < 100_000
    status.apply(TOPIC, {"kind": "run", "run": "r2", "epochs": 1, "batches": 5}, now=3.0)
    assert status.snapshot(now=4.0)["spikes"] == [] and status.spike_marks()[1] == []


def test_the_page_lists_each_spike_with_its_command_and_says_when_it_shows_the_latest():
    status = _status()
    status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(1, 7, 3), {**_mark(1, 8, 4), "command": None}]})
    body = render_body(status.snapshot())
    assert "Loss spikes" in body and "<code>daskfeed rows run --epoch 1 --step 7</code>" in body
    assert "no command: the run has no global order" in body
    quiet = render_body(_status().snapshot())
    assert "Loss spikes" not in quiet  # no section before a spike
    for i in range(SPIKES_LIMIT + 1):
        status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(2, i + 1, 1)]})
    assert f"the latest {SPIKES_LIMIT} of 203" in render_body(status.snapshot())


class Holder:
    def __init__(self, status: Status) -> None:
        self.status = status


def test_the_loss_chart_marks_each_spike_with_its_command_in_the_tooltip():
    holder = Holder(_status())
    holder.status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(1, 7, 3)]})
    doc = Document()
    charts_document(holder, doc)
    source = doc.get_model_by_name("daskfeed-spikes")
    assert list(source.data["x"]) == [3] and list(source.data["loss"]) == [15.0]
    assert list(source.data["command"]) == ["daskfeed rows run --epoch 1 --step 7"]
    [hover] = [t for t in doc.get_model_by_name("daskfeed-loss").tools if isinstance(t, HoverTool)]
    assert ("its rows", "@command") in hover.tooltips
    assert hover.renderers == [doc.get_model_by_name("daskfeed-spike-marks")]
    holder.status.apply(TOPIC, {"kind": "spikes", "spikes": [_mark(2, 1, 1)]})
    [update] = [cb.callback for cb in doc.session_callbacks]
    update()
    assert list(source.data["x"]) == [3, 11]


def test_a_scheduler_serves_the_spikes_in_status_json_the_page_and_the_charts(client):
    from bokeh.client import pull_session

    from daskfeed.dashboard._plugin import install, report

    links = install(client)
    assert links is not None
    run = f"spiky-{time.monotonic_ns()}"
    report(client, {"kind": "run", "run": run, "epochs": 2, "batches": 10})
    report(client, {"kind": "progress", "state": "training", "epoch": 1, "batch": 5, "batches": 10,
                    "logs": {"loss": 0.4}, "spikes": [_mark(1, 4, 4)]})

    def arrived(dask_scheduler) -> int:
        from daskfeed.dashboard._http import PLUGIN_NAME

        return len(dask_scheduler.plugins[PLUGIN_NAME].status.spikes)

    # events travel on the client's batched stream
    wait_for(lambda: client.run_on_scheduler(arrived) >= 1, 30, "the spike reaching the scheduler")
    status = json.loads(get(links.status))
    assert status["run"] == run and status["spikes"][0]["command"] == "daskfeed rows run --epoch 1 --step 4"
    assert "<code>daskfeed rows run --epoch 1 --step 4</code>" in get(links.page)
    with pull_session(url=links.charts) as session:
        source = session.document.get_model_by_name("daskfeed-spikes")
        assert list(source.data["command"]) == ["daskfeed rows run --epoch 1 --step 4"]
        assert list(source.data["x"]) == [4]
