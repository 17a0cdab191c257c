"""The figures of a run as the ``/daskfeed`` page and as ``daskfeed_*`` Prometheus series.

Pure functions of a status snapshot (:meth:`daskfeed.dashboard._status.Status.snapshot`), no server.
The page is rendered whole on the scheduler, then refetches its body every 2 s (a few lines
of plain JavaScript), so it shows the figures even where scripts do not run (a screenshot,
a text browser).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from daskfeed.core import duration

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["Figures", "metric_families", "render_body", "render_page"]

Figures = dict[str, Any]
"""A status snapshot: the run's figures as JSON values (what ``/daskfeed/status.json`` serves)."""

REFRESH_MS = 2000
_NONE = "—"

_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
  background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:14px;align-items:center;
  flex-wrap:wrap}
header h1{font-size:18px;margin:0}header a{color:#9cc3ff;margin-right:12px}
.state{padding:2px 10px;border-radius:10px;background:#555;font-weight:600}
.s-training{background:#2e7d32}.s-validating{background:#1565c0}.s-done{background:#6a1b9a}
.s-failed{background:#c62828}.muted{color:#8a93a6}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:12px;padding:12px}
section{background:#fff;border-radius:8px;padding:10px 14px;box-shadow:0 1px 2px #0002}
section{overflow-wrap:anywhere}section.wide{grid-column:1/-1}
h2{font-size:13px;text-transform:uppercase;color:#5a6478;margin:0 0 6px}
.big{font-size:26px;font-weight:600}.bar{background:#e3e7ee;border-radius:4px;height:10px;margin:3px 0 8px}
.bar span{display:block;height:100%;border-radius:4px;background:#3f7fd9}.bar.hot span{background:#d9822b}
table{border-collapse:collapse;width:100%}td,th{padding:2px 8px 2px 0;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}th{color:#5a6478;font-weight:600}
"""

_SCRIPT = f"""
setInterval(async () => {{
  try {{
    const r = await fetch(location.pathname + "?part=body", {{cache: "no-store"}});
    if (r.ok) document.getElementById("daskfeed").innerHTML = await r.text();
  }} catch (e) {{}}
}}, {REFRESH_MS});
"""


def render_page(body: str) -> str:
    """The whole page around ``body`` (from :func:`render_body`).

    Parameters
    ----------
    body
        The page's content, from :func:`render_body`.

    Returns
    -------
    str
        The HTML document, with the script that refetches its body.
    """
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>daskfeed — training</title><style>{_STYLE}</style></head>"
            f"<body><div id=\"daskfeed\">{body}</div><script>{_SCRIPT}</script></body></html>")


def render_body(s: Figures) -> str:
    """The page's content: progress, speed, metrics, memory, scan, data, epochs.

    Parameters
    ----------
    s
        A status snapshot (:meth:`daskfeed.dashboard._status.Status.snapshot`).

    Returns
    -------
    str
        The HTML of the page's content.
    """
    return _header(s) + "<main>" + "".join([
        _progress(s), _speed(s), _metrics(s), _memory(s), _scan(s), _data(s), _history(s),
    ]) + "</main>"


# -- pieces ------------------------------------------------------------------------------
def _header(s: dict[str, Any]) -> str:
    state = str(s.get("state") or "waiting")
    age = s.get("age_seconds")
    when = (f"updated {age:.0f} s ago" if age is not None else "no figures yet: waiting for a run")
    if s.get("elapsed_seconds") is not None:
        when += f" · run time {_duration(s['elapsed_seconds'])}"
    return (f"<header><h1>daskfeed</h1><span class=\"state s-{_e(state)}\">{_e(state)}</span>"
            f"<span class=\"muted\">{_e(when)}</span><nav><a href=\"daskfeed-charts\">charts</a>"
            f"<a href=\"status\">Dask dashboard</a>"
            f"<a href=\"daskfeed/status.json\">status.json</a><a href=\"metrics\">metrics</a></nav>"
            f"</header>")


def _progress(s: dict[str, Any]) -> str:
    rows = []
    for what, done, total in (("Epoch", s.get("epoch"), s.get("epochs")),
                              ("Batch", s.get("batch"), s.get("batches"))):
        rows.append(f"<div>{what} <b>{_int(done)}</b> of {_int(total)}</div>{_bar(_ratio(done, total))}")
    return _section("Progress", "".join(rows))


def _speed(s: dict[str, Any]) -> str:
    wait = s.get("data_wait")
    return _section("Speed", (
        f"<div class=\"big\">{_int(s.get('rows_per_s'))} rows/s</div>"
        f"<div>waiting for data: <b>{_pct(wait)}</b> of training time</div>{_bar(wait, hot=True)}"
        f"<div>rows this epoch: {_int(s.get('rows'))} of {_int(s.get('rows_per_epoch'))} · "
        f"trained in this run: {_int(s.get('rows_trained'))}</div>"))


def _metrics(s: dict[str, Any]) -> str:
    logs = s.get("logs") or {}
    last = (s.get("history") or [{}])[-1]
    names = [k for k in logs if not k.startswith("val_")]
    names += [k for k in _metric_keys(last) if not k.startswith("val_") and k not in names]
    names.sort(key=lambda k: k != "loss")
    if not names:
        return _section("Loss and metrics", f"<div class=\"muted\">{_NONE}</div>")
    head = "<tr><th>metric</th><th>now</th><th>last epoch</th><th>validation</th></tr>"
    body = "".join(f"<tr><td>{_e(n)}</td><td>{_float(logs.get(n))}</td><td>{_float(last.get(n))}</td>"
                   f"<td>{_float(last.get('val_' + n, logs.get('val_' + n)))}</td></tr>" for n in names)
    return _section("Loss and metrics", f"<table>{head}{body}</table>")


def _memory(s: dict[str, Any]) -> str:
    m = s.get("memory") or {}
    rss, budget = m.get("rss_bytes"), m.get("budget_bytes")
    parts = [f"<div>trainer's process tree: <b>{_bytes(rss)}</b> of {_bytes(budget)} budget "
             f"({_pct(_ratio(rss, budget))}) · peak {_bytes(m.get('peak_rss_bytes'))}</div>",
             _bar(_ratio(rss, budget), hot=True)]
    if m.get("workers"):
        wb, wl = m.get("workers_bytes"), m.get("workers_limit_bytes")
        n = m["workers"]
        parts += [f"<div>{n} worker{'s' if n != 1 else ''} (scheduler's view): <b>{_bytes(wb)}</b> of "
                  f"{_bytes(wl)} ({_pct(_ratio(wb, wl))})</div>", _bar(_ratio(wb, wl), hot=True)]
    return _section("Memory", "".join(parts))


def _scan(s: dict[str, Any]) -> str:
    scans = s.get("scans") or {}
    if not scans:
        return _section("Scan", f"<div class=\"muted\">no scan reported {_NONE} manifest reused?</div>")
    head = "<tr><th></th><th>state</th><th>rows</th><th>bytes</th><th>rows/s</th><th>ETA</th></tr>"
    body = "".join(
        f"<tr><td>{_e(name)}</td><td>{_e(sc.get('state') or _NONE)}</td><td>{_int(sc.get('rows'))}</td>"
        f"<td>{_bytes(sc.get('bytes'))}{_of_bytes(sc.get('bytes_total'))}</td>"
        f"<td>{_int(sc.get('rows_per_s'))}</td><td>{_duration(sc.get('eta_seconds'))}</td></tr>"
        for name, sc in scans.items())
    return _section("Scan", f"<table>{head}{body}</table>")


def _data(s: dict[str, Any]) -> str:
    cache = s.get("cache") or {}
    rate = cache.get("hit_rate")
    hits = (f"hit rate <b>{_pct(rate)}</b> ({_int(cache.get('hits'))} of "
            f"{_int((cache.get('hits') or 0) + (cache.get('misses') or 0))} blocks)"
            if rate is not None else "hit rate: not reported yet")
    bad = s.get("bad_rows") or {}
    rows = "".join(f"<tr><td>{_e(name)}</td><td>{_int(v.get('malformed'))}</td>"
                   f"<td>{_int(v.get('label_missing'))}</td></tr>"
                   for name, v in bad.items() if isinstance(v, dict))
    table = ("<table><tr><th>bad rows</th><th>malformed (skipped)</th><th>label missing</th></tr>"
             f"{rows}</table>") if rows else f"<div class=\"muted\">bad rows: {_NONE}</div>"
    return _section("Data", f"<div>{_e(cache.get('status') or 'cache: ' + _NONE)}</div>"
                            f"<div>{hits}</div>{table}")


def _history(s: dict[str, Any]) -> str:
    hist = s.get("history") or []
    if not hist:
        return _section("Epochs", "<div class=\"muted\">no epoch finished yet</div>", wide=True)
    keys = _metric_keys(hist[-1])
    head = "".join(f"<th>{_e(k)}</th>" for k in keys)
    rows = "".join(
        f"<tr><td>{_int(r.get('epoch'))}</td>" + "".join(f"<td>{_float(r.get(k))}</td>" for k in keys)
        + f"<td>{_int(r.get('rows_per_s'))}</td><td>{_pct(r.get('data_wait'))}</td>"
        f"<td>{_times(r.get('label_spread'))}</td>"
        f"<td>{_bytes(r.get('peak_rss_bytes'))}</td><td>{_duration(r.get('seconds'))}</td></tr>"
        for r in hist[-50:])
    table = (f"<table><tr><th>epoch</th>{head}<th>rows/s</th><th>data wait</th>"
             "<th title=\"spread of the batches' label means over an iid shuffle's (1.00x: as "
             "good)\">shuffle vs iid</th><th>peak memory</th>"
             f"<th>time</th></tr>{rows}</table>")
    return _section("Epochs", _chart(hist) + table, wide=True)


def _times(x: Any) -> str:
    """A ratio such as ``1.02x`` (or the mark for none)."""
    return f"{x:.2f}x" if isinstance(x, (int, float)) else _NONE


def _chart(hist: list[dict[str, Any]], width: int = 640, height: int = 120) -> str:
    """Loss (and validation loss) per epoch as an inline SVG."""
    lines: list[str] = []
    series = [(k, c) for k, c in (("loss", "#3f7fd9"), ("val_loss", "#d9822b")) if k in hist[-1]]
    values = [r[k] for r in hist for k, _ in series if isinstance(r.get(k), (int, float))]
    if not values or len(hist) < 2:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    for key, colour in series:
        pts = [(i * (width - 20) / (len(hist) - 1) + 10, height - 10 - (r[key] - lo) / span * (height - 20))
               for i, r in enumerate(hist) if isinstance(r.get(key), (int, float))]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        lines.append(f"<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{path}\"/>"
                     f"<text x=\"{width + 8}\" y=\"{16 + 16 * len(lines)}\" fill=\"{colour}\">{key}</text>")
    return (f"<svg width=\"{width + 90}\" height=\"{height}\" role=\"img\" aria-label=\"loss per epoch\">"
            f"{''.join(lines)}</svg>")


# -- formatting --------------------------------------------------------------------------
_TELEMETRY = {"epoch", "rows", "batches", "seconds", "val_seconds", "rows_per_s", "data_wait",
              "data_wait_seconds", "data_wait_fraction", "windows_computed", "peak_rss_bytes",
              "resumed_at_batch", "learning_rate", "label_spread", "inside_iid"}


def _metric_keys(rec: dict[str, Any]) -> list[str]:
    """Loss and metrics of an epoch record (train ones first, then validation)."""
    keys = [k for k in rec if k not in _TELEMETRY and isinstance(rec[k], (int, float))]
    return sorted(keys, key=lambda k: (k.startswith("val_"), k != "loss" and k != "val_loss", k))


def _section(title: str, inner: str, wide: bool = False) -> str:
    cls = ' class="wide"' if wide else ""
    return f"<section{cls}><h2>{_e(title)}</h2>{inner}</section>"


def _bar(fraction: float | None, hot: bool = False) -> str:
    width = 0.0 if fraction is None else max(0.0, min(1.0, fraction)) * 100
    cls = "bar hot" if hot and width > 85 else "bar"
    return f"<div class=\"{cls}\"><span style=\"width:{width:.1f}%\"></span></div>"


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _e(x: Any) -> str:
    return html.escape(str(x))


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


def _of_bytes(x: Any) -> str:
    return f" of {_bytes(x)}" if isinstance(x, (int, float)) else ""


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
