"""The run on the Dask dashboard: a scheduler plugin serving ``/daskfeed`` and ``daskfeed_*`` series.

How figures travel: the trainer sends events on the ``daskfeed`` topic
(``client.log_event``, see :func:`report`); the scan tasks already send theirs on
``daskfeed-scan-<token>`` from the workers (:func:`daskfeed.scanner.report`). Every event
reaches the scheduler, where :class:`WatchPlugin` (registered by :func:`install`) sees it
through the ``log_event`` hook of scheduler plugins and keeps the latest figures. This works
the same with a ``LocalCluster`` and with a separate ``dask scheduler`` process, whose
environment needs daskfeed installed (the plugin is pickled by reference).

On the scheduler's HTTP server (the dashboard port) the plugin adds (see
:mod:`daskfeed.dashboard_http`):

- ``/daskfeed``: a page that refreshes itself every 2 s (no JavaScript library);
- ``/daskfeed/status.json``: the same figures for programs;
- ``daskfeed_*`` series on the scheduler's own ``/metrics`` (a collector registered on the
  process's default ``prometheus_client`` registry, as distributed registers its own).

This module imports distributed and tornado: the trainer imports it only when it watches a
run (``import daskfeed`` stays light), the scheduler when it unpickles the plugin.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskfeed.dashboard_http import COLLECTOR, PLUGIN_NAME, add_routes, http_prefix
from daskfeed.render import Figures

if TYPE_CHECKING:
    from distributed import Client, Scheduler

__all__ = ["TOPIC", "EpochSpans", "Links", "Status", "WatchPlugin", "install", "report",
           "report_cache", "scan_span"]

logger = logging.getLogger(__name__)

TOPIC = "daskfeed"  # trainer -> scheduler: run, progress, epoch and scan events
SCAN_TOPIC_PREFIX = "daskfeed-scan-"  # scan tasks -> scheduler (daskfeed.scanner.report)
CACHE_TOPIC = "daskfeed-cache"  # window tasks -> scheduler (report_cache)
HISTORY_LIMIT = 10_000  # epoch records kept on the scheduler

Event = dict[str, Any]  # one msgpack-able event: a ``kind`` and its figures (JSON values)


# -- what the scheduler keeps ----------------------------------------------------------
class Status:
    """The latest figures of a run, updated by events; pure (no scheduler, no I/O).

    ``apply(topic, msg)`` takes one event; ``snapshot()`` gives the figures as a JSON-ready
    dict (what ``/daskfeed/status.json`` serves).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.run: Event = {}
        self.progress: Event = {}
        self.history: list[Event] = []
        self.scans: dict[str, Event] = {}
        self._scanning = "scan"  # the data set whose scan started last (scan_span's name)
        self.cache = {"hits": 0, "misses": 0}
        self.updated = 0.0

    def __getstate__(self) -> dict[str, Any]:  # pickled with the plugin
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def apply(self, topic: str, msg: object, now: float | None = None) -> bool:
        """Take one event; False when it is not daskfeed's.

        Parameters
        ----------
        topic
            The event's topic: :data:`TOPIC`, :data:`CACHE_TOPIC` or a scan topic.
        msg
            The event as logged (anything: only dicts are daskfeed's).
        now
            The time it arrived (default: now).

        Returns
        -------
        bool
            True when the event updated the figures.
        """
        if not isinstance(msg, dict):
            return False
        now = time.time() if now is None else now
        with self._lock:
            if topic == TOPIC:
                self._apply_trainer(msg, now)
            elif topic.startswith(SCAN_TOPIC_PREFIX):
                self._apply_scan_task(msg, now)
            elif topic == CACHE_TOPIC:
                self.cache["hits"] += int(msg.get("hits", 0))
                self.cache["misses"] += int(msg.get("misses", 0))
            else:
                return False
            self.updated = now
        return True

    def _apply_trainer(self, msg: dict[str, Any], now: float) -> None:
        kind = msg.get("kind")
        body = {k: v for k, v in msg.items() if k != "kind"}
        if kind == "run":
            started = self.run.get("started", now)
            if body.get("run") != self.run.get("run"):  # a new run (not the next fit of this one)
                self.progress, self.history, started = {}, [], now
                self.cache = {"hits": 0, "misses": 0}
            self.run = {**body, "started": started}
            self._settle_scans(body.get("data") or {})
        elif kind == "progress":
            self.progress.update(body)
        elif kind == "epoch":
            self.history = [r for r in self.history if r.get("epoch") != body.get("epoch")]
            self.history.append(body)
            del self.history[:-HISTORY_LIMIT]
        elif kind == "scan":
            self._apply_scan(body, now)

    def _apply_scan(self, body: dict[str, Any], now: float) -> None:
        name = str(body.get("name") or "scan")
        if body.get("state") == "running":
            self._scanning = name
            self.scans[name] = {"state": "running", "rows": 0, "bytes": 0, "started": now,
                                "bytes_total": body.get("bytes_total")}
        else:
            scan = self.scans.setdefault(name, {"rows": 0, "bytes": 0, "started": now})
            scan.update(state=body.get("state", "done"), seconds=body.get("seconds"))

    def _settle_scans(self, data: dict[str, Any]) -> None:
        """A finished scan's figures become its manifest's; a scan no task reported on was a reuse.

        The scan tasks send an event at most every 0.5 s each: live progress, a lower bound.
        """
        for name, scan in self.scans.items():
            if scan.get("state") != "done":
                continue
            if not scan.get("events"):
                scan["state"] = "reused"
            elif isinstance(data.get(name), dict):
                scan["rows"] = max(scan["rows"], int(data[name].get("rows") or 0))
                scan["bytes"] = max(scan["bytes"], int(data[name].get("bytes") or 0))

    def _apply_scan_task(self, msg: dict[str, Any], now: float) -> None:
        """A scan task's progress (its events arrive before the scan's end is reported)."""
        scan = self.scans.setdefault(self._scanning, {"state": "running", "rows": 0, "bytes": 0,
                                                      "started": now})
        scan["rows"] += int(msg.get("rows", 0))
        scan["bytes"] += int(msg.get("bytes", 0))
        scan["events"] = scan.get("events", 0) + 1
        scan["last"] = now

    def snapshot(self, workers: dict[str, int | None] | None = None, now: float | None = None) -> Figures:
        """The figures, with rates, ratios and ages worked out; finite numbers or None only.

        Parameters
        ----------
        workers
            The workers' memory as the scheduler sees it (``workers``, ``workers_bytes``,
            ``workers_limit_bytes``), merged into the ``memory`` figures.
        now
            The time the ages and rates are worked out at (default: now).

        Returns
        -------
        Figures
            The JSON-ready figures ``/daskfeed/status.json`` serves.
        """
        now = time.time() if now is None else now
        with self._lock:
            p = dict(self.progress)
            out: Figures = {
                "state": p.get("state", "waiting" if not self.run else "starting"),
                "run": self.run.get("run"),
                "updated": self.updated or None,
                "age_seconds": round(now - self.updated, 1) if self.updated else None,
                "elapsed_seconds": round(now - self.run["started"], 1) if self.run else None,
                "epoch": p.get("epoch"), "epochs": p.get("epochs", self.run.get("epochs")),
                "batch": p.get("batch"), "batches": p.get("batches", self.run.get("batches")),
                "rows": p.get("rows"), "rows_trained": p.get("rows_trained"),
                "rows_per_epoch": self.run.get("rows_per_epoch"),
                "rows_per_s": p.get("rows_per_s"), "data_wait": p.get("data_wait"),
                "logs": dict(p.get("logs") or {}),
                "memory": self._memory(p, workers or {}),
                "scans": {k: _scan_figures(v, now) for k, v in self.scans.items()},
                "cache": self._cache(),
                "bad_rows": self.run.get("bad_rows", {}),
                "history": [dict(r) for r in self.history],
            }
        return _finite(out)

    def _memory(self, p: Event, workers: dict[str, int | None]) -> Figures:
        budget = p.get("budget_bytes", self.run.get("budget_bytes"))
        rss = p.get("rss_bytes")
        return {"rss_bytes": rss, "peak_rss_bytes": p.get("peak_rss_bytes"), "budget_bytes": budget,
                "budget_fraction": rss / budget if rss and budget else None, **workers}

    def _cache(self) -> Figures:
        hits, misses = self.cache["hits"], self.cache["misses"]
        return {"status": self.run.get("cache"), "hits": hits, "misses": misses,
                "hit_rate": hits / (hits + misses) if hits + misses else None}


