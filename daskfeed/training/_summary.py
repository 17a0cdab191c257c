"""What a run leaves to read afterwards: ``history.png`` and the closing summary.

:func:`history_plot` draws loss and each metric per epoch, training beside validation;
:func:`summary_lines` writes the lines ``daskfeed train`` ends with (epochs, rows/s, the weights
kept, data wait, shuffle quality, memory), from the run's epoch records.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from daskfeed.core import duration

_NOT_METRICS = {"epoch", "rows", "epoch_rows", "batches", "seconds", "val_seconds", "rows_per_s",
                "data_wait", "data_wait_seconds", "data_wait_fraction", "first_batch_wait_seconds",
                "feed_wait_seconds", "feed_seconds", "feed_wait_fraction", "windows_computed",
                "peak_rss_bytes", "resumed_at_batch", "ended_at", "learning_rate", "label_spread",
                "inside_iid", "skipped_batches", "skipped_rows"}


def _as_records(history: Any) -> list[dict[str, Any]]:
    """Per-epoch records from daskfeed's history (a list of dicts), a Keras ``History`` or its dict."""
    history = getattr(history, "history", history)
    if isinstance(history, Mapping):
        n = max((len(v) for v in history.values()), default=0)
        return [{k: v[i] for k, v in history.items() if i < len(v)} | {"epoch": i} for i in range(n)]
    return [dict(r) for r in history]


def _metric_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Loss first, then each metric, as trained (``val_`` twins are drawn beside them)."""
    names: list[str] = []
    for rec in records:
        for k, v in rec.items():
            base = k[4:] if k.startswith("val_") else k
            if base not in names and k not in _NOT_METRICS and base not in _NOT_METRICS and _number(v):
                names.append(base)
    return sorted(names, key=lambda k: k != "loss")


def history_plot(history: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> str:
    """Write loss and each metric per epoch, training vs validation, as a PNG at ``path``.

    Parameters
    ----------
    history
        daskfeed's per-epoch records as a run keeps them (``epoch`` 0-based, as Keras counts;
        ``history.json`` numbers them from 1), or a Keras ``History`` / its ``history`` dict.
    path
        Where to write (e.g. ``OUTPUT/history.png``).

    Returns
    -------
    str
        ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = _as_records(history)
    names = _metric_names(records) or ["loss"]
    fig = Figure(figsize=(5.0 * min(len(names), 3), 3.6 * math.ceil(len(names) / 3)), dpi=100)
    FigureCanvasAgg(fig)
    epochs = [int(r.get("epoch", i)) + 1 for i, r in enumerate(records)]
    for i, name in enumerate(names):
        ax = fig.add_subplot(math.ceil(len(names) / 3), min(len(names), 3), i + 1)
        for key, label in ((name, "training"), (f"val_{name}", "validation")):
            pts = [(e, r[key]) for e, r in zip(epochs, records, strict=True) if _number(r.get(key))]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
    return os.fspath(path)


