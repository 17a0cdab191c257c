"""Where training stands in the data: the cursor a checkpoint saves and a resume checks.

A cursor is an epoch, the first batch not yet trained, and everything that fixes the order of
the batches (data fingerprint, seed, batch size, window size, features, shard, split).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
        return cls(**d)

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
