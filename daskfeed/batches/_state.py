"""The one resume state: where a stream of batches stands, and all that fixes its order.

A :class:`StreamState` is an epoch, the first batch not yet trained, and everything that fixes
the order of the batches (data fingerprint, seed, batch size, features, split). In the global
order (:mod:`daskfeed.batches._order`, the parse cache on) it also holds the *position*: the
batches of the epoch's order every trainer together has trained; a resume continues there under
any budget, worker count or number of trainers. Without the global order the windows (window
size) and the shard are part of the order, and must be the same to resume.

:meth:`BatchStream.get_state <daskfeed.batches._stream.BatchStream.get_state>` returns it as
plain JSON values (:meth:`StreamState.to_dict`, versioned), and ``set_state`` checks it against
the stream (:meth:`StreamState.check`) before going on from it. A Keras checkpoint keeps that
value as it is (``state.json``'s ``"cursor"``), as does ``TorchDataset.state_dict``; the
states written before this format (a checkpoint's cursor without a version, a ``TorchDataset``
state of version 1) are read too (:meth:`StreamState.from_dict`).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any

from daskfeed.batches._order import ORDER_FORMATS
from daskfeed.core import CheckpointError

STATE_VERSION = 2
"""The resume state's format. 1: a checkpoint's cursor (no ``version`` key), or a
``TorchDataset`` state (``version`` 1: position and batch size, seed, shard, fingerprint only)."""

_TORCH_V1 = ("batch_size", "seed", "shard", "fingerprint")  # what a TorchDataset state 1 recorded


@dataclass(frozen=True)
class StreamState:
    """Where a stream stands in the data: epoch ``epoch`` continues at batch ``batch``.

    The other fields fix the order of the batches; resuming requires all of them to match
    (:meth:`check`).
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
    units: int = 0  # the global order's units per epoch (0: windows of blocks)
    position: int | None = None  # batches of the epoch's global order trained (by all trainers)
    order: int = 1  # the global order's format (ORDER_VERSION; states without it: 1)
    skips: tuple[tuple[int, int, int], ...] = ()  # batches left out, (epoch, first, last) from 0

    @property
    def global_order(self) -> bool:
        """Whether the state is a position in the global order (else: in windows of blocks)."""
        return self.units > 0

    @property
    def at(self) -> int:
        """Where the epoch continues: its position in the global order, else the batch."""
        return self.batch if self.position is None else self.position

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (lists for tuples) with the format's ``version``: what is persisted."""
        d = asdict(self)
        d["features"], d["shard"] = list(self.features), list(self.shard)
        d["skips"] = [list(r) for r in self.skips]
        return {"version": STATE_VERSION, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, like: StreamState | None = None) -> StreamState:
        """Inverse of :meth:`to_dict`; also reads the states of format 1.

        Parameters
        ----------
        d
            A state as :meth:`to_dict` made it, or a checkpoint's cursor without a version, or
            a ``TorchDataset`` state of version 1.
        like
            The stream's own state: a ``TorchDataset`` state of version 1 recorded only its
            position, batch size, seed, shard and fingerprint; its other fields are taken from
            ``like`` (never checked, as then).

        Returns
        -------
        StreamState

        Raises
        ------
        CheckpointError
            A state of a later format, of an unknown shape, or of version 1 without ``like``.
        """
        d = dict(d)
        version = d.pop("version", 1)
        if not isinstance(version, int) or version > STATE_VERSION or version < 1:
            raise CheckpointError(
                f"Expected a resume state of format {STATE_VERSION} or older. Received: format "
                f"{version!r}.\nHint: resume with the daskfeed that saved it (or a newer one).")
        if version == 1 and "label" not in d:  # a TorchDataset state of version 1
            if like is None or not set(_TORCH_V1) <= set(d):
                raise CheckpointError(
                    f"Expected a resume state (BatchStream.get_state). Received: keys "
                    f"{sorted(d)}.\nHint: pass what get_state() or state_dict() returned.")
            recorded = {k: d[k] for k in _TORCH_V1}
            recorded["shard"] = tuple(recorded["shard"])
            return replace(like, epoch=int(d.get("epoch", 0)), batch=int(d.get("start", 0)),
                           position=d.get("position") if like.global_order else None, **recorded)
        known = {f.name for f in fields(cls)}
        missing = {f.name for f in fields(cls) if f.default is MISSING and f.name not in d}
        if missing:
            raise CheckpointError(
                f"Expected a resume state with {', '.join(sorted(missing))}. Received: keys "
                f"{sorted(d)}.\nHint: pass what get_state() or state_dict() returned.")
        d["features"] = tuple(d["features"])
        d["shard"] = tuple(d.get("shard", (0, 1)))
        d["skips"] = tuple(tuple(int(v) for v in r) for r in d.get("skips") or ())
        return cls(**{k: v for k, v in d.items() if k in known})

    def check(self, other: StreamState, where: str, *, cli: bool = True) -> None:
        """Refuse to resume with ``other`` (the stream now) unless it has the same batches.

        Parameters
        ----------
        other
            The state of the stream that resumes.
        where
            What holds this state, the errors' subject: ``"The checkpoint <path>"``.
        cli
            Hints name the command's flags (``--batch-size 64``); else the keyword arguments
            (``batch_size=64``), for a state handed over in Python.

        Raises
        ------
        CheckpointError
            Naming what differs, this state's value, the received one, and a hint.
        """
        fresh = ("train from scratch without --resume (the old checkpoints are then removed)"
                 if cli else "start from the beginning (without this state)")
        if self.fingerprint != other.fingerprint:
            raise CheckpointError(
                f"{where} was made on other data: expected data with fingerprint "
                f"{self.fingerprint} ({self.rows:,} rows, {self.num_batches} batches per epoch). "
                f"Received: fingerprint {other.fingerprint} ({other.rows:,} rows; files, sizes, "
                "mtimes or read options changed).\nHint: resume on exactly the files the run "
                f"started with, or {fresh}.")
        if self.global_order != other.global_order:
            made, now = (("in the global order (parse cache on)", "windows of blocks (the parse "
                          "cache off, or a dask DataFrame)") if self.global_order else
                         ("with windows of blocks (the parse cache off)", "the global order "
                          "(parse cache on)"))
            how = "--no-cache / --cache" if cli else "cache=False / cache=True"
            raise CheckpointError(
                f"{where} was made {made}; resuming needs the same order of rows. "
                f"Received: a run with {now}.\nHint: resume with the cache setting the run "
                f"started with ({how}), or {fresh}.")
        if self.global_order and other.global_order and self.order != other.order:
            raise CheckpointError(
                f"{where} was made in the global order of another daskfeed "
                f"(order format {self.order}: {ORDER_FORMATS.get(self.order, 'not known')}); "
                f"this one reads format {other.order} "
                f"({ORDER_FORMATS.get(other.order, 'not known')}), another order of the same rows. "
                f"Received: a run in order format {other.order}.\nHint: {fresh}, or finish the "
                "run with the daskfeed that started it.")
        flag = {"batch_size": "--batch-size", "seed": "--seed", "label": "--label",
                "features": "--features/--exclude", "validation_split": "--validation-split",
                "window_rows": "the same --memory-limit (it sets the window size) and"}
        layout = () if self.global_order else ("shard", "num_batches", "rows", "window_rows")
        for name in ("batch_size", "seed", "label", "features", "validation_split", "shuffle",
                     "drop_remainder", "units", *layout):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine == theirs:
                continue
            if not cli:
                hint = f"build it with {name}={mine!r}"
            elif name == "shard":  # windows of blocks: the shard is part of the order
                hint = (f"resume with --rank {mine[0]} --world-size {mine[1]} (a run in the "
                        "global order, with the parse cache on, resumes under any number of "
                        "trainers)")
            else:
                hint = f"resume with {flag.get(name, name)} {','.join(mine) if name == 'features' else mine}"
            raise CheckpointError(
                f"{where} was made with {name}={mine!r}; resuming needs the same batches. "
                f"Received: {name}={theirs!r}.\nHint: {hint}, or {fresh}.")
