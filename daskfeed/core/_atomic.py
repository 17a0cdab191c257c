"""Atomic writes: a file or directory appears whole under its final name, or not at all.

Everything daskfeed persists (manifest, cache entries, checkpoints, demo data) is written to a
temporary name beside its destination, flushed to disk, then renamed into place with
``os.replace``; a crash mid-write leaves the previous version untouched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import IO, Any

# a file is created, never opened where it exists: not through a link planted at its name
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def temporary_name(path: str) -> str:
    """A fresh name beside ``path``: no other writer, nor any other call, uses it.

    Parameters
    ----------
    path
        The path to be written.

    Returns
    -------
    str
        ``path`` with a ``.tmp-<pid>-<random>`` suffix (the pid tells a sweep whose it is).
    """
    return f"{path}.tmp-{os.getpid()}-{secrets.token_hex(6)}"


def create_new(path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None,
               perms: int = 0o666) -> IO[Any]:
    """Create ``path`` and open it for writing; refused where anything (a link too) is there.

    Parameters
    ----------
    path
        The file to create (a :func:`temporary_name`).
    mode
        ``"wb"`` or ``"w"``.
    encoding
        The text encoding (text mode only).
    perms
        Its permission bits (less the umask): 0o600 for what only daskfeed reads back.

    Returns
    -------
    IO
        The file, open for writing.

    Raises
    ------
    FileExistsError
        Where ``path`` exists (a file, a directory or a link to anything).
    """
    fd = os.open(path, _CREATE, perms)
    try:
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


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
            encoding: str | None = None, perms: int = 0o666) -> Iterator[IO[Any]]:
    """Open a temporary file to write ``path``; on success it is fsync'ed and renamed into place.

    On an exception the temporary file is removed and ``path`` is left as it was. The temporary
    file is created by :func:`create_new` (a fresh name, no link followed).

    Parameters
    ----------
    path
        The file to write.
    mode
        ``open``'s mode: ``"wb"`` (bytes) or ``"w"`` (text).
    encoding
        The text encoding (text mode only).
    perms
        The file's permission bits (less the umask).

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
    f = create_new(tmp, mode, encoding=encoding, perms=perms)  # (nothing to remove if refused)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_file(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8",
               perms: int = 0o666) -> None:
    """Write ``data`` to ``path`` atomically.

    Parameters
    ----------
    path
        The file to write.
    data
        Its content: bytes, or text written in ``encoding``.
    encoding
        The encoding of text ``data``.
    perms
        The file's permission bits (less the umask).
    """
    if isinstance(data, str):
        with writing(path, "w", encoding=encoding, perms=perms) as f:
            f.write(data)
    else:
        with writing(path, "wb", perms=perms) as f:
            f.write(data)
