"""Source: a lazy, picklable handle over a CSV/Parquet file set or a dask DataFrame.

Constructing a :class:`Source` lists files (glob, ``**``, list, directory, fsspec URL) and
their sizes; it never reads data. Uncompressed CSV files are split into byte-range
:class:`Block` s of ``blocksize``; each block is one partition, read on a worker by
:func:`read_block` with pyarrow. A Source holds paths and options only, never a Client.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import warnings
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from daskfeed import config
from daskfeed.exceptions import DataError, DataNotFoundError

__all__ = ["BAD_LINES", "NA_COUNTS_KEY", "NA_MARKERS", "Block", "FileInfo", "ReadOptions", "Source",
           "iter_tables", "read_block"]

_BOM = b"\xef\xbb\xbf"
# compressions read here, by suffix: each is a stream of members / frames, all of them read
_COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".xz": "xz",
                 ".zst": "zstd", ".zstd": "zstd"}
_CSV_SUFFIXES = tuple(base + packed for base in (".csv", ".tsv", ".txt")
                      for packed in ("", *_COMPRESSIONS))
_PARQUET_SUFFIXES = (".parquet", ".pq")
# values that are missing in numeric columns (text stays text unless the user lists them)
NA_MARKERS = ("NA", "N/A", "n/a", "#N/A", "#N/A N/A", "#NA", "<NA>", "NULL", "null", "None",
              "NaN", "nan", "-NaN", "-nan", "1.#IND", "-1.#IND", "1.#QNAN", "-1.#QNAN")
NULL_VALUES = ("", *NA_MARKERS)  # "" (an empty field) is missing in every column
# schema metadata of each parsed table: JSON {column: {marker: count of values it made missing}}
NA_COUNTS_KEY = b"daskfeed.na_counts"
# what to do with a line whose field count differs from the header's
BAD_LINES = ("error", "skip", "quarantine")


@dataclass(frozen=True)
class FileInfo:
    """One input file: path (with protocol for remote files), size in bytes, mtime, ETag.

    ``etag`` is the object store's version tag (S3's ``ETag``; ``""`` for local files): an
    object rewritten within the same second at the same size still gets a new fingerprint.
    """

    path: str
    size: int
    mtime: float
    etag: str = ""


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
    # credentials may be in here: never compared, printed nor written (repr=False)
    storage_options: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    bad_lines: str = "error"  # error | skip | quarantine (see BAD_LINES)
    na_values: tuple[str, ...] = ()  # the user's null markers: missing in every column

    def dtype_map(self) -> dict[str, str]:
        """Return the per-column dtype overrides as a dict."""
        return dict(self.dtype)


def _protocol(path: str) -> str:
    return path.split("://", 1)[0] if "://" in path else "file"


def _filesystem(path: str, storage_options: dict[str, Any]) -> fsspec.AbstractFileSystem:
    return fsspec.filesystem(_protocol(path), **storage_options)


def _compression(path: str) -> str | None:
    """Name the compression of ``path`` from its suffix; None when it is not compressed.

    ``"gzip"``, ``"bz2"``, ``"xz"`` and ``"zstd"`` are decompressed here (see :func:`_open`);
    another suffix fsspec knows (``.zip``, ``.lz4``, ...) gives fsspec's name and is read by it.
    """
    lower = path.lower()
    for suffix, name in _COMPRESSIONS.items():
        if lower.endswith(suffix):
            return name
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
        # fsspec keeps filesystems (and s3fs their listings) per process: list afresh, so an
        # object rewritten since an earlier listing gets its new size, mtime and ETag
        fs.invalidate_cache()
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
        except DataNotFoundError:  # (also a FileNotFoundError): ours, already clear
            raise
        except PermissionError as err:
            raise DataNotFoundError(
                f"Cannot read {pattern!r}: permission denied. Received: {_reason(err)}.\n"
                f"Hint: {_credentials_hint(proto)}"
            ) from err
        except FileNotFoundError as err:  # a bucket that does not exist (the glob lists it)
            raise DataNotFoundError(
                f"Cannot list {pattern!r}. Received: {_reason(err)}.\n"
                "Hint: check the bucket name and the endpoint (storage_options / "
                "--storage-options endpoint_url=...)."
            ) from err
        if not found and proto != "file":
            _refuse_missing_bucket(fs, pattern, stripped)
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
            etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
            files[full] = FileInfo(path=full, size=int(info.get("size") or 0), mtime=float(mtime),
                                   etag=etag)
    return list(files.values())


def _refuse_missing_bucket(fs: fsspec.AbstractFileSystem, pattern: str, stripped: str) -> None:
    """Raise a clear error when the bucket (container) of a remote ``pattern`` does not exist."""
    bucket = stripped.split("/", 1)[0]
    try:
        there = bool(bucket) and fs.exists(bucket)
    except OSError:  # cannot tell (e.g. may not list buckets): the usual "no file" error
        return
    if not there:
        raise DataNotFoundError(
            f"Cannot list {pattern!r}. Received: the bucket {bucket!r} does not exist.\n"
            "Hint: check the bucket name and the endpoint (storage_options / "
            "--storage-options endpoint_url=...)."
        )


def _reason(err: BaseException) -> str:
    """``PermissionError: <the store's message>`` (never the credentials: they are not in it)."""
    text = (getattr(err, "strerror", None) or str(err) or "").strip()
    return f"{type(err).__name__}: {text[:300]}"


