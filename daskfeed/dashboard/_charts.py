"""Live charts of the run: a Bokeh document on the scheduler's dashboard, ``/daskfeed-charts``.

Served as Dask serves its own pages: a Bokeh server application added to the scheduler's HTTP
application (:func:`add_charts`, when the plugin starts), drawn in the browser by BokehJS and
updated over Bokeh's websocket once a second from the plugin's figures
(:meth:`daskfeed.dashboard._status.Status.chart_data`): new points are streamed, not redrawn.
The page carries the document with the series so far (``templates/charts.html``): drawn at load,
before the websocket has pulled the live document, which then takes its place. Each series has a
source of its own and a point only where a sample has its figure: one unbroken line.

- loss per batch (Keras' running mean of the epoch) and, per epoch, loss and validation loss; the
  loss spikes the trainer flagged, marked at their step's own loss, the ``daskfeed rows`` command
  that lists the step's rows in their tooltip (the command only: no row is on the page);
- rows/s and the share of training time spent waiting for data, over the run's time;
- the trainer's process tree's memory against the budget, over the run's time.

Imported on the scheduler only (Bokeh is there with Dask's dashboard).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bokeh.document import Document
    from distributed import Scheduler
    from jinja2 import Template

logger = logging.getLogger(__name__)

CHARTS_PATH = "daskfeed-charts"  # one level deep, as /status: BokehJS is at the relative static/
UPDATE_MS = 1000  # the charts ask for new points every second
GIB = 2**30
WAIT_FLOOR_PCT = 3  # the data-wait axis starts this far below 0 %
# each series of Status.chart_data in the unit drawn: a source of its own, ``daskfeed-series-<name>``
_SCALES = {"loss": 1.0, "rows_per_s": 1.0, "data_wait": 100.0, "rss_bytes": 1 / GIB, "budget_bytes": 1 / GIB}
_EPOCHS = ("step", "epoch", "loss", "val_loss")
_SPIKES = ("x", "loss", "epoch", "step", "command")  # the marks' source, ``daskfeed-spikes``


def add_charts(scheduler: Scheduler, figures: Any) -> bool:
    """Serve :func:`charts_document` at ``<prefix>/daskfeed-charts`` on the scheduler's dashboard.

    Parameters
    ----------
    scheduler
        The scheduler (on its event loop: called from the plugin's ``start``).
    figures
        What holds the run's :class:`~daskfeed.dashboard._status.Status` (``.status``).

    Returns
    -------
    bool
        Whether the charts are served (False: no dashboard, or Bokeh missing).
    """
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return False
    if getattr(app, "_daskfeed_charts", False):
        return True
    try:
        from distributed.dashboard.core import BokehApplication
        from tornado.ioloop import IOLoop
    except ImportError:  # no Bokeh: the page and /metrics are served without the charts
        return False
    from daskfeed.dashboard._http import http_prefix

    bokeh_app = BokehApplication({"/" + CHARTS_PATH: functools.partial(_served, figures)}, scheduler,
                                 prefix=http_prefix(app))
    app.add_application(bokeh_app)
    bokeh_app.initialize(IOLoop.current())
    bokeh_app.start()
    app._daskfeed_charts = True
    return True


def _served(figures: Any, scheduler: Scheduler, extra: dict[str, Any], doc: Document) -> None:
    """Bokeh's entry for one browser session (``BokehApplication`` passes the scheduler)."""
    charts_document(figures, doc)


def charts_document(figures: Any, doc: Document) -> None:
    """Fill ``doc`` with the run's charts and keep them up to date (every :data:`UPDATE_MS`).

    Parameters
    ----------
    figures
        What holds the run's :class:`~daskfeed.dashboard._status.Status` (``.status``).
    doc
        The Bokeh document of one browser session.
    """
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, LinearAxis, Range1d
    from bokeh.models.widgets import Div
    from bokeh.plotting import figure

    series = {name: ColumnDataSource({"x": [], "y": []}, name=f"daskfeed-series-{name}") for name in _SCALES}
    epochs = ColumnDataSource({k: [] for k in _EPOCHS}, name="daskfeed-epochs")
    common: dict[str, Any] = {"height": 250, "sizing_mode": "stretch_width",
                              "tools": "pan,wheel_zoom,box_zoom,reset,save"}

    loss = figure(title="Loss", x_axis_label="batch (all epochs)", y_axis_label="loss",
                  name="daskfeed-loss", **common)
    loss.line("x", "y", source=series["loss"], legend_label="loss (running mean of the epoch)")
    loss.scatter("step", "loss", source=epochs, size=8, legend_label="loss (epoch)")
    loss.scatter("step", "val_loss", source=epochs, size=8, marker="square", color="orange",
                 legend_label="validation loss (epoch)")
    spikes = ColumnDataSource({k: [] for k in _SPIKES}, name="daskfeed-spikes")
    marked = loss.scatter("x", "loss", source=spikes, size=11, marker="triangle", color="crimson",
                          legend_label="loss spike (the step's own loss)", name="daskfeed-spike-marks")
    loss.add_tools(HoverTool(renderers=[marked], tooltips=[
        ("epoch, step", "@epoch, @step"), ("loss", "@loss{0.0000}"), ("its rows", "@command")]))
    loss.add_layout(loss.legend[0], "right")  # beside the plot: never over the latest points

    speed = figure(title="Rows per second and waiting for data", x_axis_label="seconds since the run started",
                   y_axis_label="rows/s (epoch so far)", name="daskfeed-speed", **common)
    speed.line("x", "y", source=series["rows_per_s"], legend_label="rows/s")
    # from just below 0: a data wait of 0 % (data keeping up, the usual case) is a line above the x
    # axis, not one hidden under it
    speed.extra_y_ranges = {"wait": Range1d(start=-WAIT_FLOOR_PCT, end=100)}
    speed.add_layout(LinearAxis(y_range_name="wait", axis_label="data wait (% of training time)"), "right")
    speed.line("x", "y", source=series["data_wait"], y_range_name="wait", color="firebrick",
               legend_label="data wait %")
    speed.y_range = DataRange1d(start=0)
    speed.add_layout(speed.legend[0], "right")

    memory = figure(title="Memory of the trainer's process tree against the budget",
                    x_axis_label="seconds since the run started", y_axis_label="GiB",
                    name="daskfeed-memory", **common)
    memory.line("x", "y", source=series["rss_bytes"], legend_label="trainer's process tree (RSS)")
    memory.line("x", "y", source=series["budget_bytes"], line_dash="dashed", color="black",
                legend_label="budget")
    memory.y_range = DataRange1d(start=0)
    memory.add_layout(memory.legend[0], "right")

    held: dict[str, Any] = {"version": -1, "seen": 0, "spikes": None}

    def update() -> None:
        version, whole, seen, points, records = figures.status.chart_data(held["version"], held["seen"])
        for name, source in series.items():
            scale = _SCALES[name]
            new = {"x": points[name]["x"], "y": [y * scale for y in points[name]["y"]]}
            if whole:
                source.data = new
            elif new["x"]:
                source.stream(new)
        held["version"], held["seen"] = version, seen
        if len(records) != len(epochs.data["epoch"]) or whole:
            epochs.data = {"step": [r.get("step") for r in records], "epoch": [r["epoch"] for r in records],
                           "loss": [_nan(r.get("loss")) for r in records],
                           "val_loss": [_nan(r.get("val_loss")) for r in records]}
        marks_version, marks = figures.status.spike_marks()
        if marks_version != held["spikes"]:
            held["spikes"] = marks_version
            shown = [m for m in marks if m.get("x") is not None and m.get("loss") is not None]
            spikes.data = {"x": [m["x"] for m in shown], "loss": [m["loss"] for m in shown],
                           "epoch": [m["epoch"] for m in shown], "step": [m["step"] for m in shown],
                           "command": [m.get("command") or "no daskfeed rows command: no global order"
                                       for m in shown]}

    update()
    doc.title = "daskfeed: charts"
    doc.add_root(column(Div(text="<b>daskfeed</b>: the run, live (updated every second)"),
                        loss, speed, memory, sizing_mode="stretch_width"))
    doc.add_periodic_callback(update, UPDATE_MS)
    doc.template = _page_template()
    doc.template_variables.update(first_paint=_FirstPaint(doc), first_paint_id=_FIRST_PAINT_ID)


_FIRST_PAINT_ID = "daskfeed-first-paint"


class _FirstPaint:
    """The document as the page carries it (``templates/charts.html``).

    Serialized when the page is rendered, so with the series as they are then; HTML-escaped as
    Bokeh escapes its own.
    """

    def __init__(self, doc: Document) -> None:
        self.doc = doc

    def __str__(self) -> str:
        from html import escape

        from bokeh.core.json_encoder import serialize_json

        return escape(serialize_json({_FIRST_PAINT_ID: self.doc.to_json(deferred=False)}), quote=False)


@functools.cache
def _page_template() -> Template:
    """``templates/charts.html``: Bokeh's server page, drawn at load from the document it carries.

    Compiled as Bokeh compiles a template given as text: in Bokeh's environment, extending the
    page it would serve (``base``).
    """
    from importlib.resources import files

    from bokeh.core.templates import get_env

    text = files("daskfeed.dashboard").joinpath("templates", "charts.html").read_text(encoding="utf-8")
    return get_env().from_string("{% extends base %}\n" + text)


def _nan(value: Any, scale: float = 1.0) -> float:
    return float("nan") if value is None else float(value) * scale
