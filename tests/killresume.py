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
   (``lost == duplicated == 0``). :meth:`KillResume.audit` checks each committed step's rows,
   in order, against what ``daskfeed rows`` recomputes from the run's order.
5. Several trainers: ``start(args, world=W)`` runs ``W`` ranks (``--rank r --world-size W``,
   ``args`` naming a shared scheduler), each its own process group and screen; rank 0's
   checkpoints are the run's. Ranks step together in a real data-parallel job, so a kill lets
   them: rank 0 is stopped (SIGSTOP) once the kill is due, the other ranks train on up to its
   checkpoint, then every rank is killed. :meth:`KillResume.by_epoch` counts rows per epoch as
   each step logged it (Keras' epoch number), whatever the number of trainers of each part.

Ids: a row's id is ``sum(column_k * scale_k)`` over the id columns (several columns when one id
would not be exact in the float32 matrix: above 2**24).
"""

from __future__ import annotations

import contextlib
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
EPOCH = [-1]  # the epoch being fitted (Keras' number: a resumed fit keeps it)


class EpochMark(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        EPOCH[0] = epoch


FD = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # (one write a step: kept at a kill)


def record(iteration, cols):  # one record per batch, before its update is applied
    ids = (np.rint(cols.numpy()).astype(np.int64) * SCALES).sum(axis=1)
    head = np.array([int(iteration.numpy()), os.getpid(), EPOCH[0], len(ids)], dtype=np.int64)
    os.write(FD, head.tobytes() + ids.tobytes())
    time.sleep({delay})  # a throttled model (the kill lands mid-epoch on any machine)
    return 0


class Recording(keras.Model):
    def fit(self, *args, callbacks=None, **kwargs):  # the epoch of each step, as Keras numbers it
        return super().fit(*args, callbacks=[*(callbacks or []), EpochMark()], **kwargs)

    def train_step(self, data):
        token = tf.py_function(record, [self.optimizer.iterations, data[0][:, :IDS]], tf.int32)
        with tf.control_dependencies([token]):
            return super().train_step(data)


def build(manifest):
    base = daskfeed.default_model(manifest, features={features!r}, as_matrix=True, hidden=(8,))
    m = Recording(base.inputs, base.outputs)
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
              steps_per_execution={steps_per_execution})
    return m
"""


@dataclass
class Step:
    """One recorded training step."""

    iteration: int
    pid: int
    epoch: int
    ids: np.ndarray


