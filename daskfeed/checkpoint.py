"""Checkpoints for exact resume: model + optimizer state + the data cursor, written atomically.

A checkpoint is a directory ``<output>/checkpoints/ckpt-<epoch>-<batch>/`` holding

* ``model.weights.h5`` -- ``model.save_weights``: every layer's weights *and* the optimizer's
  variables (its ``iterations`` counter, Adam's moments, ...), so training continues with the
  same optimizer state;
* ``state.json`` -- the data :class:`Cursor` (epoch, next batch, seed, batch size, manifest
  fingerprint, and what else fixes the batch order), the history of the completed epochs,
  the optimizer's iteration count, and the size and SHA-256 of every file of the checkpoint.

It is written into a temporary directory beside it, each file fsync'ed, then renamed into
place with ``os.replace``: a crash while writing leaves the previous checkpoints untouched and
never a half-written one under a checkpoint's name. The last :data:`KEEP` checkpoints are kept;
when the newest is unreadable (truncated, corrupt) :meth:`CheckpointStore.latest` warns and
falls back to the previous good one.

What "exact" means. The cursor of a checkpoint is the first batch *not yet trained*: batches
before it were trained and are committed in the saved weights. Resuming (``train(resume=True)``,
``daskfeed train --resume``) continues the interrupted epoch at that batch, in the same order
(plans are a pure function of the data, seed, batch size and epoch), so every row of that epoch
is trained exactly once counting committed progress. Batches trained after the last checkpoint
but before the process died were never committed: their effect on the weights is lost with the
process, and they are trained again after the resume (once in the weights that survive).
Checkpoint more often (``checkpoint_every``) to lose less work.

How the cursor is counted. Keras' ``batch`` argument of ``on_train_batch_end`` is not a
batch count one can rely on: with ``steps_per_execution=N`` a callback comes once per group of
``N`` batches and its ``batch`` is the group's *last* batch in Keras 3.15 but its *first* in
Keras 3.10 and 3.3. The cursor is therefore counted from the optimizer's step counter: the next
batch is the epoch's start batch plus the steps the optimizer took since the epoch began. The
counter is the raw one, which counts every batch also with ``gradient_accumulation_steps``
(Keras 3.5+ keeps it in ``optimizer._iterations``; its public ``iterations`` is then the number
of *applied* updates, ``batches // gradient_accumulation_steps``). The count is checked against
what the group just run can have trained (batches ``begin + 1 .. begin + N``, ``begin`` being
the group's first batch, which ``on_train_batch_begin`` receives in every Keras 3 release).
Where the optimizer does not take exactly one step per batch -- a model without an optimizer,
a ``LossScaleOptimizer`` (mixed precision: it skips the steps whose gradients overflow), a
``train_step`` that applies it twice or never -- the cursor is the end of that group instead
(``begin + N``, or the end of the epoch), with a warning when the count was out of range.

An epoch cut short by ``model.stop_training`` (set by a callback after a batch) ends with a
checkpoint at its true next batch, not with an epoch-end checkpoint, and :func:`fit_from`
then stops, as ``fit`` does.

Early stopping survives a resume. :class:`EarlyStopping` is Keras' callback whose state --
epochs waited, best value and epoch, whether it stopped, and the best weights -- the
:class:`Checkpointer` writes into every checkpoint (``state.json`` and
``best.weights.npz``), and that carries on across the two ``fit`` calls of :func:`fit_from`;
restored, a resumed run stops at the epoch the uninterrupted run would have stopped at and
restores the same best weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from daskfeed._keras import keras
from daskfeed.exceptions import CheckpointError

__all__ = ["KEEP", "Checkpoint", "CheckpointStore", "Checkpointer", "Cursor", "EarlyStopping",
           "fit_from", "open_store", "optimizer_steps"]

KEEP = 2
"""Checkpoints kept: the newest and the one before it (the fallback)."""

VERSION = 1
WEIGHTS = "model.weights.h5"
BEST = "best.weights.npz"  # EarlyStopping's best weights (model.get_weights(), in order)
STATE = "state.json"
_NAME = re.compile(r"^ckpt-(\d{6,})-(\d{9,})$")


@dataclass(frozen=True)
class Cursor:
    """Where training stands in the data: epoch ``epoch`` continues at batch ``batch``.

    The other fields fix the order of the batches; resuming requires all of them to match.
    """

    epoch: int
    batch: int
    seed: int
    batch_size: int
    fingerprint: str
    num_batches: int
    rows: int
    window_rows: int
    blocksize: int
    shuffle: bool
    drop_remainder: bool
    label: str
    features: tuple[str, ...]
    shard: tuple[int, int] = (0, 1)
    validation_split: float = 0.0  # the training part of a split (0: the whole data)

    @classmethod
    def of(cls, seq: Any, epoch: int, batch: int) -> Cursor:
        """The cursor of :class:`~daskfeed.DaskSequence` ``seq`` at ``(epoch, batch)``."""
        return cls(
            epoch=int(epoch), batch=int(batch), seed=seq.seed, batch_size=seq.batch_size,
            fingerprint=seq.manifest.fingerprint, num_batches=seq.plan.num_batches,
            rows=seq.plan.rows, window_rows=seq.window_rows,
            blocksize=seq.source.options.blocksize, shuffle=seq.shuffle,
            drop_remainder=seq.drop_remainder, label=seq.label, features=tuple(seq.features),
            shard=tuple(seq.shard),  # type: ignore[arg-type]
            validation_split=float(getattr(seq, "validation_split", 0.0)),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cursor:
        """Inverse of ``asdict``."""
        d = dict(d)
        d["features"] = tuple(d["features"])
        d["shard"] = tuple(d.get("shard", (0, 1)))
        return cls(**d)

    def check(self, other: Cursor, where: str) -> None:
        """Refuse to resume with ``other`` (the current run) unless it has the same batches.

        Raises
        ------
        CheckpointError
            Naming what differs, the checkpoint's value, the received one, and a hint.
        """
        if self.fingerprint != other.fingerprint:
            raise CheckpointError(
                f"The checkpoint {where} was made on other data: expected data with fingerprint "
                f"{self.fingerprint} ({self.rows:,} rows, {self.num_batches} batches per epoch). "
                f"Received: fingerprint {other.fingerprint} ({other.rows:,} rows; files, sizes, "
                "mtimes or read options changed).\nHint: resume on exactly the files the run "
                "started with, or train from scratch without --resume (the old checkpoints are "
                "then removed)."
            )
        flag = {"batch_size": "--batch-size", "seed": "--seed", "label": "--label",
                "features": "--features/--exclude", "validation_split": "--validation-split",
                "window_rows": "the same --memory-limit (it sets the window size) and"}
        for name in ("batch_size", "seed", "label", "features", "validation_split", "shuffle",
                     "drop_remainder", "shard", "num_batches", "rows", "window_rows"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                shown = ",".join(mine) if name == "features" else mine
                raise CheckpointError(
                    f"The checkpoint {where} was made with {name}={mine!r}; resuming needs the "
                    f"same batches. Received: {name}={theirs!r}.\nHint: resume with "
                    f"{flag.get(name, name)} {shown}, or train from scratch without --resume "
                    "(the old checkpoints are then removed)."
                )


@dataclass
class Checkpoint:
    """A checkpoint read back from disk (validated)."""

    path: str
    cursor: Cursor
    history: list[dict[str, Any]] = field(default_factory=list)
    iterations: int | None = None
    """The optimizer's raw step counter (:func:`optimizer_steps`); None: no optimizer."""
    created: float = 0.0
    early_stopping: dict[str, Any] | None = None
    """:meth:`EarlyStopping.get_state` when the run had early stopping."""

    @property
    def weights(self) -> str:
        """Path of the weights file (model and optimizer variables)."""
        return os.path.join(self.path, WEIGHTS)

    def best_weights(self) -> list[np.ndarray] | None:
        """EarlyStopping's best weights saved with this checkpoint (None: none saved)."""
        path = os.path.join(self.path, BEST)
        if not os.path.exists(path):
            return None
        with np.load(path) as z:
            return [z[f"arr_{i}"] for i in range(len(z.files))]

    def restore(self, model: Any) -> None:
        """Load the weights and optimizer state into ``model`` (built and compiled like the saved one).

        Raises
        ------
        CheckpointError
            When the model does not fit the checkpoint, or the optimizer's iteration count
            read back differs from the saved one.
        """
        if not model.built:
            raise CheckpointError(
                f"Expected a built model to restore the checkpoint {self.path} into. Received: an "
                f"unbuilt {type(model).__name__}.\nHint: build the model in your builder (e.g. "
                "call it on keras.Input tensors) before returning it."
            )
        opt = getattr(model, "optimizer", None)
        if opt is not None and not opt.built:
            opt.build(model.trainable_variables)  # create its variables so they can be loaded
        try:
            model.load_weights(self.weights)
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise CheckpointError(
                f"The checkpoint {self.path} does not fit this model: {first}\nHint: resume with "
                "the same model (--model builder and its settings) the run started with."
            ) from err
        if opt is not None and self.iterations is not None:
            got = optimizer_steps(model)
            if got != self.iterations:
                raise CheckpointError(
                    f"Expected the optimizer to resume at iteration {self.iterations} (checkpoint "
                    f"{self.path}). Received: {got}.\nHint: resume with the same optimizer."
                )


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _jsonable(v: Any) -> Any:
    if isinstance(v, (int, str, bool)) or v is None:
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


