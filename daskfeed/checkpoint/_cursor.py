"""Where training stands in the data: the cursor a checkpoint saves and a resume checks.

A cursor is an epoch, the first batch not yet trained, and everything that fixes the order of
the batches (data fingerprint, seed, batch size, features, split). In the global order
(:mod:`daskfeed.batches._order`, the parse cache on) it also holds the *position*: the batches
of the epoch's order every trainer together has trained; a resume continues there under any
budget, worker count or number of trainers. Without the global order the windows (window size)
and the shard are part of the order, and must be the same to resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskfeed.batches import ORDER_FORMATS, ORDER_VERSION
from daskfeed.core import CheckpointError

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence

__all__ = ["Cursor"]


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
    units: int = 0  # the global order's units per epoch (0: windows of blocks)
    position: int | None = None  # batches of the epoch's global order trained (by all trainers)
    order: int = 1  # the global order's format (batches.ORDER_VERSION; cursors without it: 1)

    @property
    def global_order(self) -> bool:
        """Whether the cursor is a position in the global order (else: in windows of blocks)."""
        return self.units > 0

    @property
    def at(self) -> int:
        """Where the epoch continues: its position in the global order, else the batch."""
        return self.batch if self.position is None else self.position

    @classmethod
    def of(cls, seq: DaskSequence, epoch: int, batch: int) -> Cursor:
        """The cursor of :class:`~daskfeed.DaskSequence` ``seq`` at ``(epoch, batch)``.

        Parameters
        ----------
        seq
            The training sequence (its plan, manifest and batch settings).
        epoch, batch
            Where training stands: the first batch not yet trained.

        Returns
        -------
        Cursor
        """
        ordered = seq.global_order
        position = seq.position(batch, epoch) if ordered else None
        return cls(
            epoch=int(epoch), batch=int(batch), seed=seq.seed, batch_size=seq.batch_size,
            fingerprint=seq.manifest.fingerprint, num_batches=seq.plan.num_batches,
            rows=seq.plan.rows, window_rows=seq.window_rows,
            blocksize=seq.source.options.blocksize, shuffle=seq.shuffle,
            drop_remainder=seq.drop_remainder, label=seq.label, features=tuple(seq.features),
            shard=tuple(seq.shard),  # type: ignore[arg-type]
            validation_split=float(getattr(seq, "validation_split", 0.0)),
            units=seq.stream.units if ordered else 0, position=position,
            order=ORDER_VERSION,
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cursor:
        """Inverse of ``asdict``.

        Parameters
        ----------
        d
            A cursor as ``state.json`` keeps it (``dataclasses.asdict``, lists for tuples).

        Returns
        -------
        Cursor
            The cursor.
        """
        d = dict(d)
        d["features"] = tuple(d["features"])
        d["shard"] = tuple(d.get("shard", (0, 1)))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def check(self, other: Cursor, where: str) -> None:
        """Refuse to resume with ``other`` (the current run) unless it has the same batches.

        Parameters
        ----------
        other
            The cursor of the run that resumes.
        where
            The checkpoint's path, named in the error.

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
        if self.global_order != other.global_order:
            made, now = (("in the global order (parse cache on)", "windows of blocks (the parse "
                          "cache off, or a dask DataFrame)") if self.global_order else
                         ("with windows of blocks (the parse cache off)", "the global order "
                          "(parse cache on)"))
            raise CheckpointError(
                f"The checkpoint {where} was made {made}; resuming needs the same order of rows. "
                f"Received: a run with {now}.\nHint: resume with the cache setting the run "
                "started with (--no-cache / --cache), or train from scratch without --resume.")
        if self.global_order and other.global_order and self.order != other.order:
            raise CheckpointError(
                f"The checkpoint {where} was made in the global order of another daskfeed "
                f"(order format {self.order}: {ORDER_FORMATS.get(self.order, 'not known')}); "
                f"this one reads format {other.order} "
                f"({ORDER_FORMATS.get(other.order, 'not known')}), another order of the same rows. "
                f"Received: a run in order format {other.order}.\nHint: train from scratch "
                "without --resume (the old checkpoints are then removed), or finish the run "
                "with the daskfeed that started it.")
        flag = {"batch_size": "--batch-size", "seed": "--seed", "label": "--label",
                "features": "--features/--exclude", "validation_split": "--validation-split",
                "window_rows": "the same --memory-limit (it sets the window size) and"}
        layout = () if self.global_order else ("shard", "num_batches", "rows", "window_rows")
        for name in ("batch_size", "seed", "label", "features", "validation_split", "shuffle",
                     "drop_remainder", "units", *layout):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                shown = ",".join(mine) if name == "features" else mine
                if name == "shard":  # windows of blocks: the shard is part of the order
                    shown = (f"--rank {mine[0]} --world-size {mine[1]} (a run in the global "
                             "order, with the parse cache on, resumes under any number of "
                             "trainers)")
                raise CheckpointError(
                    f"The checkpoint {where} was made with {name}={mine!r}; resuming needs the "
                    f"same batches. Received: {name}={theirs!r}.\nHint: resume with "
                    f"{flag.get(name, name) + ' ' if name != 'shard' else ''}{shown}, or train "
                    "from scratch without --resume (the old checkpoints are then removed)."
                )
