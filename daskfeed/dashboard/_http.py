"""The dashboard plugin's HTTP side on the scheduler: ``/daskfeed``, ``status.json``, ``/metrics``.

Tornado handlers added to the scheduler's dashboard application, and the collector of the
``daskfeed_*`` Prometheus series; both read the figures of
:class:`daskfeed.dashboard._plugin.DashboardPlugin`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tornado import web

from daskfeed.dashboard import _render as render
from daskfeed.dashboard._render import Figures

if TYPE_CHECKING:
    from distributed import Scheduler
    from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

PLUGIN_NAME = "daskfeed-watch"


@runtime_checkable
class Snapshots(Protocol):
    """What the handlers and the collector read: the dashboard plugin's figures."""

    def snapshot(self) -> Figures:
        """The figures as plain JSON values.

        Returns
        -------
        Figures
            A status snapshot.
        """
        ...


def _plugin_of(scheduler: Scheduler) -> Snapshots | None:
    """The scheduler's dashboard plugin (:class:`~daskfeed.dashboard._plugin.DashboardPlugin`), if any."""
    plugin = getattr(scheduler, "plugins", {}).get(PLUGIN_NAME)
    return plugin if isinstance(plugin, Snapshots) else None


# -- HTTP --------------------------------------------------------------------------------
class _Handler(web.RequestHandler):
    def initialize(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def _snapshot(self) -> Figures | None:
        self.set_header("Cache-Control", "no-store")
        plugin = _plugin_of(self.scheduler)
        if plugin is None:
            self.set_status(404)
            self.write("daskfeed is not watching this scheduler (its plugin was removed).\n")
            return None
        return plugin.snapshot()


class PageHandler(_Handler):
    """``/daskfeed``: the page; ``/daskfeed?part=body`` its body alone (what the page refetches)."""

    def get(self) -> None:
        """Write the page (or its body)."""
        snap = self._snapshot()
        if snap is not None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            body = render.render_body(snap)
            self.write(body if self.get_argument("part", "") == "body" else render.render_page(body))


class StatusHandler(_Handler):
    """``/daskfeed/status.json``: the figures as JSON."""

    def get(self) -> None:
        """Write the figures."""
        snap = self._snapshot()
        if snap is not None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(snap, allow_nan=False))


def http_prefix(app: web.Application) -> str:
    """The dashboard's URL prefix (``--dashboard-prefix``), read off its ``health`` route.

    Parameters
    ----------
    app
        The scheduler's HTTP application.

    Returns
    -------
    str
        The prefix, ``"/"`` where the routes have none.
    """
    for rule in getattr(app.default_router, "rules", []):
        for sub in getattr(rule.target, "rules", []):
            regex = getattr(sub.matcher, "regex", None)
            if regex is not None and regex.pattern.endswith("health$"):
                return regex.pattern[: -len("health$")] or "/"
    return "/"


def add_routes(scheduler: Scheduler) -> None:
    """Serve ``/daskfeed`` and ``/daskfeed/status.json`` on ``scheduler``'s dashboard (once).

    Parameters
    ----------
    scheduler
        The ``distributed`` scheduler whose HTTP application gets the routes.
    """
    app = getattr(scheduler, "http_application", None)
    if app is None or getattr(app, "_daskfeed_routes", False):
        return
    prefix = http_prefix(app)
    app.add_handlers(r".*", [
        (prefix + "daskfeed", PageHandler, {"scheduler": scheduler}),
        (prefix + re.escape("daskfeed/status.json"), StatusHandler, {"scheduler": scheduler}),
    ])
    app._daskfeed_routes = True


# -- Prometheus --------------------------------------------------------------------------
class _Collector:
    """``daskfeed_*`` series on the process's default registry: one per process, as distributed's.

    It shows the latest started plugin still running (tests and notebooks run several
    schedulers in one process, one after the other).
    """

    def __init__(self) -> None:
        self.plugins: list[Snapshots] = []
        self.registered = False

    def collect(self) -> Iterator[Metric]:
        plugins = list(self.plugins)
        if not plugins:
            return
        try:
            yield from render.metric_families(plugins[-1].snapshot())
        except Exception:  # never break the scheduler's own /metrics
            logger.exception("daskfeed: could not build the daskfeed_* series")

    def use(self, plugin: Snapshots) -> None:
        """Show ``plugin``'s figures (registers the collector on first use)."""
        try:
            import prometheus_client
        except ImportError:  # /metrics is distributed's "not available" page then
            return
        self.plugins.append(plugin)
        if not self.registered:
            prometheus_client.REGISTRY.register(self)  # type: ignore[arg-type]
            self.registered = True

    def release(self, plugin: Snapshots) -> None:
        """Stop showing ``plugin``'s figures."""
        self.plugins = [p for p in self.plugins if p is not plugin]


COLLECTOR = _Collector()
