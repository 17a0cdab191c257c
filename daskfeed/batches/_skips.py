"""Batches left out: ``--skip-batches 3:48200-48260,4:17``, the same on every run and trainer.

A skipped batch is a batch of an epoch's *global order* (:mod:`daskfeed.batches._order`):
rows ``[g * batch_size, (g + 1) * batch_size)`` of that order, numbered as ``daskfeed rows``
numbers them (epoch ``E`` and step ``S`` from 1: ``g = S - 1``). The order does not change:
the trainers deal the epoch's *kept* batches among themselves (:class:`~daskfeed.batches._order.Lanes`),
so every trainer still takes the same number of steps, and a skipped batch keeps its number
(the steps after it are numbered as in a run without skips).

:class:`Skips` is the set, as ranges per epoch; :meth:`Skips.kept_before` and
:meth:`Skips.kept_batch` map between a batch of the order and its index among the kept ones
(``O(ranges)``, vectorized where a window asks for many).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskfeed.core import refuse_setting

_ITEM = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_EXAMPLE = "e.g. --skip-batches 3:48200-48260,4:17 (epoch:step or epoch:first-last, from 1)"

Range = tuple[int, int, int]  # (epoch, first, last): from 0, last included


@dataclass(frozen=True)
class Skips:
    """Batches of the global order left out, as sorted, merged ``(epoch, first, last)`` ranges.

    Epochs and batches count from 0 here (``daskfeed rows`` and the flag count from 1); ``last``
    is included. Build one with :meth:`parse` (the flag's text), :meth:`of` (ranges) or
    :meth:`from_json` (what a resume state recorded).
    """

    ranges: tuple[Range, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ranges)

    @classmethod
    def of(cls, ranges: Iterable[Iterable[int]]) -> Skips:
        """Ranges ``(epoch, first, last)`` from 0, in any order, overlapping or not: merged."""
        items = sorted((int(e), int(a), int(b)) for e, a, b in (tuple(r) for r in ranges))
        merged: list[Range] = []
        for e, a, b in items:
            if merged and merged[-1][0] == e and a <= merged[-1][2] + 1:
                merged[-1] = (e, merged[-1][1], max(merged[-1][2], b))
            else:
                merged.append((e, a, b))
        return cls(tuple(merged))

    @classmethod
    def parse(cls, text: str | Skips | Mapping[int, Any] | None) -> Skips:
        """The flag's text, ``"3:48200-48260,4:17"`` (epochs and steps from 1), as a set.

        Also takes a :class:`Skips` (as it is), None or ``""`` (none), or a mapping of epochs
        (from 1) to steps (from 1) and ``(first, last)`` ranges: ``{3: [(48200, 48260)], 4: [17]}``.

        Raises
        ------
        SettingError
            An item that is not ``epoch:step`` or ``epoch:first-last``, a 0, or ``first > last``.
        """
        if text is None or isinstance(text, Skips):
            return text or cls()
        if isinstance(text, Mapping):
            pairs = [(e, s if isinstance(s, (tuple, list)) else (s, s))
                     for e, steps in text.items() for s in steps]
            items = [(int(e), int(s[0]), int(s[-1])) for e, s in pairs]
            shown = str(dict(text))
        else:
            items = []
            for item in str(text).split(","):
                if not item.strip():
                    continue
                m = _ITEM.match(item)
                if m is None:
                    refuse_setting("Expected batches to skip as epoch:step or epoch:first-last, "
                                   "comma-separated.", f"{item.strip()!r} in {text!r}", _EXAMPLE)
                assert m is not None
                e, a = int(m.group(1)), int(m.group(2))
                items.append((e, a, int(m.group(3)) if m.group(3) else a))
            shown = repr(text)
        for e, a, b in items:
            if max(e, b) >= 2**31:
                refuse_setting("Expected epochs and steps below 2**31.", f"{e}:{a}-{b} in {shown}",
                               _EXAMPLE)
            if min(e, a, b) < 1 or a > b:
                refuse_setting("Expected epochs and steps from 1, a range's first step not after "
                               "its last.", f"{e}:{a}-{b} in {shown}", _EXAMPLE)
        return cls.of((e - 1, a - 1, b - 1) for e, a, b in items)

    def union(self, other: Skips) -> Skips:
        """Both sets' batches."""
        return Skips.of(self.ranges + other.ranges)

    def text(self) -> str:
        """As the flag writes it (from 1): ``3:48200-48260,4:17``; ``""`` for none."""
        return ",".join(f"{e + 1}:{a + 1}" + (f"-{b + 1}" if b > a else "") for e, a, b in self.ranges)

    def to_json(self) -> list[list[int]]:
        """``[[epoch, first, last], ...]`` from 0, last included: what a resume state records."""
        return [list(r) for r in self.ranges]

    @classmethod
    def from_json(cls, value: Iterable[Iterable[int]] | None) -> Skips:
        """Inverse of :meth:`to_json` (None: none)."""
        return cls.of(value or ())

    def epoch(self, epoch: int) -> tuple[tuple[int, int], ...]:
        """``epoch``'s ranges ``(first, last)``, sorted and apart."""
        return tuple((a, b) for e, a, b in self.ranges if e == int(epoch))

    def before(self, epoch: int, batch: int) -> Skips:
        """The batches before ``batch`` of ``epoch`` (and of earlier epochs)."""
        out = [(e, a, min(b, int(batch) - 1)) for e, a, b in self.ranges
               if e < int(epoch) or (e == int(epoch) and a < int(batch))]
        return Skips(tuple(out))

    def without(self, other: Skips) -> Skips:
        """These batches but those of ``other``."""
        out: list[Range] = []
        for e, a, b in self.ranges:
            cuts = [(x, y) for f, x, y in other.ranges if f == e and y >= a and x <= b]
            for x, y in cuts:
                if x > a:
                    out.append((e, a, x - 1))
                a = max(a, y + 1)
            if a <= b:
                out.append((e, a, b))
        return Skips(tuple(out))

    def count(self, epoch: int, lo: int = 0, hi: int | None = None) -> int:
        """Skipped batches of ``epoch`` in ``[lo, hi)`` (hi None: to the end)."""
        return skipped_count(self.epoch(epoch), lo, hi)


def skipped_count(ranges: tuple[tuple[int, int], ...], lo: int = 0, hi: int | None = None) -> int:
    """Skipped batches of an epoch's ``ranges`` (:meth:`Skips.epoch`) in ``[lo, hi)`` (None: on)."""
    top = np.iinfo(np.int64).max if hi is None else int(hi)
    return sum(max(min(b + 1, top) - max(a, int(lo)), 0) for a, b in ranges)


def kept_before(ranges: tuple[tuple[int, int], ...], g: np.ndarray | int) -> np.ndarray | int:
    """Kept batches before batch ``g`` of the order (``g`` minus the skipped ones below it).

    Parameters
    ----------
    ranges
        An epoch's skipped ranges (:meth:`Skips.epoch`).
    g
        Batches of the order (an int or an int64 array).

    Returns
    -------
    int or numpy.ndarray
        Like ``g``.
    """
    if not ranges:
        return g
    if isinstance(g, (int, np.integer)):
        return int(g) - sum(max(min(b + 1, int(g)) - a, 0) for a, b in ranges)
    x = np.asarray(g, dtype=np.int64)
    out = x.copy()
    for a, b in ranges:
        out -= np.clip(x - a, 0, b + 1 - a)
    return out


def is_skipped(ranges: tuple[tuple[int, int], ...], g: np.ndarray) -> np.ndarray:
    """Whether each batch ``g`` of the order is skipped (a bool array)."""
    x = np.asarray(g, dtype=np.int64)
    out = np.zeros(x.shape, dtype=bool)
    for a, b in ranges:
        out |= (x >= a) & (x <= b)
    return out


def kept_batch(ranges: tuple[tuple[int, int], ...], k: int) -> int:
    """The order's batch that is kept batch ``k`` (from 0; past the kept ones: as if none follow)."""
    g = int(k)
    for a, b in ranges:  # sorted and apart: each range at or below g moves it past itself
        if a <= g:
            g += b + 1 - a
        else:
            break
    return g


def skipped_rows(ranges: tuple[tuple[int, int], ...], lo: int, hi: int, batch_size: int,
                 total: int) -> int:
    """Rows of an epoch's skipped batches in ``[lo, hi)`` (its last batch may be short).

    Parameters
    ----------
    ranges
        The epoch's skipped ranges (:meth:`Skips.epoch`).
    lo, hi
        Batches of the order.
    batch_size, total
        Rows per batch, and the epoch's rows.

    Returns
    -------
    int
    """
    last, short = -(-int(total) // batch_size) - 1, -int(total) % batch_size
    spans = [(max(a, int(lo)), min(b + 1, int(hi), last + 1)) for a, b in ranges]
    return sum((y - x) * batch_size - (short if x <= last < y else 0) for x, y in spans if y > x)