def summary_lines(history: Sequence[Mapping[str, Any]], *, seconds: float,
                  budget_bytes: int | None = None, peak_rss_bytes: int | None = None,
                  bad_rows: Mapping[str, Any] | None = None,
                  restored: Mapping[str, Any] | None = None) -> list[str]:
    """The closing summary of a run: final metrics, rows, time, rows/s, data-wait, memory, bad rows.

    The ``final`` figures are those of the weights the model holds: the last epoch's, or, when
    early stopping restored an earlier epoch's weights (``restored``), that epoch's, named, with
    the last epoch's on a line of their own.

    Rows and rates are this run's: the rows it trained (each record's ``rows``: in a resumed
    epoch only those from ``resumed_at_batch`` on) over its wall time ("overall") and over its
    epochs' training seconds ("while training"). A resumed run's history also holds the epochs
    that earlier runs trained (they came with the checkpoint): a record is this run's when it
    ended within the run's wall time (its ``ended_at`` at most ``seconds`` ago; when no record
    has ``ended_at``, as from older versions, every record counts as this run's). The rows
    earlier runs trained are said on the same line.

    The wait for data is what :class:`~daskfeed.training._telemetry.EpochTelemetry` measured:
    with ``handoff="pydataset"`` or ``dataloader``, Keras' wait for windows during this run's training time
    (``data_wait_seconds`` over ``seconds``), and, on a line of its own when it is material (1 %
    of the training time, 0.01 s at least), the wait before training began
    (``first_batch_wait_seconds``); with the tf.data hand-off, where Keras' wait is not observable,
    the feed's producer's wait over the time it served the epochs (``feed_wait_seconds`` over
    ``feed_seconds``). Each share is at most 100 % by construction.

    Parameters
    ----------
    history
        daskfeed's per-epoch records (Keras logs + ``EpochTelemetry``'s ``rows``, ``epoch_rows``,
        ``seconds``, wait figures and ``ended_at``).
    seconds
        Wall time of the whole run (scan included), up to now.
    budget_bytes, peak_rss_bytes
        The memory budget and the peak RSS of the process tree over the run.
    bad_rows
        ``{"train": n, "validation": n, "policy": ...}`` (``history.json``'s ``bad_lines``).
    restored
        The record of the epoch whose weights early stopping restored (None: the last epoch's).

    Returns
    -------
    list of str
        The summary's lines, ready to print.
    """
    from dask.utils import format_bytes

    records = [dict(r) for r in history]
    mine = _this_run(records, seconds)
    rows = sum(int(r.get("rows", 0)) for r in mine.values())
    train_s = sum(float(r.get("seconds", 0.0)) for r in mine.values())
    earlier = (sum(_epoch_rows(r) for i, r in enumerate(records) if i not in mine)
               + sum(_epoch_rows(r) - int(r.get("rows", 0)) for r in mine.values()))
    last = records[-1] if records else {}
    lines = [f"summary: {len(records)} epoch{'s' if len(records) != 1 else ''}, {rows:,} rows trained "
             f"in {duration(seconds, tenths=True)} wall time "
             f"({rows / max(seconds, 1e-9):,.0f} rows/s overall, "
             f"{rows / max(train_s, 1e-9):,.0f} rows/s while training)"
             + (f"; before the resume, earlier runs trained {earlier:,} rows of these epochs"
                if earlier else "")]
    if restored is not None and restored.get("epoch") != last.get("epoch"):
        lines += [f"final (epoch {int(restored['epoch']) + 1}, the best, restored by early stopping: "
                  f"the weights model.keras holds): {_figures(restored)}",
                  f"last epoch ({len(records)}), not kept: {_figures(last)}"]
    else:
        lines.append(f"final: {_figures(last)}")
    lines += _wait_lines(list(mine.values()))
    lines += _spread_lines(list(mine.values()))
    skipped = [r for r in records if r.get("skipped_batches")]
    if skipped:  # (every epoch that skipped some: their rows were never trained)
        each = ", ".join(f"{int(r['skipped_batches']):,} batch{'es' if r['skipped_batches'] > 1 else ''} "
                         f"({int(r['skipped_rows']):,} rows) of epoch {int(r['epoch']) + 1}"
                         for r in skipped)
        lines.append(f"skipped (--skip-batches): {each}")
    if peak_rss_bytes:
        of = (f" of the {format_bytes(budget_bytes)} budget ({100 * peak_rss_bytes / budget_bytes:.0f}%)"
              if budget_bytes else "")
        lines.append(f"peak memory of the process tree: {format_bytes(peak_rss_bytes)}{of}")
    if bad_rows is not None:
        counts = ", ".join(f"{k} {v:,}" for k, v in bad_rows.items() if isinstance(v, int))
        policy = f" (bad_lines={bad_rows['policy']})" if "policy" in bad_rows else ""
        lines.append(f"bad rows skipped: {counts or 'none'}{policy}")
    return lines


