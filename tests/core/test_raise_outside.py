"""Stop requests and signals: a signal's raise is not lost where Python would drop it."""

from __future__ import annotations

import gc
import sys

import pytest

from daskfeed.core._lifecycle import raise_outside


class _Stopped(Exception):
    pass


def _raise(frame) -> None:
    raise _Stopped


def test_a_raise_asked_inside_a_gc_callback_comes_right_after_it():
    """A signal handler (SIGTERM's, SIGINT's) that runs inside a garbage collector's callback
    (distributed registers one): raised there, Python prints "Exception ignored" and drops it;
    raise_outside raises it at the first call or return outside the callback."""
    asked: list[int] = []
    dropped: list = []

    def callback(phase, info):
        if phase == "start" and not asked:
            asked.append(1)
            raise_outside(_raise, sys._getframe())  # as the handler would, given this frame

    hook, sys.unraisablehook = sys.unraisablehook, dropped.append
    gc.callbacks.append(callback)
    try:
        with pytest.raises(_Stopped):
            gc.collect()
            for _ in range(1000):  # calls after the collection: the raise must have come before
                len([])
    finally:
        gc.callbacks.remove(callback)
        sys.setprofile(None)
        sys.unraisablehook = hook
    assert asked and not dropped, dropped


def test_elsewhere_the_raise_is_at_once():
    with pytest.raises(_Stopped):
        raise_outside(_raise, sys._getframe())
    assert sys.getprofile() is None