class CheckpointStore:
    """The checkpoints of one output directory (``<output>/checkpoints``, mode 0700).

    Parameters
    ----------
    directory
        Where the checkpoints live; created (0700) on the first save.
    keep
        How many checkpoints to keep (at least 2, so there is a fallback).
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = KEEP) -> None:
        self.directory = os.fspath(directory)
        self.keep = max(2, int(keep))

    # -- listing -----------------------------------------------------------------------
    def names(self) -> list[str]:
        """Checkpoint directory names, oldest first (ordered by epoch, then batch)."""
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = [(tuple(int(g) for g in m.groups()), n) for n in entries if (m := _NAME.match(n))]
        return [n for _, n in sorted(found)]

    def read(self, name: str) -> Checkpoint:
        """Read and validate one checkpoint (sizes and SHA-256 of its files).

        Raises
        ------
        CheckpointError
            When it is incomplete, truncated or corrupt.
        """
        path = os.path.join(self.directory, name)
        try:
            with open(os.path.join(path, STATE), encoding="utf-8") as f:
                state = json.load(f)
            if state.get("version") != VERSION:
                raise ValueError(f"version {state.get('version')!r}, expected {VERSION}")
            for fname, meta in state["files"].items():
                fpath = os.path.join(path, fname)
                size = os.path.getsize(fpath)
                if size != meta["size"]:
                    raise ValueError(f"{fname} has {size} bytes, expected {meta['size']} (truncated?)")
                if _digest(fpath) != meta["sha256"]:
                    raise ValueError(f"{fname} does not match its SHA-256 (corrupt)")
            if WEIGHTS not in state["files"]:
                raise ValueError(f"no {WEIGHTS}")
            if state.get("early_stopping", {}).get("best_weights") and BEST not in state["files"]:
                raise ValueError(f"no {BEST}")
            cursor = Cursor.from_dict(state["cursor"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"The checkpoint {path} is unreadable: {err}.\nHint: it was damaged after it was "
                "written (it is written atomically); an older checkpoint can be used instead."
            ) from err
        return Checkpoint(path, cursor, list(state.get("history", [])), state.get("iterations"),
                          float(state.get("created", 0.0)), state.get("early_stopping"))

    def latest(self, warn: Callable[[str], None] | None = None) -> Checkpoint | None:
        """The newest readable checkpoint, or None when there is none.

        An unreadable newer one is renamed ``<name>.corrupt`` (kept for inspection, never
        used again) and a warning says which checkpoint is used instead.

        Raises
        ------
        CheckpointError
            When there are checkpoints but none of them is readable.
        """
        errors = []
        for name in reversed(self.names()):
            try:
                ckpt = self.read(name)
            except CheckpointError as err:
                errors.append(str(err).split("\nHint:")[0])
                bad = os.path.join(self.directory, name)
                shutil.rmtree(f"{bad}.corrupt", ignore_errors=True)  # the same one damaged before
                os.replace(bad, f"{bad}.corrupt")
                continue
            if errors:
                msg = (f"{' '.join(errors)} Resuming from the previous good checkpoint {ckpt.path} "
                       f"instead (epoch {ckpt.cursor.epoch}, batch {ckpt.cursor.batch}); the "
                       "damaged one was renamed *.corrupt.")
                warnings.warn(msg, stacklevel=2)
                if warn is not None:
                    warn(f"warning: {msg}")
            return ckpt
        if errors:
            raise CheckpointError(
                f"No readable checkpoint in {self.directory}: {' '.join(errors)}\nHint: train from "
                "scratch without --resume."
            )
        return None

    # -- writing -----------------------------------------------------------------------
    def _prepare(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)

    def save(self, model: Any, cursor: Cursor, history: list[dict[str, Any]] | None = None,
             early_stopping: EarlyStopping | None = None) -> str:
        """Write a checkpoint of ``model`` (weights + optimizer) at ``cursor``; return its path.

        With ``early_stopping``, its state goes into ``state.json`` and its best weights into
        ``best.weights.npz``. Written into a temporary directory and renamed into place
        (``os.replace``); then only the newest ``keep`` checkpoints are kept.
        """
        self._prepare()
        name = f"ckpt-{cursor.epoch:06d}-{cursor.batch:09d}"
        final = os.path.join(self.directory, name)
        tmp = os.path.join(self.directory, f".tmp-{name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        try:
            weights = os.path.join(tmp, WEIGHTS)
            model.save_weights(weights)
            with open(weights, "rb+") as f:
                os.fsync(f.fileno())
            files = [weights]
            state: dict[str, Any] = {
                "version": VERSION,
                "cursor": asdict(cursor),
                "history": [{k: _jsonable(v) for k, v in rec.items()} for rec in history or []],
                "iterations": optimizer_steps(model),
                "created": time.time(),
            }
            if early_stopping is not None:
                state["early_stopping"] = early_stopping.get_state()
                if early_stopping.best_weights is not None:
                    files.append(_save_arrays(os.path.join(tmp, BEST), early_stopping.best_weights))
            state["files"] = {os.path.basename(p): {"size": os.path.getsize(p), "sha256": _digest(p)}
                              for p in files}
            with open(os.path.join(tmp, STATE), "w", encoding="utf-8") as f:
                json.dump(state, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            if os.path.exists(final):  # the same cursor again (e.g. after a fallback): replace it
                old = os.path.join(self.directory, f".old-{name}-{os.getpid()}")
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def _prune(self) -> None:
        names = self.names()
        for name in names[: max(0, len(names) - self.keep)]:
            shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        for entry in os.listdir(self.directory):  # leftovers of writers killed mid-write
            if entry.startswith((".tmp-", ".old-")) and not entry.endswith(f"-{os.getpid()}"):
                shutil.rmtree(os.path.join(self.directory, entry), ignore_errors=True)

    def clear(self) -> int:
        """Remove every checkpoint (a fresh run); return how many there were."""
        n = len(self.names())
        if os.path.isdir(self.directory):
            for entry in os.listdir(self.directory):
                if _NAME.match(entry.removesuffix(".corrupt")) or entry.startswith((".tmp-", ".old-")):
                    shutil.rmtree(os.path.join(self.directory, entry), ignore_errors=True)
        return n


def _save_arrays(path: str, arrays: list[Any]) -> str:
    """Write ``arrays`` (in order) to an ``.npz`` file, fsync'ed; return its path."""
    buf = io.BytesIO()
    np.savez(buf, *[np.asarray(a) for a in arrays])  # arr_0, arr_1, ... in order
    with open(path, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())
    return path


