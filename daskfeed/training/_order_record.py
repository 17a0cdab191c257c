"""A run's order record: what fixes its epochs' orders, and which batch of an order a step is.

A run in the global order keeps, in ``OUTPUT/order.json``, what fixes its epochs' orders — the
buckets' sizes, the parse cache's layout (its blocks' ids), seed and batch size — and one
*stretch* per entry into training (a fresh start, each ``--resume``): the epoch and the position
in its order where it began, the number of trainers, the epochs it trains to and the batches it
skips. That is a few hundred bytes whatever the run's length. From it, a step (of the epoch's
order, or of one trainer's lanes) is mapped to the order's batch it trained
(:func:`order_batch`); :mod:`daskfeed.training._rows` turns that batch into rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed.batches import Skips, is_skipped, kept_batch, kept_before, skipped_count
from daskfeed.core import DaskfeedError, SettingError, write_file
from daskfeed.training._certificate import MARK

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence

NAME = "order.json"
FORMAT = "daskfeed order record"
VERSION = 1


def record_order(out: str, seq: DaskSequence, *, epoch: int, position: int, world: int,
                 epochs: int, fresh: bool) -> None:
    """Keep what fixes the run's order, and where this entry into training begins.

    A fresh run writes ``OUTPUT/order.json`` anew; a resumed one adds a stretch to it (a record
    of another layout — other data, another seed — is started again, and says so by its layout).

    Parameters
    ----------
    out
        The run's output directory.
    seq
        The training sequence.
    epoch, position
        Where training begins: the epoch, and the batches of its order trained before.
    world
        Trainers of this entry.
    epochs
        The epochs it trains to (``--epochs``).
    fresh
        Whether the run starts from scratch (no checkpoint).
    """
    stream = seq.stream
    st = stream.data.settings
    layout: dict[str, Any] = {"fingerprint": stream.data.manifest.fingerprint, "seed": st.seed,
                              "batch_size": st.batch_size, "drop_remainder": st.drop_remainder,
                              "global_order": stream.global_order}
    if stream.buckets is not None and stream.data.cache is not None:
        cache = {k: v for k, v in asdict(stream.data.cache).items() if k != "lease"}
        layout.update(sizes=[int(n) for n in stream.buckets.sizes], cache=cache)
    layout = json.loads(json.dumps(layout, default=list))  # as it reads back
    path = os.path.join(out, NAME)
    record = None if fresh else read_record(path)
    if record is None or _identity(record["layout"]) != _identity(layout):
        record = {"format": FORMAT, "version": VERSION, "layout": layout, "stretches": []}
        if not fresh:  # resumed, but what trained before is not on record (an older daskfeed's)
            record["stretches"].append({"epoch": 0, "position": 0, "world": None,
                                        "epochs": int(epochs), "time": None})
    record["layout"] = layout  # where the buckets and the cache are now (rebuilt: the same rows)
    record["stretches"].append({"epoch": int(epoch), "position": int(position),
                                "world": int(world), "epochs": int(epochs),
                                "time": round(time.time(), 3), "skips": stream.skips.to_json()})
    write_file(path, json.dumps(record, default=list))


def forget_order(out: str) -> None:
    """A fresh run in ``out``: the order record and mark of the run before it go."""
    for name in (NAME, MARK):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, name))


def _identity(layout: dict[str, Any]) -> tuple[Any, ...]:
    """What fixes the order's batches (not where its files are)."""
    return tuple(layout.get(k) for k in ("fingerprint", "seed", "batch_size", "drop_remainder",
                                         "global_order", "sizes"))


