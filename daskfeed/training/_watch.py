"""Watching a run: the Keras callback that feeds the dashboard.

:class:`WatchCallback` reports epoch, batch of total, loss and metrics, rows/s, data-wait and
memory to the scheduler's ``/daskfeed`` page and ``daskfeed_*`` series (see
:mod:`daskfeed.dashboard._plugin`) at most every ``every_seconds`` and at each epoch's end, and
gives each epoch a ``distributed.span`` (:class:`~daskfeed.dashboard._plugin.EpochSpans`). What a
run leaves afterwards (``history.png``, the closing summary) is :mod:`daskfeed.training._summary`'s.

Example::

    from daskfeed.dashboard._plugin import install, scan_span
    from daskfeed.training._watch import WatchCallback

    links = install(client)                      # links.page: http://…/daskfeed
    with scan_span(client):
        seq = daskfeed.DaskSequence("data/**/*.csv", label="cleared", client=client)
    model.fit(seq, epochs=3, shuffle=False, callbacks=[WatchCallback(client, seq)])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from daskfeed.adapters import keras
from daskfeed.core import RSSSampler, handoff_name, refuse_setting, tree_rss
from daskfeed.dashboard import EpochSpans, Links, install, report

if TYPE_CHECKING:
    from distributed import Client

    from daskfeed.manifest import Manifest

MARKS_PER_REPORT = 20  # loss spikes sent with one report at most


class HandoffAware(keras.callbacks.Callback):
    """A callback told how batches reach Keras (``fit_from`` calls :meth:`set_handoff`)."""

    handoff = "pydataset"

    def set_handoff(self, handoff: str) -> None:
        """Say how batches reach Keras: ``pydataset``, ``dataloader`` or ``tf-data``.

        ``pydataset``: ``seq[i]``; ``dataloader``: a torch ``DataLoader`` of the sequence's
        batches; ``tf-data``: a TFDataHandoff.

        Parameters
        ----------
        handoff
            ``pydataset``, ``dataloader`` or ``tf-data`` (the old names ``batches``, ``windows``
            with a warning).

        Raises
        ------
        SettingError
            For another value (``auto`` is decided before a callback is told).
        """
        handoff = handoff_name(handoff)
        if handoff == "auto":
            refuse_setting("Expected the hand-off fit_from chose: pydataset, dataloader or tf-data.",
                           "handoff='auto'", "let fit_from tell the callback (handoff=...).")
        self.handoff = handoff


class WatchCallback(HandoffAware):
    """Report a ``fit`` to the scheduler's daskfeed page and ``/metrics`` while it runs.

    Parameters
    ----------
    client
        The ``distributed.Client`` of the cluster (a ``LocalCluster``'s or a remote
        scheduler's); :func:`~daskfeed.dashboard.install` is called on it when training starts.
    sequence
        The training :class:`~daskfeed.DaskSequence` (rows, data-wait, batches per epoch; any
        ``keras.utils.PyDataset`` works with fewer figures).
    validation
        The validation sequence, for its bad-row counts.
    budget_bytes
        The memory budget that the process tree's RSS is shown against.
    rss_sampler
        A :class:`daskfeed.core.RSSSampler` (its ``sample()`` and ``peak``); default: the RSS of
        this process and its children, measured at each report.
    every_seconds
        Least time between two reports during an epoch (each epoch's end is always reported).
    epochs
        Epochs of the whole run, when ``fit`` is called in parts (``--resume``).
    handoff
        How batches reach Keras: ``pydataset`` (the sequence itself), ``dataloader`` (a torch
        ``DataLoader`` of its batches) or ``tf-data`` (the tf.data hand-off's pipeline);
        :func:`~daskfeed.fit_from` sets it.
    marks
        ``marks(most)``: the loss spikes flagged since the last call, at most ``most`` (each a
        dict: ``epoch``, ``step``, ``batch``, ``loss``, ``median``, ``command``), sent with the
        reports; the page lists them and the loss chart marks them (``daskfeed train`` passes
        its per-step loss callback's, see ``docs/tracing.md``). None: no marks.

    Notes
    -----
    The data-wait figure (``data_wait``: the page's "waiting for data", ``/metrics``'
    ``daskfeed_data_wait_ratio``) is the share of the epoch's training time so far that Keras'
    reads of its batches waited for windows: with ``handoff="pydataset"`` (or ``dataloader``) one
    thread reads them after
    ``on_epoch_begin`` (what it read before, the TensorFlow backend's first batches when ``fit``
    starts, is not counted), so the share is at most 1 by construction. With the tf.data hand-off
    Keras' wait is not observable (``history.json`` has the producer thread's ``feed_wait_*``
    instead, see ``docs/command-line.md``): no ``data_wait`` is reported.

    Each epoch's tasks belong to the span ``daskfeed/epoch N`` when they are submitted inside
    ``spans(epoch)`` (``callback.spans``, an :class:`~daskfeed.dashboard.EpochSpans`). A
    ``distributed.span`` tags what is submitted in the thread that entered it, and a
    DaskSequence submits its windows from its prefetch and Keras' reader threads, not from
    the thread running the callbacks, and starts on the first epoch's windows when it is
    created. So the spans are entered where windows are submitted: by a sequence with a
    ``spans`` attribute (an ``EpochSpans`` given when it is created, whose epoch-1 windows are
    then in ``daskfeed/epoch 1`` too). The callback uses the training sequence's ``spans``,
    or hands its own to sequences whose ``spans`` is None (from then on); the tasks of a
    sequence without the attribute stay in the cluster's default span. The scheduler files
    tasks into spans by task group, and keys ``daskfeed-window-<token>`` all fall in the group
    ``daskfeed-window``: a window submitted while that group still has tasks on the scheduler
    (the next epoch's first windows, overlapping the last ones of this epoch or the validation
    windows) joins the group's span. Keys ``("daskfeed-window-<token>", w)`` give each window
    its own group (the prefix, ``daskfeed-window``, stays), so every window lands in its epoch.
    """

    def __init__(self, client: Client, sequence: keras.utils.PyDataset, *,
                 validation: keras.utils.PyDataset | None = None,
                 budget_bytes: int | None = None, rss_sampler: RSSSampler | None = None,
                 every_seconds: float = 2.0, epochs: int | None = None,
                 handoff: str = "pydataset",
                 marks: Callable[[int], list[dict[str, Any]]] | None = None) -> None:
        super().__init__()
        self.marks = marks
        self.client = client
        self.sequence = sequence
        self.validation = validation
        self.budget_bytes = budget_bytes
        self.rss = rss_sampler
        self.every_seconds = float(every_seconds)
        self.epochs = epochs
        self.set_handoff(handoff)
        own = getattr(sequence, "spans", None)
        self.spans = own if isinstance(own, EpochSpans) else EpochSpans()
        self.links: Links | None = None
        self.reports = 0  # events sent
        self._rows_before = 0  # rows trained in earlier epochs of this run
        self._peak = 0
        self._epoch = self._batch = 0  # the epoch (0-based) and the batches of it trained
        self._t0 = self._t_train = self._last = 0.0
        self._waited_before = 0.0  # the epoch's reads waited this long before on_epoch_begin
        for seq in (sequence, validation):
            if seq is not None and hasattr(seq, "spans") and seq.spans is None:
                seq.spans = self.spans  # a sequence that submits its tasks inside spans(epoch)

    # -- Keras hooks ------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Install the scheduler plugin (idempotent) and announce the run.

        Parameters
        ----------
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        self.links = install(self.client)
        self._send({"kind": "run", "run": self.spans.run, "epochs": self._epochs(),
                    "batches": self._batches(), "rows_per_epoch": getattr(self.sequence, "rows", None),
                    "budget_bytes": self.budget_bytes, "bad_rows": self._bad_rows(), "data": self._data(),
                    "cache": getattr(self.sequence, "cache_status", None)})

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Start the epoch's clock; report batch 0 (or the batch a resumed epoch starts at).

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        self._epoch, self._batch = epoch, self._start()
        now = self._stats()
        self._waited_before = float(now.get("wait_seconds", 0.0)) if now.get("epoch") == epoch else 0.0
        self._t0, self._t_train = time.perf_counter(), 0.0
        self._progress("training", self._batch, {})

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Report at most every ``every_seconds``.

        Parameters
        ----------
        batch
            The batch within the epoch (as Keras numbers it).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        self._batch = self._start() + batch + 1
        if time.perf_counter() - self._last >= self.every_seconds:
            self._progress("training", self._batch, logs or {})

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Validation starts: the training part of the epoch ends.

        Parameters
        ----------
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        if self._t0 and not self._t_train:
            self._t_train = time.perf_counter()
            self._progress("validating", self._batch, {})

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Report the finished epoch (train and validation logs, its rows/s and data-wait).

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        logs = _floats(logs or {})
        rec = self._epoch_record(epoch, logs)
        self._rows_before += rec["rows"]
        self._progress("epoch-end", self._batch, logs, rec)
        self._send({"kind": "epoch", **rec})

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Say the fit finished.

        Parameters
        ----------
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        stopped = getattr(self.model, "stop_training", False)
        msg: dict[str, Any] = {"kind": "progress", "state": "stopped" if stopped else "done"}
        marks = self.marks or (lambda most: [])
        spikes = marks(MARKS_PER_REPORT)
        while spikes:  # those flagged since the last report, in bounded events
            self._send({"kind": "spikes", "spikes": spikes})
            spikes = marks(MARKS_PER_REPORT) if len(spikes) == MARKS_PER_REPORT else []
        self._send(msg)

    # -- figures ------------------------------------------------------------------------
    def _progress(self, state: str, batch: int, logs: Mapping[str, Any],
                  rec: dict[str, Any] | None = None) -> None:
        rss = self._rss()
        if rec is None:
            seconds = max(time.perf_counter() - self._t0, 1e-9)
            rows = self._rows_done(batch)
            rows_per_s, wait = rows / seconds, self._wait_share(self._stats(), seconds)
        else:
            rows, rows_per_s, wait = rec["rows"], rec["rows_per_s"], rec.get("data_wait")
        msg = {
            "kind": "progress", "state": state, "epoch": self._epoch + 1, "epochs": self._epochs(),
            "batch": int(batch), "batches": self._batches(), "rows": int(rows),
            "rows_trained": int(self._rows_before + (0 if rec else rows)),
            "rows_per_s": float(rows_per_s),
            "rss_bytes": rss, "peak_rss_bytes": self._peak_rss(rss), "budget_bytes": self.budget_bytes,
        }
        if wait is not None:  # not measured with the tf.data hand-off
            msg["data_wait"] = float(wait)
        if logs:  # none at an epoch's start or validation's: the latest stay on the page
            msg["logs"] = _floats(logs)
        if not rows:  # no batch trained yet this epoch: no rate yet, the last one stays
            msg.pop("rows_per_s")
            msg.pop("data_wait", None)
        spikes = self.marks(MARKS_PER_REPORT) if self.marks is not None else []
        if spikes:  # loss spikes flagged since the last report (bounded)
            msg["spikes"] = spikes
        self._send(msg)

    def _wait_share(self, stats: Mapping[str, Any], seconds: float) -> float | None:
        """Share of the epoch's ``seconds`` of training so far Keras' reads waited for windows.

        ``stats``: the sequence's figures of the epoch (now, or at its end). None with the
        tf.data hand-off (Keras' wait is not observable), or when ``stats`` are another epoch's.
        """
        if self.handoff == "tf-data" or stats.get("epoch") != self._epoch:
            return None
        return (float(stats.get("wait_seconds", 0.0)) - self._waited_before) / seconds

    def _epoch_record(self, epoch: int, logs: dict[str, float]) -> dict[str, Any]:
        end = time.perf_counter()
        seconds = max((self._t_train or end) - self._t0, 1e-9)
        stats = self._stats(done=epoch)
        rows = int(stats.get("rows", 0))
        rec = {"epoch": epoch + 1, **logs, "rows": rows, "seconds": round(seconds, 3),
               "rows_per_s": rows / seconds, "peak_rss_bytes": self._peak_rss(self._rss())}
        if stats.get("label_spread") is not None:  # the shuffle against iid (batches._quality)
            rec["label_spread"] = float(stats["label_spread"])
        wait = self._wait_share(stats, seconds)
        if wait is not None:
            rec["data_wait"] = wait
        return rec

    def _stats(self, done: int | None = None) -> dict[str, Any]:
        """The sequence's figures of this epoch, or of the finished epoch ``done``.

        By the time Keras calls ``on_epoch_end`` the sequence has moved on to the next epoch
        (with the tf.data hand-off, maybe past it).
        """
        seq = self.sequence
        if done is not None:
            ended = seq.stats_of(done) if hasattr(seq, "stats_of") else {}
            last = getattr(seq, "last_epoch_stats", None) or {}
            if ended or last.get("epoch") == done:
                return dict(ended or last)
        return dict(seq.epoch_stats()) if hasattr(seq, "epoch_stats") else {}

    def _rows_done(self, batch: int) -> int:
        """Rows trained this epoch up to ``batch`` (only the epoch's last batch may be short)."""
        start, size = self._start(), _batch_size(self.sequence)
        rows = max(batch - start, 0) * size
        plan = getattr(self.sequence, "plan", None)
        return min(rows, plan.rows - start * size) if plan is not None else rows

    def _rss(self) -> int:
        if self.rss is not None:
            return int(self.rss.sample())
        return tree_rss()

    def _peak_rss(self, rss: int) -> int:
        self._peak = max(self._peak, rss, int(getattr(self.rss, "peak", 0) or 0))
        return self._peak

    def _epochs(self) -> int | None:
        return self.epochs or (self.params or {}).get("epochs")

    def _batches(self) -> int:
        plan = getattr(self.sequence, "plan", None)
        return int(plan.num_batches if plan is not None else (self.params or {}).get("steps") or 0)

    def _start(self) -> int:
        return int(getattr(self.sequence, "start", 0) or 0)

    def _manifests(self) -> dict[str, Manifest]:
        pairs = (("train", self.sequence), ("validation", self.validation))
        return {name: m for name, seq in pairs if (m := getattr(seq, "manifest", None)) is not None}

    def _bad_rows(self) -> dict[str, dict[str, int]]:
        return {name: {"malformed": int(m.bad_lines), "label_missing": int(m.label_missing)}
                for name, m in self._manifests().items()}

    def _data(self) -> dict[str, dict[str, int]]:
        return {name: {"rows": int(m.rows), "bytes": int(m.nbytes), "blocks": len(m.blocks)}
                for name, m in self._manifests().items()}

    def _send(self, msg: dict[str, Any]) -> None:
        self._last = time.perf_counter()
        if report(self.client, msg):
            self.reports += 1


def _batch_size(seq: keras.utils.PyDataset) -> int:
    return int(getattr(seq, "batch_size", 1) or 1)


def _floats(logs: Mapping[str, Any]) -> dict[str, float]:
    """Keras logs as plain floats (msgpack-able); what is not a number is left out."""
    out = {}
    for k, v in logs.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return out
