r"""Splits: where the records of a byte range start, when quoted fields may hold line breaks.

A block of a plain file is a byte range cut at line breaks, but a line break inside a quoted
field (``"line one\nline, two"``) is no record's end, and whether the break after a block's
nominal start is inside a field depends on every quote before it. Two ways decide it, both
in parallel over the blocks (as SIMD and speculative CSV parsers do):

- **speculated** (:func:`record_start`): each reader looks at the bytes after its block's
  first line break under both states (outside and inside a field) and takes the state whose
  quotes read as CSV writers write them (a quote opens a field at its start and closes it
  before a separator or a line break) until both readings agree. Every reader decides the same
  boundary, and each block checks that it ends outside a field (:func:`ends_inside`): a wrong
  guess is never read silently, it raises :class:`SplitError`.
- **exact** (:func:`transitions`, :func:`chain`): each block's state at its end, for either
  state at its start, and where its first record starts when it starts inside a field; chained
  from the file's start, they give every block's true start. Read once more, only for a file
  whose speculation failed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from daskfeed.core import DataError

_QUOTE, _LF, _CR = ord('"'), ord("\n"), ord("\r")
WINDOW = 64 << 10  # bytes looked at first after a boundary; grows 4x while undecided
MOST = 16 << 20  # bytes looked at most: past it, the reading with fewer odd quotes is taken


class SplitError(DataError):
    """A block's byte range, cut where its start was speculated, ends inside a quoted field.

    Raised by a reader; whoever reads the file's blocks then decides them exactly (see
    :meth:`daskfeed.Source.split_exactly`). ``path`` is the file.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]  # (travels back from a worker)
        return (SplitError, (str(self), self.path))


def next_line(f: IO[bytes], offset: int, size: int, chunk: int = 1 << 16) -> int:
    """The offset just after the first line break at or after ``offset`` (``size``: none).

    As ``fsspec.utils.read_block`` cuts: a line starting right at ``offset`` belongs to the
    range before it.
    """
    f.seek(offset)
    pos = offset
    while pos < size:
        data = f.read(min(chunk, size - pos))
        if not data:
            break
        nl = data.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(data)
        chunk = min(chunk * 4, 16 << 20)
    return size


def record_start(f: IO[bytes], offset: int, size: int, sep: str) -> int:
    """Where the first record at or after byte ``offset`` starts, speculated (see the module).

    Parameters
    ----------
    f
        The open file.
    offset
        A block's nominal start (> 0: the header is before it).
    size
        The file's size.
    sep
        The delimiter.

    Returns
    -------
    int
        Just after a line break taken to be outside quoted fields; ``size`` when there is none.
    """
    start = next_line(f, offset, size)
    window = WINDOW
    while start < size:
        f.seek(start)
        buf = f.read(min(window, size - start))
        final = start + len(buf) >= size or window >= MOST
        verdict = _speculate(buf, sep, final)
        if verdict is not None:
            inside, cut = verdict
            if not inside:
                return start
            if cut >= 0:
                return start + cut
            if start + len(buf) >= size:  # a quoted field runs on to the end of the file
                return size
            if window >= MOST:  # no record start in sight: guessed outside (the block's check
                return start    # says so if that was wrong), never a block to the file's end
        window *= 4
    return size


def _speculate(buf: bytes, sep: str, final: bool) -> tuple[bool, int] | None:
    """Decide the state at ``buf[0]`` (just after a line break): (inside, first record start).

    None: not decided yet (look further). The first record start is -1 when none is in ``buf``.
    A buffer without quotes is taken to start outside (the check in the reader says otherwise
    if a quoted field ran on over it).
    """
    if buf.find(b'"') < 0:
        return False, 0
    arr = np.frombuffer(buf, np.uint8)
    runs = _Runs(arr, ord(sep), final)
    if runs.size == 0:
        return False, 0
    out, out_odd = runs.walk(False)
    ins, ins_odd = runs.walk(True)
    agree = np.flatnonzero(runs.after(out) == runs.after(ins))
    if agree.size:  # both readings agree after run ``agree[0]``: the odd quotes up to it decide
        k = int(agree[0]) + 1
        inside = bool(np.count_nonzero(ins_odd[:k]) < np.count_nonzero(out_odd[:k]))
    elif not final:
        return None
    else:
        inside = bool(np.count_nonzero(ins_odd) < np.count_nonzero(out_odd))
    if not inside:
        return False, 0
    cut = _first_outside_break(arr, runs, runs.after(ins), True)
    if cut < 0 and not final:
        return None
    return True, cut


