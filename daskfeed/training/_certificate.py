"""The certificate of a resume: the interrupted epoch's rows, counted from its order.

Training rewrites a 16-byte mark in place as each group of steps ends (:class:`TrainedMark`):
how far it went, not which rows. A resumed run reads the stopped run's mark
(:func:`read_mark`) and counts, from the epoch's order, the rows trained before the checkpoint,
again after it, left, left out by the tail policy and lost (:func:`resume_certificate`).
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import TYPE_CHECKING

import numpy as np

from daskfeed.batches import skipped_rows

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence

MARK = "trained.bin"  # (epoch, position) trained to, 16 bytes rewritten in place
_MARK = struct.Struct("<qq")


class TrainedMark:
    """How far training went: ``(epoch, position)`` rewritten in place as each group of steps ends.

    16 bytes at the start of ``OUTPUT/trained.bin``, written through a shared memory map of the
    file: a store into the page cache, no system call a step (no fsync: the page cache outlives
    a killed process, which is what the certificate of the next resume needs); about a
    microsecond a step. Where the file system gives no shared writable map, a ``pwrite``.
    """

    def __init__(self, out: str) -> None:
        self.path = os.path.join(out, MARK)
        self._map: mmap.mmap | None = None
        self._fd: int | None = None  # where no map could be made: written with pwrite
        self._last: tuple[int, int] | None = None

    def __call__(self, epoch: int, position: int) -> None:
        now = (int(epoch), int(position))
        if now == self._last:
            return
        if self._map is None and self._fd is None:
            self._open()
        if self._map is not None:
            _MARK.pack_into(self._map, 0, *now)
        else:  # a file system without shared writable maps
            assert self._fd is not None
            os.pwrite(self._fd, _MARK.pack(*now), 0)
        self._last = now

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, _MARK.size)  # (a mark of another size, if any, is cut to this one)
            self._map = mmap.mmap(fd, _MARK.size)
        except (OSError, ValueError):  # e.g. ENODEV on some FUSE or network mounts
            self._fd = fd
            return
        os.close(fd)  # (the map keeps the file)

    def close(self) -> None:
        """Unmap or close the file (the mark stays)."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_mark(out: str) -> tuple[int, int] | None:
    """The ``(epoch, position)`` the last run of ``out`` trained to (None: no mark)."""
    try:
        with open(os.path.join(out, MARK), "rb") as f:
            raw = f.read(_MARK.size)
    except OSError:
        return None
    return _MARK.unpack(raw) if len(raw) == _MARK.size else None  # type: ignore[return-value]


def resume_certificate(seq: DaskSequence, epoch: int, position: int,
                       mark: tuple[int, int] | None) -> dict[str, int]:
    """The rows of an interrupted epoch, counted from its order when a run resumes it.

    Parameters
    ----------
    seq
        The training sequence, set to go on from the checkpoint (its layout: this run's).
    epoch, position
        The checkpoint's epoch and position (batches of the epoch's order trained by all
        trainers; without the global order, this trainer's batch).
    mark
        How far the stopped run trained (:func:`read_mark`; None: not known).

    Returns
    -------
    dict
        ``epoch`` (from 1), ``rows`` (the epoch's), ``before`` (trained before the checkpoint),
        ``again`` (trained after it by the stopped run, trained again now; -1: not known),
        ``left`` (this run trains), ``tail`` (left out by the tail policy: the ranks' equal
        counts, ``drop_remainder``), ``skipped`` (the epoch's batches left out by
        ``--skip-batches``) and ``lost`` (the rest: 0 for an exact resume).
    """
    plan, stream = seq.plan, seq.stream
    bs = stream.data.settings.batch_size
    skipped = 0
    if stream.global_order and stream.buckets is not None:
        total = int(sum(int(n) for n in stream.buckets.sizes))
        world = stream.data.settings.shard[1]
        skipped = skipped_rows(stream.skips.epoch(epoch), 0, -(-total // bs), bs, total)

        def rows_to(p: int, e: int = epoch) -> int:  # rows of epoch e's batches before p that train
            return min(int(p) * bs, total) - skipped_rows(stream.skips.epoch(e), 0, int(p), bs, total)
    else:
        total, world = plan.rows + plan.dropped, 1
        starts = np.concatenate([[0], np.cumsum([plan.batch_rows(i) for i in range(plan.num_batches)])])

        def rows_to(p: int, e: int = epoch) -> int:
            return int(starts[min(int(p), plan.num_batches)])
    before = rows_to(position)
    again = -1
    if mark is not None:
        e, p = mark
        if (e, p) == (epoch, position) or (position == 0 and e == epoch - 1):
            again = 0  # (a checkpoint at an epoch's end: the mark stays at the end of the last)
        elif (e, p) < (epoch, position):
            again = -1  # a mark behind the checkpoint was lost (a machine's crash): not known
        elif e == epoch:
            again = rows_to(p) - before
        else:  # the rest of the epoch, the epochs between (each less its skipped batches), e's start
            again = (total - skipped - before + rows_to(p, e)
                     + sum(rows_to(-(-total // bs), k) for k in range(epoch + 1, e)))
    if seq.epoch != epoch:  # nothing of the epoch left for these trainers: the rest is the tail
        left, tail = 0, total - before - skipped
    elif stream.global_order:  # the trainers' batches from here are full (one trainer: but the last)
        left = (plan.num_batches - seq.start) * world * bs if world > 1 else plan.rows - seq.start * bs
        tail, skipped = plan.dropped, plan.skipped
    else:
        left, tail = plan.rows - rows_to(seq.start), plan.dropped
    return {"epoch": epoch + 1, "rows": total, "before": before, "again": again, "left": left,
            "tail": tail, "skipped": skipped, "lost": total - before - left - tail - skipped}


def certificate_line(cert: dict[str, int], world: int) -> str:
    """The certificate in one line (what a resume prints)."""
    again = ("not known (no mark of the stopped run)" if cert["again"] < 0 else
             f"{cert['again']:,} trained again (the stopped run trained them after the checkpoint)")
    tail = (f", {cert['tail']:,} left out by the tail policy ({world} trainers, full batches only)"
            if cert["tail"] else "")
    if cert.get("skipped"):
        tail += f", {cert['skipped']:,} in batches skipped (--skip-batches)"
    return (f"resume certificate, epoch {cert['epoch']}: of its {cert['rows']:,} rows, "
            f"{cert['before']:,} trained before the checkpoint, {again}, {cert['left']:,} left "
            f"to train{tail}, {cert['lost']:,} lost")
