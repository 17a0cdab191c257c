"""Spikes to rows: the callback that keeps every step's loss and flags the steps far above the rest.

:class:`StepLosses` is the callback ``daskfeed train`` adds to ``fit``. It recovers each step's
loss from Keras' running mean (:func:`~daskfeed.training._loss_series.step_losses`), keeps it in
``OUTPUT/steps.bin`` (12 bytes a step, written in chunks), and flags a step whose loss is far
above the steps before it (:class:`~daskfeed.training._loss_series.SpikeRule`). A flagged step is
named by the ``daskfeed rows`` command that lists its rows: in ``OUTPUT/spikes.json``, the
closing summary, ``history.json`` and on the dashboard. The series' format, its precision and
its reader are :mod:`daskfeed.training._loss_series`'s.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from daskfeed.adapters import keras
from daskfeed.core import write_file
from daskfeed.training._loss_series import (
    HEADER,
    KEPT,
    MAGIC,
    NO_ORDER,
    OWN_BATCHES,
    RECORD,
    SPIKES,
    STEPS,
    SUMMARY_LINES,
    SpikeDetector,
    SpikeRule,
    finite_float,
    mark_json,
    read_header,
    read_records,
    read_spikes,
    rows_command,
    shown,
)

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence

RUN = 512  # steps kept before their losses are worked out and checked together


class StepLosses(keras.callbacks.Callback):
    """Keep every step's loss in ``OUTPUT/steps.bin``; flag steps far above their neighbourhood.

    Records are written in chunks: when ``chunk`` are waiting, ``flush_seconds`` after the last
    write, at a checkpoint (``saved``, the checkpointer's list of checkpoints, grew), at each
    epoch's end and when training ends; ``OUTPUT/spikes.json`` with them. A killed run keeps what
    was written. Place it before the dashboard's callback: :meth:`take_marks` gives the flagged
    steps not yet reported.

    Parameters
    ----------
    out
        The run's output directory.
    sequence
        The training sequence (its plan's rows per batch, ``start``, the order's batches).
    fresh
        A run from scratch (the series and the flagged steps start anew); else a resume appends,
        its neighbourhood seeded from the series' last records.
    rule
        When a step is flagged.
    saved
        The checkpointer's list of checkpoints written (a flush follows each).
    """

    def __init__(self, out: str, sequence: DaskSequence, *, fresh: bool, rule: SpikeRule | None = None,
                 saved: Sequence[Any] = (), chunk: int = 4096, flush_seconds: float = 5.0) -> None:
        super().__init__()
        self.out, self.sequence, self.rule = out, sequence, rule or SpikeRule()
        self.path = os.path.join(out, STEPS)
        self.saved, self.chunk, self.flush_seconds = saved, int(chunk), float(flush_seconds)
        own = not sequence.stream.global_order
        self.flags = OWN_BATCHES if own else 0
        self.flagged: list[dict[str, Any]] = [] if fresh else read_spikes(out)
        self.steps = 0  # records this run
        self._buffer = bytearray()
        self._pending: list[dict[str, Any]] = []  # flagged, not yet reported to the dashboard
        self._checkpoints = len(saved)
        self._written = time.monotonic()
        self._raw: list[tuple[int, int, float]] = []  # (first batch, group, running mean) of
        # the steps not yet worked out (see _digest)
        self._open(fresh)
        self._epoch = self._start = self._begin = 0
        self._rows = 0  # rows trained in this fit's epoch so far
        self._sum = 0.0  # their loss, summed (float64)

    def _open(self, fresh: bool) -> None:
        header = HEADER.pack(MAGIC, RECORD.size, self.flags)
        old = read_header(self.path) if not fresh else None
        if old != header:  # fresh, none yet, or another numbering: start the series anew
            write_file(self.path, header)
            self.flagged = []
            write_file(os.path.join(self.out, SPIKES), json.dumps(self.report(), indent=1))
            self.detector = SpikeDetector(self.rule)
            return
        whole = HEADER.size + (os.path.getsize(self.path) - HEADER.size) // RECORD.size * RECORD.size
        if os.path.getsize(self.path) != whole:  # a record cut short (a kill mid-write): cut it off
            os.truncate(self.path, whole)  # (else every record appended after it reads shifted)
        before = [float(loss) for _, _, loss in read_records(self.path, last=self.rule.window)]
        self.detector = SpikeDetector(self.rule, before)

    # -- Keras hooks ------------------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """A new running mean: Keras starts it afresh each epoch (at ``start`` when resumed).

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (may be None).
        """
        self._digest()  # (the steps of the epoch before, with its numbers)
        self._epoch, self._start = int(epoch), int(self.sequence.start)
        self._rows, self._sum = 0, 0.0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the group's first batch (what every Keras 3 passes here).

        Parameters
        ----------
        batch
            The batch within this fit's epoch.
        logs
            Keras' logs (may be None).
        """
        self._begin = int(batch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the step's running mean; every :data:`RUN` steps, work out and check the run.

        Keeping a step costs a few microseconds here: its loss, record and check are made for a
        run of steps at once (:meth:`_digest`), and before anything reads them (a checkpoint,
        the dashboard's marks, a flush, an epoch's end).

        Parameters
        ----------
        batch
            The batch within this fit's epoch (not used: its meaning depends on the Keras
            version; the group is counted from ``on_train_batch_begin``).
        logs
            Keras' logs: ``loss`` is the epoch's running mean.
        """
        mean = finite_float((logs or {}).get("loss"))
        if mean is None:
            return
        self._raw.append((self._start + self._begin,
                          int(getattr(self.model, "steps_per_execution", 1) or 1), mean))
        checkpointed = len(self.saved) != self._checkpoints
        if checkpointed or time.monotonic() - self._written >= self.flush_seconds \
                or len(self._buffer) >= self.chunk * RECORD.size:
            self._checkpoints = len(self.saved)
            self.flush()  # (the waiting steps worked out first)
        elif len(self._raw) >= RUN:
            self._digest()

    def _digest(self) -> None:
        """The waiting steps' losses from their running means, their records, their checks."""
        raw, self._raw = self._raw, []
        if not raw:
            return
        plan = self.sequence.stream.plan_of(self._epoch)  # (the stream may be in the next)
        steps = []
        for first, group, mean in raw:
            mine = range(first, min(first + group, plan.num_batches))
            rows = sum(plan.batch_rows(b) for b in mine) or 1
            self._rows += rows
            total = mean * self._rows
            loss, self._sum = (total - self._sum) / rows, total
            steps.append((first, mine, loss))
        hits = self.detector.check_many([loss for _, _, loss in steps])
        for (first, mine, loss), hit in zip(steps, hits, strict=True):
            self._keep(first, mine, loss, hit)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Write what is waiting.

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (may be None).
        """
        self.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Write what is waiting.

        Parameters
        ----------
        logs
            Keras' logs (may be None).
        """
        self.flush()

    # -- the series ---------------------------------------------------------------------
    def _keep(self, first: int, mine: range, loss: float,
              hit: tuple[float | None, float | None] | None) -> None:
        stream, epoch = self.sequence.stream, self._epoch
        order = [stream.order_batch(b, epoch) for b in mine]
        step = first if order[0] is None else int(order[0])
        self._buffer += RECORD.pack(epoch, step, loss)
        self.steps += 1
        if hit is not None:
            self._flag({"epoch": epoch + 1, "step": step + 1, "batch": mine[-1] + 1, "loss": loss,
                        "median": hit[0], "threshold": hit[1], "steps": len(mine),
                        "command": (None if order[0] is None else
                                    rows_command(self.out, epoch, [int(o) for o in order if o is not None]))})

    def _flag(self, mark: dict[str, Any]) -> None:
        mark = {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in mark.items()}
        key = (mark["epoch"], mark["step"])  # a step trained again after a resume: its last
        self.flagged = [m for m in self.flagged if (m["epoch"], m["step"]) != key] + [mark]
        del self.flagged[:-KEPT]
        self._pending.append(mark)
        del self._pending[:-KEPT]

    def take_marks(self, most: int = 20) -> list[dict[str, Any]]:
        """The flagged steps not yet reported (at most ``most``, the earliest first).

        Parameters
        ----------
        most
            The most to take (a bounded event).

        Returns
        -------
        list of dict
            ``epoch``, ``step`` (from 1), ``batch`` (this trainer's, from 1: the dashboard's
            axis), ``loss``, ``median``, ``threshold``, ``steps`` and ``command``.
        """
        self._digest()
        taken, self._pending = self._pending[:most], self._pending[most:]
        return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}
                for m in taken]

    def flush(self) -> None:
        """Append the waiting records to ``steps.bin``; rewrite ``spikes.json``."""
        self._digest()
        if self._buffer:
            with open(self.path, "ab") as f:
                f.write(self._buffer)
            self._buffer.clear()
            write_file(os.path.join(self.out, SPIKES), json.dumps(self.report(), indent=1))
        self._written = time.monotonic()

    def close(self) -> None:
        """Write what is waiting (a run that ends on an error keeps its steps)."""
        self.flush()

    def report(self) -> dict[str, Any]:
        """What ``spikes.json`` and ``history.json`` (``loss_spikes``) say.

        Returns
        -------
        dict
            ``rule``, ``steps_file``, ``numbering`` (``order`` or ``trainer``), ``flagged``
            (the latest :data:`KEPT`) and, without the global order, why there is no command.
        """
        self._digest()
        out: dict[str, Any] = {"rule": asdict(self.rule), "steps_file": STEPS,
                               "numbering": "trainer" if self.flags & OWN_BATCHES else "order",
                               "flagged": [mark_json(m) for m in self.flagged]}
        if self.flags & OWN_BATCHES:
            out["no_command"] = NO_ORDER
        return out

    def summary_lines(self) -> list[str]:
        """The closing summary's lines on the flagged steps (none flagged: one short line).

        Returns
        -------
        list of str
            The lines.
        """
        self._digest()
        r = self.rule
        if not self.flagged:
            return [f"loss spikes: none flagged ({self.steps:,} steps kept in {self.path})"]
        lines = [f"loss spikes: {len(self.flagged)} step{'s' if len(self.flagged) != 1 else ''} far "
                 f"above their neighbourhood (loss > median + {r.k:g} MADs of the {r.window} steps "
                 "before); the rows of each:"]
        for m in self.flagged[:SUMMARY_LINES]:
            median = m.get("median")
            near = f" (its neighbourhood's median {shown(median)})" if median is not None else ""
            lines.append(f"  epoch {m['epoch']} step {m['step']}: loss {shown(m['loss'])}{near}: "
                         f"{m['command'] or NO_ORDER}")
        if len(self.flagged) > SUMMARY_LINES:
            lines.append(f"  ... and {len(self.flagged) - SUMMARY_LINES} more in "
                         f"{os.path.join(self.out, SPIKES)}")
        return lines