def _credentials_hint(proto: str) -> str:
    """Where credentials come from, for a permission error on ``proto``."""
    if proto in ("s3", "s3a"):
        return ("check the credentials: storage_options (--storage-options key=... secret=...), "
                "else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials "
                "on this machine and on every worker, and that they may list and read the bucket.")
    if proto == "file":
        return "check the file permissions."
    return f"check the {proto}:// credentials (storage_options) and the file permissions."


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
    na_values
        Null markers that are missing in every column, text columns included (e.g.
        ``["NA"]``). Empty fields are always missing; ``NA``, ``N/A``, ``null``, ``NaN``, ...
        (:data:`NA_MARKERS`) are missing in numeric columns only.
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
        na_values: Sequence[str] | None = None,
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
            na_values=_na_values(na_values),
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
            {"files": [_file_key(f) for f in self.files], "options": opts}, sort_keys=True
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
            try:
                with _open(info.path, so, _compression(info.path)) as f:
                    line = f.readline()
            except PermissionError as err:  # remote files open lazily: refused at the read
                raise DataNotFoundError(
                    f"Cannot read {info.path}: permission denied. Received: {_reason(err)}.\n"
                    f"Hint: {_credentials_hint(_protocol(info.path))}"
                ) from err
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


def _file_key(info: FileInfo) -> dict[str, Any]:
    """What identifies a file's contents in a fingerprint: path, size, mtime and an ETag if any."""
    key = asdict(info)
    if not key["etag"]:  # local files: the same fingerprints as before ETags were kept
        del key["etag"]
    return key


