"""Source: a lazy, picklable handle over a CSV/Parquet file set or a dask DataFrame.

Constructing a :class:`Source` lists files (:mod:`daskfeed.reading._files`) and their sizes; it never
reads data. Each :class:`~daskfeed.reading._files.Block` is parsed on a worker by
:func:`daskfeed.reading._tables.iter_tables`. A Source holds paths and options only, never a Client.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from daskfeed.core import DataNotFoundError, SettingError, config, redact_url, warn_user
from daskfeed.reading._credentials import carry
from daskfeed.reading._files import (
    COMPRESSIONS,
    Block,
    FileInfo,
    compression_of,
    credentials_hint,
    expand_paths,
    is_parquet,
    make_blocks,
    protocol,
    reason,
)
from daskfeed.reading._listing import Listing, PathsLike
from daskfeed.reading._parts import Part, file_key, make_parts
from daskfeed.reading._records import line_number, parse_header, quote_limit, read_header, unclosed_quote
from daskfeed.reading._splits import BlockTransitions, block_transitions, chain, ends_inside, record_start
from daskfeed.reading._streams import open_file
from daskfeed.reading._tables import BAD_LINES, ReadOptions, frame_table

if TYPE_CHECKING:
    import dask.dataframe as dd
    from dask.delayed import Delayed


class Source:
    """A lazy handle over the data: files + read options, or a dask DataFrame.

    Parameters
    ----------
    data
        A path, a glob (``**`` too), a directory, an fsspec URL, a list of those, a
        :class:`~daskfeed.reading.Listing` of those (listed meanwhile), or a
        ``dask.dataframe.DataFrame``.
    blocksize
        Bytes of CSV per block (default ``daskfeed.blocksize``).
    dtype
        Per-column dtype overrides, e.g. ``{"zip": "string"}``.
    storage_options
        Passed to fsspec (credentials, endpoint URL for S3-compatible stores, ...). Credentials
        in a URL (``https://user:password@host/...``) are used to read, and kept nowhere else:
        the files, their fingerprint and every message name the URL without them.
    bad_lines
        A line whose field count differs from the header's: ``"error"`` (default) stops with
        the file, byte range and line; ``"skip"`` drops it and counts it in the manifest
        (``bad_lines``); ``"quarantine"`` also keeps its text for a rejects file.
    na_values
        Null markers that are missing in every column, text columns included (e.g.
        ``["NA"]``). Empty fields are always missing; ``NA``, ``N/A``, ``null``, ``NaN``, ...
        (:data:`daskfeed.reading.NA_MARKERS`) are missing in numeric columns only.
    decimal
        The numbers' decimal point: ``"."`` (default) or, as many locales write them, ``","``
        (then the separator is usually ``";"``).
    options
        All of the above resolved before (:func:`read_options`); the other arguments are then
        not used.
    """

    def __init__(
        self,
        data: PathsLike | Listing | dd.DataFrame,
        *,
        blocksize: int | str | None = None,
        sep: str | None = None,
        encoding: str = "utf-8",
        dtype: dict[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
        bad_lines: str = "error",
        na_values: Sequence[str] | None = None,
        decimal: str = ".",
        options: ReadOptions | None = None,
    ) -> None:
        self.options = options if options is not None else read_options(
            blocksize=blocksize, sep=sep, encoding=encoding, dtype=dtype,
            storage_options=storage_options, bad_lines=bad_lines, na_values=na_values,
            decimal=decimal)
        self.frame: dd.DataFrame | None = None
        self.files: list[FileInfo] = []
        self._fingerprint: str | None = None
        self._parts: list[Part] | None = None
        self._sizes: list[int] | None = None
        self.given: list[str] = []  # the paths and globs as given (names the data set)
        self.splits: dict[str, dict[str, Any]] = {}  # files read at exact starts (use_splits)
        if _is_dask_frame(data):
            self.frame = data
            self.blocks: list[Block] = [
                Block(f"partition {i}", 0, -1, i) for i in range(data.npartitions)
            ]
        else:
            listing = data if isinstance(data, Listing) else None
            paths: PathsLike = listing.data if listing is not None else cast("PathsLike", data)
            items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
            self.given = [os.path.abspath(os.fspath(d)) if protocol(os.fspath(d)) == "file"
                          else redact_url(os.fspath(d)) for d in items]
            so = dict(self.options.storage_options)
            self.files = listing.files(so) if listing is not None else expand_paths(paths, so)
            # the credentials of URLs travel with the storage options, to open the files
            self.options = replace(self.options, storage_options=carry(self.options.storage_options,
                                                                       items))
            if self.options.sep_by_suffix:  # no separator chosen: a tab for .tsv, else a comma
                self.options = replace(self.options, sep=_sep_of(self.files), sep_by_suffix=False)
                _decimal(self.options.decimal, self.options.sep)
            self.blocks = make_blocks(self.files, self.options.blocksize)
            packed = [f for f in self.files if compression_of(f.path)]
            if packed:
                biggest = max(packed, key=lambda f: f.size)
                warnings.warn(
                    f"{len(packed)} compressed file(s) cannot be split into byte ranges: each is "
                    f"one block (largest: {biggest.path}, {biggest.size / 1e6:.1f} MB "
                    "compressed), decompressed as a stream and parsed blocksize at a time, so "
                    "memory stays bounded, but a whole file is one unit of the shuffle and of "
                    "the work. Hint: for large files prefer uncompressed CSV or Parquet.",
                    stacklevel=2,
                )

    @property
    def npartitions(self) -> int:
        """Number of blocks (Dask's word, as in ``DataFrame.npartitions``)."""
        return len(self.blocks)

    @property
    def nbytes(self) -> int:
        """Total size of the input files in bytes (0 for a dask DataFrame)."""
        return sum(f.size for f in self.files)

    def fingerprint(self) -> str:
        """Hash of (path, size, mtime) of every file + read options (or the frame's token).

        Returns
        -------
        str
            32 hex digits (``frame-<token>`` for a dask DataFrame); computed once per Source
            (its files were listed, with their sizes and mtimes, when it was made).
        """
        if self._fingerprint is None:
            self._fingerprint = self._compute_fingerprint()
        return self._fingerprint

    def _compute_fingerprint(self) -> str:
        if self.frame is not None:
            from dask.base import tokenize  # dask is not loaded by `import daskfeed`

            return "frame-" + tokenize(self.frame)
        payload = json.dumps(
            {"files": [file_key(f) for f in self.files], "options": self.options_key()},
            sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def options_key(self) -> dict[str, Any]:
        """The read options as they enter a fingerprint (and a part's key)."""
        opts = asdict(self.options)
        opts.pop("storage_options")
        opts.pop("sep_by_suffix")  # resolved by now (a frame has no files: nothing to resolve)
        opts.pop("max_columns")  # a bound on what is read, not how: the same fingerprints
        if opts["decimal"] == ".":  # the same fingerprints as before the setting existed
            opts.pop("decimal")
        return opts

    def block_sizes(self) -> list[int]:
        """Bytes of every block (a whole file: its size; a block of a dask DataFrame: 1).

        Returns
        -------
        list of int
            One size per block, in block order; computed once (read only).
        """
        if self._sizes is None:
            self._sizes = [1] * self.npartitions if self.frame is not None else [
                b.length if b.length >= 0 else self.files[b.file_index].size for b in self.blocks]
        return self._sizes

    def parts(self) -> list[Part]:
        """The files in :class:`~daskfeed.reading.Part` s: what the scan and the cache keep.

        Returns
        -------
        list of Part
            Every file in one part, in order (none for a dask DataFrame); computed once.
        """
        if self._parts is None:
            self._parts = [] if self.frame is not None else make_parts(
                self.files, self.blocks, self.options.blocksize, self.options_key())
        return self._parts

    def split_exactly(self, path: str, map_blocks: Callable[..., Iterable[BlockTransitions]] = map,
                      done: int | None = None) -> list[int]:
        """Decide where the records of each block of file ``path`` start, from the whole file.

        For a file whose speculated starts failed (a block ended inside a quoted field: see
        ``docs/how-it-works.md``, "Bad input"): each block's text is summarized (its quotes' state
        at its end, for either state at its start) by ``map_blocks`` (e.g. a ``Client.map`` that
        gathers, run on every block at once) and the summaries chained from the file's start. The
        blocks then read those bytes exactly (:meth:`use_splits`).

        Parameters
        ----------
        path
            One of the source's files.
        map_blocks
            ``map``-like: ``map_blocks(fn, paths, offsets, lengths, seps, options)``.
        done
            The source's first block not read yet, when the blocks before it were read at their
            speculated starts (each checked by its end): the blocks from it on start no earlier
            than its speculated start, so no record is read twice.

        Returns
        -------
        list of int
            Each block's start and the file's size (block ``k`` is ``[starts[k], starts[k + 1])``,
            empty when a quoted field spans it whole); [] for a file read whole.

        Raises
        ------
        DataError
            When a quoted field is still open at the end of the file, naming its line and byte.
        """
        mine = [b for b in self.blocks if b.path == path and b.length >= 0]
        if not mine:  # a whole file: nothing to split
            return []
        so = dict(self.options.storage_options)
        found = list(map_blocks(block_transitions, [b.path for b in mine], [b.offset for b in mine],
                                [b.length for b in mine], [self.options.sep] * len(mine),
                                [so] * len(mine)))
        size = self.files[mine[0].file_index].size
        firsts = [first for first, _ in found]
        starts, opening = chain(firsts, [t for _, t in found], size)
        if opening is not None:  # an unbalanced quote: the field opened in that block never closes
            begin, end = firsts[opening], firsts[opening + 1] if opening + 1 < len(firsts) else size
            with open_file(path, so) as f:
                f.seek(begin)
                body = f.read(end - begin)
                raise unclosed_quote(path, body, max(ends_inside(body, self.options.sep), 0), begin,
                                     line_number(f, begin), False, "is never closed before the end "
                                     "of the file")
        k = 0 if done is None else done - next(i for i, b in enumerate(self.blocks) if b is mine[0])
        if 0 < k < len(mine):
            with open_file(path, so) as f:
                spec = record_start(f, mine[k].offset, size, self.options.sep)
            starts = starts[:k] + [max(s, spec) for s in starts[k:]]
        info = self.files[mine[0].file_index]
        self.use_splits({path: {"size": info.size, "mtime": info.mtime, "etag": info.etag,
                                "starts": starts}})
        return starts

    def use_splits(self, splits: Mapping[str, Mapping[str, Any]]) -> None:
        """Read the blocks of these files at these exact starts (see :meth:`split_exactly`).

        Parameters
        ----------
        splits
            Path to ``{"size", "mtime", "etag", "starts"}``: the file as it was when its starts
            were decided, and each block's start and the file's size. A file not in the source,
            changed since, or split into another number of blocks (another blocksize) is left
            as it is.
        """
        if not splits:  # the usual case: nothing to look up among the files
            return
        files = {f.path: f for f in self.files}
        for path, split in splits.items():
            info, starts = files.get(path), split["starts"]
            if info is None or (info.size, info.mtime, info.etag) != (
                    split["size"], split["mtime"], split.get("etag", "")):
                continue
            at = [i for i, b in enumerate(self.blocks) if b.path == path and b.length >= 0]
            if len(at) + 1 != len(starts):
                continue
            for k, i in enumerate(at):
                self.blocks[i] = replace(self.blocks[i], start=int(starts[k]), stop=int(starts[k + 1]))
            self.splits[path] = {"size": info.size, "mtime": info.mtime, "etag": info.etag,
                                 "starts": [int(x) for x in starts]}

    def header(self) -> list[str]:
        """Column names, read from the first file's first line (no data parsed).

        Returns
        -------
        list of str
            The header of the first file that is not empty ([] when all are).

        Raises
        ------
        DataNotFoundError
            When storage refuses to read the file.
        """
        if self.frame is not None:
            return [str(c) for c in self.frame.columns]
        return first_header(self.files, self.options)

    def partitions(self) -> list[Delayed]:
        """One ``dask.delayed`` Arrow table per partition of a dask DataFrame input.

        Each has the null-marker rule, the types and the ``na_counts`` metadata of a table parsed
        from CSV.

        Returns
        -------
        list of Delayed
            Nothing is computed; empty for a file input (its blocks are read by
            :func:`daskfeed.reading.iter_tables`).
        """
        if self.frame is None:
            return []
        from dask import delayed  # dask is not loaded by `import daskfeed`

        return [delayed(frame_table, pure=True)(part, self.options, i)
                for i, part in enumerate(self.frame.to_delayed())]

    def __repr__(self) -> str:
        if self.frame is not None:
            return f"Source(dask DataFrame, npartitions={self.npartitions})"
        return (
            f"Source({len(self.files)} files, {self.nbytes / 1e9:.2f} GB, "
            f"npartitions={self.npartitions})"
        )


def _na_values(values: Sequence[str] | str | None) -> tuple[str, ...]:
    """The user's null markers as a sorted tuple (a fingerprint does not depend on order)."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise SettingError(f"Expected na_values to be strings such as 'NA'. Received: {bad[:3]!r}."
                           "\nHint: --na-values NA,null (na_values=['NA', 'null']).")
    return tuple(sorted({v for v in values if v}))


def first_header(files: Sequence[FileInfo], options: ReadOptions) -> list[str]:
    """Column names, read from the first line of the first file that is not empty (no data parsed).

    Parameters
    ----------
    files
        The files, in their order.
    options
        How they are read (a separator chosen by the files' names is decided here, unsaid).

    Returns
    -------
    list of str
        The header ([] when every file is empty).

    Raises
    ------
    DataNotFoundError
        When storage refuses to read the file.
    DataError, SchemaError
        For a header that is not text, or names a column twice.
    """
    so = dict(options.storage_options)
    sep = options.sep
    if options.sep_by_suffix:  # (as Source decides it; a mixed set is warned of there)
        sep = _sep_of(files, warn=False)
    for info in files:  # the first file that is not empty
        if is_parquet(info.path):
            import pyarrow.parquet as pq  # only where Parquet is read

            with open_file(info.path, so) as f:
                return list(pq.ParquetFile(f).schema_arrow.names)
        try:
            with open_file(info.path, so, compression_of(info.path)) as f:
                line = read_header(f, info.path, quote_limit(options.blocksize))
        except PermissionError as err:  # remote files open lazily: refused at the read
            raise DataNotFoundError(
                f"Cannot read {info.path}: permission denied. Received: {reason(err)}.\n"
                f"Hint: {credentials_hint(protocol(info.path))}"
            ) from err
        names = parse_header(line, sep, info.path, options.encoding,
                             max_columns=options.max_columns)
        if names:
            return names
    return []


def read_options(*, blocksize: int | str | None = None, sep: str | None = None,
                 encoding: str = "utf-8",
                 dtype: dict[str, str] | None = None,
                 storage_options: dict[str, Any] | None = None, bad_lines: str = "error",
                 na_values: Sequence[str] | None = None, decimal: str = ".") -> ReadOptions:
    """How files are read, checked, with ``daskfeed.blocksize`` when no blocksize is given.

    Parameters
    ----------
    blocksize, sep, encoding, dtype, storage_options, bad_lines, na_values, decimal
        As :class:`Source` takes them.

    Returns
    -------
    ReadOptions

    Raises
    ------
    SettingError
        For an unknown ``bad_lines``, ``na_values`` that are not text, a decimal point that
        is not one character other than the separator, a ``daskfeed.max-columns`` that is not
        a whole number of at least 1, or an encoding Python does not know or whose line breaks
        are not single bytes (UTF-16).
    """
    if bad_lines not in BAD_LINES:
        raise SettingError(
            f"Expected bad_lines to be one of {', '.join(BAD_LINES)}. Received: {bad_lines!r}."
            "\nHint: --bad-lines skip (bad_lines='skip') drops and counts them.")
    return ReadOptions(
        blocksize=config.blocksize(blocksize),
        sep="," if sep is None else sep,
        sep_by_suffix=sep is None,
        encoding=_encoding(encoding),
        dtype=tuple(sorted((dtype or {}).items())),
        storage_options=tuple(sorted((storage_options or {}).items())),
        bad_lines=bad_lines,
        na_values=_na_values(na_values),
        decimal=_decimal(decimal, sep or ""),  # (no separator chosen: checked once it is)
        max_columns=_max_columns(),
    )


def _encoding(name: str) -> str:
    """``name``, checked: an encoding Python knows whose line breaks are single ASCII bytes.

    Separators and quotes too: files are cut into blocks at line-break bytes (UTF-16 is refused).
    """
    try:
        info = codecs.lookup(name)
    except (LookupError, TypeError) as err:
        raise SettingError(
            "Expected a text encoding Python knows, such as 'utf-8', 'latin-1' or 'cp1252'. "
            f"Received: encoding={name!r}.\nHint: the names are Python's "
            "(https://docs.python.org/3/library/codecs.html#standard-encodings).") from err
    sample = "az09\n\r,;|\t\"'."
    try:
        ascii_bytes = sample.encode(info.name).endswith(sample.encode("ascii"))
    except UnicodeError:
        ascii_bytes = False
    if not ascii_bytes:
        raise SettingError(
            "Expected an encoding in which line breaks, separators and quotes are single ASCII "
            "bytes (UTF-8, latin-1, cp1252, ...): files are cut into blocks at line-break bytes. "
            f"Received: encoding={name!r}.\nHint: re-encode the files as UTF-8 first, e.g. "
            f"iconv -f {info.name.upper()} -t UTF-8 in.csv > out.csv.")
    return name


def _max_columns() -> int:
    """``daskfeed.max-columns``, checked: a whole number of at least 1."""
    value = config.get("max-columns")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingError(
            "Expected daskfeed.max-columns to be a whole number of at least 1, such as 10000. "
            f"Received: {value!r}.\nHint: set it as a number (DASK_DASKFEED__MAX_COLUMNS=50000, "
            "or dask.config.set({'daskfeed.max-columns': 50000})).")
    return value


def _tsv(path: str) -> bool:
    """Whether a file's name ends in ``.tsv`` (packed or not)."""
    base = path.lower()
    for packed in COMPRESSIONS:
        base = base.removesuffix(packed)
    return base.endswith(".tsv")


def _sep_of(files: Sequence[FileInfo], warn: bool = True) -> str:
    """The separator the files' names tell: a tab when every file is ``.tsv`` (packed or not).

    A set of both is read with commas, and warned of when ``warn``.
    """
    marked = [f.path for f in files if _tsv(f.path)]
    if warn and marked and len(marked) < len(files):
        warn_user(f"{len(marked)} of {len(files)} files end in .tsv (e.g. {marked[0]}), the "
                  "others not: all are read with ',' as the separator.\nHint: pass --sep to "
                  "choose it (sep=), or read the .tsv files on their own.")
    return "\t" if marked and len(marked) == len(files) else ","


def _decimal(decimal: str, sep: str) -> str:
    """The decimal point, checked: one character, not the field separator (if known) nor a quote."""
    if (not isinstance(decimal, str) or len(decimal) != 1 or decimal == sep or decimal == '"'
            or decimal.isalnum()):
        raise SettingError(
            f"Expected a decimal point of one character other than the separator ({sep!r}), "
            f"such as '.' or ','. Received: decimal={decimal!r}.\nHint: for numbers like 1,5 "
            "pass --decimal , with --sep ';' (decimal=',', sep=';').")
    return decimal


def _is_dask_frame(data: object) -> TypeGuard[dd.DataFrame]:
    mod = type(data).__module__ or ""
    return mod.startswith("dask") and hasattr(data, "npartitions") and hasattr(data, "columns")


