"""Process-level lifecycle: stop requests (SIGINT / SIGTERM) and what runs at interpreter exit.

:class:`Stop` is the cancellation object waits for data look at; :data:`PROCESS_STOP` is the one
the process shares unless a caller passes its own. :func:`close_at_exit` and :func:`run_at_exit`
close prefetchers and clients early in the interpreter's shutdown.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours, registered after, runs before)
import contextlib
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Protocol

STOP_GRACE = 2.0  # a wait that begins this soon after SIGINT / SIGTERM still ends at once
SETTLE = 2.0  # seconds the exit hook lets open prefetchers finish gathers in progress


class Aborted(KeyboardInterrupt):
    """Waiting for a window was abandoned because the process is stopping (:class:`Stop`)."""


class _StopSignals:
    """SIGINT / SIGTERM counted as they arrive, even while the main thread waits inside C code.

    Python runs signal handlers in the main thread only between bytecodes: while ``fit`` waits
    inside TensorFlow for a batch stuck on a hung read, Ctrl-C would act only at ``timeout``.
    The C-level handler also writes the signal number to the wakeup fd at once: a daemon thread
    reading it notes the time, every wait for a window that began before it (or up to
    ``STOP_GRACE`` seconds after it: TensorFlow may ask for the next batch meanwhile) ends
    with :class:`Aborted`, TensorFlow returns, and the main thread raises
    ``KeyboardInterrupt`` as usual. Later waits are not affected (a notebook fits again). A
    wakeup fd set before (asyncio, the CLI's watcher) still receives every byte.
    """

    def __init__(self) -> None:
        self.last = float("-inf")  # time.monotonic() of the last stop signal
        self._lock = threading.Lock()
        self._pid = -1
        self._writer: socket.socket | None = None
        self._forward = -1  # our duplicate of the wakeup fd we replaced, or -1

    def install(self) -> None:
        """Listen on the wakeup fd (main thread only); idempotent, again after a fork."""
        if threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            if self._pid != os.getpid():
                self._start_reader()
            assert self._writer is not None
            mine = self._writer.fileno()
            try:
                previous = signal.set_wakeup_fd(mine, warn_on_full_buffer=False)
            except ValueError:  # not the main interpreter
                return
            if previous != mine:
                self._set_forward(previous)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.signal(signal.SIGINT, _interrupt)

    def _start_reader(self) -> None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._writer, self._pid, self._forward = writer, os.getpid(), -1
        threading.Thread(target=self._read, args=(reader,), name="daskfeed-signals",
                         daemon=True).start()

    def _set_forward(self, fd: int) -> None:
        old, self._forward = self._forward, (os.dup(fd) if fd >= 0 else -1)
        if old >= 0:
            with contextlib.suppress(OSError):
                os.close(old)

    def _read(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if any(b in (signal.SIGINT, signal.SIGTERM) and signal.getsignal(b) is not signal.SIG_IGN
                   for b in data):
                self.last = time.monotonic()
            if self._forward >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._forward, data)


_SIGNALS = _StopSignals()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Python's own SIGINT handler (KeyboardInterrupt), raised where it is not lost or mangled.

    See :func:`raise_outside`.
    """
    raise_outside(lambda at: signal.default_int_handler(signum, at), frame)


def raise_outside(raise_: Callable[[FrameType | None], None], frame: FrameType | None) -> None:
    """Call ``raise_(frame)`` (a signal handler's raise) now, or where its exception survives.

    A signal's Python handler runs between any two bytecodes of the main thread; an exception
    it raises in some places never reaches the code that was running:

    - TensorFlow's making of an error. Ctrl-C while ``fit`` waits for a batch: the wait ends
      (:class:`Aborted`), TensorFlow turns that into an error, and the main thread's first
      Python code is that error's ``__init__``, run by pybind11 while it builds the exception.
      A KeyboardInterrupt raised there comes out as pybind11's ``RuntimeError: ... MISMATCH of
      original and normalized active exception types``, which ``except KeyboardInterrupt``
      misses.
    - A garbage collector's callback (``gc.callbacks``, e.g. distributed's ``GCDiagnosis``):
      Python prints "Exception ignored in ..." with a traceback and drops the exception (a
      SIGTERM during a collection printed one).

    There it is raised at the first call or return outside them instead (a profile hook of
    this thread, removed then).

    Parameters
    ----------
    raise_
        Raises the exception, given the frame it is raised in.
    frame
        The frame the signal interrupted (the handler's second argument).
    """
    if not _raise_lost_in(frame):
        raise_(frame)
        return
    previous = sys.getprofile()

    def once_out(at: FrameType, event: str, arg: object) -> None:
        if not _raise_lost_in(at):
            sys.setprofile(previous)
            raise_(at)

    sys.setprofile(once_out)


def _raise_lost_in(frame: FrameType | None) -> bool:
    """Whether an exception raised in ``frame`` would be lost or mangled (:func:`raise_outside`)."""
    return _inside_tf_error(frame) or _inside_gc_callback(frame)


def _inside_gc_callback(frame: FrameType | None) -> bool:
    """Whether ``frame`` (or one of its few callers) is a garbage collector's callback."""
    import gc

    codes = {getattr(getattr(cb, "__func__", cb), "__code__", None) for cb in gc.callbacks}
    codes.discard(None)
    for _ in range(6):
        if frame is None or not codes:
            return False
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _inside_tf_error(frame: FrameType | None) -> bool:
    """Whether ``frame`` (or one of its few callers) is TensorFlow's making of an error."""
    for _ in range(6):
        if frame is None:
            return False
        name = frame.f_code.co_filename.replace(os.sep, "/")
        if name.endswith("tensorflow/python/framework/errors_impl.py"):
            return True
        frame = frame.f_back
    return False


class Stop:
    """A request to stop waiting for data: set by a signal watcher (the CLI's) or a caller.

    Waits check :meth:`stopped` between looks at their futures. Besides an explicit
    :meth:`request`, a SIGINT / SIGTERM that arrived since the wait began (or up to
    ``STOP_GRACE`` s before) stops it too, once :meth:`listen` ran in the main thread.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None  # the signal that made the request, if one did

    def request(self, signum: int | None = None) -> None:
        """Ask every wait that looks at this object to end with :class:`Aborted`.

        Parameters
        ----------
        signum
            The signal that asked for the stop (recorded in :attr:`signum`), or None.
        """
        if signum is not None and self.signum is None:
            self.signum = signum
        self._event.set()

    def clear(self) -> None:
        """Withdraw the request (a new command, or a notebook fitting again)."""
        self.signum = None
        self._event.clear()

    @property
    def requested(self) -> bool:
        """Whether :meth:`request` was called (and not cleared)."""
        return self._event.is_set()

    def stopped(self, since: float) -> bool:
        """Whether a wait that began at ``since`` (``time.monotonic()``) must end now.

        Parameters
        ----------
        since
            When the wait began.

        Returns
        -------
        bool
            True once a stop was requested, or a stop signal arrived after ``since - STOP_GRACE``.
        """
        return self._event.is_set() or _SIGNALS.last > since - STOP_GRACE

    @staticmethod
    def listen() -> None:
        """Notice SIGINT / SIGTERM while blocked in C code (main thread only; idempotent)."""
        _SIGNALS.install()


PROCESS_STOP = Stop()  # the process-wide default, created once


class Closable(Protocol):
    """What :func:`close_at_exit` closes: finish gathers in progress, then close."""

    def settle(self, deadline: float) -> None:
        """Wait until ``deadline`` (``time.monotonic()``) for work in progress.

        Parameters
        ----------
        deadline
            When to stop waiting (``time.monotonic()``).
        """

    def close(self) -> None:
        """Release everything; idempotent, never raises."""


_LIVE: weakref.WeakSet[Closable] = weakref.WeakSet()
_EXIT_CALLBACKS: list[Callable[[], None]] = []
_EXIT_HOOK: list[bool] = []  # [True] once registered (a fork inherits the registration)


def close_at_exit(obj: Closable) -> None:
    """Settle and close ``obj`` at interpreter exit unless it is collected before.

    Parameters
    ----------
    obj
        A prefetcher (anything with ``settle(deadline)`` and ``close()``), held weakly.
    """
    _LIVE.add(obj)
    _register_exit_hook()


def run_at_exit(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the interpreter exits, after the open prefetchers are closed.

    Runs early in the shutdown, before the interpreter joins the ``concurrent.futures``
    threads and makes their pools refuse work (which distributed's clients, schedulers and
    callbacks rely on).

    Parameters
    ----------
    fn
        Called with no arguments; its exceptions are suppressed.
    """
    _EXIT_CALLBACKS.append(fn)
    _register_exit_hook()


def _register_exit_hook() -> None:
    """Register :func:`_close_all` to run before ``concurrent.futures`` joins its threads.

    ``threading._register_atexit`` is the only hook that runs before that join (``atexit``
    runs after it); where it is missing, ``atexit`` is the fallback.
    """
    if _EXIT_HOOK:
        return
    _EXIT_HOOK.append(True)
    try:
        threading._register_atexit(_close_all)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # another Python, or already shutting down
        atexit.register(_close_all)


def _close_all() -> None:
    """At exit: finish gathers in progress, close every open prefetcher, run the callbacks."""
    if threading.current_thread() is not threading.main_thread():
        return
    live = list(_LIVE)
    deadline = time.monotonic() + SETTLE
    for obj in live:
        with contextlib.suppress(Exception):
            obj.settle(deadline)
    for obj in live:
        with contextlib.suppress(Exception):
            obj.close()
    for fn in _EXIT_CALLBACKS:
        with contextlib.suppress(Exception):
            fn()