def read_record(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            record: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    return record if record.get("format") == FORMAT else None


Segment = tuple[int, int, "int | None", tuple[tuple[int, int], ...]]  # [start, end), trainers, skips


def epoch_segments(stretches: list[dict[str, Any]], epoch: int, batches: int,
                   mark: tuple[int, int] | None = None) -> list[Segment]:
    """The stretches of ``epoch`` as ``(first batch, end, trainers, skips)``, in the order trained.

    A stretch's batches stand up to where any later stretch began: a resume from a checkpoint
    taken before a kill trains those batches again, and the later training is what the model
    kept. The last stretch ends where its run said it trained to (``mark``: the run stopped,
    early stopping, still running), else at its ``--epochs``. Trainers None: not on record.
    """
    out = []
    last = stretches[-1] if stretches else {}
    limit = (last.get("epochs", float("inf")), 0)  # where the earliest later stretch began
    if mark is not None and last and tuple(mark) >= (last["epoch"], last["position"]):
        limit = min(limit, (int(mark[0]), int(mark[1])))
    for s in reversed(stretches):
        begin = (s["epoch"], s["position"])
        lo = s["position"] if s["epoch"] == epoch else 0
        hi = limit[1] if limit[0] == epoch else batches
        if begin[0] <= epoch <= limit[0] and hi > lo:
            out.append((lo, hi, s["world"], Skips.from_json(s.get("skips")).epoch(epoch)))
        limit = min(limit, begin)
    return out[::-1]


def _lanes(start: int, world: int, total_batches: int,
           skips: tuple[tuple[int, int], ...]) -> tuple[int, int, int]:
    """A stretch's lanes from the order's batch ``start``: origin, first step, steps per trainer."""
    k = int(kept_before(skips, start))
    kept = total_batches - skipped_count(skips, 0, total_batches)
    origin = k % world
    return origin, k // world, max((kept - origin) // world, 0)


def lane_batches(start: int, end: int, world: int, rank: int, total_batches: int,
                 skips: tuple[tuple[int, int], ...] = ()) -> list[int]:
    """The order's batches trainer ``rank`` of ``world`` trained in a stretch ``[start, end)``."""
    if world == 1:
        g = np.arange(start, end, dtype=np.int64)
        return g[~is_skipped(skips, g)].tolist() if rank == 0 else []
    origin, first, per_rank = _lanes(start, world, total_batches, skips)
    out = []
    for j in range(first, per_rank):
        b = kept_batch(skips, origin + rank + j * world)
        if b >= end:
            break
        out.append(b)
    return out


def rank_batches(segments: list[Segment], rank: int, full: int,
                 batches: int) -> list[tuple[int, int | None]]:
    """Trainer ``rank``'s batches of an epoch, in the order it trained them: ``(batch, trainers)``."""
    if any(world is None for _, _, world, _ in segments):
        raise DaskfeedError(
            "Expected the run's record of which trainers trained this epoch. Received: none for "
            "its part before a resume (resumed from a checkpoint of an older daskfeed).\nHint: "
            "ask without --rank: --step then counts the epoch order's batches.")
    mine: list[tuple[int, int | None]] = []
    for start, end, world, skips in segments:
        if world is None or rank >= world:
            continue
        mine += [(b, world) for b in lane_batches(start, end, world, rank,
                                                   full if world > 1 else batches, skips)]
    return mine


def order_batch(segments: list[Segment], step: int, rank: int | None, full: int, batches: int,
                lanes: list[tuple[int, int | None]] | None = None) -> tuple[int, int | None]:
    """The order's batch (from 0) of ``step`` (and ``rank``), and the trainers that trained it.

    ``lanes``: :func:`rank_batches` of ``rank``, if known (a caller tracing many steps).
    """
    if rank is None:
        g, trained = step - 1, 0
        for start, end, world, skips in segments:
            last = end
            if world and world > 1:  # (the lanes of a stretch start there; full batches only)
                origin, _, per_rank = _lanes(start, world, full, skips)
                last = min(end, kept_batch(skips, origin + per_rank * world))
            trained = max(trained, last)
            if start <= g < last:
                return g, world
        raise SettingError(
            f"Expected a step the run trained in this epoch (1..{trained}). Received: "
            f"step={step}.\nHint: with several trainers the epoch's last few batches are left "
            "out to keep their counts equal; a run stopped early trained fewer.")
    mine = rank_batches(segments, rank, full, batches) if lanes is None else lanes
    if not 1 <= step <= len(mine):
        raise SettingError(
            f"Expected a step trainer {rank} trained in this epoch (1..{len(mine)}). Received: "
            f"step={step}.\nHint: without --rank, --step counts the epoch order's batches.")
    return mine[step - 1]


def was_skipped(segments: list[Segment], g: int) -> bool:
    """Whether the order's batch ``g`` was left out (``--skip-batches``) where it came."""
    return any(lo <= g < hi and bool(is_skipped(skips, np.array([g]))[0])
               for lo, hi, _, skips in segments)