def _scan_figures(scan: Event, now: float) -> Figures:
    """Rows, bytes, rate and (with the total bytes known) an ETA of one scan."""
    end = now if scan.get("state") == "running" else scan.get("last", now)
    seconds = scan.get("seconds") or max(end - scan["started"], 1e-9)
    out = {"state": scan.get("state"), "rows": scan["rows"], "bytes": scan["bytes"],
           "seconds": round(seconds, 2), "rows_per_s": scan["rows"] / seconds,
           "bytes_per_s": scan["bytes"] / seconds, "bytes_total": scan.get("bytes_total"),
           "eta_seconds": None}
    total = scan.get("bytes_total")
    if scan.get("state") == "running" and total and scan["bytes"]:
        out["eta_seconds"] = max(total - scan["bytes"], 0) / out["bytes_per_s"]
    return out


def _finite(x: Any) -> Any:
    """``x`` with NaN and infinities as None (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


# -- the plugin ------------------------------------------------------------------------
class WatchPlugin(SchedulerPlugin):
    """Keeps daskfeed's figures on the scheduler and serves them (``/daskfeed``, ``/metrics``).

    Register it with ``client.register_plugin(WatchPlugin())`` (what :func:`install` does);
    idempotent: registering it again keeps the running one and its figures.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.status = Status()
        self.scheduler: Scheduler | None = None

    async def start(self, scheduler: Scheduler) -> None:
        """Add the routes to the scheduler's HTTP server and the collector to /metrics.

        Parameters
        ----------
        scheduler
            The scheduler the plugin is registered on.
        """
        self.scheduler = scheduler
        add_routes(scheduler)
        COLLECTOR.use(self)

    async def close(self) -> None:
        """Stop answering /metrics for this scheduler."""
        COLLECTOR.release(self)

    def log_event(self, topic: str, msg: object) -> None:
        """Every event logged on the scheduler passes here; daskfeed's update the figures.

        Parameters
        ----------
        topic
            The event's topic; those starting with :data:`TOPIC` are daskfeed's.
        msg
            The event as logged (anything another program logs too).
        """
        if isinstance(topic, str) and topic.startswith(TOPIC):
            self.status.apply(topic, msg)

    def snapshot(self) -> Figures:
        """The figures, with the workers' memory as the scheduler sees it.

        Returns
        -------
        Figures
            What :meth:`Status.snapshot` gives, with the workers' memory.
        """
        return self.status.snapshot(_workers_memory(self.scheduler))