def read_log(path: str | Path) -> list[Step]:
    """The steps a recording model logged (a record cut short by a kill is left out)."""
    if not os.path.exists(path):
        return []
    raw = np.fromfile(path, dtype=np.int64)
    steps, at = [], 0
    while at + 4 <= len(raw):
        it, pid, epoch, n = (int(v) for v in raw[at:at + 4])
        if at + 4 + n > len(raw):
            break
        steps.append(Step(it, pid, epoch, raw[at + 4:at + 4 + n]))
        at += 4 + n
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
    steps_per_execution
        Keras' steps per call of its compiled train function (its callbacks see groups).
    """

    def __init__(self, workdir: Path, args: list[str], *, features: list[str],
                 ids: dict[str, int], delay: float = 0.0, steps_per_execution: int = 1) -> None:
        assert list(features[:len(ids)]) == list(ids), "the id columns come first"
        self.ids = dict(ids)
        self.workdir = Path(workdir)
        self.log = self.workdir / "steps.bin"
        self.output = self.workdir / "out"
        rec = self.workdir / "rec.py"
        rec.write_text(textwrap.dedent(RECORDER.format(
            log=str(self.log), ids=len(ids), scales=list(ids.values()), delay=delay,
            features=list(features), steps_per_execution=int(steps_per_execution))))
        self.args = [*args, "--model", f"{rec}:build", "--features", ",".join(features),
                     "--as-matrix", "--output", str(self.output)]
        self.proc: subprocess.Popen | None = None  # the running trainer (rank 0)
        self.procs: list[subprocess.Popen] = []  # every rank of the running job
        self.checkpoint = None  # the one the resume continues from
        self.cuts: list[int] = []  # per kill: the optimizer iteration the next run resumes at
        self.pids: list[int] = []  # per run: its trainer's (rank 0's) process id
        self.rank_pids: list[list[int]] = []  # per run: every rank's process id
        self.worlds: list[int] = []  # per run: its number of trainers
        self.runs: list[Path] = []
        self.resumed_peak = 0  # peak RSS of the resumed run's process tree
        self.started = 0.0  # when the running trainer started (time.time())

    @staticmethod
    def command() -> list[str]:
        """The ``daskfeed`` executable beside this Python."""
        return [shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"]

    def start(self, args: list[str] | None = None, world: int = 1) -> subprocess.Popen:
        """Start the run (``args``: another layout of it; ``world``: its number of trainers,
        ranks of a scheduler ``args`` name); its screen text goes to a file (one per rank).
        Returns rank 0's process."""
        n = len(self.runs) + 1
        screens = [self.workdir / (f"run{n}.txt" if world == 1 else f"run{n}-r{r}.txt")
                   for r in range(world)]
        self.runs.append(screens[0])
        self.started = time.time()  # (a checkpoint of this run: a directory made after it)
        self.procs = []
        for r, screen in enumerate(screens):
            ranks = ["--rank", str(r), "--world-size", str(world)] if world > 1 else []
            with open(screen, "w") as f:  # a file, not a pipe nobody reads while it runs
                self.procs.append(subprocess.Popen([*self.command(), *(args or self.args), *ranks],
                                                   stdout=f, stderr=subprocess.STDOUT, text=True,
                                                   env=ENV, start_new_session=True))
        self.proc = self.procs[0]
        self.pids.append(self.proc.pid)
        self.rank_pids.append([p.pid for p in self.procs])
        self.worlds.append(world)
        return self.proc

    def text(self, run: int = -1) -> str:
        """What run ``run`` printed (rank 0's screen)."""
        return self.runs[run].read_text()

    def screens(self, run: int = -1) -> str:
        """The ends of what every rank of run ``run`` printed."""
        first = self.runs[run]
        paths = sorted(first.parent.glob(first.stem.rsplit("-r", 1)[0] + "-r*.txt")) or [first]
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in paths)

    def steps(self) -> list[Step]:
        """Every step logged so far."""
        return read_log(self.log)

    def kill_at(self, epoch: int, batch: int, more: int = 7, timeout: float = 600):
        """SIGKILL the whole run once epoch ``epoch`` (0-based) has a checkpoint at ``batch`` or
        later and ``more`` steps were trained after it; return that checkpoint.

        The number of steps per epoch is read from the checkpoint (``num_batches``)."""
        def near() -> bool:
            ckpt = self.newest()
            return ckpt is not None and ckpt.cursor.epoch == epoch and ckpt.cursor.batch >= batch

        def ready() -> bool:
            ckpt = self.newest()
            if ckpt is None or ckpt.cursor.epoch != epoch or ckpt.cursor.batch < batch:
                return False
            return len(self.steps()) >= ckpt.iterations + more

        store = self.store()

        self.kill_when(ready, lambda: f"a checkpoint of epoch {epoch} at batch {batch}+ and "
                       f"{more} more steps (checkpoints {store.names()}, {len(self.steps())} "
                       "steps)", timeout, near=near)
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

    def kill_when(self, ready, describe, timeout: float = 600, near=None):
        """SIGKILL the whole running job once ``ready()`` is true (polled; ``describe()`` says
        what was awaited if it never is); return the checkpoint the next run resumes from.

        ``ready()`` is checked with rank 0 stopped (SIGSTOP; SIGCONT when not ready), once the
        cheaper ``near()`` holds (default: ``ready``): the job is killed in the state checked,
        and the trainer cannot run past it while a check reads the whole step log."""
        import psutil

        procs = list(self.procs)
        assert procs

        def running() -> None:  # (a rank but 0 may be done: its last steps are not kept)
            assert procs[0].poll() is None and all(p.poll() in (None, 0) for p in procs[1:]), \
                self.screens()

        def alive_and_ready() -> bool:
            running()
            return ready()

        def stopped_and_ready() -> bool:
            """Near, then ready with rank 0 stopped (SIGSTOP): the job is killed in the state
            that was checked, not after the checkpoints written while it was read (a check
            reads the whole step log: on a busy machine the trainer ran on past the epoch)."""
            running()
            if not (near or ready)():
                return False
            os.kill(procs[0].pid, signal.SIGSTOP)
            if alive_and_ready():
                return True
            os.kill(procs[0].pid, signal.SIGCONT)
            return False

        tree = []
        try:
            wait_for(stopped_and_ready, timeout, describe, interval=0.05)
            if len(procs) > 1:
                self._others_reach_rank_0(procs, timeout)
            running = [p for p in procs if p.poll() is None]  # (a rank but 0 may be done)
            for p in running:
                tree += [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
            for p in running:  # the whole job dies: trainers and their workers
                with contextlib.suppress(ProcessLookupError):  # (a rank that ended just now)
                    os.killpg(p.pid, signal.SIGKILL)
            for p in running:
                p.wait(30)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(tree, timeout=30)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running 30 s after SIGKILL: {alive}"
        self.checkpoint = self.store().latest()
        self.cuts.append(self.checkpoint.iterations if self.checkpoint else 0)
        return self.checkpoint

    def _others_reach_rank_0(self, procs: list[subprocess.Popen], timeout: float) -> None:
        """Stop rank 0 (SIGSTOP) and wait until every other rank trained up to its checkpoint
        (or ended): ranks that step together are all there when a job is killed."""
        os.kill(procs[0].pid, signal.SIGSTOP)
        ckpt = self.newest()  # (rank 0 stands: no checkpoint is half written)
        start = self.cuts[-1] if self.cuts else 0
        need = (ckpt.iterations if ckpt is not None else start) - start

        def caught_up() -> bool:
            counts = {p.pid: 0 for p in procs[1:]}
            for s in self.steps():
                if s.pid in counts:
                    counts[s.pid] += 1
            for p in procs[1:]:
                assert p.poll() in (None, 0), self.screens()
            return all(p.poll() == 0 or counts[p.pid] >= need for p in procs[1:])

        wait_for(caught_up, timeout, lambda: f"every rank at rank 0's checkpoint ({need} steps "
                 f"of this run)", interval=0.05)

    def resume(self, args: list[str] | None = None, timeout: float = 600,
               world: int = 1) -> str:
        """Run again with ``--resume`` (``args``: another layout); its screen text (exit 0).

        The peak RSS of its process tree (sampled every 0.1 s; rank 0's with several) is kept
        in ``resumed_peak``."""
        import psutil

        from daskfeed.core._rss import RSSSampler

        proc = self.start([*(args or self.args), "--resume"], world=world)
        with RSSSampler(interval=0.1, process=psutil.Process(proc.pid)) as rss:
            for p in self.procs:
                p.wait(timeout)
        self.resumed_peak = rss.overall_peak
        assert all(p.returncode == 0 for p in self.procs), self.screens()
        return self.text()

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
        assert len(self.pids) == len(self.cuts) + 1, (self.pids, self.cuts)  # (no kill: every step)
        by_pid: dict[int, list[Step]] = {}
        for s in self.steps():
            by_pid.setdefault(s.pid, []).append(s)
        assert set(by_pid) <= {p for pids in self.rank_pids for p in pids}, \
            "steps of a run the harness did not start"
        out: list[Step] = []
        starts = [0, *self.cuts]
        for k, pids in enumerate(self.rank_pids):
            end = self.cuts[k] if k < len(self.cuts) else None
            for pid in pids:  # (every rank resumes from rank 0's checkpoint, at its iteration)
                steps = by_pid.get(pid, [])
                # a run starts at the checkpoint it resumed from (a kill may come before its first step)
                assert [s.iteration for s in steps[:1]] in ([], [starts[k]]), (k, starts[k], steps[:1])
                assert [s.iteration for s in steps] == list(range(starts[k], starts[k] + len(steps)))
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

    def audit(self) -> int:
        """Check every committed step against ``daskfeed.batch_rows``: the rows it recomputes for
        the step's epoch and its trainer's step (counted across the jobs that trained the epoch),
        each named by file and line, are the rows the step logged, in order — the ids read from
        the data files themselves at those lines. Returns the steps checked."""
        import daskfeed

        truth = self._ids_by_line()
        rank_of = {pid: r for pids in self.rank_pids for r, pid in enumerate(pids)}
        mine: dict[tuple[int, int], list[Step]] = {}
        for s in self.committed():
            mine.setdefault((s.epoch, rank_of[s.pid]), []).append(s)
        for (epoch, rank), steps in sorted(mine.items()):
            frame = daskfeed.batch_rows(self.output, epoch=epoch + 1, step=range(1, len(steps) + 1),
                                        rank=rank)
            by_step = frame.groupby("step", sort=True)
            assert len(by_step) == len(steps), (epoch, rank, len(by_step), len(steps))
            for (k, rows), s in zip(by_step, steps, strict=True):
                ids = [truth[(f, int(line))] for f, line in zip(rows["file"], rows["line"], strict=True)]
                assert ids == s.ids.tolist(), (epoch, rank, k)
        return sum(len(v) for v in mine.values())

    def _ids_by_line(self) -> dict[tuple[str, int], int]:
        """``(file, line) -> row id`` of every record of the training data, read with ``csv``."""
        import csv
        import glob

        scales = list(self.ids.values())
        out = {}
        for path in glob.glob(self.args[1], recursive=True):
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                header = next(reader)
                cols = [header.index(c) for c in self.ids]
                line = reader.line_num + 1  # where the next record starts
                for row in reader:
                    if row:
                        out[(path, line)] = sum(int(float(row[c])) * k
                                                for c, k in zip(cols, scales, strict=True))
                    line = reader.line_num + 1
        return out

    def by_epoch(self, rows: int, epochs: int) -> list[tuple[int, int, int]]:
        """``(lost, duplicated, trainers)`` of each epoch among the committed steps, each step
        counted in the epoch it logged; ``trainers``: the number of the job that trained the
        epoch's last committed step (whose ranks left out its tail, if any)."""
        steps = self.committed()
        world_of = {pid: self.worlds[k] for k, pids in enumerate(self.rank_pids) for pid in pids}
        out = []
        for e in range(epochs):
            mine = [s for s in steps if s.epoch == e]
            seen = np.zeros(rows, dtype=np.int32)
            for s in mine:
                np.add.at(seen, s.ids, 1)
            last = max(mine, key=lambda s: s.iteration) if mine else None
            out.append((int((seen == 0).sum()), int(np.maximum(seen - 1, 0).sum()),
                        world_of[last.pid] if last is not None else 0))
        assert not [s for s in steps if not 0 <= s.epoch < epochs], "a step of no epoch"
        return out
