"""Streams: one input file opened for reading bytes, decompressed by its suffix.

gzip (all members), bz2 (all streams), xz and zstd (all frames) are decompressed here on top
of the raw fsspec file, so the stream ends only where the file does; damaged data names the file.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import zlib
from typing import IO, TYPE_CHECKING, Any, Union

import fsspec

from daskfeed.core import DataError, DataNotFoundError, redact_text, redact_url
from daskfeed.reading._credentials import fsspec_target
from daskfeed.reading._files import COMPRESSIONS

if TYPE_CHECKING:
    import zstandard
    from _typeshed import WriteableBuffer

# what _decompressor gives: the stdlib's readers, or zstandard's (an optional dependency)
Decompressing = Union[io.BufferedIOBase, "zstandard.ZstdDecompressionReader"]


def read_at_most(f: IO[bytes], most: int) -> bytes:
    """``f.read(most)``, asking only for what the file holds where it can say (a local file).

    ``read(n)`` sizes its buffer for ``n`` bytes before reading: for a small file read with a
    block's bound (64 MiB), a map of that size made and unmade per file, 3x the time of the read
    on 20,000 small files. A file that grew since it was opened reads as before: up to its new
    size, one byte more when it can (the caller compares the length with ``most``).
    """
    try:
        st = os.fstat(f.fileno())
        left = st.st_size - f.tell() if stat.S_ISREG(st.st_mode) else -1
    except (OSError, AttributeError, ValueError):  # (not a file of this machine's: fsspec's)
        left = -1
    if left < 0:  # (no size to trust: a pipe, a device, /proc, an object store's stream)
        return f.read(most)
    return f.read(min(most, left + 1))


def open_file(path: str, storage_options: dict[str, Any],
              compression: str | None = None) -> IO[bytes]:
    """Open ``path`` for reading bytes, decompressed when ``compression`` is given.

    Parameters
    ----------
    path
        A local path or fsspec URL (as listed: without credentials).
    storage_options
        Passed to fsspec; the credentials of URLs they carry are put back into ``path``.
    compression
        From :func:`daskfeed.reading.compression_of`; None reads the bytes as they are.

    Returns
    -------
    IO[bytes]
        A seekable raw file, or a buffered reader of the decompressed bytes.

    Raises
    ------
    DataNotFoundError
        When the file is gone or unreadable.
    DataError
        When a ``.zst`` file is to be read and the ``zstandard`` module is missing.
    """
    own = compression in COMPRESSIONS.values()
    if compression == "zstd":
        _require_zstandard(path)
    try:
        if "://" not in path and (own or compression is None):  # local: no fsspec per file
            raw: IO[bytes] = open(path, "rb")  # closed by the caller
        else:
            target, options = fsspec_target(path, storage_options)  # with its credentials
            raw = fsspec.open(target, "rb", compression=None if own else compression,
                              **options).open()
    except (FileNotFoundError, PermissionError, IsADirectoryError) as err:
        if isinstance(err, DataNotFoundError):  # (credentials where they cannot be read)
            raise
        raise DataNotFoundError(
            f"Cannot read {redact_url(path)}: {redact_text(err.strerror or type(err).__name__)}.\n"
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


def _decompressor(compression: str, raw: IO[bytes]) -> Decompressing:
    """A reader of the decompressed bytes of ``raw``, across all its members / frames."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw, "rb")
    if compression == "xz":
        return lzma.LZMAFile(raw, "rb")
    import zstandard  # optional: only where a .zst file is read

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

    def __init__(self, stream: Decompressing, raw: IO[bytes], path: str, compression: str) -> None:
        super().__init__()
        self._stream, self._raw = stream, raw
        self._path, self._compression = path, compression

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
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
