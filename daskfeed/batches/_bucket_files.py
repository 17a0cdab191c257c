"""The trainer's handle on a data set's bucket files: built here, or in a thread as training starts.

:func:`daskfeed.batches._buckets.bucket_set` plans a build; :class:`Buckets` holds its result,
or runs it in a daemon thread of the trainer and hands the files to :meth:`Buckets.wait` once
written (the epoch needs only the buckets' sizes until its first window is read).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed.cluster import WindowCancelled, wait_for
from daskfeed.core import PROCESS_STOP, Aborted, ClusterError, Stop

if TYPE_CHECKING:
    from types import TracebackType

    from distributed import Client

    from daskfeed.batches._memory_buckets import BucketFiles

    Abandon = Callable[[], BaseException | None]  # what a build asks between its waits
    Build = Callable[[Abandon], tuple[BucketFiles, str] | "Missed"]

CLOSE_WAIT = 30.0  # seconds close() waits for a build's thread to release its tasks and end


class Buckets:
    """A data set's buckets as the trainer plans with them: the files and each one's rows.

    The rows of each bucket are known before any file is written (from the manifest's counts),
    so an epoch can be planned while the files are still being built: a build in the background
    (:func:`bucket_set` with ``background``) gives its files to :meth:`wait`.

    Attributes
    ----------
    sizes
        Rows of each bucket (numpy int64, ``K`` of them).
    seconds
        How long their build took here (None: built before, reused; or still building).
    work
        What the build did, in words ("": nothing, reused; or still building).
    background
        Whether they are (or were) built in the background.
    held
        Bytes of them the trainer holds, about (0: they are files), see
        :class:`~daskfeed.batches._memory_buckets.MemoryBuckets`.
    """

    def __init__(self, files: BucketFiles | None, sizes: np.ndarray, seconds: float | None = None,
                 work: str = "",
                 build: Build | None = None, held: int = 0) -> None:
        self._files = files
        self.sizes = sizes
        self.seconds = seconds
        self.work = work
        self.held = held
        self._error: BaseException | None = None
        self._trace: TracebackType | None = None  # (the build's: each raise starts from it)
        self.background = build is not None  # (built in a thread of this process)
        self._built = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        if build is None:
            self._built.set()
        else:
            self._thread = threading.Thread(target=self._build, args=(build,), daemon=True,
                                            name="daskfeed-bucket-build")
            self._thread.start()

    @property
    def count(self) -> int:
        """``K``."""
        return len(self.sizes)

    @property
    def building(self) -> bool:
        """Whether the files are still being built in the background."""
        return not self._built.is_set()

    @property
    def failed(self) -> bool:
        """Whether the build in the background ended in an error (:meth:`wait` raises it)."""
        return self._built.is_set() and self._error is not None

    @property
    def files(self) -> BucketFiles:
        """The :class:`~daskfeed.cache._buckets.BucketSet`, once built (:meth:`wait`).

        What a window task reads: a view of its generations; or the rows the trainer holds
        (:class:`~daskfeed.batches._memory_buckets.MemoryBuckets`, ``held``).
        """
        return self.wait()

    def wait(self, stop: Stop = PROCESS_STOP,
             abandon: Callable[[], BaseException | None] | None = None) -> BucketFiles:
        """The files, once the build in the background ended (at once when there was none).

        Parameters
        ----------
        stop
            The process's stop request: it ends the wait.
        abandon
            Returns an error to raise instead of waiting on (the reader was closed), or None.

        Raises
        ------
        DaskfeedError
            Why the build failed (the same error each call).
        Aborted
            ``stop`` asked the process to stop first.
        """
        wait_for(self._built.is_set, math.inf, self._built.wait, 1.0, abandon, stop)
        if self._error is not None:
            raise self._error.with_traceback(self._trace)
        assert self._files is not None
        return self._files

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Stop a build in the background and wait (at most ``timeout`` s) for its thread to end.

        The build stops at its next wait for the workers' tasks and releases them: the
        scheduler drops those not started that no one else wants; a task already running on a
        worker finishes there (its result unused). A build cut short is written again by the
        next run that needs it; its files, unsealed, are removed once stale
        (:meth:`~daskfeed.cache.BucketSet.sweep`). A reader waiting for the files gets
        ``WindowCancelled`` (the sequence was closed), not the stop. Idempotent.
        """
        self._closing.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _abandoned(self) -> BaseException | None:
        if not self._closing.is_set():
            return None
        return Aborted("the reader was closed: its buckets' build stops")

    def __getstate__(self) -> dict[str, Any]:
        self.wait()  # (a copy holds the files)
        state = self.__dict__.copy()
        for k in ("_built", "_closing", "_thread"):
            del state[k]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._built = threading.Event()
        self._built.set()
        self._closing = threading.Event()
        self._thread = None

    def _build(self, build: Build) -> None:
        t0 = time.perf_counter()
        try:
            made = build(self._abandoned)
            if isinstance(made, Missed):  # (the epoch was planned on them: no fallback left)
                raise ClusterError(
                    f"Expected the global order's buckets written beside the parse cache while "
                    f"training started. Received: {made.reason}, after this run's epochs were "
                    f"planned on them.\nHint: {made.hint}; a run that cannot write them from the "
                    "start shuffles within windows of blocks.")
            self._files, self.work = made
            self.seconds = time.perf_counter() - t0
        except BaseException as err:  # raised by wait(), in the thread that needs the files
            if isinstance(err, Aborted) and self._closing.is_set():  # (not a stop of the process)
                err = WindowCancelled("no buckets: the sequence was closed while they were built")
            self._error, self._trace = err, err.__traceback__
        finally:
            self._built.set()


@dataclass(frozen=True)
class Missed:
    """Why a build could not write its buckets, and what to do about it."""

    reason: str
    hint: str


def disk_shared(client: Client, root: str | None) -> bool:
    """Whether every worker sees this process's files under ``root`` (a probe written here).

    Workers of this machine may still have disks of their own (containers on the host's
    network): a build in the background, which has no fallback left, needs the same files.
    """
    if root is None:
        return False
    try:
        os.makedirs(root, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".daskfeed-probe-", dir=root)
        os.close(fd)
    except OSError:
        return False
    try:
        seen = client.run(os.path.exists, probe)
        return bool(seen) and all(seen.values())
    except Exception:  # (a worker that does not answer: built first, as for remote workers)
        return False
    finally:
        with contextlib.suppress(OSError):
            os.remove(probe)
