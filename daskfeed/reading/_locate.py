"""Where values are: the line and field of a value in one block, read again for a message.

The scan keeps counts of values, not their places. A refusal that names a value (a stray ``?``
in a column of numbers) finds where it first is by reading that block once more: its text in
buffers of whole records, each searched for the value as a whole field of its column (a byte
search where no field is quoted; else record by record with Python's ``csv`` module). Lines
are numbered as an editor numbers them: the header is line 1, a quoted field over two lines
counts two. Only on the way to an error: one block read, at most.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import IO

from daskfeed.reading._files import Block, compression_of, is_parquet
from daskfeed.reading._records import (
    line_number,
    parse_header,
    quote_limit,
    read_header,
    record_buffers,
)
from daskfeed.reading._streams import open_file
from daskfeed.reading._tables import ReadOptions, record_range


@dataclass(frozen=True)
class Spot:
    """Where a value of a column first is in a block.

    ``line`` is the line of the record holding it (the header is line 1); ``from_byte`` is 0
    when lines are counted from the file's start, else the byte they are counted from (a
    block that starts more than :func:`~daskfeed.reading.line_number`'s bound into
    its file: ``line`` is then the line counted from that byte, the first being 1).
    """

    value: str
    path: str
    line: int
    column: str
    field: int  # 1-based, in that file's header
    from_byte: int = 0

    def describe(self) -> str:
        """Say where the value is, for messages.

        Returns
        -------
        str
            ``line 1,502 of data.csv (column 'x', field 3)``, or with the byte lines are
            counted from when that is not the file's start.
        """
        at = f"line {self.line:,}" + (f" counted from byte {self.from_byte:,}" if self.from_byte else "")
        return f"{at} of {self.path} (column {self.column!r}, field {self.field})"


def locate_values(block: Block, options: ReadOptions, column: str, values: Collection[str]) -> list[Spot]:
    """The first place of each of ``values`` as a field of ``column`` in ``block``.

    Reads the block again (on the caller's machine), stopping once every value is found: to
    name the line of a value in an error.

    Parameters
    ----------
    block
        A block of a CSV file (a byte range or a whole file, compressed or not).
    options
        How it is read.
    column
        The column, by name (its field is looked up in the file's own header).
    values
        The values to find, as the field reads (unquoted).

    Returns
    -------
    list of Spot
        Of the values found, in the order of the file; [] for a Parquet file, or a header
        without ``column``.
    """
    wanted = {v for v in values if v}
    if is_parquet(block.path) or not wanted:
        return []
    with open_file(block.path, dict(options.storage_options), compression_of(block.path)) as f:
        header = read_header(f, block.path, quote_limit(options.blocksize))
        names = parse_header(header, options.sep, block.path, options.encoding,
                             max_columns=options.max_columns)
        if column not in names:
            return []
        index = names.index(column)
        found: dict[str, Spot] = {}
        for first, from_byte, buf in _buffers(f, block, len(header), options):
            for value, at in _first_lines(buf, wanted - found.keys(), options, index).items():
                found[value] = Spot(value, block.path, first + at, column, index + 1, from_byte)
            if len(found) == len(wanted):
                break
    return sorted(found.values(), key=lambda s: s.line)


def _buffers(f: IO[bytes], block: Block, header: int,
             options: ReadOptions) -> Iterator[tuple[int, int, bytes]]:
    """The block's records in buffers: ``(line of the buffer's start, byte lines count from, text)``.

    A byte range is one buffer (its start's line counted from the file's start, unless that
    is past :func:`~daskfeed.reading._records.line_number`'s bound: then from its start); a
    whole file is read as a stream, in buffers of about a blocksize of whole records.
    """
    if block.length >= 0:
        start, stop = record_range(f, block, header, options.sep)
        if stop > start:
            line = line_number(f, start)
            f.seek(start)
            yield (line, 0, f.read(stop - start)) if line is not None else (1, start, f.read(stop - start))
        return
    line = 2
    for _, buf in record_buffers(f, header, options.blocksize, path=block.path, sep=options.sep,
                                 compressed=bool(compression_of(block.path))):
        yield line, 0, buf
        line += buf.count(b"\n")


def _first_lines(buf: bytes, values: set[str], options: ReadOptions, index: int) -> dict[str, int]:
    """``{value: line of its first record (0: buf's first)}`` of the ``values`` that field ``index`` holds."""
    if b'"' not in buf and codecs.lookup(options.encoding).name == "utf-8":  # no quoted fields
        return {v: at for v in values if (at := _plain_line(buf, v.encode(), options.sep.encode(),
                                                             index)) is not None}
    found: dict[str, int] = {}
    text = io.StringIO(buf.decode(options.encoding, "replace"), newline="")
    reader = csv.reader(text, delimiter=options.sep, quotechar='"', doublequote=True, strict=False)
    before = 0  # lines read before the record
    try:
        for row in reader:
            if index < len(row) and row[index] in values and row[index] not in found:
                found[row[index]] = before
                if len(found) == len(values):
                    break
            before = reader.line_num
    except csv.Error:  # (a field over csv's size limit: nothing more is told)
        pass
    return found


def _plain_line(buf: bytes, value: bytes, sep: bytes, index: int) -> int | None:
    """The line (0: the first) of the first record of ``buf`` whose field ``index`` is ``value``.

    No field of ``buf`` is quoted: a record is a line, and a field is what lies between
    separators. Each place ``value`` ends a field is found in C; those where it also starts one
    are candidates, and their field is counted.
    """
    for match in re.finditer(re.escape(value) + b"(?=" + re.escape(sep) + b"|\r?\n|\\Z)", buf):
        at = match.start()
        if at and buf[at - 1 : at] not in (b"\n", sep):
            continue
        start = buf.rfind(b"\n", 0, at) + 1
        if buf.count(sep, start, at) == index:
            return buf.count(b"\n", 0, start)
    return None
