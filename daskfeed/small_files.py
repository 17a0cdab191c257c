"""Small files parsed together: one pyarrow call for up to ``SHARED_FILES`` whole small files.

A ``pyarrow.csv.read_csv`` call costs about 0.4 ms before it parses a byte, as much as parsing
a 1000-row file; a scan task of thousands of small files pays it once per few dozen files here.
The first file of a run is parsed alone (exactly as :func:`daskfeed.tables.iter_tables` does) and
its column types are imposed on the others, parsed as one text; each file's rows are then a
slice of that table and get the null-marker rule of their own block. Anything unusual (another
header, a value that does not fit the first file's types, a line that is no record, bad lines
to skip) falls back to parsing file by file, so errors and counts name the right file. Two
reads differ from a file parsed alone, in kind only: whole numbers after a first file with
decimals read as float64, and dates after a first file with text in that column read as text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from daskfeed.exceptions import DataError
from daskfeed.files import Block, compression_of, is_parquet
from daskfeed.nulls import numbers_by_part
from daskfeed.records import parse_header
from daskfeed.streams import open_file
from daskfeed.tables import (
    ReadOptions,
    check_text,
    dtype_overrides,
    iter_tables,
    read_csv,
    refuse_unclosed,
    with_markers,
)

__all__ = ["SHARED_BYTES", "SHARED_FILES", "SmallFiles"]

SHARED_FILES = 32  # files parsed by one pyarrow call
SHARED_BYTES = 8 << 20  # text parsed by one pyarrow call (bounds the memory held at once)


class SmallFiles:
    """The tables of a scan task's blocks, small whole files parsed a few dozen at a time.

    Parameters
    ----------
    items
        ``(block index, block)`` in the order they are asked for.
    options
        How to parse them.
    """

    def __init__(self, items: Sequence[tuple[int, Block]], options: ReadOptions) -> None:
        self.items = list(items)
        self.options = options
        self.position = {index: n for n, (index, _) in enumerate(self.items)}
        self.parsed: dict[int, pa.Table] = {}

    def tables(self, index: int, block: Block, rejects: list[str] | None = None) -> Iterator[pa.Table]:
        """The tables of block ``index`` (as :func:`daskfeed.tables.iter_tables` gives them).

        Parameters
        ----------
        index, block
            The block and its number in ``items``.
        rejects
            See :func:`daskfeed.tables.iter_tables`.

        Yields
        ------
        pyarrow.Table
            The block's rows in file order.
        """
        if index not in self.parsed and self._shareable(block):
            self.parsed.update(self._parse_from(self.position[index]))
        table = self.parsed.pop(index, None)
        if table is None:
            yield from iter_tables(block, self.options, rejects)
        else:
            yield table

    def _shareable(self, block: Block) -> bool:
        return (block.length < 0 and self.options.bad_lines == "error"
                and not compression_of(block.path) and not is_parquet(block.path))

    def _parse_from(self, start: int) -> dict[int, pa.Table]:
        """Tables of the run of small files from ``items[start]`` on (empty: parse it alone)."""
        texts: list[tuple[int, Block, bytes]] = []
        header = b""
        size = 0
        for index, block in self.items[start : start + SHARED_FILES]:
            if not self._shareable(block):
                break
            with open_file(block.path, dict(self.options.storage_options)) as f:
                data = f.read(self.options.blocksize + 1)
            line_end = data.find(b"\n") + 1
            body = data[line_end:]
            if (not line_end or (texts and data[:line_end] != header) or not body or body.isspace()
                    or len(data) > self.options.blocksize):
                break  # another header, no rows, or no longer small: read on its own
            header = data[:line_end]
            texts.append((index, block, body))
            size += len(data)
            if size >= SHARED_BYTES:
                break
        if len(texts) < 2:
            return {}
        try:  # any trouble: parsed file by file, where errors name the right file
            names = parse_header(header, self.options.sep, texts[0][1].path, self.options.encoding)
            return self._parse_together(texts, names, len(header)) if names else {}
        except DataError:
            return {}

    def _parse_together(self, texts: list[tuple[int, Block, bytes]], names: list[str],
                        start: int) -> dict[int, pa.Table]:
        """The first file parsed alone, the others as one text typed as it is; a table each.

        Returns {} when some line is no record (a field over lines, a blank line): the rows of
        a file are then not its lines.
        """
        bodies = [body if body.endswith(b"\n") or not body else body + b"\n" for _, _, body in texts]
        lines = [body.count(b"\n") for body in bodies]
        forced = dtype_overrides(self.options, names)
        first = read_csv(bodies[0], names, texts[0][1], self.options, None, forced, True)
        types = {name: t for name, t in zip(first.column_names, first.schema.types, strict=True)
                 if not pa.types.is_null(t)}
        rest = read_csv(b"".join(bodies[1:]), names, texts[1][1], self.options, None, forced,
                        True, types)
        if first.num_rows != lines[0] or rest.num_rows != sum(lines[1:]):
            return {}
        # the rule on columns that are not text goes value by value: once for all the files
        bounds = np.concatenate(([0], np.cumsum(lines[1:])))
        numbers = {name: numbers_by_part(col, self.options.na_values, bounds)
                   for name, col in zip(rest.column_names, rest.columns, strict=True)
                   if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type))}
        out = {}
        offset = -lines[0]
        for k, ((index, block, body), n) in enumerate(zip(texts, lines, strict=True)):
            refuse_unclosed(body, body.rfind(b"\n", 0, len(body) - 1) + 1, start, block,
                            self.options.sep)
            part = first if offset < 0 else rest.slice(offset, n)
            check_text(part, block, self.options.encoding)
            done = None if offset < 0 else {
                name: (col.slice(offset, n), made[k - 1]) for name, (col, made) in numbers.items()}
            out[index] = with_markers(part, forced, self.options, block, done)
            offset += n
        return out
