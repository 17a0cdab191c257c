"""The figures of a run as the ``/daskfeed`` page and as ``daskfeed_*`` Prometheus series.

Pure functions of a status snapshot (:meth:`daskfeed.dashboard._status.Status.snapshot`), no server.
The page is Jinja2 templates (``templates/``: ``page.html`` around ``body.html``, every value
escaped), rendered whole on the scheduler; it refetches its body every 2 s (a few lines of plain
JavaScript), so it shows the figures even where scripts do not run (a screenshot, a text browser).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from daskfeed.core import duration

if TYPE_CHECKING:
    import jinja2
    from prometheus_client.metrics_core import Metric

Figures = dict[str, Any]
"""A status snapshot: the run's figures as JSON values (what ``/daskfeed/status.json`` serves)."""

REFRESH_MS = 2000
_NONE = "—"


def render_page(body: str) -> str:
    """The whole page around ``body`` (from :func:`render_body`).

    Parameters
    ----------
    body
        The page's content, from :func:`render_body`.

    Returns
    -------
    str
        The HTML document (``templates/page.html``), with the script that refetches its body.
    """
    from markupsafe import Markup

    return _templates().get_template("page.html").render(body=Markup(body), refresh_ms=REFRESH_MS)


def render_body(s: Figures) -> str:
    """The page's content: progress, speed, metrics, memory, scan, data, epochs.

    Parameters
    ----------
    s
        A status snapshot (:meth:`daskfeed.dashboard._status.Status.snapshot`).

    Returns
    -------
    str
        The HTML of the page's content (``templates/body.html``; every value escaped).
    """
    hist = s.get("history") or []
    return _templates().get_template("body.html").render(
        s=s, metrics=_metric_names(s), epoch_keys=_metric_keys(hist[-1]) if hist else [],
        chart=_chart(hist))


