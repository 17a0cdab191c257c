"""The Keras backend daskfeed runs on, chosen from the environment before keras is imported.

TensorFlow by default, JAX or PyTorch; others refused. Under JAX, 64-bit types are on unless
``JAX_ENABLE_X64`` says otherwise: daskfeed's batches carry int64 / float64 columns exactly
(values beyond float32's 2**24), which JAX would narrow to 32 bits. PyTorch keeps them as they
are (``torch.int64`` / ``torch.float64``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Iterator

from daskfeed.core._exceptions import BackendError, refuse_setting, warn_user

#: The Keras backends daskfeed is tested on (tests/core/test_backend.py).
BACKENDS = ("tensorflow", "jax", "torch")
#: How batches reach Keras, the *hand-off* (``--handoff`` / ``daskfeed.handoff``): ``tf-data`` (a
#: tf.data pipeline fed a chunk of batches per call, TensorFlow only), ``dataloader`` (a torch
#: ``DataLoader`` of runs of batches, PyTorch only), ``pydataset`` (the ``PyDataset``, one call
#: per batch) or ``auto`` (``tf-data`` on TensorFlow, ``dataloader`` on PyTorch, else ``pydataset``).
HANDOFFS = ("auto", "tf-data", "dataloader", "pydataset")
#: The hand-offs' names before (``--feed windows|batches``), still understood.
_OLD_HANDOFFS = {"windows": "tf-data", "batches": "pydataset"}
#: The package each backend but TensorFlow needs, and the extra that installs it.
_EXTRAS = {"jax": "jax", "torch": "torch"}
_HINT = ("Hint: KERAS_BACKEND=tensorflow (the default), KERAS_BACKEND=jax or KERAS_BACKEND=torch; "
         "daskfeed is not tested on the numpy or openvino backends, so it refuses them.")


def handoff_name(value: str, what: str = "handoff") -> str:
    """``value`` as one of :data:`HANDOFFS`; an old name (``windows``, ``batches``) with a warning.

    Parameters
    ----------
    value
        The hand-off asked for.
    what
        How it was asked for, named in the warning and the error (``--feed``, ``handoff``).

    Returns
    -------
    str
        ``auto``, ``tf-data``, ``dataloader`` or ``pydataset``.

    Raises
    ------
    SettingError
        Another name.
    """
    if value in _OLD_HANDOFFS:
        new = _OLD_HANDOFFS[value]
        warn_user(f"{what}={value!r} is the old name of the hand-off {new!r}; it works, but "
                  f"will go.\nHint: --handoff {new} (handoff={new!r}, daskfeed.handoff).",
                  FutureWarning)
        return new
    if value not in HANDOFFS:
        refuse_setting(f"Expected the hand-off to be one of {', '.join(HANDOFFS)}.",
                       f"{what}={value!r}", "auto (the default) picks the fastest for the Keras "
                       "backend (--handoff auto).")
    return value


def refuse(backend: str) -> None:
    """Refuse a backend daskfeed does not run on.

    Parameters
    ----------
    backend
        The backend's name.

    Raises
    ------
    BackendError
        ``backend`` is not one of :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise BackendError(f"Expected the Keras backend tensorflow, jax or torch. Received: "
                           f"KERAS_BACKEND={backend!r}.\n{_HINT}")


def choose() -> str:
    """Set ``KERAS_BACKEND`` (and its defaults) for the keras import to come; refuse others.

    Returns
    -------
    str
        The backend.

    Raises
    ------
    BackendError
        ``KERAS_BACKEND`` names a backend daskfeed does not run on, or one not installed
        (naming the extra that installs it).
    """
    backend = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    refuse(backend)
    if backend in _EXTRAS and importlib.util.find_spec(backend) is None:
        raise BackendError(f"Expected {backend} installed for KERAS_BACKEND={backend}. Received: "
                           f"no module named {backend!r} in {sys.executable}.\nHint: pip install "
                           f"'daskfeed[{_EXTRAS[backend]}]', or unset KERAS_BACKEND (TensorFlow).")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend == "jax":
        os.environ.setdefault("JAX_ENABLE_X64", "1")
    return backend


# what TensorFlow's native libraries print while they load, before absl's logging is set up, so
# TF_CPP_MIN_LOG_LEVEL does not reach it: the preamble and INFO lines (I<mmdd> <time> <thread> <file>])
_PREAMBLE = re.compile(rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are "
                       rb"written to STDERR|I\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] .*)\r?\n?$")


@contextlib.contextmanager
def native_logs_filtered() -> Iterator[None]:
    """Drop the INFO lines TensorFlow's native code prints to stderr while it loads.

    ``TF_CPP_MIN_LOG_LEVEL`` (daskfeed sets 2 unless it is set) hides TensorFlow's INFO and
    WARNING logs, but not those its libraries print before absl's logging starts (``oneDNN
    custom operations are on ...``, twice per process). Around the import, the process's
    stderr (file descriptor 2) passes through a pipe that drops those lines and forwards every
    other byte; with ``TF_CPP_MIN_LOG_LEVEL=0`` nothing is dropped.

    The context ends once what this process wrote is forwarded (a line of its own marks the
    end), not when the pipe closes: a process started meanwhile (by another thread) holds the
    pipe as its stderr for as long as it lives, and its lines go on being forwarded.
    """
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") in ("", "0"):
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all
        yield
        return
    read, write = os.pipe()
    os.dup2(write, 2)
    end = b"\0daskfeed-stderr-filter-end-" + os.urandom(8).hex().encode() + b"\n"
    ended = threading.Event()

    def forward() -> None:
        try:
            with os.fdopen(read, "rb") as lines:
                for line in lines:
                    if line.endswith(end):  # this process's writes are all forwarded
                        line = line[: -len(end)]
                        ended.set()
                    if line and not _PREAMBLE.match(line):
                        with contextlib.suppress(OSError):  # (a stderr closed: nothing to say)
                            os.write(saved, line)
        finally:  # every writer closed the pipe
            ended.set()
            os.close(saved)

    pump = threading.Thread(target=forward, daemon=True, name="daskfeed-stderr-filter")
    pump.start()
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.write(write, end)  # after every byte written to the pipe by this process
        os.close(write)
        ended.wait()
