"""The few error classes daskfeed raises, and :func:`warn_user` for what it warns of.

Each error class is also a builtin, so callers can catch either; a warning points at the
user's line.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType
from typing import NoReturn

from daskfeed.core._secrets import redact_text


class DaskfeedError(Exception):
    """Base class: a user-facing error whose message says what, where, and a hint."""


class BackendError(DaskfeedError, ImportError):
    """A Keras backend daskfeed does not run on (it runs on TensorFlow, JAX, PyTorch), or not installed."""


class DataNotFoundError(DaskfeedError, FileNotFoundError):
    """A path, glob or URL that matches no readable file."""


class SchemaError(DaskfeedError, ValueError):
    """Columns or dtypes that do not fit what was asked (label, features, drift)."""


class SettingError(DaskfeedError, ValueError):
    """A setting daskfeed cannot work with.

    An argument, flag or config value of the wrong kind or range, settings that exclude each
    other, or an object used where it cannot work (a sequence in a forked process).
    """


class DataError(DaskfeedError, ValueError):
    """A block that cannot be parsed; the message names file and byte range."""


class BudgetError(DaskfeedError, ValueError):
    """A memory budget that is malformed or too small to work."""


class CacheError(DaskfeedError, OSError):
    """A parse-cache directory that cannot be used (not writable, not enough free space)."""


class ManifestMismatchError(DaskfeedError, ValueError):
    """A manifest (or checkpoint) made for other data or other read options.

    ``change`` says what differs as information (``"label is now 'y' (the manifest was made with
    'x')"``), for a caller to whom a new scan is routine (a retrain after the data changed);
    "" where it has nothing more to say than the message.
    """

    def __init__(self, message: str, change: str = "") -> None:
        super().__init__(message)
        self.change = change


class CheckpointError(DaskfeedError, ValueError):
    """A checkpoint that cannot be resumed: other data, batch size or seed; or unreadable."""


class ClusterError(DaskfeedError, ConnectionError):
    """The Dask scheduler cannot be reached, refused the connection, or was lost."""


class FeedTimeoutError(DaskfeedError, TimeoutError):
    """Work on the cluster sent nothing in time: a scan task, a window of batches, a block to score.

    Raised by the watchdog (``--timeout``), naming what it waited for.
    """


def refuse_setting(expected: str, received: str, hint: str) -> NoReturn:
    """Raise the :class:`SettingError` of a bad setting, in daskfeed's three parts.

    Parameters
    ----------
    expected
        What was expected (a sentence).
    received
        What was received (without the trailing full stop).
    hint
        What to do instead.

    Raises
    ------
    SettingError
        The expected, received and hint parts, the hint on a line of its own.
    """
    raise SettingError(f"{expected} Received: {received}.\nHint: {hint}")


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn, pointing at the first caller outside daskfeed (the user's line, not ours).

    Parameters
    ----------
    message
        What to say (what was found, and a hint); a URL in it is shown without credentials.
    category
        The warning's class.
    """
    frame: FrameType | None = sys._getframe(1)  # warn_user's caller: stacklevel 2
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "daskfeed":
        frame, level = frame.f_back, level + 1
    warnings.warn(redact_text(message), category, stacklevel=level)


def _one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
              line: str | None = None) -> str:
    text = redact_text(" ".join(str(message).split()))
    kind = "" if issubclass(category, UserWarning) else f"{category.__name__}: "
    return f"warning: {kind}{text}\n"


_python_format = None


def one_line_warnings(enable: bool = True) -> None:
    """Print warnings as ``warning: <message>``, one line, no source line; or undo that.

    The CLI turns this on (``daskfeed.warnings: line``); a process that imports daskfeed with
    that setting (a local cluster's worker processes inherit it) does the same.

    Parameters
    ----------
    enable
        True: one line per warning; False: Python's format again.
    """
    global _python_format
    if enable:
        if warnings.formatwarning is not _one_line:
            _python_format = warnings.formatwarning
            warnings.formatwarning = _one_line
    elif warnings.formatwarning is _one_line and _python_format is not None:
        warnings.formatwarning = _python_format