class _Runs:
    """The runs of quotes of a buffer that starts a line: where, how long, what is around them."""

    def __init__(self, arr: np.ndarray, sep: int, final: bool) -> None:
        q = np.flatnonzero(arr == _QUOTE)
        if q.size and not final and q[-1] == arr.size - 1:  # a run at the end may go on
            q = q[: np.searchsorted(q, q[-1] - _run_back(q) + 1)]
        brk = np.flatnonzero(np.diff(q) != 1) + 1
        self.starts = q[np.r_[0, brk]] if q.size else q
        self.ends = (q[np.r_[brk - 1, q.size - 1]] + 1) if q.size else q
        self.size = int(self.starts.size)
        before = arr[np.maximum(self.starts - 1, 0)]
        if self.size and self.starts[0] == 0:
            before[0] = _LF
        after = arr[np.minimum(self.ends, arr.size - 1)]
        self.field_start = (before == sep) | (before == _LF) | (before == _CR)
        self.field_end = (after == sep) | (after == _LF) | (after == _CR) | (self.ends >= arr.size)
        self.odd = ((self.ends - self.starts) & 1) == 1

    def walk(self, inside: bool) -> tuple[np.ndarray, np.ndarray]:
        """The state before each run, from ``inside`` at the buffer's start; which runs read oddly.

        A run reads oddly when CSV writers would not have written it so: quotes in the middle of
        an unquoted field, or a quoted field closed before something other than a separator or
        a line break. A run that opens or closes a field as writers write it does not.
        """
        before = ((np.cumsum(self.odd) - self.odd) & 1).astype(bool) ^ inside
        if np.any(~before & self.odd & ~self.field_start):  # odd quotes inside an unquoted field
            before = self._walk(inside)
        strange = np.where(before, self.odd & ~self.field_end,
                           np.where(self.field_start, ~self.odd & ~self.field_end, True))
        return before, strange

    def after(self, before: np.ndarray) -> np.ndarray:
        """The state after each run, from the state before it."""
        return before ^ (self.odd & (before | self.field_start))

    def _walk(self, inside: bool) -> np.ndarray:
        """:meth:`walk`'s states one run at a time, for quotes that are text (``5'11"``)."""
        before = np.empty(self.size, dtype=bool)
        for i, (odd, field_start) in enumerate(zip(self.odd.tolist(), self.field_start.tolist(),
                                                   strict=True)):
            before[i] = inside
            if odd and (inside or field_start):
                inside = not inside
        return before


def _run_back(q: np.ndarray) -> int:
    """How many quotes end ``q`` consecutively."""
    n = 1
    while n < q.size and q[-n - 1] == q[-n] - 1:
        n += 1
    return n


def _first_outside_break(arr: np.ndarray, runs: _Runs, after: np.ndarray, inside: bool) -> int:
    """Just after the first line break outside quoted fields; -1: none.

    ``after``: the state after each run; ``inside``: the state at the buffer's start.
    """
    breaks = np.flatnonzero(arr == _LF)
    if breaks.size == 0:
        return -1
    k = np.searchsorted(runs.starts, breaks)  # runs before each break
    state = np.where(k > 0, after[np.maximum(k - 1, 0)], inside)
    outside = breaks[~state]
    return int(outside[0]) + 1 if outside.size else -1


def ends_inside(body: bytes, sep: str) -> int:
    """Where the quoted field open at the end of ``body`` (whole records from its start) opened.

    Returns
    -------
    int
        The quote's index in ``body``; -1 when ``body`` ends outside quoted fields.
    """
    if body.find(b'"') < 0:
        return -1
    from daskfeed.reading._records import Quotes

    quotes = Quotes(sep)
    quotes.scan(body, final=True)
    return quotes.opened if quotes.inside else -1


#: a block's text start and its :func:`transitions`: what :func:`block_transitions` gives
BlockTransitions = tuple[int, tuple[bool, bool, int]]


def transitions(body: bytes, sep: str) -> tuple[bool, bool, int]:
    """One block's summary for :func:`chain`.

    Parameters
    ----------
    body
        The block's bytes, from just after its first line break (the first block's: after
        the header) to just after the next block's.
    sep
        The delimiter.

    Returns
    -------
    tuple
        (inside at the end when it starts outside, inside at the end when it starts inside,
        just after its first line break outside quoted fields when it starts inside, or -1).
    """
    arr = np.frombuffer(body, np.uint8)
    runs = _Runs(arr, ord(sep), True)
    if runs.size == 0:
        return False, True, -1
    out = runs.after(runs.walk(False)[0])
    ins = runs.after(runs.walk(True)[0])
    return bool(out[-1]), bool(ins[-1]), _first_outside_break(arr, runs, ins, True)


def chain(firsts: Sequence[int], summaries: Sequence[tuple[bool, bool, int]],
          size: int) -> tuple[list[int], int | None]:
    """Every block's true start, from each block's :func:`transitions` (in file order).

    Parameters
    ----------
    firsts
        Each block's first line break's end (the first block's: the header's end), where its
        summary starts.
    summaries
        :func:`transitions` of each block's text.
    size
        The file's size.

    Returns
    -------
    tuple
        Each block's start, and the file's size after them: block ``k`` is
        ``[starts[k], starts[k + 1])`` (a block that a quoted field spans whole is empty); and
        the block a quoted field still open at the end of the file opened in (starting outside
        one), or None when the file ends outside quoted fields.
    """
    starts: list[int | None] = []
    inside, opening = False, 0
    for k, (first, (from_out, from_in, cut)) in enumerate(zip(firsts, summaries, strict=True)):
        if not inside:
            starts.append(first)
            opening = k if from_out else opening
        else:
            starts.append(first + cut if cut >= 0 else None)
        inside = from_in if inside else from_out
    out = [size]
    for s in reversed(starts):
        out.append(out[-1] if s is None else s)
    return out[::-1], opening if inside else None


def block_transitions(path: str, offset: int, length: int, sep: str,
                      storage_options: dict[str, Any]) -> BlockTransitions:
    """Where a block's text starts and its :func:`transitions` (on a worker).

    Parameters
    ----------
    path, offset, length
        The block's file and nominal byte range.
    sep, storage_options
        The delimiter; how the file is opened.

    Returns
    -------
    tuple
        Just after the range's first line break (for the first block: after the header), and
        the summary of the text from there to just after the next range's first line break.
    """
    from daskfeed.reading._streams import open_file

    with open_file(path, storage_options) as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        first = len(f.readline()) if offset == 0 else next_line(f, offset, size)
        end = offset + length
        stop = size if end >= size else next_line(f, end, size)
        f.seek(first)
        body = f.read(stop - first) if stop > first else b""
    return first, transitions(body, sep)
