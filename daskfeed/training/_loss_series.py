"""The per-step loss series and its spikes, without Keras: the rule, the files, their readers.

A step's loss is recovered from Keras' running mean (:func:`step_losses`) and kept in
``OUTPUT/steps.bin``; a step whose loss is far above the steps before it is flagged
(:class:`SpikeRule`, :class:`SpikeDetector`) and named by the ``daskfeed rows`` command that
lists its rows (:func:`rows_command`), in ``OUTPUT/spikes.json``. :func:`loss_steps` reads the
series back (no Keras loaded); the callback that writes them is
:class:`daskfeed.training._spikes.StepLosses`.

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
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed.core import DataNotFoundError

if TYPE_CHECKING:
    import pandas as pd

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
        hit = self._step(loss, self.rule.threshold(list(self.near)), bool(self.near))
        if math.isfinite(loss):
            self.near.append(loss)
        return hit

    def _step(self, loss: float, limit: tuple[float, float] | None,
              seen: bool) -> tuple[float | None, float | None] | None:
        """The rule applied to one step, given its neighbourhood's ``limit``.

        ``seen``: whether any finite loss came before it. The state after the step is kept
        here; its neighbourhood (``near``) is the caller's to extend.
        """
        rule, finite_before = self.rule, self._finite
        self._finite = math.isfinite(loss)
        self._since += 1
        if not self._finite:
            hit: tuple[float | None, float | None] | None = (
                (limit or (None, None)) if finite_before and seen else None)
        else:
            excess = loss - limit[0] if limit is not None else 0.0
            aftermath = self._since <= rule.after and excess * rule.ratio < self._excess
            hit = limit if limit is not None and loss > limit[1] and not aftermath else None
        if hit is not None:
            self._since = 0
            self._excess = loss - hit[0] if self._finite and hit[0] is not None else math.inf
        return hit

    def check_many(self, losses: Sequence[float]) -> list[tuple[float | None, float | None] | None]:
        """:meth:`check` of each loss in turn, the neighbourhoods' medians computed together.

        The same results, bit for bit, as calling :meth:`check` once a step, at a fraction of
        the cost a step (a training loop's callback keeps its steps and checks them in runs).

        Parameters
        ----------
        losses
            The next steps' losses, in order.

        Returns
        -------
        list
            What :meth:`check` returns for each.
        """
        if not len(losses):
            return []
        rule = self.rule
        finite = np.isfinite(np.asarray(losses, dtype="float64"))
        series = np.concatenate([np.asarray(self.near, dtype="float64"),
                                 np.asarray(losses, dtype="float64")[finite]])
        # the finite values before each step: its neighbourhood is the last ``window`` of them
        ends = len(self.near) + np.concatenate([[0], np.cumsum(finite)[:-1]]).astype(np.int64)
        limits: list[tuple[float, float] | None] = [None] * len(losses)
        full = np.flatnonzero(ends >= rule.window)
        if len(full) and rule.window >= rule.warmup:  # (else no neighbourhood is ever enough)
            windows = np.lib.stride_tricks.sliding_window_view(series, rule.window)[ends[full] - rule.window]
            med = np.median(windows, axis=1)
            mad = 1.4826 * np.median(np.abs(windows - med[:, None]), axis=1)
            top = med + rule.k * np.maximum(np.maximum(mad, rule.floor * np.abs(med)), 1e-6)
            for i, m, t in zip(full.tolist(), med.tolist(), top.tolist(), strict=True):
                limits[i] = (m, t)
        for i in np.flatnonzero(ends < rule.window).tolist():  # (a series' first steps)
            limits[i] = rule.threshold(series[: ends[i]].tolist())
        hits = [self._step(loss, limit, seen > 0)
                for loss, limit, seen in zip(losses, limits, ends.tolist(), strict=True)]
        self.near.extend(float(x) for x in np.asarray(losses, dtype="float64")[finite])
        return hits


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
    head = read_header(path)
    if head is None:
        raise DataNotFoundError(
            f"Expected a run's per-step losses at {path}. Received: no such file (or not one "
            "daskfeed wrote).\nHint: give the --output of a daskfeed train run; runs of daskfeed "
            "before the per-step series have none.")
    recs = np.array(list(read_records(path)), dtype=[("epoch", "<i4"), ("step", "<i4"), ("loss", "<f4")])
    frame = pd.DataFrame({"epoch": recs["epoch"].astype("int64") + 1,
                          "step": recs["step"].astype("int64") + 1, "loss": recs["loss"]})
    frame = frame.drop_duplicates(["epoch", "step"], keep="last").reset_index(drop=True)
    spikes = read_spikes(os.fspath(output))
    marked = {(int(m["epoch"]), int(m["step"])) for m in spikes}
    frame["flagged"] = [(e, s) in marked for e, s in zip(frame["epoch"], frame["step"], strict=True)]
    flags = HEADER.unpack(head)[2]
    frame.attrs.update(numbering="trainer" if flags & OWN_BATCHES else "order", rule=read_rule(output))
    return frame


def read_header(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except OSError:
        return None
    return head if len(head) == HEADER.size and head.startswith(MAGIC) else None


def read_records(path: str, last: int | None = None) -> Iterable[tuple[int, int, float]]:
    """The records of ``steps.bin`` (the ``last`` ones only); a torn last record is left out."""
    size = os.path.getsize(path) - HEADER.size
    count = size // RECORD.size
    skip = 0 if last is None else max(count - last, 0)
    with open(path, "rb") as f:
        f.seek(HEADER.size + skip * RECORD.size)
        raw = f.read((count - skip) * RECORD.size)
    return RECORD.iter_unpack(raw)


def read_spikes(out: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(out, SPIKES), encoding="utf-8") as f:
            return list(json.load(f).get("flagged") or [])
    except (OSError, ValueError):
        return []


def read_rule(out: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        with open(os.path.join(os.fspath(out), SPIKES), encoding="utf-8") as f:
            return dict(json.load(f).get("rule") or {})
    except (OSError, ValueError):
        return None


def finite_float(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def shown(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)


def mark_json(mark: dict[str, Any]) -> dict[str, Any]:
    """A mark as JSON has it (NaN and infinities as strings)."""
    return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in mark.items()}