def _workers_memory(scheduler: Scheduler | None) -> dict[str, int | None]:
    workers = list(getattr(scheduler, "workers", {}).values())
    if not workers:
        return {"workers": 0}
    return {"workers": len(workers),
            "workers_bytes": sum(int(ws.memory.process) for ws in workers),
            "workers_limit_bytes": sum(int(ws.memory_limit or 0) for ws in workers) or None}


# -- the trainer's side -----------------------------------------------------------------
@dataclass(frozen=True)
class Links:
    """Where to watch: Dask's dashboard, daskfeed's page, its JSON, the Prometheus series."""

    dashboard: str
    page: str
    status: str
    metrics: str


def links(client: Client, prefix: str = "/") -> Links | None:
    """The URLs of ``client``'s dashboard (None: the scheduler serves none).

    Parameters
    ----------
    client
        The client whose ``dashboard_link`` the URLs start from.
    prefix
        The scheduler's ``--dashboard-prefix``, where the client's link lacks it.

    Returns
    -------
    Links or None
        Where to watch; None when the scheduler serves no dashboard.
    """
    from urllib.parse import urlsplit, urlunsplit

    link = getattr(client, "dashboard_link", None)
    if not link:
        return None
    parts = urlsplit(link)
    path = parts.path[: -len("status")] if parts.path.endswith("/status") else parts.path.rstrip("/") + "/"
    if not path.endswith(prefix):
        path = path.rstrip("/") + prefix
    root = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return Links(dashboard=root + "status" if parts.path.endswith("/status") else link,
                 page=root + "daskfeed", status=root + "daskfeed/status.json",
                 metrics=root + "metrics")


def served_prefix(dask_scheduler: Scheduler) -> str:
    """On the scheduler (``client.run_on_scheduler``): the prefix of its HTTP routes.

    Parameters
    ----------
    dask_scheduler
        The scheduler (``run_on_scheduler`` passes it by this name).

    Returns
    -------
    str
        The prefix, ``"/"`` where the scheduler serves no HTTP application.
    """
    app = getattr(dask_scheduler, "http_application", None)
    return http_prefix(app) if app is not None else "/"


def install(client: Client | None) -> Links | None:
    """Register :class:`WatchPlugin` on ``client``'s scheduler; return where to watch.

    Idempotent. Where the scheduler cannot take the plugin (daskfeed missing from its
    environment), warn once and return None: training goes on without the page.

    Parameters
    ----------
    client
        The run's client (None: nothing to install).

    Returns
    -------
    Links or None
        Where to watch; None without a client, a dashboard or the plugin.
    """
    if client is None:
        return None
    try:
        client.register_plugin(WatchPlugin())
        prefix = client.run_on_scheduler(served_prefix)
    except Exception as err:
        warnings.warn(
            f"daskfeed: the dashboard page is off: the scheduler refused daskfeed's plugin "
            f"({type(err).__name__}: {err}). Hint: install daskfeed where `dask scheduler` runs.",
            stacklevel=2)
        return None
    return links(client, prefix)


