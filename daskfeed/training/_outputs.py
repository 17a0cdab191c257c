"""What a training run writes and says besides the manifest.

model.keras (whole or not at all), history.json, history.png, rejects.csv; the scan progress
lines, the class weights and the validation split it reports.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import os
import secrets
import socket
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dask.utils import format_bytes

from daskfeed.core import DaskfeedError, SettingError, eta_seconds, fsync, replace, write_file
from daskfeed.manifest import Manifest
from daskfeed.training._chart import ChartError
from daskfeed.training._ranks import shard_report

if TYPE_CHECKING:
    from keras import Model

    from daskfeed.adapters import DaskSequence
    from daskfeed.training._chart import ChartProcess
    from daskfeed.training._run import Run

Echo = Callable[[str], None]


class OutputLock:
    """One run at a time in an output directory: ``flock`` on ``OUTPUT/.daskfeed-run.lock``.

    Held from before the checkpoints are looked at until the run ends (the kernel gives it back
    when its process dies, killed or not). It says who holds it: host, process, start. Readers
    (``predict``, the dashboard) take no lock; ranks each hold their own directory's.

    Raises
    ------
    SettingError
        Another run holds the directory.
    """

    NAME = ".daskfeed-run.lock"

    def __init__(self, out: str) -> None:
        import fcntl

        path = os.path.join(out, self.NAME)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(self.fd)
            raise SettingError(
                f"Expected an output directory no other run is writing. Received: {out} is "
                f"held by another daskfeed train ({holder}).\nHint: wait for that run to end, "
                "stop it, or give this one another --output.") from None
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n"
                  .encode(), 0)

    def release(self) -> None:
        """Give the directory back (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def save_model(net: Model, out: str) -> str:
    """Save ``net`` as ``out/model.keras`` whole or not at all: the last good model stands.

    Saved under a fresh temporary name beside it (Keras wants the ``.keras`` suffix), flushed,
    then renamed over it: a crash or a full disk during the save leaves the previous
    ``model.keras`` as it was, and no half-written file under its name.

    Parameters
    ----------
    net
        The Keras model.
    out
        The run's output directory.

    Returns
    -------
    str
        The model's path.
    """
    path = os.path.join(out, "model.keras")
    tmp = os.path.join(out, f"model.keras.tmp-{os.getpid()}-{secrets.token_hex(6)}.keras")
    try:
        net.save(tmp)
        fsync(tmp)
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return path


def scan_bar(echo: Echo) -> Callable[[int, int, int, float, bool], None]:
    """A scan progress line every 10 % of the bytes (and at the end): rows/s, bytes, ETA.

    The ETA once it means something (:func:`~daskfeed.core.eta_seconds`).

    Parameters
    ----------
    echo
        Where the lines go.

    Returns
    -------
    callable
        The ``progress`` callback of a scan: ``(rows, done, total, seconds, finished)``.
    """
    shown = [-1]

    def show(rows: int, done: int, total: int, seconds: float, finished: bool) -> None:
        step = int(10 * done / total) if total else 0
        if finished or not done or step <= shown[0] or seconds < 2:  # small scans: no lines
            return
        shown[0] = step
        left = eta_seconds(done, total, seconds)  # (None until it means something)
        eta = f", ETA {left:.0f}s" if left is not None else ""
        echo(f"scan: {100 * done / total:.0f}% of {format_bytes(total)}, {rows:,} rows, "
             f"{rows / seconds:,.0f} rows/s{eta}")

    return show


def require_tensorboard() -> None:
    """Refuse ``tensorboard=`` up front when the ``tensorboard`` package is missing.

    Raises
    ------
    DaskfeedError
        When it is not installed, with the extra to install.
    """
    if importlib.util.find_spec("tensorboard") is None:
        raise DaskfeedError(
            "Expected the tensorboard package for --tensorboard. Received: it is not installed "
            "(tensorflow-cpu does not bring it).\nHint: pip install 'daskfeed[tensorboard]', or "
            "leave out --tensorboard."
        )


def class_weights(manifest: Manifest, spec: str | dict[Any, float] | None,
                  echo: Echo) -> dict[int, float] | None:
    """The class weights of ``spec`` from the manifest's label counts, echoed.

    Parameters
    ----------
    manifest
        The training manifest (its label counts).
    spec
        ``"balanced"``, ``{class: weight}``, or None.
    echo
        Where the weights are said.

    Returns
    -------
    dict or None
        ``{class id: weight}`` as ``fit(class_weight=)`` takes it; None: no class weights.
    """
    if spec is None:
        return None
    weights = manifest.class_weights(spec)
    counts = ", ".join(f"{k}: {int(n):,}" for k, n in manifest.label_counts.items())
    names = manifest.classes  # a text label: its class names, not their codes
    shown = ", ".join(f"{names[k] if names else k}: {w:.4g}" for k, w in weights.items())
    how = "balanced, from the label counts" if spec == "balanced" else "given; label counts"
    echo(f"class weights ({how} {counts}): {shown}")
    return weights


def split_report(train_seq: DaskSequence, val_seq: DaskSequence | None) -> dict[str, Any] | None:
    """What history.json says of a validation split.

    Parameters
    ----------
    train_seq, val_seq
        The training sequence and the held-out one.

    Returns
    -------
    dict or None
        Fraction, seed, held-out blocks and rows; None: no split.
    """
    split = train_seq.manifest.split
    if not split:
        return None
    return {"fraction": split["validation_split"], "seed": split["seed"], "by": "partition",
            "validation_partitions": split["validation_partitions"],
            "training_rows": train_seq.manifest.rows,
            "validation_rows": val_seq.manifest.rows if val_seq is not None else None}


def bad_lines_report(out: str, policy: str, reused: bool,
                     *seqs: DaskSequence | None) -> dict[str, Any]:
    """Malformed lines skipped per data set; under quarantine their text goes to rejects.csv.

    Parameters
    ----------
    out
        The output directory.
    policy
        The ``bad_lines`` policy.
    reused
        Whether the manifest was reused from ``out`` (a rerun, ``--resume``): the rejects
        file that the scan of that manifest wrote is then kept as it is.
    *seqs
        The training and validation sequences.

    Returns
    -------
    dict
        The policy, the counts per data set and, under quarantine, the rejects file.
    """
    report: dict[str, Any] = {"policy": policy}
    rejects = []
    for name, seq in zip(("train", "validation"), seqs, strict=False):
        if seq is not None:
            report[name] = seq.manifest.bad_lines
            rejects += [(name, r["where"], r["line"]) for r in seq.manifest.rejects]
    if policy == "quarantine":
        path = os.path.join(out, "rejects.csv")
        report["rejects_file"] = path
        if reused and os.path.exists(path):
            return report
        text = io.StringIO(newline="")
        w = csv.writer(text)
        w.writerow(["data", "where", "line"])
        w.writerows(rejects)
        write_file(path, text.getvalue())
    return report


def numbered(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The epoch records with their epochs numbered from 1, as the screen and Keras' bar show them.

    The one numbering a run's records are shown and given in (``history.json``,
    ``TrainResult.history`` and ``final``, the dashboard page); Keras' callbacks and the
    checkpoints count from 0, and the records are kept so until they leave the run.

    Parameters
    ----------
    history
        The records, ``epoch`` 0-based (Keras').

    Returns
    -------
    list of dict
        Copies, ``epoch`` 1-based.
    """
    return [{**r, "epoch": int(r["epoch"]) + 1} for r in history]


def write_history(run: Run, history: list[dict[str, Any]], train_seq: DaskSequence,
                  chart: ChartProcess, *, peak_rss: int, bad_lines: dict[str, Any],
                  class_weights: dict[int, float] | None, split: dict[str, Any] | None,
                  early_stopping: dict[str, Any] | None) -> None:
    """Write ``history.json`` and ``history.png``: the epochs and what the run was.

    The chart is drawn aside while the run's other outputs were written (``chart``, started as
    training ended) and put in place here, after ``history.json``. A chart that cannot be drawn
    is warned about, not raised: the run's records stand.

    Parameters
    ----------
    run
        The run: its output directory, budget, rank, the checkpoint it resumed from (or None),
        its id (its ``run.json`` ties ``history.json`` to the model and manifest) and the
        sample weight column.
    history
        The epoch records.
    train_seq
        This trainer's training sequence (its shard; its rows per epoch).
    chart
        ``history.png`` of ``history``, being drawn.
    peak_rss
        The process tree's peak RSS.
    bad_lines, class_weights, split, early_stopping
        What the run reports of them (see the functions above and
        :func:`daskfeed.training._callbacks.report_early_stopping`).
    """
    out, budget, ckpt = run.out, run.budget, run.ckpt
    record = {  # epochs numbered from 1, as the screen and Keras' progress bar show them
        "run_id": run.run_id, "epochs": numbered(history),
        "memory_limit_bytes": budget.total, "budget": budget.__dict__,
        "rows_per_epoch": train_seq.rows, "peak_rss_bytes": peak_rss, "bad_lines": bad_lines,
        "sample_weight": run.opts.data.weight,
        "class_weight": {str(k): v for k, v in class_weights.items()} if class_weights else None,
        "validation_split": split, "early_stopping": _numbered(early_stopping),
        "ranks": shard_report(run.ranks, train_seq),
        "resumed_from": ({"checkpoint": ckpt.path, "epoch": ckpt.cursor.epoch + 1,
                          "batch": ckpt.cursor.batch,  # the batch of the trainer that wrote it
                          "position": ckpt.cursor.position,  # of the global order (None: blocks)
                          "world_size": ckpt.cursor.shard[1]} if ckpt else None),
        "resume_certificate": run.certificate,
        "skip_batches": train_seq.stream.skips.text() or None,  # this run's and the resumed ones'
        "loss_spikes": _spikes(run),
    }
    write_file(os.path.join(out, "history.json"), json.dumps(record, indent=1))
    try:
        chart.finish()
    except ChartError as err:  # the chart alone: the trained model and the records stand
        with contextlib.suppress(FileNotFoundError):
            os.remove(chart.path)  # (not an earlier run's chart beside this run's records)
        warnings.warn(f"daskfeed: history.png not written ({err}). The "
                      "model and history.json are: history.json holds the figures the chart "
                      "shows.\nHint: the chart is drawn with matplotlib, a dependency of "
                      "daskfeed; reinstall it if it does not import.", stacklevel=2)


def _spikes(run: Run) -> dict[str, Any] | None:
    """The flagged steps (the first 100; all of them in spikes.json) and the rule that flagged them."""
    if run.spikes is None:
        return None
    report = run.spikes.report()
    flagged = report["flagged"]
    return {**report, "count": len(flagged), "flagged": flagged[:100], "spikes_file": "spikes.json"}


def _numbered(stopping: dict[str, Any] | None) -> dict[str, Any] | None:
    """Early stopping's epochs numbered from 1 (Keras counts them from 0; 0: did not stop)."""
    if not stopping:
        return stopping
    out = dict(stopping)
    if "best_epoch" in out:
        out["best_epoch"] = int(out["best_epoch"]) + 1
    if "stopped_epoch" in out:
        out["stopped_epoch"] = int(out["stopped_epoch"]) + 1 if out["stopped_epoch"] else None
    return out
