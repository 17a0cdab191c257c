"""Source: a lazy, picklable handle over a CSV/Parquet file set or a dask DataFrame.

Constructing a :class:`Source` lists files (glob, ``**``, list, directory, fsspec URL) and
their sizes; it never reads data. Uncompressed CSV files are split into byte-range
:class:`Block` s of ``blocksize``; each block is one partition, read on a worker by
:func:`read_block` with pyarrow. A Source holds paths and options only, never a Client.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from daskfeed import config
from daskfeed.exceptions import DataError, DataNotFoundError

__all__ = ["BAD_LINES", "Block", "FileInfo", "ReadOptions", "Source", "iter_tables", "read_block"]

_BOM = b"\xef\xbb\xbf"
_CSV_SUFFIXES = (".csv", ".tsv", ".txt", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zst")
_PARQUET_SUFFIXES = (".parquet", ".pq")
NULL_VALUES = ("", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "#N/A")
# what to do with a line whose field count differs from the header's
BAD_LINES = ("error", "skip", "quarantine")


@dataclass(frozen=True)
class FileInfo:
    """One input file: path (with protocol for remote files), size in bytes, mtime."""

    path: str
    size: int
    mtime: float


@dataclass(frozen=True)
class Block:
    """One partition of the file set: a byte range of one file (``length=-1``: whole file)."""

    path: str
    offset: int
    length: int
    file_index: int

    def describe(self) -> str:
        """Say which file and byte range this block covers, for error messages."""
        if self.length < 0:
            return f"{self.path} (whole file)"
        return f"{self.path} bytes {self.offset}-{self.offset + self.length}"


@dataclass(frozen=True)
class ReadOptions:
    """How files are read; part of the fingerprint, so changing one invalidates manifests."""

    blocksize: int = 64 * 2**20
    sep: str = ","
    encoding: str = "utf-8"
    dtype: tuple[tuple[str, str], ...] = ()
    storage_options: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    bad_lines: str = "error"  # error | skip | quarantine (see BAD_LINES)

    def dtype_map(self) -> dict[str, str]:
        """Return the per-column dtype overrides as a dict."""
        return dict(self.dtype)


def _protocol(path: str) -> str:
    return path.split("://", 1)[0] if "://" in path else "file"


def _filesystem(path: str, storage_options: dict[str, Any]) -> fsspec.AbstractFileSystem:
    return fsspec.filesystem(_protocol(path), **storage_options)


def _compression(path: str) -> str | None:
    return fsspec.utils.infer_compression(path)


def _is_parquet(path: str) -> bool:
    return path.lower().endswith(_PARQUET_SUFFIXES)


def expand_paths(
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: dict[str, Any] | None = None,
) -> list[FileInfo]:
    """Expand a path, glob (``**`` too), directory, URL or list of them into files.

    Raises
    ------
    DataNotFoundError
        When a pattern matches nothing or a path does not exist.
    """
    storage_options = storage_options or {}
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if not items:
        raise DataNotFoundError(
            "Expected at least one path or glob. Received: an empty list.\n"
            "Hint: pass a path such as 'data/log_quest/**/*.csv'."
        )
    files: dict[str, FileInfo] = {}
    for item in items:
        pattern = os.fspath(item)
        fs = _filesystem(pattern, storage_options)
        proto = _protocol(pattern)
        stripped = fs._strip_protocol(pattern)
        try:  # one listing gives names, sizes and mtimes: no request per file afterwards
            found: dict[str, dict[str, Any]]
            if fsspec.core.has_magic(stripped):
                found = {p: i for p, i in fs.glob(stripped, detail=True).items()
                         if i.get("type") != "directory"}
            elif fs.isdir(stripped):
                listed = fs.find(stripped, detail=True)
                found = {p: i for p, i in listed.items()
                         if p.lower().endswith(_CSV_SUFFIXES + _PARQUET_SUFFIXES)}
                if not found:
                    where = os.path.abspath(stripped) if proto == "file" else pattern
                    held = (f"it holds {len(listed)} other file(s), e.g. "
                            f"{os.path.basename(sorted(listed)[0])!r}" if listed else "it is empty")
                    raise DataNotFoundError(
                        f"Expected CSV or Parquet files in the directory {pattern!r} ({where}). "
                        f"Received: no file ending in {', '.join(_CSV_SUFFIXES + _PARQUET_SUFFIXES)} "
                        f"there or below; {held}.\nHint: point at the directory holding the data, "
                        "or give a glob such as \"data/**/*.csv\" for other file names."
                    )
            elif fs.exists(stripped):
                found = {stripped: fs.info(stripped)}
            else:
                found = {}
        except PermissionError as err:
            raise DataNotFoundError(
                f"Cannot read {pattern!r}: permission denied.\n"
                "Hint: check the file permissions or the storage credentials."
            ) from err
        if not found:
            what = "No file matches" if fsspec.core.has_magic(stripped) else "No such file"
            where = os.path.abspath(stripped) if proto == "file" else pattern
            raise DataNotFoundError(
                f"{what}: {pattern!r} (looked in {where}).\n"
                "Hint: check the path and quote globs so the shell does not expand them, "
                "e.g. \"data/log_quest/**/*.csv\"."
            )
        for p in sorted(found):
            full = p if proto == "file" else f"{proto}://{p}"
            if full in files:
                continue
            info = found[p]
            mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
            if hasattr(mtime, "timestamp"):
                mtime = mtime.timestamp()
            files[full] = FileInfo(path=full, size=int(info.get("size") or 0), mtime=float(mtime))
    return list(files.values())


def make_blocks(files: Sequence[FileInfo], blocksize: int) -> list[Block]:
    """Split files into byte-range blocks; compressed and Parquet files stay whole."""
    blocks: list[Block] = []
    for i, f in enumerate(files):
        if _compression(f.path) or _is_parquet(f.path) or f.size <= blocksize:
            blocks.append(Block(f.path, 0, -1, i))
            continue
        for off in range(0, f.size, blocksize):
            blocks.append(Block(f.path, off, min(blocksize, f.size - off), i))
    return blocks


class Source:
    """A lazy handle over the data: files + read options, or a dask DataFrame.

    Parameters
    ----------
    data
        A path, a glob (``**`` too), a directory, an fsspec URL, a list of those, or a
        ``dask.dataframe.DataFrame``.
    blocksize
        Bytes of CSV per partition (default ``daskfeed.blocksize``).
    dtype
        Per-column dtype overrides, e.g. ``{"zip": "string"}``.
    storage_options
        Passed to fsspec (credentials, endpoint URL for S3-compatible stores, ...).
    bad_lines
        A line whose field count differs from the header's: ``"error"`` (default) stops with
        the file, byte range and line; ``"skip"`` drops it and counts it in the manifest
        (``bad_lines``); ``"quarantine"`` also keeps its text for a rejects file.
    """

    def __init__(
        self,
        data: Any,
        *,
        blocksize: int | str | None = None,
        sep: str = ",",
        encoding: str = "utf-8",
        dtype: dict[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
        bad_lines: str = "error",
    ) -> None:
        if bad_lines not in BAD_LINES:
            raise ValueError(
                f"Expected bad_lines to be one of {', '.join(BAD_LINES)}. Received: {bad_lines!r}."
            )
        self.options = ReadOptions(
            blocksize=config.get_bytes("blocksize", blocksize),
            sep=sep,
            encoding=encoding,
            dtype=tuple(sorted((dtype or {}).items())),
            storage_options=tuple(sorted((storage_options or {}).items())),
            bad_lines=bad_lines,
        )
        self.frame = None
        self.files: list[FileInfo] = []
        if _is_dask_frame(data):
            self.frame = data
            self.blocks: list[Block] = [
                Block(f"partition {i}", 0, -1, i) for i in range(data.npartitions)
            ]
        else:
            self.files = expand_paths(data, dict(self.options.storage_options))
            self.blocks = make_blocks(self.files, self.options.blocksize)
            packed = [f for f in self.files if _compression(f.path)]
            if packed:
                biggest = max(packed, key=lambda f: f.size)
                warnings.warn(
                    f"{len(packed)} compressed file(s) cannot be split into byte ranges: each is "
                    f"one partition (largest: {biggest.path}, {biggest.size / 1e6:.1f} MB "
                    "compressed), decompressed as a stream and parsed in blocksize chunks, so "
                    "memory stays bounded, but a whole file is one unit of the shuffle and of "
                    "the work. Hint: for large files prefer uncompressed CSV or Parquet.",
                    stacklevel=2,
                )

    @property
    def npartitions(self) -> int:
        """Number of partitions (blocks)."""
        return len(self.blocks)

    @property
    def nbytes(self) -> int:
        """Total size of the input files in bytes (0 for a dask DataFrame)."""
        return sum(f.size for f in self.files)

    def fingerprint(self) -> str:
        """Hash of (path, size, mtime) of every file + read options (or the frame's token)."""
        if self.frame is not None:
            from dask.base import tokenize

            return "frame-" + tokenize(self.frame)
        opts = asdict(self.options)
        opts.pop("storage_options")
        payload = json.dumps(
            {"files": [asdict(f) for f in self.files], "options": opts}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def header(self) -> list[str]:
        """Column names, read from the first file's first line (no data parsed)."""
        if self.frame is not None:
            return [str(c) for c in self.frame.columns]
        so = dict(self.options.storage_options)
        for info in self.files:  # the first file that is not empty
            if _is_parquet(info.path):
                import pyarrow.parquet as pq

                with _open(info.path, so) as f:
                    return list(pq.ParquetFile(f).schema_arrow.names)
            with _open(info.path, so, _compression(info.path)) as f:
                line = f.readline()
            names = _parse_header(line, self.options.sep, info.path, self.options.encoding)
            if names:
                return names
        return []

    def partitions(self) -> list[Any]:
        """One ``dask.delayed`` pandas DataFrame per partition (nothing is computed)."""
        from dask import delayed
        from dask.base import tokenize

        if self.frame is not None:
            return list(self.frame.to_delayed())
        opts = self.options
        return [
            delayed(read_block, pure=True)(b, opts, dask_key_name=f"daskfeed-read-{tokenize(b, opts)}")
            for b in self.blocks
        ]

    def to_dask(self) -> Any:
        """The data as a lazy ``dask.dataframe.DataFrame`` (one partition per block)."""
        if self.frame is not None:
            return self.frame
        import dask.dataframe as dd

        return dd.from_map(read_block, self.blocks, options=self.options)

    def __repr__(self) -> str:
        if self.frame is not None:
            return f"Source(dask DataFrame, npartitions={self.npartitions})"
        return (
            f"Source({len(self.files)} files, {self.nbytes / 1e9:.2f} GB, "
            f"npartitions={self.npartitions})"
        )


def _is_dask_frame(data: Any) -> bool:
    mod = type(data).__module__ or ""
    return mod.startswith("dask") and hasattr(data, "npartitions") and hasattr(data, "columns")


def _open(path: str, storage_options: dict[str, Any], compression: str | None = None) -> Any:
    try:
        return fsspec.open(path, "rb", compression=compression, **storage_options).open()
    except (FileNotFoundError, PermissionError, IsADirectoryError) as err:
        raise DataNotFoundError(
            f"Cannot read {path}: {err.strerror or type(err).__name__}.\n"
            "Expected the file listed when the data were opened. Hint: it was moved or deleted "
            "since (rerun to list the files again), or check its permissions / credentials."
        ) from err


def _parse_header(line: bytes, sep: str, path: str, encoding: str = "utf-8") -> list[str]:
    if line.startswith(_BOM):
        line = line[len(_BOM) :]
    try:
        text = line.decode(encoding).rstrip("\r\n")
    except UnicodeDecodeError as err:
        raise DataError(
            f"Expected a {encoding} header line in {path}. Received bytes {line[:60]!r}.\n"
            "Hint: pass encoding='latin-1' (or the file's real encoding), or re-encode as UTF-8."
        ) from err
    if not text:
        return []
    import csv

    return next(csv.reader([text], delimiter=sep))


def read_block(block: Block, options: ReadOptions) -> pd.DataFrame:
    """Read one block into a pandas DataFrame (runs on a worker).

    Types are inferred per block (per chunk of a compressed file) by pyarrow; reconciling
    them across blocks is the scan's job (see :mod:`daskfeed.manifest`). Errors name the file
    and the byte range.
    """
    tables = list(iter_tables(block, options))
    if not tables:  # an empty file: no header, no rows
        return pd.DataFrame()
    if len(tables) == 1:
        return _to_pandas(tables[0])
    return pd.concat([_to_pandas(t) for t in tables], ignore_index=True)


def iter_tables(block: Block, options: ReadOptions, rejects: list[str] | None = None) -> Iterator[pa.Table]:
    """Parse one block into Arrow tables, at most about ``blocksize`` of text each (on a worker).

    A byte range or a small file gives one table. A compressed file cannot be split into byte
    ranges, so it is decompressed as a stream and parsed in chunks of whole lines: memory stays
    bounded by the blocksize however large the file. Each table's column types are inferred
    on its own rows. Lines skipped under ``bad_lines="skip"|"quarantine"`` are appended to
    ``rejects`` (their text).
    """
    so = dict(options.storage_options)
    if _is_parquet(block.path):
        import pyarrow.parquet as pq

        with _open(block.path, so) as f:
            pf = pq.ParquetFile(f)
            for i in range(pf.num_row_groups):
                yield _normalize(pf.read_row_group(i))
        return
    compression = _compression(block.path)
    with _open(block.path, so, compression) as f:
        header = f.readline()
        names = _parse_header(header, options.sep, block.path, options.encoding)
        if not names:
            return
        if block.length >= 0:
            f.seek(0)
            body = fsspec.utils.read_block(f, block.offset, block.length, delimiter=b"\n")
            if block.offset == 0:
                body = body[len(header) :]
            yield _parse(body, names, block, options, rejects, whole=False)
            return
        first = True
        for start, body in _line_chunks(f, len(header), options.blocksize):
            where = block if first and len(body) < options.blocksize else Block(
                block.path, start, len(body), block.file_index)
            table = _parse(body, names, where, options, rejects, whole=True)  # chunks end outside quotes
            first = False
            yield table


def _line_chunks(f: Any, start: int, size: int) -> Iterator[tuple[int, bytes]]:
    """Whole-line chunks of about ``size`` bytes of a (decompressed) stream, with offsets."""
    carry = b""
    pos = start
    while True:
        want = max(size - len(carry), 1 << 16)
        data = f.read(want)
        if len(data) < want:  # the end of the stream: the rest is one chunk
            rest = carry + data
            if rest.strip() or pos == start:
                yield pos, rest
            return
        buf = carry + data
        cut = _balanced_cut(buf)
        if cut < 0:
            carry = buf
            continue
        chunk, carry = buf[: cut + 1], buf[cut + 1 :]
        yield pos, chunk
        pos += len(chunk)


def _balanced_cut(buf: bytes) -> int:
    """Index of the last line break outside quotes (-1: none), so quoted line breaks stay whole."""
    cut = buf.rfind(b"\n")
    if cut < 0:
        return -1
    quotes = buf.count(b'"', 0, cut)
    while quotes % 2:  # inside a quoted field: step back one line
        prev = buf.rfind(b"\n", 0, cut)
        if prev < 0:
            return -1
        quotes -= buf.count(b'"', prev, cut)
        cut = prev
    return cut


def _parse(body: bytes, names: list[str], block: Block, options: ReadOptions,
           rejects: list[str] | None, whole: bool) -> pa.Table:
    if not body.strip():
        return pa.table({n: pa.nulls(0) for n in names})
    overrides = {k: _arrow_type(v) for k, v in options.dtype}
    skipped: list[str] = rejects if rejects is not None else []

    def bad_line(row: Any) -> str:
        skipped.append(row.text)
        return "skip"

    try:
        table = pacsv.read_csv(
            io.BytesIO(body),
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False,
                                           encoding=options.encoding),
            # a whole file may have quoted fields with line breaks; a byte range cannot
            parse_options=pacsv.ParseOptions(
                delimiter=options.sep, newlines_in_values=whole,
                invalid_row_handler=None if options.bad_lines == "error" else bad_line),
            convert_options=pacsv.ConvertOptions(
                column_types={k: v for k, v in overrides.items() if k in names},
                strings_can_be_null=True,
                null_values=list(NULL_VALUES),
                timestamp_parsers=[],
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        hint = ("Hint: fix or remove the line, or pass bad_lines='skip' (--bad-lines skip) to drop "
                "such lines and count them, or 'quarantine' to also write them to a rejects file."
                if "Expected" in str(err) and "columns" in str(err) else
                "Hint: check this part of the file for malformed lines or a different delimiter.")
        raise DataError(
            f"Cannot parse {block.describe()}: {str(err).strip()}\n"
            "Expected rows with the header's columns "
            f"({len(names)}: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}).\n"
            f"{hint} Quoted fields with line breaks are read only when a file is not split: pass "
            "a blocksize larger than the file."
        ) from err
    for name, t in zip(table.column_names, table.schema.types, strict=True):
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):  # pyarrow's fallback: not text
            bad = next(v for v in table.column(name).to_pylist() if v is not None
                       and not _decodes(v, options.encoding))
            raise DataError(
                f"Expected {options.encoding} text in column {name!r} of {block.describe()}. "
                f"Received: bytes {bad[:40]!r}.\nHint: pass encoding='latin-1' (or the file's real "
                "encoding), or re-encode the file as UTF-8."
            )
    return _normalize(table)


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


def _normalize(table: pa.Table) -> pa.Table:
    """Types that survive nulls and chunking: bool → float64, dates → timestamps."""
    cols = []
    for i, t in enumerate(table.schema.types):
        col = table.column(i)
        if pa.types.is_boolean(t):
            col = col.cast(pa.float64())
        elif pa.types.is_date(t):
            col = col.cast(pa.timestamp("s"))
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow → pandas; an all-null column becomes float64 NaN."""
    if any(pa.types.is_null(t) for t in table.schema.types):
        table = pa.Table.from_arrays(
            [c.cast(pa.float64()) if pa.types.is_null(c.type) else c for c in table.columns],
            names=table.column_names)
    return table.to_pandas()