_warned: set[int] = set()


def report(client: Client | None, msg: Event) -> bool:
    """Send one event (a msgpack-able dict with a ``kind``) to the scheduler's daskfeed figures.

    Never raises: watching must not stop training. A failure is warned about once per client.

    Parameters
    ----------
    client
        The run's client (None, closing or closed: nothing is sent).
    msg
        The event.

    Returns
    -------
    bool
        True when the event was sent.
    """
    if client is None or getattr(client, "status", "running") in ("closing", "closed"):
        return False
    try:
        client.log_event(TOPIC, msg)
        return True
    except Exception as err:
        if id(client) not in _warned:
            _warned.add(id(client))
            warnings.warn(f"daskfeed: could not send figures to the dashboard ({type(err).__name__}: "
                          f"{err}); training goes on.", stacklevel=2)
        return False


def report_cache(hits: int = 0, misses: int = 0) -> None:
    """On a worker: count blocks read from the parse cache (hits) or parsed again (misses).

    One event per call (call it once per window task); the page shows the hit rate. A no-op
    outside a Dask worker.

    Parameters
    ----------
    hits
        Blocks read from the cache.
    misses
        Blocks parsed again.
    """
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return
    worker.log_event(CACHE_TOPIC, {"hits": int(hits), "misses": int(misses)})


def _current_client(client: Client | None) -> Client | None:
    if client is not None:
        return client
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


@contextmanager
def scan_span(client: Client | None = None, *, name: str = "train",
              nbytes: int | None = None) -> Iterator[str]:
    """Scan inside this block: its tasks form the span ``daskfeed/scan <name>``; progress shown.

    Parameters
    ----------
    client
        The client the scan runs on (default: the current one); its scheduler's page shows
        the scan's rows, bytes and rate (and an ETA when ``nbytes``, the data's size, is given).
    name
        Which data set (``"train"``, ``"validation"``).
    nbytes
        The data's size in bytes, for the ETA (None: no ETA).

    Yields
    ------
    str
        The span's id (``scheduler.extensions["spans"].spans[id]``).
    """
    from distributed import span

    client = _current_client(client)
    report(client, {"kind": "scan", "name": name, "state": "running", "bytes_total": nbytes})
    t0, state = time.perf_counter(), "failed"
    try:
        with span("daskfeed", f"scan {name}") as span_id:
            yield span_id
        state = "done"
    finally:
        report(client, {"kind": "scan", "name": name, "state": state,
                        "seconds": round(time.perf_counter() - t0, 3)})


class EpochSpans:
    """One ``distributed.span`` per epoch, ``daskfeed/epoch N``, enterable from any thread.

    ``distributed.span`` tags the tasks submitted inside it, in the thread (context) that
    entered it; entering it again makes a new span. This keeps one span per epoch (under one
    ``daskfeed`` span for the run) and re-enters it wherever the epoch's tasks are submitted::

        spans = EpochSpans()
        with spans(epoch):          # any thread: the prefetch thread of a DaskSequence too
            client.submit(...)      # -> span daskfeed/epoch <epoch + 1>
    """

    def __init__(self, name: str = "daskfeed") -> None:
        import dask
        from distributed import span

        with span(name):
            self._root = dict(dask.get_annotations()["span"])
        self._epochs: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.run = str(uuid.uuid4())

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def annotation(self, epoch: int) -> dict[str, Any]:
        """The ``span`` annotation of ``epoch``'s tasks (the same ids every time).

        Parameters
        ----------
        epoch
            The epoch (0-based).

        Returns
        -------
        dict
            The ``span`` annotation (``name`` and ``ids``) as ``dask.annotate`` takes it.
        """
        import dask
        from distributed import span

        with self._lock:
            ann = self._epochs.get(epoch)
            if ann is None:
                with dask.annotate(span=self._root), span(f"epoch {epoch + 1}"):
                    ann = self._epochs[epoch] = dict(dask.get_annotations()["span"])
        return ann

    def id(self, epoch: int) -> str:
        """The span id of ``epoch`` on the scheduler.

        Parameters
        ----------
        epoch
            The epoch (0-based).

        Returns
        -------
        str
            The span's id.
        """
        return str(self.annotation(epoch)["ids"][-1])

    @contextmanager
    def __call__(self, epoch: int) -> Iterator[str]:
        """Tasks submitted inside belong to ``epoch``'s span."""
        import dask

        ann = self.annotation(epoch)
        with dask.annotate(span=ann):
            yield str(ann["ids"][-1])
