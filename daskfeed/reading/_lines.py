r"""Lines: where each row a block parses is in its file, as an editor counts lines.

A row is traced to its file and line without reading the file from its start: the scan keeps,
per block, the line breaks (``\n``) in the text it parsed as its own, and the line of each row
when its rows are not one per line. The blocks of a file tile its text after the header
(:func:`~daskfeed.reading._tables.record_range`), so a block's first line is 2 (the header is
line 1) plus the line breaks of the file's earlier blocks.

Most text has one row per line: a text's rows are one per line exactly when their number is
its number of lines and no ``\r`` alone ends a line (pyarrow ends a record there too), checked
at the cost of counting bytes. Otherwise (a quoted field over lines, blank lines, lines skipped
as malformed) the records are found again as pyarrow finds them (quotes by
:class:`~daskfeed.reading._records.Quotes`' rules, records ended by ``\n``, ``\r\n`` or ``\r``
outside quoted fields, empty ones ignored, those of another number of fields skipped where
bad lines are) and their count checked against the rows parsed: a mismatch leaves the lines
of that block unknown, never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from daskfeed.reading._records import _odd_quote_runs, _quote_flips

_LF, _CR = ord("\n"), ord("\r")
_STRIDE = 4 << 20  # bytes whose separators are counted at a time (bounds the temporary arrays)


@dataclass
class RowLines:
    r"""The lines of the rows :func:`~daskfeed.reading.iter_tables` parses from one block.

    Filled text by text as the block is parsed; nothing is kept per row while every text has
    one row per line.

    Attributes
    ----------
    breaks
        Line breaks in the text the block parsed as its own (from its first record's first byte
        to the next block's; a whole file: its text after the header); None: not read as text
        lines (Parquet, or an encoding whose line break is not the byte ``\n``).
    rows
        Rows parsed.
    known
        False when the line of some row could not be found (see the module).
    """

    breaks: int | None = 0
    rows: int = 0
    known: bool = True
    # (line breaks before the text, its rows, their lines from the block's first line or None:
    # one per line from there)
    _texts: list[tuple[int, int, np.ndarray | None]] = field(default_factory=list, repr=False)

    def add(self, body: bytes, rows: int, skipped: int, sep: str, width: int | None) -> None:
        """Count one text of the block: ``rows`` parsed from ``body``, ``skipped`` lines skipped.

        Parameters
        ----------
        body
            Whole records, in file order after the texts added before.
        rows, skipped
            What pyarrow parsed from it, and the malformed lines it skipped.
        sep
            The delimiter.
        width
            The header's number of fields when lines of another number are skipped (bad_lines
            skip or quarantine); None: every record is a row.
        """
        if self.breaks is None:
            return
        base = self.breaks
        self.breaks += body.count(b"\n")
        self.rows += rows
        if not self.known:
            return
        lines = self.breaks - base + (bool(body) and not body.endswith(b"\n"))
        if not rows and not skipped:  # (blank lines only: no row to place)
            self._texts.append((base, 0, np.zeros(0, np.int64)))
            return
        if rows == lines and not skipped and not lone_cr(body):
            self._texts.append((base, rows, None))
            return
        found = row_offsets(body, sep, rows, skipped, width)
        if found is None:
            self.known = False
            self._texts = []
        else:
            self._texts.append((base, rows, found + base))

    def not_lines(self) -> None:
        """Say the block is not read as text lines (its rows have no line)."""
        self.breaks = None
        self._texts = []

    def offsets(self) -> np.ndarray | None:
        """The line of each row from the block's first line; None when row ``i`` is on line ``i``.

        Returns
        -------
        numpy.ndarray or None
            int64, one per row parsed (only meaningful while :attr:`known` and :attr:`breaks`
            is set).
        """
        if all(found is None for _, _, found in self._texts):
            at = 0
            for base, rows, _ in self._texts:
                if base != at:
                    break
                at += rows
            else:
                return None
        full = np.concatenate([np.arange(base, base + rows) if found is None else found
                               for base, rows, found in self._texts] or [np.zeros(0, np.int64)])
        if np.array_equal(full, np.arange(full.size)):
            return None
        return full.astype(np.int64)


def lone_cr(body: bytes) -> bool:
    r"""Whether some ``\r`` in ``body`` is not followed by ``\n`` (pyarrow ends a record there)."""
    return body.find(b"\r") >= 0 and body.count(b"\r") != body.count(b"\r\n")


def row_offsets(body: bytes, sep: str, rows: int, skipped: int,
                width: int | None) -> np.ndarray | None:
    r"""The line each row of ``body`` starts on (from 0), its records found as pyarrow finds them.

    Parameters
    ----------
    body
        Whole records.
    sep
        The delimiter (one byte).
    rows, skipped
        The rows pyarrow parsed from ``body`` and the malformed lines it skipped: the check.
    width
        The header's number of fields when lines of another number were skipped; None: every
        record is a row.

    Returns
    -------
    numpy.ndarray or None
        int64, one per row; None when the records found are not ``rows`` rows and ``skipped``
        skipped lines (the lines are then not known).
    """
    sep_bytes = sep.encode("utf-8")
    if len(sep_bytes) != 1:
        return None
    arr = np.frombuffer(body, np.uint8)
    flips = np.zeros(0, np.int64)
    if body.find(b'"') >= 0:
        flips = _quote_flips(arr, _odd_quote_runs(arr), sep_bytes[0], False, _LF)
        if flips.size & 1:  # a quoted field open at the end: not whole records
            return None
    lf = np.flatnonzero(arr == _LF)
    ends = lf if body.find(b"\r") < 0 else np.union1d(lf, np.flatnonzero(arr == _CR))
    if flips.size:
        ends = ends[(np.searchsorted(flips, ends) & 1) == 0]  # outside quoted fields
    starts = np.concatenate(([0], ends + 1))
    stops = np.concatenate((ends, [arr.size]))
    records = stops > starts  # an empty line is no record
    kept = records
    if width is not None:
        fields = _fields(arr, sep_bytes[0], flips, starts)
        kept = records & (fields == width)
    if int(np.count_nonzero(kept)) != rows or int(np.count_nonzero(records & ~kept)) != skipped:
        return None
    return np.searchsorted(lf, starts[kept]).astype(np.int64)


def _fields(arr: np.ndarray, sep: int, flips: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The number of fields of each record (``starts``: where each starts), a stride at a time."""
    counts = np.ones(starts.size, np.int64)
    for a in range(0, arr.size, _STRIDE):
        at = np.flatnonzero(arr[a : a + _STRIDE] == sep) + a
        if flips.size:
            at = at[(np.searchsorted(flips, at) & 1) == 0]
        counts += np.bincount(np.searchsorted(starts, at, side="right") - 1, minlength=starts.size)
    return counts