def _na_values(values: Sequence[str] | str | None) -> tuple[str, ...]:
    """The user's null markers as a sorted tuple (a fingerprint does not depend on order)."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise ValueError(f"Expected na_values to be strings such as 'NA'. Received: {bad[:3]!r}.")
    return tuple(sorted({v for v in values if v}))


def _is_dask_frame(data: Any) -> bool:
    mod = type(data).__module__ or ""
    return mod.startswith("dask") and hasattr(data, "npartitions") and hasattr(data, "columns")


def _open(path: str, storage_options: dict[str, Any], compression: str | None = None) -> Any:
    """Open ``path`` for reading bytes, decompressed when ``compression`` is given.

    gzip (all members), bz2 (all streams), xz and zstd (all frames) are decompressed here,
    on top of the raw fsspec file; the stream ends only where the file does.

    Raises
    ------
    DataNotFoundError
        When the file is gone or unreadable.
    DataError
        When a ``.zst`` file is to be read and the ``zstandard`` module is missing.
    """
    own = compression in _COMPRESSIONS.values()
    if compression == "zstd":
        _require_zstandard(path)
    try:
        raw = fsspec.open(path, "rb", compression=None if own else compression,
                          **storage_options).open()
    except (FileNotFoundError, PermissionError, IsADirectoryError) as err:
        raise DataNotFoundError(
            f"Cannot read {path}: {err.strerror or type(err).__name__}.\n"
            "Expected the file listed when the data were opened. Hint: it was moved or deleted "
            "since (rerun to list the files again), or check its permissions / credentials."
        ) from err
    if not own:
        return raw
    assert compression is not None
    try:
        stream = _decompressor(compression, raw)
    except BaseException:
        raw.close()
        raise
    return io.BufferedReader(_Decompressed(stream, raw, path, compression), buffer_size=1 << 20)


def _require_zstandard(path: str) -> None:
    try:
        import zstandard  # noqa: F401
    except ImportError as err:
        raise DataError(
            f"Cannot read {path}: it is zstd-compressed and the 'zstandard' module is not "
            "installed.\nExpected: zstandard importable wherever the file is read (every Dask "
            "worker). Received: ImportError.\nHint: pip install 'daskfeed[zstd]' (or pip "
            "install zstandard), or decompress the file (zstd -d)."
        ) from err


def _decompressor(compression: str, raw: Any) -> Any:
    """A reader of the decompressed bytes of ``raw``, across all its members / frames."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw, "rb")
    if compression == "xz":
        return lzma.LZMAFile(raw, "rb")
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)


def _corrupt_errors() -> tuple[type[BaseException], ...]:
    """What the decompressors raise on bytes that are not (or no longer) their format."""
    errors: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error, lzma.LZMAError)
    try:
        import zstandard
    except ImportError:
        return errors
    return (*errors, zstandard.ZstdError)


