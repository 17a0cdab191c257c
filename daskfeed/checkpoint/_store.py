"""Checkpoint store: the checkpoints of one output directory, written atomically, read with a fallback.

A checkpoint (:mod:`daskfeed.checkpoint._format`, its format) is written into a temporary directory
beside its place, each file fsync'ed, then renamed into place with ``os.replace``: a crash while
writing leaves the previous checkpoints untouched and never a half-written one under a
checkpoint's name. The last :data:`~daskfeed.checkpoint._format.KEEP` are kept; when the newest is
unreadable (truncated, corrupt) :meth:`CheckpointStore.latest` warns and falls back to the
previous good one. No keras here either: the model is handed in.
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
from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed.batches import StreamState
from daskfeed.checkpoint._format import (
    BEST,
    KEEP,
    STATE,
    VERSION,
    WEIGHTS,
    Checkpoint,
    StoppingState,
    json_value,
    optimizer_steps,
)
from daskfeed.core import CheckpointError, fsync, replace, write_file

if TYPE_CHECKING:
    from keras import Model

_NAME = re.compile(r"^ckpt-(\d{6,})-(\d{9,})$")


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
        """Checkpoint directory names, oldest first (ordered by epoch, then batch).

        Returns
        -------
        list of str
            The names (``ckpt-<epoch>-<batch>``); empty when there are none.
        """
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = [(tuple(int(g) for g in m.groups()), n) for n in entries if (m := _NAME.match(n))]
        return [n for _, n in sorted(found)]

    def read(self, name: str) -> Checkpoint:
        """Read and validate one checkpoint (sizes and SHA-256 of its files).

        Parameters
        ----------
        name
            The checkpoint's directory name (``ckpt-<epoch>-<batch>``).

        Returns
        -------
        Checkpoint

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
            cursor = StreamState.from_dict(state["cursor"])  # (format 1: no version)
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

        Parameters
        ----------
        warn
            Also told the warning (the run's echo), besides ``warnings.warn``.

        Returns
        -------
        Checkpoint or None

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
                       f"instead (epoch {ckpt.cursor.epoch}, batch {ckpt.cursor.at}); the "
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

    def save(self, model: Model, cursor: StreamState, history: list[dict[str, Any]] | None = None,
             stopping: StoppingState | None = None,
             best_weights: list[np.ndarray] | None = None) -> str:
        """Write a checkpoint of ``model`` (weights + optimizer) at ``cursor``; return its path.

        Parameters
        ----------
        model
            A built Keras model (``save_weights``, its optimizer's step count).
        cursor
            Where training stands: the first batch not yet trained.
        history
            Records of the completed epochs.
        stopping, best_weights
            Early stopping's state (``EarlyStopping.get_state()``), into ``state.json``, and its
            best weights, into ``best.weights.npz``; None: no early stopping.

        Returns
        -------
        str
            The checkpoint's directory. Written into a temporary directory and renamed into
            place; then only the newest ``keep`` checkpoints are kept.

        Raises
        ------
        OSError
            When the directory cannot be written (the temporary directory is removed).
        """
        self._prepare()
        name = f"ckpt-{cursor.epoch:06d}-{cursor.at:09d}"  # sorted by where the epoch stands
        final = os.path.join(self.directory, name)
        tmp = os.path.join(self.directory, f".tmp-{name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        try:
            self._write(tmp, model, cursor, history, stopping, best_weights)
            if os.path.exists(final):  # the same cursor again (e.g. after a fallback): replace it
                old = os.path.join(self.directory, f".old-{name}-{os.getpid()}")
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    @staticmethod
    def _write(tmp: str, model: Model, cursor: StreamState, history: list[dict[str, Any]] | None,
               stopping: StoppingState | None, best_weights: list[np.ndarray] | None) -> None:
        """The files of one checkpoint in directory ``tmp``, each flushed to disk."""
        weights = os.path.join(tmp, WEIGHTS)
        model.save_weights(weights)
        fsync(weights)
        files = [weights]
        state: dict[str, Any] = {
            "version": VERSION,
            "cursor": cursor.to_dict(),
            "history": [{k: json_value(v) for k, v in rec.items()} for rec in history or []],
            "iterations": optimizer_steps(model),
            "created": time.time(),
        }
        if stopping is not None:
            state["early_stopping"] = stopping
            if best_weights is not None:
                files.append(_save_arrays(os.path.join(tmp, BEST), best_weights))
        state["files"] = {os.path.basename(p): {"size": os.path.getsize(p), "sha256": _digest(p)}
                          for p in files}
        write_file(os.path.join(tmp, STATE), json.dumps(state, indent=1))
        fsync(tmp)

    def _prune(self) -> None:
        names = self.names()
        for name in names[: max(0, len(names) - self.keep)]:
            shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        for entry in os.listdir(self.directory):  # leftovers of writers killed mid-write
            if entry.startswith((".tmp-", ".old-")) and not entry.endswith(f"-{os.getpid()}"):
                shutil.rmtree(os.path.join(self.directory, entry), ignore_errors=True)

    def clear(self) -> int:
        """Remove every checkpoint (a fresh run); return how many there were.

        Returns
        -------
        int
            The checkpoints removed.
        """
        n = len(self.names())
        if os.path.isdir(self.directory):
            for entry in os.listdir(self.directory):
                if _NAME.match(entry.removesuffix(".corrupt")) or entry.startswith((".tmp-", ".old-")):
                    shutil.rmtree(os.path.join(self.directory, entry), ignore_errors=True)
        return n


def _save_arrays(path: str, arrays: list[np.ndarray]) -> str:
    """Write ``arrays`` (in order) to an ``.npz`` file, fsync'ed; return its path."""
    buf = io.BytesIO()
    np.savez(buf, *[np.asarray(a) for a in arrays])  # arr_0, arr_1, ... in order
    write_file(path, buf.getvalue())
    return path


def open_store(output: str | os.PathLike[str], *, resume: bool,
               echo: Callable[[str], None] = print) -> tuple[CheckpointStore, Checkpoint | None]:
    """The checkpoint store of ``output`` and the checkpoint to resume from (None: from scratch).

    Without ``resume`` the checkpoints of an earlier run in ``output`` are removed (they would
    mix with this run's). With ``resume`` and no checkpoint, training starts from scratch, as
    Keras' ``BackupAndRestore`` does; both cases are echoed.

    Parameters
    ----------
    output
        The run's output directory (checkpoints in ``<output>/checkpoints``).
    resume
        Whether to continue from the newest good checkpoint.
    echo
        Where to say what was removed or found.

    Returns
    -------
    tuple
        The store and the checkpoint to resume from, or None.

    Raises
    ------
    CheckpointError
        With ``resume``, when there are checkpoints and none of them is readable.
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