def _spread_lines(records: list[dict[str, Any]]) -> list[str]:
    """The shuffle's quality: the batch label-mean spread against iid, per epoch (none measured: [])."""
    measured = [r for r in records if isinstance(r.get("label_spread"), (int, float))]
    if not measured:
        return []
    spreads = ", ".join(f"{r['label_spread']:.2f}x" for r in measured[:8])
    more = f" (and {len(measured) - 8} more)" if len(measured) > 8 else ""
    inside = min(float(r.get("inside_iid") or 0.0) for r in measured)
    return [f"shuffle: batch label-mean spread {spreads}{more} that of an iid shuffle per epoch "
            f"(1.00x: as good), at least {100 * inside:.0f}% of batches inside its 99% interval"]


def _this_run(records: list[dict[str, Any]], seconds: float) -> dict[int, dict[str, Any]]:
    """The records (by index) of epochs this run trained: those that ended within its wall time."""
    if not any(_number(r.get("ended_at")) for r in records):
        return dict(enumerate(records))  # older records: no way to tell, all count
    since = time.time() - seconds
    return {i: r for i, r in enumerate(records) if _number(r.get("ended_at")) and r["ended_at"] >= since}


def _epoch_rows(rec: Mapping[str, Any]) -> int:
    """All the epoch's rows (``rows`` alone in records made before ``epoch_rows`` was)."""
    return int(rec.get("epoch_rows", rec.get("rows", 0)))


def _wait_lines(mine: list[dict[str, Any]]) -> list[str]:
    """The summary's lines on the wait for data (see :func:`summary_lines`)."""
    lines = []
    keras_read = [(w, float(r.get("seconds", 0.0)), r) for r in mine if (w := _keras_wait(r)) is not None]
    if keras_read:
        wait_s = sum(w for w, _, _ in keras_read)
        train_s = sum(s for _, s, _ in keras_read)
        lines.append(f"data wait: {100 * wait_s / max(train_s, 1e-9):.1f}% of training time "
                     f"(Keras waited {wait_s:.2f}s for windows in {train_s:.2f}s of training)")
        first = sum(float(r.get("first_batch_wait_seconds") or 0.0) for _, _, r in keras_read)
        if first >= max(0.01, 0.01 * train_s):
            lines.append(f"data wait before training began: {first:.2f}s (Keras reads the first "
                         "batches when fit starts; not in the share above)")
    windows = [r for r in mine if "feed_wait_seconds" in r]
    fed = [r for r in windows if _number(r["feed_wait_seconds"]) and _number(r.get("feed_seconds"))]
    if windows:
        lost = len(windows) - len(fed)
        wait_s = sum(float(r["feed_wait_seconds"]) for r in fed)
        served = sum(float(r["feed_seconds"]) for r in fed)
        share = (f"its producer waited for windows {100 * wait_s / max(served, 1e-9):.1f}% of the "
                 f"time it served the epochs ({wait_s:.2f}s of {served:.2f}s)" if fed else "")
        gone = (f"{'; ' if fed else ''}the producer's figures of {lost} epoch{'s' if lost != 1 else ''} "
                "were no longer kept (it read more than eight epochs ahead)" if lost else "")
        lines.append("data wait: not measured with the tf.data hand-off (Keras waits on a tf.data "
                     f"queue); {share}{gone}")
    return lines


def _keras_wait(rec: Mapping[str, Any]) -> float | None:
    """Seconds Keras waited for data in the epoch's training time; None: not measured."""
    if "data_wait_seconds" in rec:
        return float(rec["data_wait_seconds"]) if _number(rec["data_wait_seconds"]) else None
    if _number(rec.get("data_wait_fraction")):  # records of older versions
        return float(rec["data_wait_fraction"]) * float(rec.get("seconds", 0.0))
    return None


def _figures(rec: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {rec[k]:.4f}" for k in _final_keys(rec)) or "no metrics"


def _final_keys(rec: Mapping[str, Any]) -> list[str]:
    keys = [k for k in rec if _number(rec[k]) and (k[4:] if k.startswith("val_") else k) not in _NOT_METRICS]
    return sorted(keys, key=lambda k: (k.startswith("val_"), k != "loss" and k != "val_loss"))


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