def _step_variable(model: Any) -> Any:
    """The optimizer variable that counts train steps, or None when there is no optimizer.

    Keras 3.5+ keeps the raw count in ``_iterations`` and makes ``iterations`` the count of
    applied updates when ``gradient_accumulation_steps`` is set; before 3.5 ``iterations`` is
    the raw count itself. A ``LossScaleOptimizer`` counts in its inner optimizer.
    """
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return None
    opt = getattr(opt, "inner_optimizer", opt)
    raw = getattr(opt, "_iterations", None)
    return raw if raw is not None else opt.iterations


def optimizer_steps(model: Any) -> int | None:
    """The train steps ``model``'s optimizer has taken (every batch, accumulated or applied).

    Parameters
    ----------
    model
        A compiled Keras model.

    Returns
    -------
    int or None
        The raw step counter (also with ``gradient_accumulation_steps``); None when the model
        has no optimizer.
    """
    var = _step_variable(model)
    return None if var is None else int(keras.ops.convert_to_numpy(var))


def _counts_batches(model: Any) -> bool:
    """Whether ``model``'s optimizer takes one step per trained batch (so it can count them).

    Not without an optimizer, nor with a ``LossScaleOptimizer``: it skips the inner
    optimizer's step when the gradients overflow.
    """
    opt = getattr(model, "optimizer", None)
    return opt is not None and not hasattr(opt, "inner_optimizer")


