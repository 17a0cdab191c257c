"""Atomic writes: a file or directory appears whole under its final name, or not at all.

Everything daskfeed persists (manifest, cache entries, checkpoints, demo data) is written to a
temporary name beside its destination, flushed to disk, then renamed into place with
``os.replace``; a crash mid-write leaves the previous version untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["fsync", "replace", "temporary_name", "write_file", "writing"]


def temporary_name(path: str) -> str:
    """A name beside ``path`` that no other process writing the same path uses.

    Parameters
    ----------
    path
        The path to be written.

    Returns
    -------
    str
        ``path`` with this process's ``.tmp-<pid>`` suffix.
    """
    return f"{path}.tmp-{os.getpid()}"


def fsync(path: str | os.PathLike[str]) -> None:
    """Flush a file or a directory's entries to disk (a no-op where the platform refuses).

    Parameters
    ----------
    path
        The file or directory.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace(tmp: str, path: str) -> None:
    """Rename ``tmp`` (a finished file or directory) onto ``path`` and flush the parent.

    Parameters
    ----------
    tmp
        The finished file or directory.
    path
        Where it goes (replaced if it exists).
    """
    os.replace(tmp, path)
    fsync(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], mode: str = "wb", *,
            encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file to write ``path``; on success it is fsync'ed and renamed into place.

    On an exception the temporary file is removed and ``path`` is left as it was.

    Parameters
    ----------
    path
        The file to write.
    mode
        ``open``'s mode: ``"wb"`` (bytes) or ``"w"`` (text).
    encoding
        The text encoding (text mode only).

    Yields
    ------
    IO
        The temporary file, open for writing.

    Raises
    ------
    OSError
        Where the file cannot be written or renamed (the exception of the block also passes
        through, after the temporary file is removed).
    """
    path = os.fspath(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            if os.path.isdir(tmp):
                shutil.rmtree(tmp)
            else:
                os.remove(tmp)
        raise


def write_file(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8") -> None:
    """Write ``data`` to ``path`` atomically.

    Parameters
    ----------
    path
        The file to write.
    data
        Its content: bytes, or text written in ``encoding``.
    encoding
        The encoding of text ``data``.
    """
    if isinstance(data, str):
        with writing(path, "w", encoding=encoding) as f:
            f.write(data)
    else:
        with writing(path, "wb") as f:
            f.write(data)
