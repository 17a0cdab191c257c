"""Small files parsed together: one pyarrow call for up to ``SHARED_FILES`` whole small files.

A ``pyarrow.csv.read_csv`` call has a fixed cost before it parses a byte; a scan task of
thousands of small files pays it once per run of up to ``SHARED_FILES`` files here. The first
file of a run is parsed alone (exactly as :func:`daskfeed.reading._tables.iter_tables` does)
and its column types are imposed on the others,
parsed as one text; each file's rows are then a slice of that table (a :class:`SharedParse`), with the
null-marker rule of their own block: applied once to the whole table where that gives each
file what it gets alone (numbers; text that reads as text in every file), else file by file.
Anything unusual (another header, a value that does not fit the first file's types, a line
that is no record, bad lines to skip) falls back to parsing file by file, so errors and counts
name the right file. Two reads differ from a file parsed alone, in kind only: whole numbers
after a first file with decimals read as float64, and dates after a first file with text in
that column read as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from daskfeed.core import DataError
from daskfeed.reading._files import Block, compression_of, is_parquet
from daskfeed.reading._lines import lone_cr
from daskfeed.reading._nulls import na_counts, numbers_by_part, text_by_part
from daskfeed.reading._records import parse_header
from daskfeed.reading._streams import open_file, read_at_most
from daskfeed.reading._tables import (
    ReadOptions,
    check_text,
    dtype_overrides,
    read_csv,
    refuse_unclosed,
    with_markers,
)

SHARED_FILES = 128  # files parsed by one pyarrow call (4 tasks of 250 files: 0.94 → 0.82 s vs 32)
SHARED_BYTES = 8 << 20  # text parsed by one pyarrow call (bounds the memory held at once)


@dataclass
class SharedParse:
    """Blocks parsed together: block ``indices[k]`` is the rows ``bounds[k]:bounds[k + 1]`` of ``table``.

    Each block's rows, values and types are those it gets parsed alone (see the module), and
    ``counts[k]`` what the null markers made missing in it (:func:`daskfeed.reading.na_counts`
    of that table). Each file's rows are one per line (else it is not parsed with others);
    ``breaks[k]``: the line breaks of its text after the header.
    """

    indices: list[int]
    table: pa.Table
    bounds: np.ndarray
    counts: list[dict[str, dict[str, int]]]
    breaks: list[int] = field(default_factory=list)

    @classmethod
    def alone(cls, index: int, table: pa.Table) -> SharedParse:
        """One block's table (as :func:`daskfeed.reading.iter_tables` gives it) as one parse."""
        return cls([index], table, np.array([0, table.num_rows]), [na_counts(table)])


