"""Spikes to rows: every step's loss kept at low cost, and the steps far above their neighbourhood.

:class:`StepLosses` is the callback ``daskfeed train`` adds to ``fit``. It recovers each step's
loss from Keras' running mean (:func:`step_losses`), keeps it in ``OUTPUT/steps.bin`` (12 bytes a
step, written in chunks), and flags a step whose loss is far above the steps before it
(:class:`SpikeRule`). A flagged step is named by the ``daskfeed rows`` command that lists its
rows: in ``OUTPUT/spikes.json``, the closing summary, ``history.json`` and on the dashboard.
:func:`loss_steps` reads the series back.

``steps.bin``: a 16-byte header (``DFLOSS``, a version byte pair, the record size and flags: bit
0 set when the steps are the trainer's own batches, the run having no global order), then one
record per step, ``<iif``: the epoch (from 0), the batch of the epoch's global order (from 0) and
the loss as float32. A resumed run appends: the steps it trains again after its checkpoint
follow the stopped run's records of them, and readers take a step's last record.

Precision. Keras gives ``on_train_batch_end`` the epoch's running mean of the loss, weighted by
the rows of each batch, kept in float32 (its ``Mean`` metric: a float32 total and count). A
step's loss is recovered by differencing the running sums in float64, ``S_i = mean_i * rows_i``
(rows trained in the epoch so far), ``loss_i = (S_i - S_{i-1}) / rows of step i``: the float32
rounding of the total and of the mean, a few times ``6e-8 * S_i``, is divided by one batch's
rows, so the error grows with the steps of the epoch so far, about ``2e-7 * mean_i * i``
(``2e-3`` times the loss 10,000 steps in; after a spike, its share of the sum counts too).
Enough to see a spike, which is many times the loss; not a figure to compare to the fourth
digit late in a long epoch. Keras' count of rows is exact up to 2^24 (16.7M) rows an
epoch. With ``steps_per_execution=N`` Keras reports once per group of ``N`` steps: a record
covers the group (its first batch, the group's mean loss). A resumed epoch starts its running
mean afresh at the checkpoint's batch.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import struct
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed.adapters import keras
from daskfeed.core import DataNotFoundError, write_file

if TYPE_CHECKING:
    import pandas as pd

    from daskfeed.adapters import DaskSequence

STEPS = "steps.bin"
SPIKES = "spikes.json"
MAGIC = b"DFLOSS\x00\x01"
HEADER = struct.Struct("<8sII")  # magic, record size, flags
RECORD = struct.Struct("<iif")  # epoch, batch of the epoch's order (both from 0), loss
OWN_BATCHES = 1  # flags: the steps are the trainer's own batches (no global order)
KEPT = 1000  # flagged steps kept in spikes.json (the latest)
SUMMARY_LINES = 10  # flagged steps named in the closing summary


@dataclass(frozen=True)
class SpikeRule:
    """When a step's loss is far above its neighbourhood.

    A step is flagged when its loss exceeds ``median + k * scale`` of the ``window`` steps before
    it, ``scale`` being their median absolute deviation (times 1.4826: a standard deviation for
    normal noise), at least ``floor`` times the median's magnitude (and 1e-6): a run whose loss
    barely moves is not flagged at every wobble. No step is flagged before ``warmup`` steps are
    there to compare with (a run's first steps). A non-finite loss is flagged where the step
    before had a finite one (the first NaN, not those after it).

    A spike's update disturbs the model: the steps after it train at a raised loss, for reasons
    that are not in their rows. A step within ``after`` steps of a flagged one, whose excess over
    its median is less than the flagged step's over ``ratio``, is taken for that aftermath and
    not flagged; two spikes of a like size close together both are.

    The defaults: ``k=8`` scaled MADs, far outside a batch's noise (a batch loss's right tail is
    heavier than normal noise's, hence not 3 or 4; measured: the largest step of a clean run
    of the demo data, 376 steps, was 5.1 MADs above its neighbourhood; in a run on a few corrupted
    labels the spikes were over 800, their aftermath up to 15); ``window=64`` steps span a fraction
    of an epoch, so the median follows the loss as it falls; ``warmup=16``; ``floor=0.02``;
    ``after=16``, ``ratio=4``.
    """

    k: float = 8.0
    window: int = 64
    warmup: int = 16
    floor: float = 0.02
    after: int = 16
    ratio: float = 4.0

    def threshold(self, before: Sequence[float]) -> tuple[float, float] | None:
        """The neighbourhood's median and the loss above which a step is flagged.

        Parameters
        ----------
        before
            The finite losses of the steps before, the latest last (only the last ``window``
            count).

        Returns
        -------
        tuple of float or None
            ``(median, threshold)``; None before ``warmup`` steps.
        """
        near = np.asarray(before[-self.window:], dtype="float64")
        if len(near) < self.warmup:
            return None
        med = float(np.median(near))
        mad = 1.4826 * float(np.median(np.abs(near - med)))
        return med, med + self.k * max(mad, self.floor * abs(med), 1e-6)

    def flags(self, losses: Iterable[float]) -> np.ndarray:
        """Which of a series of step losses are flagged (the rule applied step by step).

        Parameters
        ----------
        losses
            The losses in the order trained.

        Returns
        -------
        numpy.ndarray
            One bool per loss.
        """
        detector = SpikeDetector(self)
        return np.array([detector.check(float(loss)) is not None for loss in losses], dtype=bool)


class SpikeDetector:
    """A :class:`SpikeRule` applied to one series, step by step (what it remembers of the steps).

    Parameters
    ----------
    rule
        The rule.
    before
        Losses of earlier steps (a resumed run's series), the latest last.
    """

    def __init__(self, rule: SpikeRule, before: Iterable[float] = ()) -> None:
        self.rule = rule
        self.near: deque[float] = deque((x for x in before if math.isfinite(x)), maxlen=rule.window)
        self._finite = True
        self._since = rule.after  # steps since the last flagged step
        self._excess = 0.0  # the last flagged step's loss over its median

    def check(self, loss: float) -> tuple[float | None, float | None] | None:
        """Take the next step's loss; say whether it is flagged.

        Parameters
        ----------
        loss
            The step's loss.

        Returns
        -------
        tuple or None
            ``(median, threshold)`` of its neighbourhood when flagged (None each for a first
            non-finite loss before ``warmup`` steps), else None.
        """
        rule, finite_before = self.rule, self._finite
        limit = rule.threshold(list(self.near))
        self._finite = math.isfinite(loss)
        self._since += 1
        if not self._finite:
            hit: tuple[float | None, float | None] | None = (
                (limit or (None, None)) if finite_before and self.near else None)
        else:
            self.near.append(loss)
            excess = loss - limit[0] if limit is not None else 0.0
            aftermath = self._since <= rule.after and excess * rule.ratio < self._excess
            hit = limit if limit is not None and loss > limit[1] and not aftermath else None
        if hit is not None:
            self._since = 0
            self._excess = loss - hit[0] if self._finite and hit[0] is not None else math.inf
        return hit


def step_losses(means: Sequence[float], rows: Sequence[int]) -> np.ndarray:
    """Each step's loss from Keras' running means of an epoch (see the module's precision note).

    Parameters
    ----------
    means
        The running mean after each step (``logs["loss"]`` of ``on_train_batch_end``).
    rows
        The rows of each step.

    Returns
    -------
    numpy.ndarray
        float64 losses, one per step.
    """
    n = np.cumsum(np.asarray(rows, dtype="float64"))
    sums = np.asarray(means, dtype="float64") * n
    return np.diff(sums, prepend=0.0) / np.asarray(rows, dtype="float64")


def rows_command(out: str, epoch: int, steps: Sequence[int]) -> str:
    """The ``daskfeed rows`` command that lists the rows of ``steps`` (batches of the order, from 0).

    Parameters
    ----------
    out
        The run's output directory.
    epoch
        The epoch, from 0.
    steps
        The batches of the epoch's global order, from 0 (a group of steps: ``--step A-B`` when
        they follow each other, else the first).

    Returns
    -------
    str
        The command, its numbers from 1 as the progress bar counts.
    """
    first, last = steps[0] + 1, steps[-1] + 1
    contiguous = list(steps) == list(range(steps[0], steps[-1] + 1))
    step = f"{first}-{last}" if contiguous and last > first else f"{first}"
    return f"daskfeed rows {shlex.quote(out)} --epoch {epoch + 1} --step {step}"


NO_ORDER = ("no command: the run has no global order (the parse cache is off, its buckets had no "
            "disk room, or the data are a dask DataFrame), so daskfeed rows cannot recompute a batch")


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
        self.flagged: list[dict[str, Any]] = [] if fresh else _read_spikes(out)
        self.steps = 0  # records this run
        self._buffer = bytearray()
        self._pending: list[dict[str, Any]] = []  # flagged, not yet reported to the dashboard
        self._checkpoints = len(saved)
        self._written = time.monotonic()
        self._open(fresh)
        self._epoch = self._start = self._begin = 0
        self._rows = 0  # rows trained in this fit's epoch so far
        self._sum = 0.0  # their loss, summed (float64)

    def _open(self, fresh: bool) -> None:
        header = HEADER.pack(MAGIC, RECORD.size, self.flags)
        old = _header(self.path) if not fresh else None
        if old != header:  # fresh, none yet, or another numbering: start the series anew
            write_file(self.path, header)
            self.flagged = []
            write_file(os.path.join(self.out, SPIKES), json.dumps(self.report(), indent=1))
            self.detector = SpikeDetector(self.rule)
            return
        whole = HEADER.size + (os.path.getsize(self.path) - HEADER.size) // RECORD.size * RECORD.size
        if os.path.getsize(self.path) != whole:  # a record cut short (a kill mid-write): cut it off
            os.truncate(self.path, whole)  # (else every record appended after it reads shifted)
        before = [float(loss) for _, _, loss in _records(self.path, last=self.rule.window)]
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
        """Recover the step's loss, keep it, flag it if it is far above its neighbourhood.

        Parameters
        ----------
        batch
            The batch within this fit's epoch (not used: its meaning depends on the Keras
            version; the group is counted from ``on_train_batch_begin``).
        logs
            Keras' logs: ``loss`` is the epoch's running mean.
        """
        mean = _float((logs or {}).get("loss"))
        if mean is None:
            return
        plan = self.sequence.stream.plan_of(self._epoch)  # (the stream may be in the next)
        group = int(getattr(self.model, "steps_per_execution", 1) or 1)
        first = self._start + self._begin
        mine = range(first, min(first + group, plan.num_batches))
        rows = sum(plan.batch_rows(b) for b in mine) or 1
        self._rows += rows
        total = mean * self._rows
        loss, self._sum = (total - self._sum) / rows, total
        self._keep(first, mine, loss)
        if len(self.saved) != self._checkpoints or len(self._buffer) >= self.chunk * RECORD.size \
                or time.monotonic() - self._written >= self.flush_seconds:
            self._checkpoints = len(self.saved)
            self.flush()

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
    def _keep(self, first: int, mine: range, loss: float) -> None:
        stream, epoch = self.sequence.stream, self._epoch
        order = [stream.order_batch(b, epoch) for b in mine]
        step = first if order[0] is None else int(order[0])
        self._buffer += RECORD.pack(epoch, step, loss)
        self.steps += 1
        hit = self.detector.check(loss)
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
        taken, self._pending = self._pending[:most], self._pending[most:]
        return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}
                for m in taken]

    def flush(self) -> None:
        """Append the waiting records to ``steps.bin``; rewrite ``spikes.json``."""
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
        out: dict[str, Any] = {"rule": asdict(self.rule), "steps_file": STEPS,
                               "numbering": "trainer" if self.flags & OWN_BATCHES else "order",
                               "flagged": [_json(m) for m in self.flagged]}
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
        r = self.rule
        if not self.flagged:
            return [f"loss spikes: none flagged ({self.steps:,} steps kept in {self.path})"]
        lines = [f"loss spikes: {len(self.flagged)} step{'s' if len(self.flagged) != 1 else ''} far "
                 f"above their neighbourhood (loss > median + {r.k:g} MADs of the {r.window} steps "
                 "before); the rows of each:"]
        for m in self.flagged[:SUMMARY_LINES]:
            median = m.get("median")
            near = f" (its neighbourhood's median {_fmt(median)})" if median is not None else ""
            lines.append(f"  epoch {m['epoch']} step {m['step']}: loss {_fmt(m['loss'])}{near}: "
                         f"{m['command'] or NO_ORDER}")
        if len(self.flagged) > SUMMARY_LINES:
            lines.append(f"  ... and {len(self.flagged) - SUMMARY_LINES} more in "
                         f"{os.path.join(self.out, SPIKES)}")
        return lines


def loss_steps(output: str | os.PathLike[str]) -> pd.DataFrame:
    """Every step's loss of a run, read from its ``steps.bin``, and whether it was flagged.

    Parameters
    ----------
    output
        The run's output directory (``daskfeed train --output``).

    Returns
    -------
    pandas.DataFrame
        ``epoch`` and ``step`` (from 1, as ``daskfeed rows`` takes them: the batch of the epoch's
        order, or the trainer's own batch when the run had no global order), ``loss`` (float32
        as kept) and ``flagged``, one row per step in the order trained; a step trained again
        after a resume has its last record. ``attrs["numbering"]`` says ``order`` or
        ``trainer``; ``attrs["rule"]`` the rule that flagged.

    Raises
    ------
    DataNotFoundError
        When ``output`` has no ``steps.bin`` (a run of an older daskfeed, or not a run).
    """
    import pandas as pd

    path = os.path.join(os.fspath(output), STEPS)
    head = _header(path)
    if head is None:
        raise DataNotFoundError(
            f"Expected a run's per-step losses at {path}. Received: no such file (or not one "
            "daskfeed wrote).\nHint: give the --output of a daskfeed train run; runs of daskfeed "
            "before the per-step series have none.")
    recs = np.array(list(_records(path)), dtype=[("epoch", "<i4"), ("step", "<i4"), ("loss", "<f4")])
    frame = pd.DataFrame({"epoch": recs["epoch"].astype("int64") + 1,
                          "step": recs["step"].astype("int64") + 1, "loss": recs["loss"]})
    frame = frame.drop_duplicates(["epoch", "step"], keep="last").reset_index(drop=True)
    spikes = _read_spikes(os.fspath(output))
    marked = {(int(m["epoch"]), int(m["step"])) for m in spikes}
    frame["flagged"] = [(e, s) in marked for e, s in zip(frame["epoch"], frame["step"], strict=True)]
    flags = HEADER.unpack(head)[2]
    frame.attrs.update(numbering="trainer" if flags & OWN_BATCHES else "order", rule=_rule(output))
    return frame


def _header(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except OSError:
        return None
    return head if len(head) == HEADER.size and head.startswith(MAGIC) else None


def _records(path: str, last: int | None = None) -> Iterable[tuple[int, int, float]]:
    """The records of ``steps.bin`` (the ``last`` ones only); a torn last record is left out."""
    size = os.path.getsize(path) - HEADER.size
    count = size // RECORD.size
    skip = 0 if last is None else max(count - last, 0)
    with open(path, "rb") as f:
        f.seek(HEADER.size + skip * RECORD.size)
        raw = f.read((count - skip) * RECORD.size)
    return RECORD.iter_unpack(raw)


def _read_spikes(out: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(out, SPIKES), encoding="utf-8") as f:
            return list(json.load(f).get("flagged") or [])
    except (OSError, ValueError):
        return []


def _rule(out: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        with open(os.path.join(os.fspath(out), SPIKES), encoding="utf-8") as f:
            return dict(json.load(f).get("rule") or {})
    except (OSError, ValueError):
        return None


def _float(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)


def _json(mark: dict[str, Any]) -> dict[str, Any]:
    """A mark as JSON has it (NaN and infinities as strings)."""
    return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in mark.items()}

