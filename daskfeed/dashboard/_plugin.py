"""The run on the Dask dashboard: a scheduler plugin serving ``/daskfeed`` and ``daskfeed_*`` series.

How figures travel: the trainer sends events on the ``daskfeed`` topic
(``client.log_event``, see :func:`report`); the scan tasks already send theirs on
``daskfeed-scan-<token>`` from the workers (:func:`daskfeed.scanning._task.report`). Every event
reaches the scheduler, where :class:`DashboardPlugin` (registered by :func:`install`) sees it
through the ``log_event`` hook of scheduler plugins and keeps the latest figures. This works
the same with a ``LocalCluster`` and with a separate ``dask scheduler`` process, whose
environment needs daskfeed installed (the plugin is pickled by reference).

On the scheduler's HTTP server (the dashboard port) the plugin adds (see
:mod:`daskfeed.dashboard._http`):

- ``/daskfeed``: a page that refreshes itself every 2 s (no JavaScript library);
- ``/daskfeed-charts``: live Bokeh charts of loss, rows/s, data wait and memory
  (:mod:`daskfeed.dashboard._charts`);
- ``/daskfeed/status.json``: the same figures for programs;
- ``daskfeed_*`` series on the scheduler's own ``/metrics`` (a collector registered on the
  process's default ``prometheus_client`` registry, as distributed registers its own).

This module imports distributed and tornado: the trainer imports it only when it watches a
run (``import daskfeed`` stays light), the scheduler when it unpickles the plugin.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskfeed.dashboard._charts import CHARTS_PATH, add_charts
from daskfeed.dashboard._http import COLLECTOR, PLUGIN_NAME, add_routes, http_prefix
from daskfeed.dashboard._render import Figures
from daskfeed.dashboard._status import CACHE_TOPIC, TOPIC, Event, Status

if TYPE_CHECKING:
    from distributed import Client, Scheduler

logger = logging.getLogger(__name__)


# -- the plugin ------------------------------------------------------------------------
class DashboardPlugin(SchedulerPlugin):
    """Keeps daskfeed's figures on the scheduler and serves them (``/daskfeed``, ``/metrics``).

    Register it with ``client.register_plugin(DashboardPlugin())`` (what :func:`install` does);
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
        try:
            add_charts(scheduler, self)
        except Exception:  # the page and /metrics are served without them
            logger.warning("daskfeed: the charts page is off", exc_info=True)

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
    """Where to watch: Dask's dashboard, daskfeed's page, its charts, its JSON, the Prometheus series."""

    dashboard: str
    page: str
    status: str
    metrics: str
    charts: str = ""


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
                 metrics=root + "metrics", charts=root + CHARTS_PATH)


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
    """Register the ``/daskfeed`` page's plugin on ``client``'s scheduler; return where to watch.

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
        client.register_plugin(DashboardPlugin())
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


def report_cache(hits: int = 0, misses: int = 0, client: Client | None = None) -> None:
    """Count blocks read from the parse cache (hits) or parsed again (misses), for the page.

    One event per call (call it once per window); the page shows the hit rate. On a Dask worker
    it goes through the worker; elsewhere through ``client`` (a trainer reading windows itself),
    and without one it is a no-op.

    Parameters
    ----------
    hits
        Blocks read from the cache.
    misses
        Blocks parsed again.
    client
        The client to send it through outside a worker.
    """
    from distributed import get_worker

    event = {"hits": int(hits), "misses": int(misses)}
    try:
        worker = get_worker()
    except ValueError:
        if client is not None:
            with contextlib.suppress(Exception):  # (a chart's count: never a window's failure)
                client.log_event(CACHE_TOPIC, event)
        return
    worker.log_event(CACHE_TOPIC, event)


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