class SmallFiles:
    """A scan task's blocks: small whole files parsed up to ``SHARED_FILES`` at a time.

    Each call gives :class:`SharedParse` s.

    Parameters
    ----------
    items
        ``(block index, block)`` in the order they are read.
    options
        How to parse them.
    """

    def __init__(self, items: Sequence[tuple[int, Block]], options: ReadOptions) -> None:
        self.items = list(items)
        self.options = options

    def runs(self, start: int) -> list[SharedParse]:
        """The small files from ``items[start]`` on, parsed together: the first alone, then the rest.

        Empty when ``items[start]`` is to be parsed on its own (not small, not plain, or no
        small file like it follows).

        Parameters
        ----------
        start
            A position in ``items``.

        Returns
        -------
        list of SharedParse
            The runs, in block order.
        """
        if not self._shareable(self.items[start][1]):
            return []
        return self._parse_from(start)

    def _shareable(self, block: Block) -> bool:
        return (block.length < 0 and self.options.bad_lines == "error"
                and not compression_of(block.path) and not is_parquet(block.path))

    def _parse_from(self, start: int) -> list[SharedParse]:
        """The runs of small files from ``items[start]`` on (empty: parse it alone)."""
        texts: list[tuple[int, Block, bytes]] = []
        header = b""
        size = 0
        for index, block in self.items[start : start + SHARED_FILES]:
            if not self._shareable(block):
                break
            with open_file(block.path, dict(self.options.storage_options)) as f:
                data = read_at_most(f, self.options.blocksize + 1)
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
            return []
        try:  # any trouble: parsed file by file, where errors name the right file
            names = parse_header(header, self.options.sep, texts[0][1].path, self.options.encoding,
                                 max_columns=self.options.max_columns)
            return self._parse_together(texts, names, len(header)) if names else []
        except DataError:
            return []

    def _parse_together(self, texts: list[tuple[int, Block, bytes]], names: list[str],
                        start: int) -> list[SharedParse]:
        """The first file parsed alone, the others as one text typed as it is.

        Returns [] when some line is no record (a field over lines, a blank line, a carriage return
        alone ending a line): the rows of a file are then not its lines.
        """
        if any(lone_cr(body) for _, _, body in texts):
            return []
        ends = [not body or body.endswith(b"\n") for _, _, body in texts]  # (else one is added)
        bodies = [body if end else body + b"\n" for (_, _, body), end in zip(texts, ends, strict=True)]
        lines = [body.count(b"\n") for body in bodies]
        forced = dtype_overrides(self.options, names)
        first = read_csv(bodies[0], names, texts[0][1], self.options, None, forced, True)
        types = {name: t for name, t in zip(first.column_names, first.schema.types, strict=True)
                 if not pa.types.is_null(t)}
        rest = read_csv(b"".join(bodies[1:]), names, texts[1][1], self.options, None, forced,
                        True, types)
        if first.num_rows != lines[0] or rest.num_rows != sum(lines[1:]):
            return []
        for (_, block, body) in texts:
            refuse_unclosed(body, body.rfind(b"\n", 0, len(body) - 1) + 1, start, block,
                            self.options.sep)
        check_text(first, texts[0][1], self.options.encoding)
        if any(pa.types.is_binary(t) or pa.types.is_large_binary(t) for t in rest.schema.types):
            return []  # not text: the file by file read names the file
        head = SharedParse.alone(texts[0][0], with_markers(first, forced, self.options, texts[0][1]))
        bounds = np.concatenate(([0], np.cumsum(lines[1:])))
        runs = [head, *self._rest(rest, [(i, b) for i, b, _ in texts[1:]], bounds, forced)]
        breaks = {index: n - (not end)  # (the file's own line breaks)
                  for (index, _, _), n, end in zip(texts, lines, ends, strict=True)}
        for run in runs:
            run.breaks = [breaks[i] for i in run.indices]
        return runs

    def _rest(self, rest: pa.Table, blocks: list[tuple[int, Block]], bounds: np.ndarray,
              forced: dict[str, pa.DataType]) -> list[SharedParse]:
        """The files after the first: one run, or a run per file (each with its own types).

        One run when the null-marker rule can be applied once for all of them.
        """
        na = self.options.na_values
        done = {}
        for name, col in zip(rest.column_names, rest.columns, strict=True):
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                done[name] = numbers_by_part(col, na, bounds)  # value by value: once for all
            elif name not in forced:
                whole = text_by_part(col, na, bounds, self.options.decimal)
                if whole is not None:
                    done[name] = whole
        if len(done) == rest.num_columns:
            counts = [{name: made[k] for name, (_, made) in done.items() if made[k]}
                      for k in range(len(blocks))]
            table = pa.Table.from_arrays([done[n][0] for n in rest.column_names], names=rest.column_names)
            return [SharedParse([i for i, _ in blocks], table, bounds, counts)]
        runs = []  # some column is decided file by file (numbers in a text column?): runs of one
        for k, (index, block) in enumerate(blocks):
            a, n = bounds[k], bounds[k + 1] - bounds[k]
            runs.append(SharedParse.alone(index, with_markers(
                rest.slice(a, n), forced, self.options, block,
                {name: (col.slice(a, n), made[k]) for name, (col, made) in done.items()})))
        return runs
