"""Stop requests and signals: a signal's raise is not lost where Python would drop it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from daskfeed.core._lifecycle import raise_outside


class _Stopped(Exception):
    pass


def _raise(frame) -> None:
    raise _Stopped


_IN_GC = """
import gc, sys
from daskfeed.core._lifecycle import raise_outside

class Stopped(Exception):
    pass

def raise_(frame):
    raise Stopped

asked, dropped = [], []

def callback(phase, info):
    if phase == "start" and not asked:
        asked.append(1)
        raise_outside(raise_, sys._getframe())  # as the handler would, given this frame

sys.unraisablehook = dropped.append
gc.callbacks.append(callback)
try:
    gc.collect()
    for _ in range(1000):  # calls after the collection: the raise must have come before
        len([])
    print("not raised")
except Stopped:
    print("raised", len(asked), len(dropped))
"""


def test_a_raise_asked_inside_a_gc_callback_comes_right_after_it():
    """A signal handler (SIGTERM's, SIGINT's) that runs inside a garbage collector's callback
    (distributed registers one): raised there, Python prints "Exception ignored" and drops it;
    raise_outside raises it at the first call or return outside the callback. (In a process of
    its own: the test process's other gc callbacks and profile hooks are not the point.)"""
    out = subprocess.run([sys.executable, "-c", _IN_GC], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised 1 0", (out.stdout, out.stderr)


def test_elsewhere_the_raise_is_at_once():
    with pytest.raises(_Stopped):
        raise_outside(_raise, sys._getframe())
    assert sys.getprofile() is None
