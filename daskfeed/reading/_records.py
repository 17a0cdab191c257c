"""Records: CSV text cut into whole records: the header line, quoted fields, unbalanced quotes.

A compressed file cannot be split into byte ranges, so its decompressed stream is cut into
buffers of whole records by :func:`record_buffers`, which scans quotes once, in order
(:class:`Quotes`, by pyarrow's quoting rules). ``pyarrow.csv.open_csv`` streams too, but fixes
each column's type from its first block (a later text value is an error) and reports an unclosed
quote as "straddles two block boundaries", naming no file, line or byte (checked with pyarrow 26).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

from daskfeed.core import DataError, SchemaError

_BOM = b"\xef\xbb\xbf"


def parse_header(line: bytes, sep: str, path: str, encoding: str = "utf-8", *,
                 max_columns: int) -> list[str]:
    """The column names in a header line.

    Parameters
    ----------
    line
        The file's first line, as read (a UTF-8 BOM and the line break are dropped).
    sep
        The delimiter.
    path
        The file (for errors).
    encoding
        The file's text encoding.
    max_columns
        The most columns it may name (``daskfeed.max-columns``, resolved with the read
        options: :attr:`~daskfeed.reading._tables.ReadOptions.max_columns`).

    Returns
    -------
    list of str
        The names; [] for an empty line.

    Raises
    ------
    DataError
        When the line is not ``encoding`` text, or names more than ``max_columns`` columns.
    SchemaError
        When a name is there twice.
    """
    if line.startswith(_BOM):
        line = line[len(_BOM) :]
    try:
        text = line.decode(encoding).rstrip("\r\n")
    except UnicodeDecodeError as err:
        utf16 = line.startswith((b"\xff\xfe", b"\xfe\xff")) or line.count(b"\x00") > len(line) // 4
        raise DataError(
            f"Expected a {encoding} header line in {path}. Received bytes {line[:60]!r}.\n"
            + ("Hint: the file looks like UTF-16 text (a byte-order mark, a zero byte beside "
               "each letter): re-encode it as UTF-8 first, e.g. iconv -f UTF-16 -t UTF-8 in.csv "
               "> out.csv." if utf16 else
               "Hint: pass encoding='latin-1' (or the file's real encoding), or re-encode as "
               "UTF-8.")) from err
    if not text:
        return []
    try:
        names = next(csv.reader([text], delimiter=sep))
    except csv.Error as err:  # (a field past the csv module's limit, 128 KiB; a stray NUL ...)
        if "\r" in text:  # lines that end with \r alone: the file read as its first line
            raise DataError(
                f"Expected lines that end with \\n or \\r\\n in {path}. Received: a line break "
                f"\\r alone (classic Mac OS) in its first line: {text[:60]!r}.\nHint: convert "
                "the line breaks first, e.g. tr '\\r' '\\n' < in.csv > out.csv.") from err
        raise DataError(
            f"Expected a CSV header line in {path} (line 1). Received: {err}; it starts "
            f"{text[:60]!r}.\nHint: is it a CSV file? Column names longer than 128 KiB are not "
            "read.") from err
    if len(names) > max_columns:
        raise DataError(
            f"Expected at most {max_columns:,} columns in the header of {path} (line 1). "
            f"Received: {len(names):,} columns split on {sep!r}; it starts {text[:60]!r}.\n"
            "Hint: is it a CSV file, and is its separator --sep (sep=)? A table this wide needs "
            f"daskfeed.max-columns raised (DASK_DASKFEED__MAX_COLUMNS={len(names)}, or "
            f"dask.config.set({{'daskfeed.max-columns': {len(names)}}})).")
    seen: dict[str, int] = {}
    for i, name in enumerate(names, start=1):
        if name in seen:
            raise SchemaError(
                f"Expected distinct column names in the header of {path}. Received: {name!r} "
                f"as column {seen[name]} and column {i} (line 1).\nHint: rename one of them in "
                "the file; a column is told by its name everywhere (features, --exclude, the "
                "model's inputs).")
        seen[name] = i
    return names


def line_number(f: IO[bytes], offset: int, most: int = 256 * 2**20) -> int | None:
    """The line number of a byte of a file.

    Parameters
    ----------
    f
        The open file (seeked to 0 and read).
    offset
        The byte.
    most
        Bytes counted at most.

    Returns
    -------
    int or None
        1-based; None when ``offset`` is past ``most`` bytes.
    """
    if offset > most:
        return None
    f.seek(0)
    lines, left = 1, offset
    while left > 0 and (data := f.read(min(left, 16 * 2**20))):
        lines += data.count(b"\n")
        left -= len(data)
    return lines


def quote_limit(blocksize: int) -> int:
    """Bytes a quoted field may stay open in a stream before it is taken for an unbalanced quote.

    Parameters
    ----------
    blocksize
        The read's blocksize.

    Returns
    -------
    int
        Four blocksizes, at least 64 MiB.
    """
    return max(4 * blocksize, 64 * 2**20)


def record_buffers(f: IO[bytes], start: int, size: int, *, path: str = "", sep: str = ",",
                   limit: int | None = None, compressed: bool = True) -> Iterator[tuple[int, bytes]]:
    """Buffers of whole records, about ``size`` bytes each, of a (decompressed) stream.

    Each buffer ends at a line break outside quoted fields. The stream is scanned once, in
    order (:class:`Quotes`), so the work is linear in its length. Only an empty read ends it.

    Parameters
    ----------
    f
        The (decompressed) stream, after its header line.
    start
        The stream offset of its first byte (the header is before it).
    size
        Bytes per buffer, about.
    path, sep
        The file (for errors) and its delimiter.
    limit
        Bytes a quoted field may stay open (default :func:`quote_limit`).
    compressed
        Whether offsets are of decompressed text (for errors).

    Yields
    ------
    tuple of (int, bytes)
        The stream offset of each buffer and the buffer.

    Raises
    ------
    DataError
        When a quoted field stays open for more than ``limit`` bytes (default
        :func:`quote_limit`) or up to the end of the stream: an unbalanced quote; when a line
        runs past ``limit`` bytes without a line break (a file that is not CSV, e.g. one line
        of JSON): read no further than that, whatever the file's size.
    """
    limit = quote_limit(size) if limit is None else limit
    buf = bytearray()
    quotes = Quotes(sep)
    pos, line = start, 2  # stream offset and line number of buf[0] (the header is line 1)
    while data := f.read(max(size - len(buf), min(size, 1 << 20), 1)):
        buf += data
        quotes.scan(buf, final=False)
        if quotes.inside and len(buf) - quotes.opened > limit:
            raise unclosed_quote(path, buf, quotes.opened, pos, line, compressed,
                                 f"is still open {len(buf) - quotes.opened:,} bytes later "
                                 f"(the limit is {limit:,})")
        if not quotes.inside and not quotes.cut and len(buf) > limit:
            raise long_line(path, buf, pos, line, compressed, limit)
        if quotes.cut and len(buf) >= size:
            cut = quotes.cut
            with memoryview(buf) as view:
                out = bytes(view[:cut])
            yield pos, out
            del buf[:cut]
            quotes.drop(cut)
            pos, line = pos + cut, line + out.count(b"\n")
    quotes.scan(buf, final=True)
    if quotes.inside:
        raise unclosed_quote(path, buf, quotes.opened, pos, line, compressed,
                             "is never closed before the end of the file")
    if (buf and not buf.isspace()) or pos == start:
        yield pos, bytes(buf)


_QUOTE, _LF, _CR = ord('"'), ord("\n"), ord("\r")
_STRIDE = 4 << 20  # bytes scanned at a time: bounds the scanner's temporary arrays


@dataclass
class Quotes:
    """Quoted fields of a CSV buffer, by pyarrow's rules, scanned incrementally.

    ``buf[0]`` starts a record. A quote opens a quoted field only at the start of a field
    (after the separator or a line break); inside one, ``""`` is a quote and a lone ``"``
    closes it; any other quote is text (``5'11"``). :meth:`scan` goes on from ``scanned``,
    never re-reading what it saw.

    Attributes
    ----------
    stride
        Bytes scanned at a time (bounds the temporary arrays).
    scanned
        Bytes of the buffer scanned so far.
    inside
        Whether a quoted field is open at ``scanned``.
    opened
        Index of the quote that opened it (meaningful while ``inside``).
    cut
        Index just after the last line break outside quoted fields (0: none yet).
    """

    sep: str = ","
    stride: int = _STRIDE
    scanned: int = 0
    inside: bool = False
    opened: int = -1
    cut: int = 0

    def scan(self, buf: bytes | bytearray, *, final: bool) -> None:
        """Scan the bytes added to ``buf`` since the last call.

        A run of quotes at the end of a buffer that may grow (``final=False``) waits for the
        next call: whether ``""`` follows decides what it means.

        Parameters
        ----------
        buf
            The buffer read so far (bytes before :attr:`cut` already dropped).
        final
            True when ``buf`` ends the stream (no more bytes follow).
        """
        end = len(buf)
        if not final:
            while end > self.scanned and buf[end - 1] == _QUOTE:
                end -= 1
        while self.scanned < end:
            stop = min(self.scanned + self.stride, end)
            while stop < end and buf[stop - 1] == _QUOTE:  # never split a run of quotes
                stop += 1
            self._scan_span(buf, self.scanned, stop)
            self.scanned = stop

    def drop(self, n: int) -> None:
        """Forget the first ``n`` bytes of the buffer (``n`` is :attr:`cut`).

        Parameters
        ----------
        n
            Bytes dropped from the buffer's start.
        """
        self.scanned -= n
        self.opened -= n
        self.cut = 0

    def _scan_span(self, buf: bytes | bytearray, start: int, stop: int) -> None:
        if buf.find(b'"', start, stop) < 0:  # the usual case: no quote, only line breaks
            if not self.inside and (nl := buf.rfind(b"\n", start, stop)) >= 0:
                self.cut = nl + 1
            return
        arr = np.frombuffer(buf, np.uint8, stop - start, start)
        odd = _odd_quote_runs(arr)
        prev = buf[start - 1] if start else _LF
        flips = _quote_flips(arr, odd, ord(self.sep), self.inside, prev)
        inside_after = self.inside ^ bool(flips.size & 1)
        nl = -1
        if not inside_after:  # after the last flip is outside: its last line break, if any
            nl = buf.rfind(b"\n", start + (int(flips[-1]) if flips.size else 0), stop)
        if nl < 0 and flips.size:
            breaks = np.flatnonzero(arr == _LF)
            outside = breaks[(np.searchsorted(flips, breaks) & 1) == int(self.inside)]
            nl = start + int(outside[-1]) if outside.size else -1
        if nl >= 0:
            self.cut = nl + 1
        if inside_after and flips.size:
            self.opened = start + int(flips[-1])
        self.inside = inside_after


def _odd_quote_runs(arr: np.ndarray) -> np.ndarray:
    """Positions in ``arr`` of the first quote of each run of an odd number of quotes."""
    q = np.flatnonzero(arr == _QUOTE)
    adjacent = q[1:] - q[:-1] == 1
    if not adjacent.any():  # most text: every quote is a run of one
        return q
    first = np.ones(q.size, dtype=bool)
    first[1:] = ~adjacent
    starts = np.flatnonzero(first)
    return q[starts[(np.diff(starts, append=q.size) & 1) == 1]]


def _quote_flips(arr: np.ndarray, odd: np.ndarray, sep: int, inside: bool, prev: int) -> np.ndarray:
    """Positions in ``arr`` where a quoted field opens or closes, in order.

    ``odd``: the runs of an odd number of quotes (:func:`_odd_quote_runs`), the only ones
    that can change the state (``""`` never does). Inside a field every such run closes it;
    outside, it opens one only at the start of a field. When every opening run is at a field
    start (well-formed CSV) the state simply alternates.
    """
    if odd.size == 0:
        return odd
    before = arr[odd - 1]
    if odd[0] == 0:
        before[0] = prev
    at_field_start = (before == sep) | (before == _LF) | (before == _CR)
    opening = at_field_start[int(inside)::2]  # the runs that open a field if the state alternates
    if bool(opening.all()):
        return odd
    return _quote_flips_in_order(odd, at_field_start, inside)


def _quote_flips_in_order(odd: np.ndarray, at_field_start: np.ndarray, inside: bool) -> np.ndarray:
    """:func:`_quote_flips` one run at a time, for text with quotes inside unquoted fields."""
    flips = []
    for pos, field_start in zip(odd.tolist(), at_field_start.tolist(), strict=True):
        if inside or field_start:
            flips.append(pos)
            inside = not inside
    return np.asarray(flips, dtype=np.int64)


def long_line(path: str, buf: bytes | bytearray, pos: int, line: int | None, compressed: bool,
              limit: int, length: int | None = None) -> DataError:
    """The error for a line that runs past ``limit`` bytes.

    ``buf[0]`` is at byte ``pos``, on line ``line`` (None: not counted); ``length``: the bytes
    the line runs, else ``len(buf)``.
    """
    where = f"byte {pos:,}{' of the decompressed text' if compressed else ''}"
    which = f"line {line:,} (at {where})" if line is not None else f"the line at {where}"
    return DataError(
        f"Expected CSV lines of at most {limit:,} bytes in {path}. Received: {which} runs past "
        f"{len(buf) if length is None else length:,} bytes without a line break; it starts "
        f"{bytes(buf[:60])!r}.\nHint: is it a CSV file? (one line of JSON or a binary file is "
        "not); lines longer than that need a larger --blocksize (the limit is four blocksizes, "
        "at least 64 MiB).")


def read_header(f: IO[bytes], path: str, limit: int) -> bytes:
    """The first line of ``f`` (its header), read no further than ``limit`` bytes.

    Raises
    ------
    DataError
        When no line break comes within ``limit`` bytes of a file longer than that.
    """
    try:
        line = f.readline(limit + 1)
    except TypeError:  # fsspec's remote files take no size: read in pieces, then seek back
        line = _bounded_line(f, limit)
    if len(line) > limit:
        hint = ("its lines end with \\r alone (classic Mac OS): convert them first, e.g. "
                "tr '\\r' '\\n' < in.csv > out.csv" if b"\r" in line else
                "is it a CSV file? (one line of JSON or a binary file is not); a longer header "
                "needs a larger --blocksize (the limit is four blocksizes, at least 64 MiB)")
        raise DataError(
            f"Expected a header line of at most {limit:,} bytes in {path}. Received: no line "
            f"break in its first {limit:,} bytes; it starts {line[:60]!r}.\nHint: {hint}.")
    return line


def _bounded_line(f: IO[bytes], limit: int) -> bytes:
    """``f.readline(limit + 1)`` for a seekable file whose ``readline`` takes no size."""
    start, got = f.tell(), bytearray()
    while len(got) <= limit:
        chunk = f.read(min(1 << 16, limit + 1 - len(got)))
        if not chunk:
            break
        end = chunk.find(b"\n")
        if end >= 0:
            got += chunk[:end + 1]
            f.seek(start + len(got))  # (the stream goes on right after the line)
            return bytes(got)
        got += chunk
    return bytes(got)


def unclosed_quote(path: str, buf: bytes | bytearray, opened: int, pos: int, line: int | None,
                    compressed: bool, what: str, hint: str = "") -> DataError:
    """The error for an unbalanced quote.

    Parameters
    ----------
    path
        The file.
    buf
        Text of the file; ``buf[0]`` is at byte ``pos``, on line ``line``.
    opened
        Where the quote is in ``buf``.
    pos, line
        Where ``buf`` starts; ``line`` None: not known (counted from ``pos`` instead).
    compressed
        Whether ``pos`` is an offset into decompressed text.
    what, hint
        What became of the field, and an extra hint.

    Returns
    -------
    DataError
        To raise.
    """
    line_start = buf.rfind(b"\n", 0, opened) + 1
    at_line = buf.count(b"\n", 0, opened)
    where = (f"line {line + at_line}" if line is not None else
             f"line {at_line + 1} counted from byte {pos:,}")
    text = bytes(buf[line_start:min(opened + 60, line_start + 160)]).split(b"\n")[0]
    return DataError(
        f"Expected every quoted field to be closed. Received: the quote at {where}, byte "
        f"{pos + opened:,}{' of the decompressed text' if compressed else ''} of {path} opens "
        f"a field that {what}; the lines after it would be read as one field.\n"
        f"  that line starts: {text.decode('utf-8', 'replace')!r}\n"
        'Hint: an unbalanced " in that line: fix the line, or its quoting (a field with a '
        'quote in it is written in quotes, its quotes doubled: "5\'11""").' + (f" {hint}" if hint else "")
    )