@functools.cache
def _templates() -> jinja2.Environment:
    """The page's Jinja2 templates (as distributed renders its own pages), with the filters."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("daskfeed.dashboard", "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(whole=_int, number=_float, pct=_pct, bytes=_bytes, duration=_duration,
                       times=_times)
    env.globals.update(ratio=_ratio, bar_width=_bar_width)
    env.tests["mapping"] = lambda x: isinstance(x, dict)
    return env


def _metric_names(s: Figures) -> list[str]:
    """Loss first, then the metrics the trainer reports now or reported at the last epoch."""
    logs = s.get("logs") or {}
    last = (s.get("history") or [{}])[-1]
    names = [k for k in logs if not k.startswith("val_")]
    names += [k for k in _metric_keys(last) if not k.startswith("val_") and k not in names]
    return sorted(names, key=lambda k: k != "loss")


def _chart(hist: list[dict[str, Any]], width: int = 640, height: int = 120) -> dict[str, Any] | None:
    """Loss (and validation loss) per epoch as polyline points for the page's inline SVG."""
    series = [(k, c) for k, c in (("loss", "#3f7fd9"), ("val_loss", "#d9822b")) if hist and k in hist[-1]]
    values = [r[k] for r in hist for k, _ in series if isinstance(r.get(k), (int, float))]
    if not values or len(hist) < 2:
        return None
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    lines = []
    for key, colour in series:
        pts = [(i * (width - 20) / (len(hist) - 1) + 10, height - 10 - (r[key] - lo) / span * (height - 20))
               for i, r in enumerate(hist) if isinstance(r.get(key), (int, float))]
        lines.append({"key": key, "colour": colour, "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)})
    return {"width": width, "height": height, "lines": lines}


# -- formatting (the templates' filters: "—" for a figure not known yet) ---------------------
_TELEMETRY = {"epoch", "rows", "batches", "seconds", "val_seconds", "rows_per_s", "data_wait",
              "data_wait_seconds", "data_wait_fraction", "windows_computed", "peak_rss_bytes",
              "resumed_at_batch", "learning_rate", "label_spread", "inside_iid"}


def _metric_keys(rec: dict[str, Any]) -> list[str]:
    """Loss and metrics of an epoch record (train ones first, then validation)."""
    keys = [k for k in rec if k not in _TELEMETRY and isinstance(rec[k], (int, float))]
    return sorted(keys, key=lambda k: (k.startswith("val_"), k != "loss" and k != "val_loss", k))


def _bar_width(fraction: float | None) -> float:
    """A bar's filled width in percent."""
    return 0.0 if fraction is None else max(0.0, min(1.0, fraction)) * 100


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _times(x: Any) -> str:
    """A ratio such as ``1.02x``."""
    return f"{x:.2f}x" if isinstance(x, (int, float)) else _NONE


def _int(x: Any) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else _NONE


def _float(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else _NONE


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else _NONE


def _bytes(x: Any) -> str:
    if not isinstance(x, (int, float)):
        return _NONE
    from dask.utils import format_bytes

    return format_bytes(int(x))


def _duration(x: Any) -> str:
    return duration(x) if isinstance(x, (int, float)) else _NONE


# -- Prometheus --------------------------------------------------------------------------
_GAUGES = [  # (series, help, figure in the snapshot)
    ("epoch", "Epoch being trained (1-based)", ("epoch",)),
    ("epochs", "Epochs of the run", ("epochs",)),
    ("batch", "Batches of the current epoch trained", ("batch",)),
    ("batches", "Batches per epoch", ("batches",)),
    ("rows_per_second", "Rows trained per second (current epoch)", ("rows_per_s",)),
    ("data_wait_ratio", "Share of training time spent waiting for data", ("data_wait",)),
    ("process_tree_memory_bytes", "RSS of the trainer and its child processes",
     ("memory", "rss_bytes")),
    ("process_tree_peak_memory_bytes", "Peak RSS of the trainer's process tree this epoch",
     ("memory", "peak_rss_bytes")),
    ("memory_budget_bytes", "Memory budget (--memory-limit)", ("memory", "budget_bytes")),
    ("workers_memory_bytes", "Process memory of the workers (scheduler's view)",
     ("memory", "workers_bytes")),
    ("cache_hit_ratio", "Share of blocks read from the parse cache", ("cache", "hit_rate")),
    ("last_report_timestamp_seconds", "When the trainer last reported (Unix time)", ("updated",)),
]


def metric_families(s: Figures) -> Iterator[Metric]:
    """``daskfeed_*`` Prometheus metric families of a :meth:`Status.snapshot`.

    Parameters
    ----------
    s
        A status snapshot (:meth:`daskfeed.dashboard._status.Status.snapshot`).

    Yields
    ------
    prometheus_client.metrics_core.Metric
        One gauge or counter family at a time.
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for name, doc, path in _GAUGES:
        value: Any = s
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            yield GaugeMetricFamily(f"daskfeed_{name}", doc, value=float(value))
    metrics = GaugeMetricFamily("daskfeed_metric", "Latest loss and metrics (Keras logs)", labels=["name"])
    for key, value in (s.get("logs") or {}).items():
        if isinstance(value, (int, float)):
            metrics.add_metric([str(key)], float(value))
    yield metrics
    for name, key, doc in (("rows_trained", "rows_trained", "Rows trained in this run"),):
        if isinstance(s.get(key), (int, float)):
            yield CounterMetricFamily(f"daskfeed_{name}", doc, value=float(s[key]))
    scan_rows = CounterMetricFamily("daskfeed_scan_rows", "Rows parsed by the scan", labels=["data"])
    scan_bytes = CounterMetricFamily("daskfeed_scan_bytes", "Bytes parsed by the scan", labels=["data"])
    for data, sc in (s.get("scans") or {}).items():
        scan_rows.add_metric([data], float(sc.get("rows") or 0))
        scan_bytes.add_metric([data], float(sc.get("bytes") or 0))
    yield from (scan_rows, scan_bytes)
    cache = s.get("cache") or {}
    yield CounterMetricFamily("daskfeed_cache_hits", "Blocks read from the parse cache",
                              value=float(cache.get("hits") or 0))
    yield CounterMetricFamily("daskfeed_cache_misses", "Blocks parsed again (not cached)",
                              value=float(cache.get("misses") or 0))
    bad = GaugeMetricFamily("daskfeed_bad_rows", "Rows left out of training", labels=["data", "kind"])
    for data, counts in (s.get("bad_rows") or {}).items():
        for kind, n in (counts.items() if isinstance(counts, dict) else ()):
            if isinstance(n, (int, float)):
                bad.add_metric([data, kind], float(n))
    yield bad