class Checkpointer(keras.callbacks.Callback):
    """Keras callback: a checkpoint every ``every`` batches and at the end of every epoch.

    A mid-epoch checkpoint is written when the next batch to train crosses a multiple of
    ``every`` (counted from the epoch's batch 0, also in a resumed epoch); its cursor is that
    true next batch, counted from the optimizer's steps (see the module docstring), so it is
    exact whatever ``every`` and the model's ``steps_per_execution`` are (with
    ``steps_per_execution=4`` callbacks, hence checkpoints, come every 4 batches at most).
    ``every=0`` writes only the epoch-end ones. The epoch-end checkpoint is written after
    validation, with the cursor at ``(epoch + 1, 0)`` and the epoch's record (Keras logs +
    ``telemetry``'s) in the history; an epoch cut short by ``model.stop_training`` gets a
    checkpoint at its true next batch instead, and no record.

    Parameters
    ----------
    store
        Where to write.
    sequence
        The training :class:`~daskfeed.DaskSequence` (its ``start`` gives the offset of a
        resumed epoch).
    every
        Batches between mid-epoch checkpoints; 0: at epoch ends only.
    history
        Records of the epochs completed before this run (from the resumed checkpoint).
    telemetry
        An :class:`~daskfeed.model.EpochTelemetry` placed before this callback; its records
        are merged into the history.
    early_stopping
        An :class:`EarlyStopping` placed before this callback: its state (and best weights)
        is saved with every checkpoint, so a resumed run keeps its patience.

    Attributes
    ----------
    saved
        Paths of the checkpoints written, in order.
    cursors
        ``(epoch, batch)`` of each of them.
    """

    def __init__(self, store: CheckpointStore, sequence: Any, *, every: int = 0,
                 history: list[dict[str, Any]] | None = None, telemetry: Any = None,
                 early_stopping: EarlyStopping | None = None) -> None:
        super().__init__()
        self.store = store
        self.sequence = sequence
        self.every = max(0, int(every))
        self.history: list[dict[str, Any]] = list(history or [])
        self.telemetry = telemetry
        self.early_stopping = early_stopping
        self.saved: list[str] = []
        self.cursors: list[tuple[int, int]] = []
        self._epoch = 0
        self._start = 0  # the batch this epoch started at (> 0 in a resumed epoch)
        self._begin = 0  # first batch (within this fit's epoch) of the group being trained
        self._next = 0  # the next batch to train (within the whole epoch)
        self._base: int | None = None  # optimizer steps at epoch begin; None: not counted
        self._warned = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the epoch, the batch it starts at, and the optimizer's step count."""
        self._epoch = int(epoch)
        self._start = self._next = int(self.sequence.start)
        self._base = optimizer_steps(self.model) if _counts_batches(self.model) else None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the group's first batch (what every Keras 3 passes here)."""
        self._begin = int(batch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Count the batches trained; checkpoint when the next one crosses a multiple of ``every``.

        ``batch`` itself is not used: its meaning depends on the Keras version.
        """
        last, self._next = self._next, self._trained_to()
        if not self.every or self._next >= self.sequence.plan.num_batches:
            return  # the epoch-end checkpoint follows
        if self._next // self.every > last // self.every:
            self._save(self._epoch, self._next)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the epoch and checkpoint at the start of the next one (or where it stopped)."""
        if self._next < self.sequence.plan.num_batches and getattr(self.model, "stop_training", False):
            if self.cursors[-1:] != [(self._epoch, self._next)]:
                self._save(self._epoch, self._next)  # stopped mid-epoch: not a complete epoch
            return
        rec = {k: _jsonable(v) for k, v in (logs or {}).items()}
        if self.telemetry is not None and self.telemetry.epochs:
            rec.update(self.telemetry.epochs[-1])
        rec["epoch"] = int(epoch)
        if self._start:
            rec["resumed_at_batch"] = self._start
        self.history.append(rec)
        self._save(int(epoch) + 1, 0)

    def _trained_to(self) -> int:
        """The next batch to train after the group that just ran (see the module docstring)."""
        group = int(getattr(self.model, "steps_per_execution", 1) or 1)
        low = self._start + self._begin + 1
        high = min(self._start + self._begin + group, self.sequence.plan.num_batches)
        if self._base is None:
            return high
        counted = self._start + optimizer_steps(self.model) - self._base
        if low <= counted <= high:
            return counted
        self._warn(counted, low, high)
        return high

    def _warn(self, counted: int, low: int, high: int) -> None:
        if self._warned:
            return
        self._warned = True
        span = f"{low}" if low == high else f"{low} .. {high}"
        warnings.warn(
            f"Checkpoints of epoch {self._epoch}: the optimizer's step count puts the next batch "
            f"at {counted}, but the group of steps Keras just ran puts it at {span}: the optimizer "
            "does not take one step per batch (a custom train_step?). Checkpoint cursors are "
            "counted from Keras' batch numbers instead.", stacklevel=2)

    def _save(self, epoch: int, batch: int) -> None:
        cursor = Cursor.of(self.sequence, epoch, batch)
        self.saved.append(self.store.save(self.model, cursor, self.history, self.early_stopping))
        self.cursors.append((epoch, batch))


def open_store(output: str | os.PathLike[str], *, resume: bool,
               echo: Callable[[str], None] = print) -> tuple[CheckpointStore, Checkpoint | None]:
    """The checkpoint store of ``output`` and the checkpoint to resume from (None: from scratch).

    Without ``resume`` the checkpoints of an earlier run in ``output`` are removed (they would
    mix with this run's). With ``resume`` and no checkpoint, training starts from scratch, as
    Keras' ``BackupAndRestore`` does; both cases are echoed.
    """
    store = CheckpointStore(os.path.join(os.fspath(output), "checkpoints"))
    if not resume:
        n = store.clear()
        if n:
            echo(f"removed {n} checkpoint{'s' if n > 1 else ''} of an earlier run in "
                 f"{store.directory} (pass --resume to continue a run)")
        return store, None
    ckpt = store.latest(warn=echo)
    if ckpt is None:
        echo(f"no checkpoint in {store.directory}: starting from scratch")
    return store, ckpt


def fit_from(model: Any, sequence: Any, *, epochs: int, epoch: int = 0, batch: int = 0,
             **kwargs: Any) -> list[Any]:
    """``model.fit(sequence, ...)`` from epoch ``epoch``, batch ``batch`` to the end of ``epochs``.

    Keras fixes the steps per epoch when ``fit`` starts, so a resumed epoch (``batch > 0``)
    is fitted on its own, ``sequence`` serving its batches ``batch ..`` (see
    :meth:`~daskfeed.DaskSequence.set_epoch`), its progress bar numbered out of ``epochs``
    ("Epoch 2/6", not "Epoch 2/2"); the remaining epochs follow in a second ``fit``. Both use
    ``initial_epoch``, so epochs keep their numbers in callbacks and logs, and the optimizer
    state carries over. When a callback stops training
    (``model.stop_training``) during the resumed epoch, the remaining epochs are not fitted.
    Returns the ``History`` of each ``fit``.
    """
    fits = []
    if batch and epoch < epochs:
        sequence.set_epoch(epoch, batch)
        carried = [cb for cb in kwargs.get("callbacks") or () if isinstance(cb, EarlyStopping)]
        for cb in carried:  # one run in two fits: no restore of best weights in between
            cb.continuing = epoch + 1 < epochs
        # a bar that counts to ``epochs`` ("Epoch 2/6", not "Epoch 2/2") for this one-epoch fit
        callbacks = list(kwargs.get("callbacks") or ())
        if not any(isinstance(cb, keras.callbacks.ProgbarLogger) for cb in callbacks):
            callbacks.append(_ProgbarTo(epochs))
        try:
            fits.append(model.fit(sequence, initial_epoch=epoch, epochs=epoch + 1,
                                  **{**kwargs, "callbacks": callbacks}))
        finally:
            for cb in carried:
                cb.continuing = False
        epoch += 1
        if getattr(model, "stop_training", False):
            return fits
    if epoch < epochs:
        sequence.set_epoch(epoch)
        fits.append(model.fit(sequence, initial_epoch=epoch, epochs=epochs, **kwargs))
    return fits


class _ProgbarTo(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, numbering epochs out of ``epochs`` whatever the ``fit`` was given."""

    def __init__(self, epochs: int) -> None:
        super().__init__()
        self._total = int(epochs)

    def set_params(self, params: dict[str, Any]) -> None:
        """Keras' params, with the run's epoch count."""
        super().set_params({**params, "epochs": self._total})


class EarlyStopping(keras.callbacks.EarlyStopping):
    """Keras' ``EarlyStopping`` whose state survives a resume and :func:`fit_from`'s two fits.

    Keras' callback starts afresh in every ``fit`` (``on_train_begin``) and restores the
    best weights at the end of every ``fit``. Here the state is reset only when a run
    starts: :meth:`set_state` (from a checkpoint, :attr:`Checkpoint.early_stopping` and
    :meth:`Checkpoint.best_weights`) makes the next ``fit`` continue where the interrupted
    run was, and ``continuing`` (set by :func:`fit_from` for its first, partial-epoch fit)
    defers the restore of the best weights to the end of the run. Everything else is Keras'
    (``monitor``, ``patience``, ``mode``, ``min_delta``, ``restore_best_weights``...).

    Attributes
    ----------
    continuing
        True while a ``fit`` is only the first part of the run.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.continuing = False
        self._running = False
        self._loaded = False
        self.best_epoch = 0
        self.best: Any = None

    def get_state(self) -> dict[str, Any]:
        """What the next fit needs to go on as if never interrupted (JSON-ready)."""
        return {"monitor": self.monitor, "patience": int(self.patience), "wait": int(self.wait),
                "stopped_epoch": int(self.stopped_epoch), "best_epoch": int(self.best_epoch),
                "best": None if self.best is None else float(self.best),
                "best_weights": self.best_weights is not None}

    def set_state(self, state: dict[str, Any], best_weights: list[Any] | None = None) -> None:
        """Continue from ``state`` (:meth:`get_state` of the interrupted run) at the next fit.

        Raises
        ------
        CheckpointError
            When the checkpoint's early stopping watched another quantity.
        """
        if state.get("monitor") != self.monitor:
            raise CheckpointError(
                f"The checkpoint's early stopping monitored {state.get('monitor')!r}. Received: "
                f"monitor={self.monitor!r}.\nHint: resume with --monitor "
                f"{state.get('monitor')}, or train from scratch without --resume."
            )
        self.wait, self.stopped_epoch = int(state["wait"]), int(state["stopped_epoch"])
        self.best_epoch, self.best = int(state["best_epoch"]), state["best"]
        self.best_weights = best_weights
        self._loaded = True
        self._running = False

    @property
    def stopped(self) -> bool:
        """Whether this run stopped early."""
        return self.stopped_epoch > 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Start afresh (or from :meth:`set_state`) when a run starts; go on within one."""
        if self._running:
            return
        if not self._loaded:
            super().on_train_begin(logs)
        self._loaded = False
        self._running = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Restore the best weights when the run ends (not between :func:`fit_from`'s fits)."""
        if self.continuing and not getattr(self.model, "stop_training", False):
            return
        self._running = False
        super().on_train_end(logs)
