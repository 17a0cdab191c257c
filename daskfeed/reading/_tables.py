"""Tables: one block parsed into Arrow tables with pyarrow, the same way wherever it comes from.

A byte range or a small file gives one table; a compressed file is parsed in buffers of whole
records (:func:`daskfeed.reading._records.record_buffers`); a Parquet file gives a table per row group;
a partition of a dask DataFrame is converted column by column (:func:`frame_table`). Every table then
gets the null-marker rule and the normalized types of :mod:`daskfeed.reading._nulls`.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pacsv

from daskfeed.core import DataError
from daskfeed.reading._files import Block, compression_of, is_parquet
from daskfeed.reading._lines import RowLines
from daskfeed.reading._nulls import (
    column_markers,
    finite_floats,
    normalize,
    normalize_column,
    with_na_counts,
)
from daskfeed.reading._records import (
    Quotes,
    line_number,
    long_line,
    parse_header,
    quote_limit,
    read_header,
    record_buffers,
    unclosed_quote,
)
from daskfeed.reading._splits import SplitError, ends_inside, record_start
from daskfeed.reading._streams import open_file, read_at_most

if TYPE_CHECKING:
    import pandas as pd

# what to do with a line whose field count differs from the header's
BAD_LINES = ("error", "skip", "quarantine")


@dataclass(frozen=True)
class ReadOptions:
    """How blocks are parsed; part of the fingerprint, so changing one invalidates manifests."""

    blocksize: int = 64 * 2**20
    sep: str = ","
    encoding: str = "utf-8"
    dtype: tuple[tuple[str, str], ...] = ()
    # credentials may be in here: never compared, printed nor written (repr=False)
    storage_options: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    bad_lines: str = "error"  # error | skip | quarantine (see BAD_LINES)
    na_values: tuple[str, ...] = ()  # the user's null markers: missing in every column
    decimal: str = "."  # the numbers' decimal point (pyarrow's decimal_point; "," in many locales)
    # no separator chosen: the Source that lists the files makes it a tab when all are .tsv
    sep_by_suffix: bool = False
    # columns a header may name (daskfeed.max-columns, shipped 10,000): a bound, not a way of
    # reading, so it enters no fingerprint and no comparison
    max_columns: int = field(default=10_000, compare=False)


@dataclass
class FieldText:
    """Columns wanted also as their fields' text, as written, beside the parsed tables.

    What ``daskfeed predict --keep`` writes into a CSV: ``2013-01-01T10:00:00Z``, ``1.50`` and
    ``007`` as they are, not as the values pyarrow read from them. :func:`iter_tables` appends
    one table of these columns per table it yields, the same rows in the same order: parsed
    from the same bytes as their field text (quotes removed, no null marker applied: an empty
    field is ``""``), or, from a Parquet file, the columns as read.

    Attributes
    ----------
    columns
        The columns.
    tables
        Filled by :func:`iter_tables`.
    """

    columns: tuple[str, ...]
    tables: list[pa.Table] = field(default_factory=list)


def iter_tables(block: Block, options: ReadOptions, rejects: list[str] | None = None,
                text: FieldText | None = None, lines: RowLines | None = None,
                ) -> Iterator[pa.Table]:
    """Parse one block into Arrow tables, at most about ``blocksize`` of text each (on a worker).

    A byte range or a small file gives one table. A compressed file cannot be split into byte
    ranges, so it is decompressed as a stream and parsed in buffers of whole records: memory
    stays bounded by the blocksize however large the file. Each table's column types are
    inferred on its own rows; what the null markers made missing is in its schema metadata
    under the key ``b"daskfeed.na_counts"``.

    Parameters
    ----------
    block
        The block to read.
    options
        How to parse it.
    rejects
        Lines skipped under ``bad_lines="skip"|"quarantine"`` are appended here (their text).
    text
        Columns wanted also as their fields' text: one table of them is appended to its
        ``tables`` per table yielded (see :class:`FieldText`).
    lines
        Where the line of each row parsed is counted (:class:`~daskfeed.reading.RowLines`;
        a Parquet file's rows have none).

    Yields
    ------
    pyarrow.Table
        The block's rows, in file order.

    Raises
    ------
    DataError
        On a line that cannot be parsed, an unbalanced quote (naming file, line and byte), or
        a damaged compressed file.
    """
    so = dict(options.storage_options)
    if is_parquet(block.path):
        if lines is not None:
            lines.not_lines()
        for table in _parquet_tables(block, so):
            if text is not None:
                text.tables.append(table.select(list(text.columns)))
            yield table
        return
    compression = compression_of(block.path)
    with open_file(block.path, so, compression) as f:
        header = read_header(f, block.path, quote_limit(options.blocksize))
        names = parse_header(header, options.sep, block.path, options.encoding,
                             max_columns=options.max_columns)
        if not names:
            return
        if lines is not None and "\n".encode(options.encoding) != b"\n":
            lines.not_lines()  # (UTF-16: its lines are not counted by the byte \n)
        if block.length >= 0:
            yield _byte_range_table(f, block, header, names, options, rejects, text, lines)
            return
        if not compression:  # a whole small file: read at once (see _small_file_table)
            body = read_at_most(f, options.blocksize + 1)
            if len(body) <= options.blocksize:
                yield _small_file_table(body, len(header), names, block, options, rejects, text,
                                        lines)
                return
            f.seek(len(header))  # grew past the blocksize since it was listed: as a stream
        first = True
        for start, body in record_buffers(f, len(header), options.blocksize, path=block.path,
                                          sep=options.sep, compressed=bool(compression)):
            where = block if first and len(body) < options.blocksize else Block(
                block.path, start, len(body), block.file_index)
            first = False
            yield _parse(body, names, where, options, rejects, whole=True,  # ends outside quotes
                         text=text, lines=lines)


def _small_file_table(body: bytes, start: int, names: list[str], block: Block,
                      options: ReadOptions, rejects: list[str] | None,
                      text: FieldText | None = None, lines: RowLines | None = None) -> pa.Table:
    """Parse the whole body of a small file (it starts at byte ``start``, on line 2).

    pyarrow takes a quote left open at the end of the text for a field running to the end. When
    every line is a record only the last line can hold one, so only it is scanned; when pyarrow
    fails or some lines are no records (a field over lines, blank lines), the whole text is.
    """
    skipped: list[str] = [] if rejects is None else rejects
    before = len(skipped)
    try:
        table = _parse(body, names, block, options, skipped, whole=True, text=text, lines=lines)
    except DataError:
        refuse_unclosed(body, 0, start, block, options.sep)
        raise
    if table.num_rows + len(skipped) - before < body.count(b"\n") + (not body.endswith(b"\n")):
        refuse_unclosed(body, 0, start, block, options.sep)
    else:
        refuse_unclosed(body, body.rfind(b"\n", 0, len(body) - 1) + 1, start, block, options.sep)
    return table


def refuse_unclosed(body: bytes, first: int, start: int, block: Block, sep: str) -> None:
    """Raise :class:`DataError` when a quote opened in ``body[first:]`` is never closed.

    Parameters
    ----------
    body
        A small file's text after its header: starts at byte ``start``, on line 2.
    first
        Where to start looking (a record's start).
    start
        The header's length.
    block
        The file's block.
    sep
        The delimiter.

    Raises
    ------
    DataError
        Naming the file, the line and the byte of the quote.
    """
    if body.find(b'"', first) < 0:
        return
    quotes = Quotes(sep)
    quotes.scan(body[first:], final=True)
    if quotes.inside:
        raise unclosed_quote(block.path, body, first + quotes.opened, start, 2, False,
                             "is never closed before the end of the file")


def frame_table(df: pd.DataFrame, options: ReadOptions, index: int) -> pa.Table:
    """One partition of a dask DataFrame as an Arrow table, null markers and types as for CSV.

    Parameters
    ----------
    df
        The computed partition.
    options
        Its read options (the user's null markers).
    index
        The partition's number (for errors).

    Returns
    -------
    pyarrow.Table
        With the ``b"daskfeed.na_counts"`` metadata.
    """
    columns = [_frame_column(df[name]) for name in df.columns]
    table = pa.Table.from_arrays(columns, names=[str(c) for c in df.columns])
    return with_markers(table, {}, options, Block(f"partition {index}", 0, -1, index))


def _frame_column(s: pd.Series) -> pa.ChunkedArray:
    """One pandas column as Arrow: categories as their values, mixed objects as text.

    Text is ``string``, as pyarrow parses it from CSV (pandas' pyarrow strings are large).
    """
    try:
        arr = pa.chunked_array([pa.array(s, from_pandas=True)])
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. numbers and strings in one column
        arr = pa.chunked_array([pa.array([None if v is None or v != v else str(v) for v in s],
                                         pa.string())])
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    return arr


def _parquet_tables(block: Block, storage_options: dict[str, Any]) -> Iterator[pa.Table]:
    import pyarrow.parquet as pq  # only where Parquet is read

    with open_file(block.path, storage_options) as f:
        pf = pq.ParquetFile(f)
        for i in range(pf.num_row_groups):
            yield finite_floats(normalize(pf.read_row_group(i)))  # (NaN, inf: missing)


# where a speculated start fails (SplitError): what the scan does about it, and what a user can
_SPLIT_HINT = ("Hint: the blocks of this file are decided exactly when a scan meets this; scan "
               "the data again (daskfeed scan), or pass a blocksize larger than the file.")


def _byte_range_table(f: IO[bytes], block: Block, header: bytes, names: list[str],
                      options: ReadOptions, rejects: list[str] | None,
                      text: FieldText | None = None, lines: RowLines | None = None) -> pa.Table:
    """Parse the records of one byte range of an uncompressed file.

    Its records are those that start in it: from the first record start at or after its
    offset to the next block's (a line belongs to the block its first byte follows from, however
    long it is; a line break in a quoted field ends no record). Every reader speculates those
    starts alike (:func:`~daskfeed.reading._splits.record_start`) unless the block's exact bytes
    were decided (``block.start``). A range that ends inside a quoted field raises
    :class:`~daskfeed.reading._splits.SplitError` where a start was speculated (the file's
    blocks are then decided exactly); where it was not, the quote is unbalanced.
    """
    size = f.seek(0, os.SEEK_END)
    start, stop = record_range(f, block, len(header), options.sep)
    if block.start < 0 and stop < start:  # the two starts speculated disagree: blocks overlap
        raise SplitError(f"Expected the record starts speculated for {block.describe()} to be in "
                         f"order. Received: {start:,} for its start, {stop:,} for the next "
                         f"block's.\n{_SPLIT_HINT}", block.path)
    _refuse_a_long_last_line(f, block, start, stop, quote_limit(options.blocksize))
    f.seek(start)
    body = f.read(stop - start) if stop > start else b""
    opened = ends_inside(body, options.sep)
    if opened >= 0:
        if block.start < 0 and (block.offset > 0 or stop < size):  # (no line counted: the scan
            raise SplitError(                                       # catches it and goes on)
                f"Expected {block.describe()} to end outside quoted fields where its end was "
                f"speculated (byte {stop:,}). Received: a quoted field opened at byte "
                f"{start + opened:,} still open there.\n{_SPLIT_HINT}", block.path)
        raise unclosed_quote(block.path, body, opened, start, line_number(f, start), False,
                             "is never closed before the end of the file")
    try:
        return _parse(body, names, block, options, rejects, whole=body.find(b'"') >= 0,
                      text=text, lines=lines)
    except DataError as err:  # a speculated start inside a quoted field reads lines that are not records
        if block.start >= 0 or block.offset == 0:
            raise
        raise SplitError(f"{err}\n(The start of {block.describe()} was speculated: the file's "
                         "blocks are decided exactly before this is taken for an error.)",
                         block.path) from err


def _refuse_a_long_last_line(f: IO[bytes], block: Block, start: int, stop: int, limit: int) -> None:
    """Raise when the block's last record runs more than ``limit`` bytes past the block's end.

    A block reads on past its end to its last record's end; a line of gigabytes (a file that is
    not CSV) would be read whole. Only the block's own bytes are read to name the line.
    """
    end = block.offset + max(block.length, 0)
    if stop - max(start, end) <= limit:
        return
    f.seek(start)
    own = f.read(max(0, end - start))  # at most a block
    at = start + own.rfind(b"\n") + 1  # where the line that runs past the end starts
    f.seek(at)
    head = f.read(60)
    raise long_line(block.path, head, at, line_number(f, at), False, limit, length=stop - at)


def record_range(f: IO[bytes], block: Block, header: int, sep: str) -> tuple[int, int]:
    """The bytes of a byte-range block's records: exact (``block.start`` set), or speculated.

    Speculated: from the first record start at or after the block's offset to the next block's
    (a line break in a quoted field ends no record), as every reader finds them alike.

    Parameters
    ----------
    f
        The open (uncompressed) file.
    block
        The byte range.
    header
        The header line's length.
    sep
        The delimiter.

    Returns
    -------
    tuple of int
        ``(start, stop)``; ``stop < start`` when two speculated starts disagree.
    """
    if block.start >= 0:
        return block.start, block.stop
    size = f.seek(0, os.SEEK_END)
    end = block.offset + block.length
    start = header if block.offset == 0 else record_start(f, block.offset, size, sep)
    return start, size if end >= size else record_start(f, end, size, sep)


def _parse(body: bytes, names: list[str], block: Block, options: ReadOptions,
           rejects: list[str] | None, whole: bool = True, text: FieldText | None = None,
           lines: RowLines | None = None) -> pa.Table:
    """Parse whole CSV records into an Arrow table, null markers stated and counted.

    Empty fields are missing in every column. The usual markers are missing only in a column
    whose other values are all numbers; in a text column they stay text, unless listed in
    ``options.na_values``: those are missing in every column. A column holding only markers
    and empties stays text (the scan decides, knowing the other blocks). How many values each
    marker made missing, per column, is in the schema metadata: JSON ``{column: {marker:
    count}}``, non-zero counts only; ``""`` counts empty fields, ``"NaN"`` every NaN pyarrow
    read as a float (``NaN``, ``nan``, ...). ``text``: its columns' field text too, parsed
    from the same bytes (:class:`FieldText`); ``lines``: its rows' lines counted (:class:`RowLines`).
    """
    if not body or body.isspace():  # (no copy of the body)
        if lines is not None:
            lines.add(body, 0, 0, options.sep, None)
        if text is not None:
            text.tables.append(pa.table({n: pa.array([], pa.string()) for n in text.columns}))
        return with_na_counts(pa.table({n: pa.nulls(0) for n in names}), {})
    forced = dtype_overrides(options, names)
    if lines is not None and rejects is None:
        rejects = []  # (to count the lines skipped)
    before = len(rejects) if rejects is not None else 0
    table = read_csv(body, names, block, options, rejects, forced, whole)
    check_text(table, block, options.encoding)
    if lines is not None:
        lines.add(body, table.num_rows, len(rejects or ()) - before, options.sep,
                  len(names) if options.bad_lines != "error" else None)
    if text is not None:
        text.tables.append(_field_text(body, names, block, options, text.columns, whole))
    return with_markers(table, forced, options, block)


def _field_text(body: bytes, names: list[str], block: Block, options: ReadOptions,
                columns: tuple[str, ...], whole: bool) -> pa.Table:
    """``columns`` of ``body``'s records as their fields' text: quotes removed, nothing else.

    The same records as :func:`read_csv` keeps (a line it skips under ``bad_lines`` has the
    wrong number of fields whichever columns are converted; its text is not counted twice).
    """
    try:
        return pacsv.read_csv(
            pa.BufferReader(body), **_csv_options(body, names, options, whole, lambda _row: "skip"),
            convert_options=pacsv.ConvertOptions(
                include_columns=list(columns), column_types=dict.fromkeys(columns, pa.string()),
                strings_can_be_null=False, null_values=[], quoted_strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:  # (read_csv parsed these bytes first)
        raise _parse_error(err, block, names) from err


def _csv_options(body: bytes, names: list[str], options: ReadOptions, whole: bool,
                 bad_line: Callable[[pacsv.InvalidRow], str]) -> dict[str, Any]:
    """The read and parse options of pyarrow for one block's ``body`` (``bad_line``: unless "error").

    One pyarrow block for the whole body (a line is never longer than it); no larger: a block
    allocated far beyond a small file's text costs more than parsing it.
    """
    return {"read_options": pacsv.ReadOptions(column_names=names, use_threads=False,
                                              encoding=options.encoding,
                                              block_size=min(len(body) + 1, 2**31 - 1)),
            "parse_options": pacsv.ParseOptions(
                delimiter=options.sep, newlines_in_values=whole,
                invalid_row_handler=None if options.bad_lines == "error" else bad_line)}


def with_markers(table: pa.Table, forced: dict[str, pa.DataType], options: ReadOptions,
                 block: Block, done: dict[str, tuple[pa.ChunkedArray, dict[str, int]]] | None = None,
                 ) -> pa.Table:
    """The null-marker rule on every column, counts in the metadata, types normalized.

    Parameters
    ----------
    table
        As :func:`read_csv` parsed it (or converted from pandas).
    forced
        The dtype overrides (those columns were read as text).
    options
        The read options (the user's null markers).
    block
        Where the table is from (for errors).
    done
        Columns the rule was applied to already (see :func:`daskfeed.reading._nulls.numbers_by_part`):
        by name, the column and what each marker made missing.

    Returns
    -------
    pyarrow.Table
        What :func:`iter_tables` yields.

    Raises
    ------
    DataError
        When a value of a column with a dtype override does not convert.
    """
    counts: dict[str, dict[str, int]] = {}
    naive: dict[str, int] = {}
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if done and name in done:
            column, made = done[name]
        else:
            column, made = column_markers(name, column, forced.get(name), options.na_values, block,
                                          options.decimal, naive)
            column = normalize_column(column)
        columns.append(column)
        if made:
            counts[name] = made
    return with_na_counts(pa.Table.from_arrays(columns, names=table.column_names), counts, naive)


def dtype_overrides(options: ReadOptions, names: list[str]) -> dict[str, pa.DataType]:
    """The dtype overrides of some columns, as Arrow types.

    Parameters
    ----------
    options
        The read options (``dtype``: column to dtype name).
    names
        The columns of the text being parsed.

    Returns
    -------
    dict
        Column name to Arrow type, for the columns in ``names`` only.
    """
    return {k: _arrow_type(v) for k, v in options.dtype if k in names}


def read_csv(body: bytes, names: list[str], block: Block, options: ReadOptions,
             rejects: list[str] | None, forced: dict[str, pa.DataType], whole: bool,
             types: dict[str, pa.DataType] | None = None) -> pa.Table:
    """Parse CSV text with pyarrow: only empty fields are null; forced columns read as text.

    Parameters
    ----------
    body
        Whole records, no header.
    names
        The header's column names.
    block
        Where the text is from (for errors).
    options
        How to parse it.
    rejects
        Lines skipped under ``bad_lines="skip"|"quarantine"`` are appended here.
    forced
        The dtype overrides (see :func:`dtype_overrides`).
    whole
        Whether quoted fields may hold line breaks.
    types
        The column types to parse into instead of inferring them (forced columns as text).

    Returns
    -------
    pyarrow.Table
        As parsed: no null markers applied yet (see :func:`with_markers`).

    Raises
    ------
    DataError
        When pyarrow cannot parse ``body`` (or a value into its column's type).
    """
    skipped: list[str] = rejects if rejects is not None else []
    if options.bad_lines != "error":  # pyarrow decodes a bad line before its handler sees it
        _check_utf8(body, block, options.encoding)

    def bad_line(row: pacsv.InvalidRow) -> str:
        skipped.append(row.text)
        return "skip"

    try:
        return pacsv.read_csv(
            pa.BufferReader(body), **_csv_options(body, names, options, whole, bad_line),
            convert_options=pacsv.ConvertOptions(
                # forced columns are read as text and converted by column_markers
                column_types={k: pa.string() for k in forced} if types is None else types,
                strings_can_be_null=True,
                null_values=[""],
                timestamp_parsers=[],
                decimal_point=options.decimal,
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        raise _parse_error(err, block, names) from err


def _check_utf8(body: bytes, block: Block, encoding: str) -> None:
    """Refuse bytes that are not UTF-8 in a UTF-8 ``body`` before a bad-line handler runs.

    pyarrow decodes a malformed line as UTF-8 to hand it to the handler; bytes of another
    encoding there raised inside pyarrow (printed as "Exception ignored") and the line was
    reported as malformed under ``bad_lines="skip"``. Costs nothing on ASCII text.
    """
    if body.isascii() or codecs.lookup(encoding).name != "utf-8":
        return
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as err:
        start = body.rfind(b"\n", 0, err.start) + 1
        end = body.find(b"\n", err.start)
        line = body[start:end if end >= 0 else len(body)]
        raise DataError(
            f"Expected {encoding} text in {block.describe()}. Received: bytes "
            f"{body[err.start:err.end]!r} in the line that starts {line[:60]!r}.\nHint: pass "
            "encoding='latin-1' (or the file's real encoding), or re-encode the file as UTF-8; "
            "bad_lines='skip' drops lines of the wrong shape, not bytes of another encoding."
        ) from err


def _parse_error(err: Exception, block: Block, names: list[str]) -> DataError:
    """What pyarrow could not parse, where, and what to do about it."""
    hint = ("Hint: fix or remove the line, or pass bad_lines='skip' (--bad-lines skip) to drop "
            "such lines and count them, or 'quarantine' to also write them to a rejects file."
            if "Expected" in str(err) and "columns" in str(err) else
            "Hint: check this part of the file for malformed lines or a different delimiter.")
    return DataError(
        f"Cannot parse {block.describe()}: {str(err).strip()}\n"
        "Expected rows with the header's columns "
        f"({len(names)}: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}).\n"
        f"{hint}"
    )


def check_text(table: pa.Table, block: Block, encoding: str) -> None:
    """Refuse a column pyarrow left as binary: bytes that are not ``encoding`` text.

    Parameters
    ----------
    table
        As :func:`read_csv` parsed it.
    block
        Where it is from.
    encoding
        The text encoding the file was read with.

    Raises
    ------
    DataError
        Naming the column, the block and the bytes.
    """
    for name, t in zip(table.column_names, table.schema.types, strict=True):
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):  # pyarrow's fallback: not text
            bad = next(v for v in table.column(name).to_pylist() if v is not None
                       and not _decodes(v, encoding))
            raise DataError(
                f"Expected {encoding} text in column {name!r} of {block.describe()}. "
                f"Received: bytes {bad[:40]!r}.\nHint: pass encoding='latin-1' (or the file's real "
                "encoding), or re-encode the file as UTF-8."
            )


def _decodes(value: bytes, encoding: str) -> bool:
    try:
        value.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def _arrow_type(name: str) -> pa.DataType:
    aliases = {"str": "string", "object": "string", "category": "string", "int": "int64",
               "float": "float64", "bool": "bool"}
    name = aliases.get(name, name)
    return pa.type_for_alias(name)
