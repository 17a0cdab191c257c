"""``history.png`` drawn in a process of its own while the trainer writes the run's other outputs.

After ``fit`` the trainer saves the model, the manifest and ``serving/`` (Keras' export: a
trace of the model on the trainer's interpreter), then ``history.json``; the chart needs only
the epochs' records. Drawn in the trainer it came after all of them: matplotlib's import and
the draw, 0.45–0.8 s on two cores, most of the run's close. A :class:`ChartProcess` starts as
training ends and draws on the core the trainer leaves idle meanwhile; :meth:`ChartProcess.finish`
waits for it once ``history.json`` is written and puts the chart in place (it is drawn to a
name of its own first: a run that fails before then leaves no chart of its epochs).

The process finds modules where the trainer does (its ``sys.path``, as ``PYTHONPATH``); where
no process can be started (no interpreter at ``sys.executable``), the chart is drawn in the
trainer as before. A chart that cannot be drawn (matplotlib that does not import, a draw that
raises, a process that dies) is a :class:`ChartError` naming why; the caller warns and the
run's records stand (:func:`daskfeed.training._outputs.write_history`).

Run as ``python -m daskfeed.training._chart PATH`` with the records as JSON on stdin: it draws
them to ``PATH`` and exits 0, or prints ``Type: message`` and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

from daskfeed.training._summary import history_plot

FINISH_SECONDS = 300.0  # the longest finish() waits for a draw (a stuck process is then killed)


class ChartError(Exception):
    """The chart was not drawn; ``str()`` is ``"Type: message"`` of the cause."""


class ChartProcess:
    """``history.png`` of ``history`` (the epochs' records) being drawn to ``path`` aside.

    Parameters
    ----------
    history
        The epochs' records as the run keeps them (plain numbers: they are sent as JSON).
    path
        Where the chart goes once :meth:`finish` succeeds.
    """

    def __init__(self, history: list[dict[str, Any]], path: str) -> None:
        self.path, self.history = path, history
        self._drawn = f"{path}.{os.getpid()}.drawing.png"  # (renamed into place by finish())
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            records = json.dumps(history).encode()
        except (ValueError, TypeError):  # (not plain numbers: drawn here, from the objects)
            return
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "daskfeed.training._chart", self._drawn],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        except OSError:  # no interpreter to start: drawn here by finish()
            return
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(records)
            self._proc.stdin.close()
        except OSError:  # (it died at once: finish() says why)
            pass
        self._proc.stdin = None  # (sent and closed: communicate() only reads)

    def finish(self, timeout: float = FINISH_SECONDS) -> str:
        """Wait for the draw and put the chart at ``path``.

        Returns
        -------
        str
            ``path``.

        Raises
        ------
        ChartError
            Not drawn (why, as ``Type: message``); nothing is left at ``path`` by this run.
        """
        if self._proc is None:
            try:
                return history_plot(self.history, self.path)
            except Exception as err:
                raise ChartError(f"{type(err).__name__}: {err}") from err
        try:
            out, _ = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise ChartError(f"TimeoutError: the chart was not drawn in {timeout:.0f} s") from None
        if self._proc.returncode != 0:
            lines = out.decode(errors="replace").strip().splitlines()
            self.close()
            raise ChartError(lines[-1] if lines else
                             f"the chart's process exited with code {self._proc.returncode}")
        os.replace(self._drawn, self.path)
        return self.path

    def close(self) -> None:
        """Stop the draw if it still runs and remove what it drew (the run did not finish it)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._drawn)


def main() -> int:
    """Draw the records on stdin to ``sys.argv[1]``: 0, or 1 with ``Type: message`` printed."""
    try:
        history_plot(json.loads(sys.stdin.buffer.read()), sys.argv[1])
    except Exception as err:  # said to the trainer, which warns (the run's records stand)
        print(f"{type(err).__name__}: {err}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
