"""The held buckets taken by an idle worker of this machine and mapped by the trainer.

:class:`~daskfeed.batches._memory_buckets.MemoryBuckets` takes its rows as training starts,
while Keras traces its training step in the trainer's main thread. That trace holds the
interpreter's lock in long stretches of TensorFlow's C++ (graph building), and the take (a few
thousand short calls that give the lock up: Arrow's reads, each block's stored order) waits
for it at each: in the trainer the take of the bench's 2M rows took 1.4-2.2 s beside the trace
against ~0.5 s alone, and the first batch waited for it. A worker of a local cluster is idle
then, with a lock of its own: it takes and encodes the rows into arrays in files (numpy's
``.npy``, written where they are encoded) in a directory of the parse cache, and the trainer
maps them (read-only) and removes the directory at once: the rows are the same bytes, taken by
the same code (:meth:`MemoryBuckets.take`), and no copy of them crosses the cluster's socket.

Used where every worker runs on this machine and can hold the rows (a quarter of its memory
limit: :func:`daskfeed.batches._here.can_take_aside`); anything that fails on the way (a
worker that does not see the directory, a worker lost) leaves the take to the trainer, which
raises what is wrong with the data itself.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import stat
import tempfile
import uuid
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from daskfeed.cluster import result
from daskfeed.manifest import WindowData

if TYPE_CHECKING:
    from collections.abc import Callable

    from distributed import Client

    from daskfeed.cache import BlockCache


class Held(Protocol):
    """What is taken aside: :class:`~daskfeed.batches._memory_buckets.MemoryBuckets`."""

    cache: BlockCache

    def take_rows(self, abandon: Callable[[], BaseException | None] | None = None,
                  allocate: Callable[[np.ndarray, int, str], np.ndarray] | None = None,
                  ) -> tuple[WindowData, np.ndarray]: ...


PREFIX = ".daskfeed-held-"  # the directory the worker writes in, under the parse cache's root
_OWNER = f"{socket.gethostname()}-{os.getpid()}"  # (its name says whose it is: see sweep())


def sweep(root: str) -> list[str]:
    """Remove the directories under ``root`` left by trainers of this host that are gone.

    A trainer killed while a worker takes its rows (a second or so) leaves its directory; the
    next take on this host removes it. Another host's, a live process's, another user's (a
    shared cache) and anything not a directory of ours (a link) are left.

    Returns
    -------
    list of str
        The directories removed.
    """
    host = f"{PREFIX}{socket.gethostname()}-"
    gone = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            pid = name[len(host):].split("-", 1)[0] if name.startswith(host) else ""
            if pid.isdigit() and not _alive(int(pid)) and _ours(os.path.join(root, name)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                gone.append(name)
    return gone


def _ours(path: str) -> bool:
    """Whether ``path`` is a directory (not a link) of this user: only those are swept."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == getattr(os, "getuid", lambda: st.st_uid)()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's: alive)
        return True
    return True


def take_aside(buckets: Held, client: Client,
               abandon: Callable[[], BaseException | None]) -> tuple[WindowData, np.ndarray] | None:
    """The held rows and their buckets' starts, taken by a worker; None: take them here.

    Raises
    ------
    BaseException
        What ``abandon()`` returns, or :class:`~daskfeed.core.Aborted` (the process stops).
    """
    root = buckets.cache.root
    if root is None:
        return None
    try:
        sweep(os.fspath(root))
        directory = tempfile.mkdtemp(prefix=f"{PREFIX}{_OWNER}-", dir=os.fspath(root))
    except OSError:
        return None
    try:
        future = client.submit(_take_into, buckets, directory, pure=False,
                               key=f"daskfeed-held-take-{uuid.uuid4().hex}")
        try:
            layout = result(future, math.inf, abandon)
        except Exception:  # (Aborted, the process stopping, is not one: it goes up)
            stop = abandon()
            if stop is not None:
                raise stop from None
            return None  # (the trainer's own take says what is wrong, if anything is)
        finally:
            future.release()
        return _mapped(layout)
    except OSError:  # files the worker wrote that are not here (another disk)
        return None
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # (the trainer's maps stay valid)


def _take_into(buckets: Held, directory: str) -> dict[str, Any]:
    """On a worker: take and encode ``buckets``' rows into ``.npy`` files in ``directory``."""
    if not os.path.isdir(directory):  # (a worker with a disk of its own)
        raise FileNotFoundError(directory)

    def allocate(like: np.ndarray, n: int, name: str) -> np.ndarray:  # (encoded where it is kept)
        return np.lib.format.open_memmap(os.path.join(directory, f"{name}.npy"), mode="w+",
                                         dtype=like.dtype, shape=(n, *like.shape[1:]))

    held, starts = buckets.take_rows(allocate=allocate)

    def saved(a: np.ndarray, name: str) -> str:
        path = os.path.join(directory, f"{name}.npy")
        if isinstance(a, np.memmap):
            a.flush()
        else:  # (not encoded into a file: no rows, or a dtype of its own)
            np.save(path, a)
        return path

    x = held.x
    return {"x": ({k: saved(v, f"x-{i}") for i, (k, v) in enumerate(x.items())}
                  if isinstance(x, dict) else saved(x, "x")),
            "y": saved(held.y, "y"), "w": None if held.w is None else saved(held.w, "w"),
            "starts": starts}


def _mapped(layout: dict[str, Any]) -> tuple[WindowData, np.ndarray]:
    """The files a worker wrote, mapped read-only (they stay mapped once removed)."""
    def load(path: str) -> np.ndarray:
        a: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
        with contextlib.suppress(OSError):
            os.remove(path)
        return a

    x = layout["x"]
    held = WindowData({k: load(p) for k, p in x.items()} if isinstance(x, dict) else load(x),
                      load(layout["y"]), None if layout["w"] is None else load(layout["w"]))
    return held, np.asarray(layout["starts"], dtype=np.int64)