class _Decompressed(io.RawIOBase):
    """Raw reader over a decompressing stream: names the file on corrupt data, closes both."""

    def __init__(self, stream: Any, raw: Any, path: str, compression: str) -> None:
        super().__init__()
        self._stream, self._raw = stream, raw
        self._path, self._compression = path, compression

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._stream.readinto(buffer)
        except _corrupt_errors() as err:
            raise DataError(
                f"Cannot decompress {self._path}: {type(err).__name__}: {err}.\nExpected a "
                f"complete {self._compression} file (from its suffix). Hint: the file is "
                "truncated or damaged (was it still being written?), or its suffix does not "
                "match its format."
            ) from err

    def close(self) -> None:
        if not self.closed:
            try:
                self._stream.close()
            finally:
                self._raw.close()
        super().close()


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
    on its own rows; what the null markers made missing is in its schema metadata under
    :data:`NA_COUNTS_KEY` (see :func:`_parse`). Lines skipped under
    ``bad_lines="skip"|"quarantine"`` are appended to ``rejects`` (their text).

    Raises
    ------
    DataError
        On a line that cannot be parsed, an unbalanced quote (naming file, line and byte), or
        a damaged compressed file.
    """
    so = dict(options.storage_options)
    if _is_parquet(block.path):
        yield from _parquet_tables(block, so)
        return
    compression = _compression(block.path)
    with _open(block.path, so, compression) as f:
        header = f.readline()
        names = _parse_header(header, options.sep, block.path, options.encoding)
        if not names:
            return
        if block.length >= 0:
            yield _byte_range_table(f, block, header, names, options, rejects)
            return
        first = True
        for start, body in _line_chunks(f, len(header), options.blocksize, path=block.path,
                                        sep=options.sep, compressed=bool(compression)):
            where = block if first and len(body) < options.blocksize else Block(
                block.path, start, len(body), block.file_index)
            table = _parse(body, names, where, options, rejects, whole=True)  # chunks end outside quotes
            first = False
            yield table


def _parquet_tables(block: Block, storage_options: dict[str, Any]) -> Iterator[pa.Table]:
    import pyarrow.parquet as pq

    with _open(block.path, storage_options) as f:
        pf = pq.ParquetFile(f)
        for i in range(pf.num_row_groups):
            yield _normalize(pf.read_row_group(i))


def _byte_range_table(f: Any, block: Block, header: bytes, names: list[str],
                      options: ReadOptions, rejects: list[str] | None) -> pa.Table:
    """Parse the lines of one byte range of an uncompressed file.

    The range is cut at line breaks: a line belongs to the block its first byte follows
    from, however long it is (later blocks inside it read nothing), so every line is read
    once. A quoted field still open at the end of the range is refused: it is looked for
    when pyarrow fails or gives fewer rows (skipped ones included) than the range has lines,
    the only ways such a field can show.
    """
    f.seek(0)
    body = fsspec.utils.read_block(f, block.offset, block.length, delimiter=b"\n")
    body_start = f.tell() - len(body)
    if block.offset == 0:
        body, body_start = body[len(header):], len(header)
    skipped: list[str] = [] if rejects is None else rejects
    before = len(skipped)
    try:
        table = _parse(body, names, block, options, skipped, whole=False)
    except DataError:
        _refuse_open_quote(f, block, body, body_start, options.sep)
        raise
    lines = body.count(b"\n") + (not body.endswith(b"\n"))
    if table.num_rows + len(skipped) - before < lines:  # a field over lines, or blank lines
        _refuse_open_quote(f, block, body, body_start, options.sep)
    return table


def _refuse_open_quote(f: Any, block: Block, body: bytes, body_start: int, sep: str) -> None:
    """Raise :class:`DataError` when a quoted field is open at the end of the byte range."""
    quotes = _Quotes(sep)
    quotes.scan(body, final=True)
    if quotes.inside:
        raise _unclosed_quote(
            block.path, body, quotes.opened, body_start, _line_number(f, body_start), False,
            f"is still open at the end of this part of the file, {block.describe()} (files "
            "are read in byte ranges cut at line breaks)",
            "If the file has quoted fields with line breaks in them, pass a blocksize larger "
            "than the file (--blocksize) so it is read whole.")


def _line_number(f: Any, offset: int, most: int = 256 * 2**20) -> int | None:
    """Line number (1-based) of byte ``offset`` of file ``f``; None past ``most`` bytes."""
    if offset > most:
        return None
    f.seek(0)
    lines, left = 1, offset
    while left > 0 and (data := f.read(min(left, 16 * 2**20))):
        lines += data.count(b"\n")
        left -= len(data)
    return lines


def _quote_limit(blocksize: int) -> int:
    """Bytes a quoted field may stay open in a stream before it is taken for an unbalanced quote."""
    return max(4 * blocksize, 64 * 2**20)


def _line_chunks(f: Any, start: int, size: int, *, path: str = "", sep: str = ",",
                 limit: int | None = None, compressed: bool = True) -> Iterator[tuple[int, bytes]]:
    """Whole-record chunks of about ``size`` bytes of a (decompressed) stream, with offsets.

    Chunks end at a line break outside quoted fields. The stream is scanned once, in order
    (:class:`_Quotes`), so the work is linear in its length; ``start`` is the stream offset of
    its first byte (the header is before it). Only an empty read ends the stream.

    Raises
    ------
    DataError
        When a quoted field stays open for more than ``limit`` bytes (default
        :func:`_quote_limit`) or up to the end of the stream: an unbalanced quote.
    """
    limit = _quote_limit(size) if limit is None else limit
    buf = bytearray()
    quotes = _Quotes(sep)
    pos, line = start, 2  # stream offset and line number of buf[0] (the header is line 1)
    while data := f.read(max(size - len(buf), min(size, 1 << 20), 1)):
        buf += data
        quotes.scan(buf, final=False)
        if quotes.inside and len(buf) - quotes.opened > limit:
            raise _unclosed_quote(path, buf, quotes.opened, pos, line, compressed,
                                  f"is still open {len(buf) - quotes.opened:,} bytes later "
                                  f"(the limit is {limit:,})")
        if quotes.cut and len(buf) >= size:
            cut = quotes.cut
            with memoryview(buf) as view:
                chunk = bytes(view[:cut])
            yield pos, chunk
            del buf[:cut]
            quotes.drop(cut)
            pos, line = pos + cut, line + chunk.count(b"\n")
    quotes.scan(buf, final=True)
    if quotes.inside:
        raise _unclosed_quote(path, buf, quotes.opened, pos, line, compressed,
                              "is never closed before the end of the file")
    if (buf and not buf.isspace()) or pos == start:
        yield pos, bytes(buf)


_QUOTE, _LF, _CR = ord('"'), ord("\n"), ord("\r")
_WINDOW = 4 << 20  # bytes scanned at a time: bounds the scanner's temporary arrays


@dataclass
class _Quotes:
    """Quoted fields of a CSV buffer, by pyarrow's rules, scanned incrementally.

    ``buf[0]`` starts a record. A quote opens a quoted field only at the start of a field
    (after the separator or a line break); inside one, ``""`` is a quote and a lone ``"``
    closes it; any other quote is text (``5'11"``). :meth:`scan` goes on from ``scanned``,
    never re-reading what it saw.

    Attributes
    ----------
    window
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
    window: int = _WINDOW
    scanned: int = 0
    inside: bool = False
    opened: int = -1
    cut: int = 0

    def scan(self, buf: bytes | bytearray, *, final: bool) -> None:
        """Scan the bytes added to ``buf`` since the last call.

        A run of quotes at the end of a buffer that may grow (``final=False``) waits for the
        next call: whether ``""`` follows decides what it means.
        """
        end = len(buf)
        if not final:
            while end > self.scanned and buf[end - 1] == _QUOTE:
                end -= 1
        while self.scanned < end:
            stop = min(self.scanned + self.window, end)
            while stop < end and buf[stop - 1] == _QUOTE:  # never split a run of quotes
                stop += 1
            self._window(buf, self.scanned, stop)
            self.scanned = stop

    def drop(self, n: int) -> None:
        """Forget the first ``n`` bytes of the buffer (``n`` is :attr:`cut`)."""
        self.scanned -= n
        self.opened -= n
        self.cut = 0

    def _window(self, buf: bytes | bytearray, start: int, stop: int) -> None:
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


def _unclosed_quote(path: str, buf: bytes | bytearray, opened: int, pos: int, line: int | None,
                    compressed: bool, what: str, hint: str = "") -> DataError:
    """The error for an unbalanced quote at ``buf[opened]``; ``buf[0]`` is at ``pos``, ``line``.

    ``line`` None: the line number is not known (counted from ``pos`` instead).
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


def _parse(body: bytes, names: list[str], block: Block, options: ReadOptions,
           rejects: list[str] | None, whole: bool = True) -> pa.Table:
    """Parse whole CSV records into an Arrow table, null markers stated and counted.

    Empty fields are missing in every column. The usual markers (:data:`NA_MARKERS`) are
    missing only in a column whose other values are all numbers; in a text column they stay
    text, unless listed in ``options.na_values``: those are missing in every column. A column
    holding only markers and empties stays text (the scan decides, knowing the other blocks).
    How many values each marker made missing, per column, is in the schema metadata under
    :data:`NA_COUNTS_KEY`: JSON ``{column: {marker: count}}``, non-zero counts only; ``""``
    counts empty fields, ``"NaN"`` every NaN pyarrow read as a float (``NaN``, ``nan``, ...).
    """
    if not body or body.isspace():  # (no copy of the body)
        return _with_na_counts(pa.table({n: pa.nulls(0) for n in names}), {})
    forced = {k: _arrow_type(v) for k, v in options.dtype if k in names}
    table = _read_csv(body, names, block, options, rejects, forced, whole)
    _check_text(table, block, options.encoding)
    counts: dict[str, dict[str, int]] = {}
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        column, made = _column_markers(name, column, forced.get(name), options.na_values, block)
        columns.append(column)
        if made:
            counts[name] = made
    table = pa.Table.from_arrays(columns, names=table.column_names)
    return _with_na_counts(_normalize(table), counts)


def _read_csv(body: bytes, names: list[str], block: Block, options: ReadOptions,
              rejects: list[str] | None, forced: dict[str, pa.DataType], whole: bool) -> pa.Table:
    """Parse ``body`` with pyarrow: only empty fields are null; forced columns read as text."""
    skipped: list[str] = rejects if rejects is not None else []

    def bad_line(row: Any) -> str:
        skipped.append(row.text)
        return "skip"

    try:
        return pacsv.read_csv(
            pa.BufferReader(body),
            # one block for the whole body: a line is never longer than pyarrow's block
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False,
                                           encoding=options.encoding,
                                           block_size=min(max(len(body) + 1, 1 << 20), 2**31 - 1)),
            parse_options=pacsv.ParseOptions(
                delimiter=options.sep, newlines_in_values=whole,
                invalid_row_handler=None if options.bad_lines == "error" else bad_line),
            convert_options=pacsv.ConvertOptions(
                column_types={k: pa.string() for k in forced},  # converted in _column_markers
                strings_can_be_null=True,
                null_values=[""],
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
            f"{hint}"
        ) from err


def _check_text(table: pa.Table, block: Block, encoding: str) -> None:
    """Refuse a column pyarrow left as binary: bytes that are not ``encoding`` text."""
    for name, t in zip(table.column_names, table.schema.types, strict=True):
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):  # pyarrow's fallback: not text
            bad = next(v for v in table.column(name).to_pylist() if v is not None
                       and not _decodes(v, encoding))
            raise DataError(
                f"Expected {encoding} text in column {name!r} of {block.describe()}. "
                f"Received: bytes {bad[:40]!r}.\nHint: pass encoding='latin-1' (or the file's real "
                "encoding), or re-encode the file as UTF-8."
            )


_NUMBER_TYPES = (pa.int64(), pa.float64(), pa.bool_())  # pyarrow's order of inference


def _column_markers(name: str, column: pa.ChunkedArray, forced: pa.DataType | None,
                    na_values: tuple[str, ...], block: Block) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Apply the null-marker rule to one parsed column; return it and the counts per marker.

    ``forced``: the column's dtype override (the column was read as text).
    """
    counts = {"": column.null_count} if column.null_count else {}
    markers = tuple(dict.fromkeys(NA_MARKERS + na_values))
    if _is_text(column.type):
        if forced is None:
            numbers = _as_numbers(column, markers)
            if numbers is None:  # text: only the user's markers are missing
                column, made = _null_where_in(column, na_values)
            else:
                column, made = numbers[0], _value_counts(column, numbers[1])
        elif _is_text(forced):
            column, made = _null_where_in(column, na_values)
        else:
            column, made = _as_forced(name, column, forced, markers, block)
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        column, made = _null_numbers(column, na_values)
    else:
        made = {}
    if pa.types.is_floating(column.type):
        column, nans = _nan_to_null(column)
        made.update(nans)
    counts.update(made)
    return column, counts


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_in(column: pa.ChunkedArray, values: Sequence[str]) -> pa.ChunkedArray:
    return pc.is_in(column, value_set=pa.array(list(values), pa.string()))


def _null(column: pa.ChunkedArray, where: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(where, pa.scalar(None, column.type), column)


def _value_counts(column: pa.ChunkedArray, where: pa.ChunkedArray) -> dict[str, int]:
    """How many times each value of ``column`` occurs where ``where`` is true."""
    return {r["values"]: r["counts"] for r in pc.value_counts(pc.filter(column, where)).to_pylist()}


def _as_numbers(column: pa.ChunkedArray,
                markers: Sequence[str]) -> tuple[pa.ChunkedArray, pa.ChunkedArray] | None:
    """Convert a text column whose values other than markers are all numbers.

    Returns ``column`` as int64, float64 or bool with its markers missing, and where the
    markers were; None for text (told by its first values, before the whole column is
    looked at), and for a column of only markers and empties.
    """
    head = column.slice(0, 256)
    values = pc.drop_null(pc.filter(head, pc.invert(_is_in(head, markers))))
    if len(values) and not _looks_like_a_number(values[0].as_py()):
        return None  # text, told by its first value without a failing cast (they are slow)
    targets = [t for t in _NUMBER_TYPES if _casts(values, t)]
    if len(values) and not targets:
        return None
    is_marker = _is_in(column, markers)
    if not len(values):  # the first values are markers: look further
        values = pc.drop_null(pc.filter(column, pc.invert(is_marker))).slice(0, 256)
        targets = [t for t in _NUMBER_TYPES if len(values) and _casts(values, t)]
    for target in targets:
        try:
            return pc.cast(_null(column, is_marker), target), is_marker
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


def _looks_like_a_number(text: str) -> bool:
    """Whether ``text`` could be a value of a number or bool column (pyarrow decides for sure)."""
    try:
        float(text)
    except ValueError:
        return text.strip().lower() in ("true", "false")
    return True


def _casts(values: pa.ChunkedArray, target: pa.DataType) -> bool:
    try:
        pc.cast(values, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _null_where_in(column: pa.ChunkedArray, markers: Sequence[str]) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Text column: ``markers`` become missing; counted per marker."""
    if not markers:
        return column, {}
    hit = _is_in(column, markers)
    made = _value_counts(column, hit)
    return (_null(column, hit), made) if made else (column, {})


def _as_forced(name: str, column: pa.ChunkedArray, target: pa.DataType, markers: Sequence[str],
               block: Block) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """A column with a dtype override (read as text): markers missing, the rest cast."""
    hit = _is_in(column, markers)
    try:
        converted = pc.cast(_null(column, hit), target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(
            f"Expected {target} values in column {name!r} of {block.describe()} (its dtype "
            f"override). Received: {err}.\nHint: fix the value, list it as a null marker "
            "(na_values / --na-values), or change the column's dtype override."
        ) from err
    return converted, _value_counts(column, hit)


def _null_numbers(column: pa.ChunkedArray,
                  na_values: Sequence[str]) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Numeric column: the user's markers that are numbers (``-999``) become missing."""
    made = {}
    for marker in na_values:
        try:
            value = float(marker)
        except ValueError:
            continue
        hit = pc.fill_null(pc.equal(column, value), False)
        n = pc.sum(hit).as_py() or 0
        if n:
            made[marker] = n
            column = _null(column, hit)
    return column, made


def _nan_to_null(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Float column: NaN (however it was spelled: NaN, nan, -nan) becomes missing, as "NaN"."""
    nan = pc.fill_null(pc.is_nan(column), False)
    n = pc.sum(nan).as_py() or 0
    return (_null(column, nan), {"NaN": n}) if n else (column, {})


def _with_na_counts(table: pa.Table, counts: dict[str, dict[str, int]]) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    meta[NA_COUNTS_KEY] = json.dumps(counts, sort_keys=True).encode()
    return table.replace_schema_metadata(meta)


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
