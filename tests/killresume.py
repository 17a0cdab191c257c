"""One real-process kill/resume harness: ``daskfeed train`` killed at a checkpoint, resumed, counted.

Every test of resume that kills a real run uses it (``from killresume import KillResume``;
tests/ is on ``sys.path`` as for ``helpers``):

1. :meth:`KillResume.start` runs ``daskfeed train ARGS --model REC:build`` as its own process
   group. ``REC`` is a model builder written by the harness: the default model (``hidden=(8,)``)
   whose every training step first appends the batch's optimizer iteration, the process id and
   the rows' ids (from the first id columns of the ``--as-matrix`` input) to a binary log.
2. :meth:`KillResume.kill_at` waits (on the checkpoints and the log, never on the clock) for a
   checkpoint of epoch ``E`` at batch ``B`` or later and ``more`` batches past it, then SIGKILLs
   the whole group (trainer, cluster, workers) and checks that none of it lives on.
   :meth:`KillResume.kill_when` kills at any other event (a line on the screen: mid-scan, at
   start-up; a new checkpoint and some steps past it).
3. :meth:`KillResume.resume` runs the same command (or another layout of it) with ``--resume``
   and waits for it to finish; :meth:`KillResume.start` with ``--resume`` in ``args`` starts a
   resume to kill again. Kills and resumes may follow each other any number of times.
4. :meth:`KillResume.epochs` counts, per epoch, how often each row was trained by the committed
   steps: each killed run's from the checkpoint it resumed from to the checkpoint the next run
   resumed from, every step of the last run. An exact resume gives each row once per epoch
   (``lost == duplicated == 0``).

Ids: a row's id is ``sum(column_k * scale_k)`` over the id columns (several columns when one id
would not be exact in the float32 matrix: above 2**24).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from helpers import wait_for

ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}

RECORDER = """
import os, time
import numpy as np
import tensorflow as tf
import daskfeed
from daskfeed.adapters._keras import keras

LOG = {log!r}
IDS = {ids}
SCALES = np.array({scales!r}, dtype=np.int64)


def record(iteration, cols):  # one record per batch, before its update is applied
    ids = (np.rint(cols.numpy()).astype(np.int64) * SCALES).sum(axis=1)
    head = np.array([int(iteration.numpy()), os.getpid(), len(ids)], dtype=np.int64)
    with open(LOG, "ab") as f:
        f.write(head.tobytes() + ids.tobytes())
    time.sleep({delay})  # a throttled model (the kill lands mid-epoch on any machine)
    return 0


class Recording(keras.Model):
    def train_step(self, data):
        token = tf.py_function(record, [self.optimizer.iterations, data[0][:, :IDS]], tf.int32)
        with tf.control_dependencies([token]):
            return super().train_step(data)


def build(manifest):
    base = daskfeed.default_model(manifest, features={features!r}, as_matrix=True, hidden=(8,))
    m = Recording(base.inputs, base.outputs)
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
    return m
