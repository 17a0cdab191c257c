"""A worker's close, quiet: no traceback for the heartbeat that its own close cut off.

``Worker.close`` (distributed's ``worker.py``) stops the heartbeat's periodic callback,
then closes the worker's connections (``rpc.close``). A heartbeat sent just before, whose answer
has not come yet, fails there with ``CommClosedError``, and ``Worker.heartbeat`` logs that as an
error with its traceback ("Failed to communicate with scheduler during heartbeat."). Closing the
workers before the scheduler does not help: a LocalCluster already does (``SpecCluster._close``
retires and closes them first), and the connection is cut on the worker's side. The window is
as long as the scheduler takes to answer, which on a busy machine (the scheduler shares the
trainer's process and cores, and workers heartbeat every 0.5 s) is long enough for a healthy
script's exit to print such a traceback.

Nothing is lost there (the worker is going away), so :class:`ClosingHeartbeat` drops exactly
that record: the heartbeat's failure is a closed connection and the worker that sent it was
already closing. A heartbeat that fails while its worker runs is still logged, traceback and all.

The same close cancels the tasks the worker is still running (a window a sequence fetched ahead,
released when it closed: a thread cannot be stopped, so it runs on), and distributed warns of
each ("Async instruction for <Task ... execute(...)> ended with CancelledError", which it says
happens only in ``Worker.close``): a healthy script's exit printed one per window in flight.
:class:`CancelledAtClose` drops exactly that record.

:class:`QuietClose` installs both in every worker of a cluster daskfeed is handed.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING

from distributed.diagnostics.plugin import WorkerPlugin

if TYPE_CHECKING:
    from distributed import Worker

#: the start of what distributed logs when a worker's heartbeat fails to reach the scheduler
HEARTBEAT_CUT = "Failed to communicate with scheduler during heartbeat"
_CLOSING = frozenset({"closing", "closed"})  # distributed's Status names once close began


class ClosingHeartbeat(logging.Filter):
    """Drop the traceback of a heartbeat cut off by its own worker's close; keep every other."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged (False only for a heartbeat cut off by its worker's close).

        Parameters
        ----------
        record
            A record of the ``distributed.worker`` logger.

        Returns
        -------
        bool
            False for a heartbeat's closed connection whose worker was closing, else True.
        """
        if not record.exc_info or not str(record.msg).startswith(HEARTBEAT_CUT):
            return True
        _, err, tb = record.exc_info
        if not isinstance(err, OSError):  # CommClosedError is one; anything else is a real error
            return True
        worker = _heartbeat_of(tb)
        return worker is None or getattr(worker.status, "name", None) not in _CLOSING


def _heartbeat_of(tb: TracebackType | None) -> Worker | None:
    """The worker whose ``heartbeat`` coroutine is in traceback ``tb`` (None if none is)."""
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "heartbeat" and hasattr(frame.f_locals.get("self"), "status"):
            worker: Worker = frame.f_locals["self"]
            return worker
        tb = tb.tb_next
    return None


#: how distributed's worker state machine says a task's run was cancelled (only by Worker.close)
TASK_CUT = ("Async instruction for ", " ended with CancelledError")


class CancelledAtClose(logging.Filter):
    """Drop the warning of a task its worker's close cancelled; keep every other record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged (False only for a task cancelled by its worker's close).

        Parameters
        ----------
        record
            A record of the ``distributed.worker.state_machine`` logger.

        Returns
        -------
        bool
            False for "Async instruction for ... ended with CancelledError", else True.
        """
        text = record.getMessage()
        return not (text.startswith(TASK_CUT[0]) and text.endswith(TASK_CUT[1]))


def install() -> None:
    """Add :class:`ClosingHeartbeat` and :class:`CancelledAtClose` to distributed's worker loggers.

    Once per process.
    """
    for name, kind in (("distributed.worker", ClosingHeartbeat),
                       ("distributed.worker.state_machine", CancelledAtClose)):
        log = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in log.filters):
            log.addFilter(kind())


class QuietClose(WorkerPlugin):
    """Installs the filters of a quiet close in each worker's process (those that join later too)."""

    idempotent = True  # registered again (another sequence on the same cluster): nothing to do
    name = "daskfeed-quiet-close"

    def setup(self, worker: Worker) -> None:
        """Install the filter in the process of ``worker``.

        Parameters
        ----------
        worker
            The worker being set up.
        """
        install()
