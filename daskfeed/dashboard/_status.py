"""The run's figures as the scheduler keeps them: :class:`Status`, updated by daskfeed's events.

Pure (no scheduler, no I/O): :class:`daskfeed.dashboard._plugin.DashboardPlugin` feeds it the events logged
on the ``daskfeed`` topics and serves its :meth:`Status.snapshot`.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from daskfeed.core import eta_seconds
from daskfeed.dashboard._render import Figures

TOPIC = "daskfeed"  # trainer -> scheduler: run, progress, epoch and scan events
SCAN_TOPIC_PREFIX = "daskfeed-scan-"  # scan tasks -> scheduler (daskfeed.scanning._task.report)
CACHE_TOPIC = "daskfeed-cache"  # window tasks -> scheduler (report_cache)
HISTORY_LIMIT = 10_000  # epoch records kept on the scheduler
SERIES_LIMIT = 4_000  # progress samples kept for the charts (halved, oldest thinned, when full)
SPIKES_LIMIT = 200  # loss spikes kept (the latest), each with its `daskfeed rows` command
SPIKE_FIELDS = ("epoch", "step", "batch", "loss", "median", "command")  # what a spike keeps
# the charts' series: name -> (x, figure) of a sample; each series has a point where its sample
# has the figure, none where it lacks it (an epoch's start has no rate nor loss yet; the tf.data
# hand-off no data wait): a line of points only, never a gap
CHART_SERIES = {"loss": ("step", "loss"), "rows_per_s": ("t", "rows_per_s"), "data_wait": ("t", "data_wait"),
                "rss_bytes": ("t", "rss_bytes"), "budget_bytes": ("t", "budget_bytes")}

Event = dict[str, Any]  # one msgpack-able event: a ``kind`` and its figures (JSON values)
Series = dict[str, list[float]]  # one chart series' points: ``x`` and ``y``, as long as each other


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
        self.series: list[Event] = []  # one sample per progress event (see chart_data)
        self.series_version = 0  # changes when samples are thinned or a new run starts
        self.spikes: list[Event] = []  # loss spikes flagged by the trainer (the latest SPIKES_LIMIT)
        self.spikes_seen = 0  # spikes received in this run, kept or not
        self.epoch_batches: dict[int, int] = {}  # each epoch's batches (skipped ones change them)
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
                self.series, self.series_version = [], self.series_version + 1
                self.cache = {"hits": 0, "misses": 0}
                self.spikes, self.spikes_seen, self.epoch_batches = [], 0, {}
            self.run = {**body, "started": started}
            self._settle_scans(body.get("data") or {})
        elif kind == "progress":
            self._keep_spikes(body.pop("spikes", None))
            self.progress.update(body)
            self._sample(body, now)
        elif kind == "spikes":
            self._keep_spikes(body.get("spikes"))
        elif kind == "epoch":
            self.history = [r for r in self.history if r.get("epoch") != body.get("epoch")]
            self.history.append(body)
            del self.history[:-HISTORY_LIMIT]
        elif kind == "scan":
            self._apply_scan(body, now)

    def _keep_spikes(self, marks: object) -> None:
        """Keep the loss spikes of an event: their figures and command, no more.

        A step trained again after a resume replaces its earlier mark; the latest
        :data:`SPIKES_LIMIT` are kept.
        """
        if not isinstance(marks, (list, tuple)):  # (msgpack over TCP gives a tuple)
            return
        for m in marks:
            if not isinstance(m, dict) or not _number(m.get("epoch")) or not _number(m.get("step")):
                continue
            mark = {k: m.get(k) for k in SPIKE_FIELDS}
            mark["command"] = str(mark["command"])[:500] if mark["command"] is not None else None
            key = (mark["epoch"], mark["step"])
            self.spikes = [s for s in self.spikes if (s["epoch"], s["step"]) != key] + [mark]
            self.spikes_seen += 1
        del self.spikes[:-SPIKES_LIMIT]

    def spike_marks(self) -> tuple[tuple[int, int], list[Event]]:
        """The loss spikes as the loss chart marks them: each at its batch on the chart's axis.

        Returns
        -------
        tuple
            ``(version, marks)``: the version changes when the marks do (a spike received, a new
            run); each kept spike with ``x``, the batch of all epochs it was trained at.
        """
        with self._lock:
            marks = [{**m, "x": self._step(int(m["epoch"]), int(m["batch"]))
                      if _number(m.get("batch")) else None} for m in self.spikes]
            return (self.series_version, self.spikes_seen), _finite(marks)

    def _step(self, epoch: int, batch: int) -> int | None:
        """Batch ``batch`` of ``epoch`` on the charts' axis: the batches of the epochs before it, plus it.

        Each epoch counts its own batches (``--skip-batches`` can leave epochs with different
        counts); one not seen (the page opened after it, a resumed run) counts as the latest.
        """
        latest = int(self.progress.get("batches") or self.run.get("batches") or 0)
        if not latest:
            return None
        return sum(self.epoch_batches.get(e, latest) for e in range(1, epoch)) + batch

    def _sample(self, body: Event, now: float) -> None:
        """One point of the charts from a progress event (only while batches are trained).

        Its own figures, not the latest merged ones: a figure the event lacks (no data wait
        with the tf.data hand-off, no loss at an epoch's start) is None here, not the last value
        again, and no point of that figure's series (:meth:`chart_data`).
        """
        p = self.progress
        if body.get("state") not in ("training", "epoch-end") or p.get("batch") is None:
            return
        batches, epoch = p.get("batches"), int(p.get("epoch") or 1)
        if batches:
            self.epoch_batches[epoch] = int(batches)
        step = self._step(epoch, int(p["batch"]))
        step = len(self.series) if step is None else step
        self.series.append({
            "t": now - self.run.get("started", now), "step": step, "epoch": epoch,
            "loss": (body.get("logs") or {}).get("loss"), "rows_per_s": body.get("rows_per_s"),
            "data_wait": body.get("data_wait"), "rss_bytes": body.get("rss_bytes"),
            "budget_bytes": p.get("budget_bytes", self.run.get("budget_bytes"))})
        if len(self.series) > SERIES_LIMIT:  # the older half thinned to every other sample
            half = SERIES_LIMIT // 2
            self.series = self.series[:half:2] + self.series[half:]
            self.series_version += 1

    def chart_data(self, version: int, seen: int) -> tuple[int, bool, int, dict[str, Series], list[Event]]:
        """What the charts need since they last asked: each series' new points.

        Parameters
        ----------
        version, seen
            The :attr:`series_version` and the number of samples the charts hold.

        Returns
        -------
        tuple
            ``(version, whole, seen, series, epochs)``: ``whole`` True when the points replace
            what the charts hold (thinned, or a new run), else they follow it; ``seen`` the
            samples the charts hold with them; ``series`` each of :data:`CHART_SERIES` as its
            points' ``x`` and ``y``, finite numbers only (a sample that lacks a figure, or has
            NaN, is no point of its series, not a gap in its line); every epoch record with the
            batch step it ended at (``step``).
        """
        with self._lock:
            whole = version != self.series_version or seen > len(self.series)
            points = _points(self.series if whole else self.series[seen:])
            latest = int(self.progress.get("batches") or self.run.get("batches") or 0)
            epochs = [{**r, "step": self._step(int(r["epoch"]),
                                               self.epoch_batches.get(int(r["epoch"]), latest))}
                      for r in self.history if r.get("epoch") is not None]
            return self.series_version, whole, len(self.series), points, _finite(epochs)

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
                "spikes": [dict(m) for m in self.spikes], "spikes_seen": self.spikes_seen,
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
    if scan.get("state") == "running" and total:  # once it means something, as the lines say it
        out["eta_seconds"] = eta_seconds(scan["bytes"], total, seconds)
    return out


def _points(samples: list[Event]) -> dict[str, Series]:
    """Each chart series' points (``x``, ``y``) of ``samples``: where both are numbers."""
    out: dict[str, Series] = {}
    for name, (x, figure) in CHART_SERIES.items():
        pairs = [(s[x], s[figure]) for s in samples if _number(s.get(x)) and _number(s.get(figure))]
        out[name] = {"x": [float(a) for a, _ in pairs], "y": [float(b) for _, b in pairs]}
    return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _finite(x: Any) -> Any:
    """``x`` with NaN and infinities as None (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