"""


@dataclass
class Step:
    """One recorded training step."""

    iteration: int
    pid: int
    ids: np.ndarray


def read_log(path: str | Path) -> list[Step]:
    """The steps a recording model logged (a record cut short by a kill is left out)."""
    if not os.path.exists(path):
        return []
    raw = np.fromfile(path, dtype=np.int64)
    steps, at = [], 0
    while at + 3 <= len(raw):
        it, pid, n = (int(v) for v in raw[at:at + 3])
        if at + 3 + n > len(raw):
            break
        steps.append(Step(it, pid, raw[at + 3:at + 3 + n]))
        at += 3 + n
    return steps


class KillResume:
    """A ``daskfeed train`` run to kill and resume (see the module docstring).

    Parameters
    ----------
    workdir
        Where the model builder, the log, the run's output and its screen text go.
    args
        ``daskfeed train`` arguments: data, ``--label``, ``--epochs``, ``--batch-size``,
        ``--checkpoint-every``... (the harness adds ``--model``, ``--features``,
        ``--as-matrix`` and ``--output``).
    features
        The model's features, the id columns first.
    ids
        The id columns (the first of ``features``) and the scale of each.
    delay
        Seconds each step sleeps.
    """

    def __init__(self, workdir: Path, args: list[str], *, features: list[str],
                 ids: dict[str, int], delay: float = 0.0) -> None:
        assert list(features[:len(ids)]) == list(ids), "the id columns come first"
        self.workdir = Path(workdir)
        self.log = self.workdir / "steps.bin"
        self.output = self.workdir / "out"
        rec = self.workdir / "rec.py"
        rec.write_text(textwrap.dedent(RECORDER.format(
            log=str(self.log), ids=len(ids), scales=list(ids.values()), delay=delay,
            features=list(features))))
        self.args = [*args, "--model", f"{rec}:build", "--features", ",".join(features),
                     "--as-matrix", "--output", str(self.output)]
        self.proc: subprocess.Popen | None = None
        self.checkpoint = None  # the one the resume continues from
        self.cuts: list[int] = []  # per kill: the optimizer iteration the next run resumes at
        self.pids: list[int] = []  # per run: its trainer's process id
        self.runs: list[Path] = []
        self.resumed_peak = 0  # peak RSS of the resumed run's process tree
        self.started = 0.0  # when the running trainer started (time.time())

    @staticmethod
    def command() -> list[str]:
        """The ``daskfeed`` executable beside this Python."""
        return [shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"]

    def start(self, args: list[str] | None = None) -> subprocess.Popen:
        """Start the run (``args``: another layout of it); its screen text goes to a file."""
        screen = self.workdir / f"run{len(self.runs) + 1}.txt"
        self.runs.append(screen)
        self.started = time.time()  # (a checkpoint of this run: a directory made after it)
        with open(screen, "w") as f:  # a file, not a pipe nobody reads while it runs
            self.proc = subprocess.Popen([*self.command(), *(args or self.args)], stdout=f,
                                         stderr=subprocess.STDOUT, text=True, env=ENV,
                                         start_new_session=True)
        self.pids.append(self.proc.pid)
        return self.proc

    def text(self, run: int = -1) -> str:
        """What run ``run`` printed."""
        return self.runs[run].read_text()

    def steps(self) -> list[Step]:
        """Every step logged so far."""
        return read_log(self.log)

    def kill_at(self, epoch: int, batch: int, more: int = 7, timeout: float = 600):
        """SIGKILL the whole run once epoch ``epoch`` (0-based) has a checkpoint at ``batch`` or
        later and ``more`` steps were trained after it; return that checkpoint.

        The number of steps per epoch is read from the checkpoint (``num_batches``)."""
        def ready() -> bool:
            ckpt = self.newest()
            if ckpt is None or ckpt.cursor.epoch != epoch or ckpt.cursor.batch < batch:
                return False
            return len(self.steps()) >= ckpt.iterations + more

        store = self.store()

        self.kill_when(ready, lambda: f"a checkpoint of epoch {epoch} at batch {batch}+ and "
                       f"{more} more steps (checkpoints {store.names()}, {len(self.steps())} "
                       "steps)", timeout)
        assert self.checkpoint is not None and self.checkpoint.cursor.epoch == epoch
        return self.checkpoint

    def store(self):
        """The run's checkpoint store."""
        from daskfeed.checkpoint._store import CheckpointStore

        return CheckpointStore(self.output / "checkpoints")

    def trained(self) -> int:
        """Steps the running trainer logged."""
        return sum(1 for s in self.steps() if s.pid == self.pids[-1])

    def newest(self):
        """The newest checkpoint the running trainer wrote, or None; read without a side
        effect (the store's ``latest`` renames an unreadable one) and tolerating one that the
        trainer is writing or removing as it is read."""
        from daskfeed.core import CheckpointError

        store = self.store()
        names = store.names()
        if not names:
            return None
        path = os.path.join(store.directory, names[-1])
        try:
            if os.path.getmtime(path) < self.started:  # an earlier run's, about to be removed
                return None
            return store.read(names[-1])
        except (CheckpointError, OSError):
            return None

    def past_a_new_checkpoint(self, steps: int = 0) -> bool:
        """Whether the running trainer wrote a checkpoint after the one it resumed from and has
        trained ``steps`` steps in all (checkpoints are written every few steps: the kill lands
        that many steps past one, at most)."""
        ckpt = self.newest()
        cut = self.cuts[-1] if self.cuts else 0
        return ckpt is not None and ckpt.iterations > cut and self.trained() >= steps

    def kill_when(self, ready, describe, timeout: float = 600):
        """SIGKILL the whole running job once ``ready()`` is true (polled; ``describe()`` says
        what was awaited if it never is); return the checkpoint the next run resumes from."""
        import psutil

        proc = self.proc
        assert proc is not None

        def alive_and_ready() -> bool:
            assert proc.poll() is None, self.text()[-3000:]
            return ready()

        try:
            wait_for(alive_and_ready, timeout, describe, interval=0.05)
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            os.killpg(proc.pid, signal.SIGKILL)  # the whole job dies: trainer and its workers
            proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(tree, timeout=30)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running 30 s after SIGKILL: {alive}"
        self.checkpoint = self.store().latest()
        self.cuts.append(self.checkpoint.iterations if self.checkpoint else 0)
        return self.checkpoint

    def resume(self, args: list[str] | None = None, timeout: float = 600) -> str:
        """Run again with ``--resume`` (``args``: another layout); its screen text (exit 0).

        The peak RSS of its process tree (sampled every 0.1 s) is kept in ``resumed_peak``."""
        import psutil

        from daskfeed.core._rss import RSSSampler

        proc = self.start([*(args or self.args), "--resume"])
        with RSSSampler(interval=0.1, process=psutil.Process(proc.pid)) as rss:
            proc.wait(timeout)
        self.resumed_peak = rss.overall_peak
        text = self.text()
        assert proc.returncode == 0, text[-3000:]
        return text

    def relayout(self, **flags: str) -> list[str]:
        """The run's arguments with some flags' values replaced (``memory_limit="2GB"``...)."""
        out = list(self.args)
        for name, value in flags.items():
            flag = "--" + name.replace("_", "-")
            out[out.index(flag) + 1] = value
        return out

    def committed(self) -> list[Step]:
        """The steps whose updates stand: each killed run's from the checkpoint it resumed from
        up to the checkpoint the next run resumed from, then every step of the last run."""
        assert self.cuts and len(self.pids) == len(self.cuts) + 1, (self.pids, self.cuts)
        by_pid: dict[int, list[Step]] = {}
        for s in self.steps():
            by_pid.setdefault(s.pid, []).append(s)
        assert set(by_pid) <= set(self.pids), "steps of a run the harness did not start"
        out: list[Step] = []
        starts = [0, *self.cuts]
        for k, pid in enumerate(self.pids):
            steps = by_pid.get(pid, [])
            # a run starts at the checkpoint it resumed from (a kill may come before its first step)
            assert [s.iteration for s in steps[:1]] in ([], [starts[k]]), (k, starts[k], steps[:1])
            end = self.cuts[k] if k < len(self.cuts) else None
            out += [s for s in steps if end is None or s.iteration < end]
        return out

    def epochs(self, rows: int, steps_per_epoch: int, epochs: int) -> list[tuple[int, int]]:
        """``(lost, duplicated)`` rows of each epoch among the committed steps (ids < ``rows``)."""
        steps = self.committed()
        assert [s.iteration for s in steps] == list(range(len(steps)))  # each step once, in order
        out = []
        for e in range(epochs):
            seen = np.zeros(rows, dtype=np.int32)
            for s in steps[e * steps_per_epoch:(e + 1) * steps_per_epoch]:
                np.add.at(seen, s.ids, 1)
            out.append((int((seen == 0).sum()), int(np.maximum(seen - 1, 0).sum())))
        return out
