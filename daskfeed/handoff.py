"""Window handoff through a shared directory: a worker writes a window to a file the trainer maps.

No copy and no transfer through the scheduler's TCP path.

Used when every worker sees the trainer's directory (a cluster on this machine): the task
returns a small :class:`WindowFile` (path and layout); the trainer maps the file and unlinks
it at once (the mapping lives while the arrays do). Elsewhere windows are gathered as usual.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed.feed import Encoding, WindowData, read_window

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["WindowFile", "discard", "make_handoff_dir", "open_window", "read_window_file",
           "remove_handoff_dir", "write_window"]

ALIGN = 64  # bytes: every array starts on a cache line
PREFIX = "daskfeed-windows-"  # then the trainer's pid: a killed trainer's directory is found


@dataclass(frozen=True)
class WindowFile:
    """Where a worker wrote a window's arrays: the file and each array's place in it.

    ``layout``: ``(name, dtype, shape, offset)`` per array; names are ``x`` (a matrix) or
    ``x:<feature>``, then ``y`` and ``w``.
    """

    path: str
    layout: tuple[tuple[str, str, tuple[int, ...], int], ...]
    rows: int
    nbytes: int

    def __len__(self) -> int:
        return self.rows


def _arrays(data: WindowData) -> list[tuple[str, np.ndarray]]:
    xs = ([(f"x:{k}", v) for k, v in data.x.items()] if isinstance(data.x, dict)
          else [("x", data.x)])
    return [*xs, ("y", data.y), *([("w", data.w)] if data.w is not None else [])]


def write_window(data: WindowData, path: str) -> WindowFile:
    """Write ``data``'s arrays to ``path`` (a temporary name, then renamed; on a worker).

    Parameters
    ----------
    data
        The encoded window.
    path
        The file to write (its directory exists).

    Returns
    -------
    WindowFile
        The path and the layout :func:`open_window` maps.
    """
    layout = []
    offset = 0
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        for name, arr in _arrays(data):
            arr = np.ascontiguousarray(arr)
            offset = -(-offset // ALIGN) * ALIGN
            f.seek(offset)
            f.write(arr.data)
            layout.append((name, arr.dtype.str, tuple(arr.shape), offset))
            offset += arr.nbytes
    os.replace(tmp, path)
    return WindowFile(path, tuple(layout), len(data), offset)


def read_window_file(blocks: list[tuple[int, Any]], options: Any, encoding: Encoding, seed: Any,
                     cache: Any, path: str) -> WindowFile:
    """:func:`~daskfeed.feed.read_window`, written to ``path`` (the task of a local handoff).

    Parameters
    ----------
    blocks, options, encoding, seed, cache
        As for :func:`~daskfeed.feed.read_window`.
    path
        The file the window goes to.

    Returns
    -------
    WindowFile
        What the trainer maps.
    """
    return write_window(read_window(blocks, options, encoding, seed, cache), path)


def open_window(handle: WindowFile | WindowData) -> WindowData:
    """Map a window's file read-only and unlink it; a gathered window passes through.

    Parameters
    ----------
    handle
        What the window's task returned.

    Returns
    -------
    WindowData
        Arrays viewing the mapping (read-only).
    """
    if isinstance(handle, WindowData):
        return handle
    try:
        with open(handle.path, "rb") as f:
            buf: Any = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if handle.nbytes
                        else b"")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(handle.path)
    arrays = {}
    for name, dtype, shape, offset in handle.layout:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        arrays[name] = np.frombuffer(buf, dtype=dt, count=count, offset=offset).reshape(shape)
    x: dict[str, np.ndarray] | np.ndarray = (
        arrays["x"] if "x" in arrays else {k[2:]: v for k, v in arrays.items() if k.startswith("x:")})
    return WindowData(x, arrays["y"], arrays.get("w"))


def discard(path: str) -> None:
    """Remove a window file that will not be opened (its window was cancelled); never raises."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _probe(path: str) -> str | None:
    """On a worker: the marker file's text, or None when this worker cannot read it."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return None


def make_handoff_dir(client: Client, need: int) -> str | None:
    """A private directory every worker of ``client`` can write and the trainer read, or None.

    Tried under ``/dev/shm`` (memory, no disk writes), then the temporary directory; a
    directory is kept only when every worker reads a marker written here (same host and
    filesystem), else removed (a remote cluster gathers windows over the network).

    Parameters
    ----------
    client
        The cluster's client.
    need
        Bytes of window files that may exist at once (the prefetch budget): a root with less
        free space is skipped.

    Returns
    -------
    str or None
        The directory (the caller removes it with :func:`remove_handoff_dir`), or None.
    """
    roots = [r for r in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(r)]
    for root in roots:
        _remove_orphans(root)
        st = os.statvfs(root)
        if st.f_bavail * st.f_frsize < 2 * need:
            continue
        try:
            path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)
        except OSError:
            continue
        token = secrets.token_hex(8)
        marker = os.path.join(path, "marker")
        with open(marker, "w", encoding="ascii") as f:
            f.write(token)
        try:
            seen = client.run(_probe, marker)
        except Exception:  # a worker that cannot answer: no local handoff
            seen = {}
        if seen and all(v == token for v in seen.values()):
            os.unlink(marker)
            return path
        remove_handoff_dir(path)
        return None
    return None


def _remove_orphans(root: str) -> None:
    """Remove the handoff directories under ``root`` of trainers that no longer run (killed)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            pid = name[len(PREFIX):].split("-", 1)[0]
            if not (name.startswith(PREFIX) and pid.isdigit()):
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                remove_handoff_dir(os.path.join(root, name))
            except OSError:
                continue  # alive (another user's process)


def remove_handoff_dir(path: str | None) -> None:
    """Remove a handoff directory and every window file left in it; never raises."""
    if path:
        shutil.rmtree(path, ignore_errors=True)
