"""Telemetry: per epoch the rows trained, their rate, the wait for data and the tree's peak RSS.

:class:`EpochTelemetry` is the callback ``daskfeed train`` adds to ``fit``; its records are the
history's daskfeed fields (:mod:`daskfeed.training._summary` says them).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from daskfeed.core import RSSSampler
from daskfeed.training._watch import HandoffAware

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence
    from daskfeed.batches import EpochStats


class EpochTelemetry(HandoffAware):
    """Per epoch: rows trained, training seconds, rows/s, the wait for data, peak RSS of the tree.

    Every time is measured on one clock, ``time.perf_counter`` of this process, the clock of the
    sequence's own figures (:meth:`~daskfeed.DaskSequence.stats_of`). A record's fields:

    ``rows``, ``batches``
        Rows and batches trained in the epoch by this process: in a resumed epoch those from
        ``resumed_at_batch`` on (the :class:`Checkpointer` adds that field), else all the epoch's.
    ``epoch_rows``
        The epoch's rows, all of them (``rows`` plus those of the batches before
        ``resumed_at_batch``, which the run that wrote the checkpoint trained).
    ``seconds``
        The epoch's training time: from ``on_epoch_begin`` to validation's start (to the epoch's
        end without validation). ``val_seconds``: validation's.
    ``rows_per_s``
        ``rows / seconds``: only rows trained in that time.
    ``windows_computed``, ``peak_rss_bytes``
        Windows the epoch computed; the process tree's peak RSS during the epoch.
    ``skipped_batches``, ``skipped_rows``
        Batches of the epoch's order left out by ``--skip-batches`` (all trainers'), and their
        rows; only in an epoch that skipped some.
    ``ended_at``
        When the epoch ended, in Unix seconds (``time.time()``): a resumed run's history holds
        the records of earlier runs too, and :func:`~daskfeed.training._summary.summary_lines`
        tells this run's by it.

    The wait for data depends on how batches reach Keras (:func:`fit_from` says which through
    :meth:`set_handoff`; ``pydataset`` unless told):

    ``handoff="pydataset"`` (``seq[i]``, one thread at a time with ``workers=1``) or ``"dataloader"``
        ``data_wait_seconds`` is the time Keras' reads of the epoch's batches waited for windows
        during the epoch's training time, ``data_wait_fraction`` that over ``seconds``. Keras
        starts reading an epoch's batches after ``on_epoch_begin`` and has read them all before
        its training ends, so those waits lie inside the training time, one after another: the
        fraction is at most 1 by construction. ``first_batch_wait_seconds`` is the time reads
        of the epoch waited *before* its training began: the TensorFlow backend reads batches
        0 and 1 when ``fit`` starts, before its first ``on_epoch_begin`` (0 for other epochs).
    ``handoff="tf-data"`` (a ``tf.data`` pipeline fed by a :class:`~daskfeed.adapters._tf_data.TFDataHandoff`)
        Keras' own wait, on the ``tf.data`` queue, is not observable from Python, and the feed's
        producer thread reads ahead of training (the next epochs' chunks while this one trains,
        ends or validates), so its waits are not the trainer's and do not lie inside
        ``seconds``: ``data_wait_seconds``, ``data_wait_fraction`` and
        ``first_batch_wait_seconds`` are None (not measured). The producer's figures are
        recorded instead: ``feed_wait_seconds``, the time it waited for the epoch's windows;
        ``feed_seconds``, the time from when the sequence began serving the epoch (made, or
        done with the epoch before) to when the producer assembled its last batch;
        ``feed_wait_fraction``, the first over the second. The producer's waits for the epoch
        lie inside that span, one after another: at most 1 by construction.

    The sequence keeps the figures of its last eight epochs. On small data the tf.data hand-off can
    read further ahead than that; an epoch whose figures are gone by its end has its rows and
    batches from its plan (every epoch has the same, and Keras trained them all) and None for
    ``windows_computed`` and the wait.

    Parameters
    ----------
    sequence
        The training :class:`~daskfeed.DaskSequence`.
    rss_sampler
        Samples the process tree's RSS (its peak per epoch is recorded); None: no memory figure.
    handoff
        ``pydataset``, ``dataloader`` or ``tf-data``: how batches reach Keras (:func:`fit_from` sets it).
    """

    def __init__(self, sequence: DaskSequence, rss_sampler: RSSSampler | None = None, *,
                 handoff: str = "pydataset") -> None:
        super().__init__()
        self.sequence = sequence
        self.rss = rss_sampler
        self.epochs: list[dict[str, Any]] = []
        self.set_handoff(handoff)
        self._t0 = self._t_train = 0.0
        self._start = 0  # the batch the epoch starts at (> 0 in a resumed epoch)
        self._waited_before = 0.0  # the epoch's reads waited this long before on_epoch_begin
        self._seen: EpochStats | dict[str, Any] = {}  # the epoch's final figures, once seen

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Start the epoch clock and a new RSS peak; note how long its reads already waited.

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        now = self.sequence.epoch_stats()
        self._waited_before = float(now["wait_seconds"]) if now["epoch"] == epoch else 0.0
        self._start = int(self.sequence.start)
        self._seen = self.sequence.stats_of(epoch)  # a feed that reads ahead may be done with it
        self._t0 = time.perf_counter()
        self._t_train = 0.0
        if self.rss is not None:
            self.rss.reset_peak()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Validation starts: the training part of the epoch ends here.

        Parameters
        ----------
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        if self._t0 and not self._t_train:
            self._t_train = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the epoch's telemetry.

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        end = time.perf_counter()
        train_end = self._t_train or end
        seconds = max(train_end - self._t0, 1e-9)
        stats = self._stats(epoch)
        size = int(self.sequence.batch_size)
        if stats:
            rows, batches, start = int(stats["rows"]), int(stats["batches"]), int(stats["start_batch"])
        else:  # figures no longer kept: the plan's (the same every epoch), all trained
            start = self._start
            rows = int(self.sequence.rows) - start * size
            batches = int(self.sequence.plan.num_batches) - start
        rec: dict[str, Any] = {
            "epoch": epoch,
            "rows": rows,
            "epoch_rows": rows + start * size,
            "batches": batches,
            "seconds": round(seconds, 4),
            "val_seconds": round(end - train_end, 4),
            "rows_per_s": round(rows / seconds, 1),
            "windows_computed": stats.get("windows_computed"),
            "label_spread": stats.get("label_spread"),  # the shuffle against iid (batches._quality)
            "inside_iid": stats.get("inside_iid"),
            "ended_at": round(time.time(), 3),
        }
        waited = float(stats["wait_seconds"]) if stats else None
        if self.handoff != "tf-data":  # (pydataset, dataloader: read in the trainer's thread)
            during = None if waited is None else waited - self._waited_before
            rec.update(data_wait_seconds=_rounded(during),
                       data_wait_fraction=None if during is None else round(during / seconds, 4),
                       first_batch_wait_seconds=round(self._waited_before, 4))
        else:
            served = float(stats["seconds"]) if stats else None
            rec.update(data_wait_seconds=None, data_wait_fraction=None, first_batch_wait_seconds=None,
                       feed_wait_seconds=_rounded(waited), feed_seconds=_rounded(served),
                       feed_wait_fraction=(round(waited / served, 4)
                                           if waited is not None and served else None))
        if stats.get("skipped_batches"):  # left out by --skip-batches (all trainers')
            rec.update(skipped_batches=int(stats["skipped_batches"]),
                       skipped_rows=int(stats["skipped_rows"]))
        if self.rss is not None:
            rec["peak_rss_bytes"] = int(self.rss.peak)
        self.epochs.append(rec)

    def _stats(self, epoch: int) -> EpochStats | dict[str, Any]:
        """The sequence's figures of ``epoch`` at its end ({} when no longer kept).

        An epoch cut short (``model.stop_training``) has the figures of what was read of it.
        """
        ended = self.sequence.stats_of(epoch) or self._seen
        if ended:
            return ended
        now = self.sequence.epoch_stats()
        return now if now["epoch"] == epoch and getattr(self.model, "stop_training", False) else {}


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
