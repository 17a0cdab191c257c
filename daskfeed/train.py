"""Train: cluster + budget + sequences + model + telemetry + outputs (used by the CLI).

``train(...)`` is also the Python entry point for the whole job; it imports keras only when
called, so the CLI's ``--help`` stays light.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from daskfeed.cluster import (
    Budget,
    check_worker_memory,
    close_client,
    default_memory_limit,
    open_cluster,
)
from daskfeed.ranks import rank_output, resolve_rank, shard_line, shard_report
from daskfeed.rss import RSSSampler

__all__ = ["FitOptions", "TrainResult", "default_memory_limit", "train"]

DEFAULT_HIDDEN = (64, 64)
DEFAULT_DROPOUT = 0.0
DEFAULT_LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class FitOptions:
    """How :func:`train` fits, resolved once from its arguments (:meth:`resolve`).

    Attributes
    ----------
    weight
        The sample-weight column, or None.
    class_weight
        ``"balanced"`` or ``{class: weight}`` (checked against the manifest later), or None.
    validation_split
        Fraction held out by partition when there is no validation data, or None.
    patience, monitor
        Early stopping: epochs without improvement of ``monitor``; None: no early stopping.
    hidden, dropout, learning_rate
        The default model's shape and Adam's learning rate (None: a ``--model`` builder's
        own; a learning rate is applied to a builder's model only if it comes uncompiled).
    """

    weight: str | None = None
    class_weight: str | dict[int, float] | None = None
    validation_split: float | None = None
    patience: int | None = None
    monitor: str | None = None
    hidden: tuple[int, ...] | None = DEFAULT_HIDDEN
    dropout: float | None = DEFAULT_DROPOUT
    learning_rate: float | None = DEFAULT_LEARNING_RATE

    @classmethod
    def resolve(cls, *, validation: Any = None, builder: bool = False, weight: str | None = None,
                class_weight: str | dict[Any, float] | None = None,
                validation_split: float | None = None, early_stopping: int | None = None,
                monitor: str | None = None, hidden: Any = None, dropout: float | None = None,
                learning_rate: float | None = None) -> FitOptions:
        """Check the fit settings together and fill in defaults (no I/O).

        Raises
        ------
        SchemaError
            For settings that exclude each other, or a value out of range, with a hint.
        """
        if validation_split is not None and not 0.0 < float(validation_split) < 1.0:
            _refuse("Expected 0 < validation_split < 1.", f"validation_split={validation_split!r}",
                    "e.g. 0.1 holds out about 10% of the data (--validation-split 0.1).")
        if validation_split and validation:
            _refuse("Expected validation data or a validation split, not both.",
                    f"validation={validation!r} and validation_split={validation_split}",
                    "drop --validation-split to validate on that data, or drop --validation.")
        if class_weight is not None and weight is not None:
            _refuse("Expected class weights or a weight column, not both: Keras' fit does not take "
                    "class_weight and sample weights together.",
                    f"class_weight={class_weight!r}, weight={weight!r}",
                    "multiply the class weights into the weight column, or drop one.")
        has_validation = bool(validation or validation_split)
        patience, monitor = _early_stopping(early_stopping, monitor, has_validation)
        if builder and (hidden is not None or dropout is not None):
            _refuse("Expected --hidden/--dropout only for the default model: a --model builder "
                    "shapes its own.", f"hidden={hidden!r}, dropout={dropout!r} with a builder",
                    "set them in your builder, or drop --model.")
        return cls(
            weight=weight, class_weight=_class_weight_spec(class_weight),
            validation_split=float(validation_split) if validation_split else None,
            patience=patience, monitor=monitor,
            hidden=None if builder else tuple(int(u) for u in (hidden or DEFAULT_HIDDEN)),
            dropout=None if builder else float(DEFAULT_DROPOUT if dropout is None else dropout),
            learning_rate=(learning_rate if builder else
                           float(DEFAULT_LEARNING_RATE if learning_rate is None else learning_rate)),
        )


def _refuse(expected: str, received: str, hint: str) -> None:
    from daskfeed.exceptions import SchemaError

    raise SchemaError(f"{expected} Received: {received}.\nHint: {hint}")


def _early_stopping(patience: int | None, monitor: str | None,
                    has_validation: bool) -> tuple[int | None, str | None]:
    """Patience and the monitored quantity: val_loss with validation data, else loss."""
    if patience is None:
        if monitor is not None:
            _refuse("Expected --monitor only with early stopping.", f"monitor={monitor!r}",
                    "add --early-stopping PATIENCE (e.g. 3).")
        return None, None
    if int(patience) < 0:
        _refuse("Expected a patience >= 0 (epochs without improvement).",
                f"early_stopping={patience!r}", "e.g. --early-stopping 3.")
    monitor = monitor or ("val_loss" if has_validation else "loss")
    if monitor.startswith("val_") and not has_validation:
        _refuse(f"Expected validation data to monitor {monitor!r}.", "no validation data",
                "pass --validation DATA or --validation-split 0.1, or monitor 'loss'.")
    return int(patience), monitor


def _class_weight_spec(spec: Any) -> str | dict[Any, float] | None:
    """``"balanced"``, a mapping, or JSON text of one (``'{"0": 1, "1": 9}'``)."""
    if spec is None or isinstance(spec, dict):
        return spec
    text = str(spec).strip()
    if text == "balanced":
        return text
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        _refuse("Expected class weights 'balanced' or a JSON object {class: weight}.",
                f"class_weight={spec!r}", "e.g. --class-weight balanced or --class-weight "
                "'{\"0\": 1, \"1\": 9}'.")
    return parsed


@dataclass
class TrainResult:
    """What ``train`` produced: output files, per-epoch history, manifest, budget."""

    output: str
    history: list[dict[str, Any]]
    manifest: Any
    budget: Budget | None
    dashboard_link: str | None
    model: Any = field(repr=False, default=None)

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's record."""
        return self.history[-1] if self.history else {}


def train(
    data: Any,
    *,
    label: str,
    validation: Any = None,
    features: list[str] | None = None,
    exclude: tuple[str, ...] | list[str] = (),
    epochs: int = 3,
    batch_size: int | None = None,
    memory_limit: str | int | None = None,
    nworkers: int | None = None,
    nthreads: int = 1,
    dashboard_address: str | None = None,
    scheduler: str | None = None,
    model: str | Callable[..., Any] | None = None,
    seed: int = 0,
    output: str | os.PathLike[str] = "daskfeed-out",
    as_matrix: bool = False,
    encoding: str = "utf-8",
    verbose: int | str = "auto",
    echo: Callable[[str], None] = print,
    processes: bool = True,
    timeout: float | str | None = None,
    security: Any = None,
    resume: bool = False,
    checkpoint_every: int | None = None,
    cache: bool | str | os.PathLike[str] = True,
    bad_lines: str = "error",
    blocksize: int | str | None = None,
    sep: str = ",",
    na_values: list[str] | tuple[str, ...] | None = None,
    vocabulary_size: int | None = None,
    dtype: dict[str, str] | None = None,
    storage_options: dict[str, Any] | None = None,
    weight: str | None = None,
    class_weight: str | dict[Any, float] | None = None,
    validation_split: float | None = None,
    early_stopping: int | None = None,
    monitor: str | None = None,
    hidden: tuple[int, ...] | list[int] | None = None,
    dropout: float | None = None,
    learning_rate: float | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    tensorboard: str | os.PathLike[str] | None = None,
) -> TrainResult:
    """Train a Keras model on ``data`` within ``memory_limit``; write model, manifest, history.

    Parameters
    ----------
    data, validation
        Paths / globs / lists / URLs of the training and validation data.
    label
        The label column.
    memory_limit
        Budget of the whole process tree (trainer + workers), e.g. ``"14GB"``.
    scheduler
        Address or scheduler-file of a running cluster; default: a LocalCluster on 127.0.0.1.
    model
        ``"module:function"`` (or a callable) called with the manifest, returning a
        ``keras.Model``; compiled for the label's task if it is not yet.
    output
        Directory for ``model.keras``, ``manifest.json`` and ``history.json``.
    timeout
        Longest wait for one window of batches (seconds or ``"300s"``; default
        ``daskfeed.timeout``) before :class:`~daskfeed.exceptions.FeedTimeoutError`.
    security
        A ``distributed.Security`` for a ``tls://`` scheduler (see
        :func:`daskfeed.cluster.make_security`).
    checkpoint_every
        Batches between mid-epoch checkpoints in ``<output>/checkpoints`` (default
        ``daskfeed.checkpoint-every``, 1000); 0: only at epoch ends, which are always
        checkpointed. A checkpoint holds model + optimizer state + the data cursor.
    resume
        Continue from the newest good checkpoint in ``<output>/checkpoints`` at exactly its
        epoch and batch, with the same batch order (refused if the data, batch size or seed
        changed). Batches trained after that checkpoint and before the interruption were never
        committed: they are trained again. Without ``resume``, old checkpoints are removed.
        See :mod:`daskfeed.checkpoint`.
    blocksize
        CSV bytes per partition (``"16MiB"`` or bytes). Default: a ``daskfeed.blocksize`` set in
        the config (other than the shipped 64MiB), else derived from the budget (at most 64MiB,
        small enough that a window's parse peak fits a worker); see
        :func:`daskfeed.config.resolve_blocksize`.
    batch_size, checkpoint_every, timeout, dashboard_address, vocabulary_size
        ``None``: the ``daskfeed.*`` config value (``DASK_DASKFEED__BATCH_SIZE=…``).
    sep, na_values, dtype
        Delimiter, null markers that are missing in every column (text too), and column
        types to force (``{"zip": "string"}``).
    tensorboard
        Also write TensorBoard logs there (Keras' ``TensorBoard`` callback).

    The run is watched on the Dask dashboard: daskfeed's page (``/daskfeed``, printed at the
    start) and ``daskfeed_*`` series on the scheduler's ``/metrics`` show epoch, batch, loss,
    rows/s, data-wait and memory live; each epoch is a ``distributed.span``. At the end it
    writes ``history.png`` and prints a summary.
    storage_options
        fsspec options for ``s3://`` and other URLs (``{"endpoint_url": ...}``), used here and
        sent to the workers; without credentials in them, each process takes its own from its
        environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...). Never printed nor written to
        the manifest or ``history.json``.
    weight
        A column of per-row sample weights (not a feature): the loss and the
        ``weighted_`` metrics are weighted, in validation too when the validation data have
        the column. Every row with a label needs a weight >= 0, else a clear error names the
        file and line before training (see :class:`~daskfeed.DaskSequence`).
    class_weight
        ``"balanced"`` (from the manifest's label counts, no extra pass:
        :meth:`~daskfeed.manifest.Manifest.class_weights`) or ``{class: weight}`` (also as
        JSON text); echoed and written to ``history.json``. Not with ``weight``.
    validation_split
        Without ``validation``: hold out about this fraction of the data, by whole partitions
        drawn with ``seed``, as validation data; the manifest describes the training part
        only (see :class:`~daskfeed.DaskSequence`).
    early_stopping, monitor
        Patience of Keras' ``EarlyStopping`` (epochs without improvement of ``monitor``,
        default ``val_loss`` with validation data, else ``loss``), restoring the best
        weights; its state is in every checkpoint, so ``resume`` keeps it.
    hidden, dropout, learning_rate
        The default model's hidden layer sizes (default ``(64, 64)``), dropout rate (0) and
        Adam's learning rate (0.001). With ``model``, only ``learning_rate``, used when the
        builder's model comes uncompiled.
    rank, world_size
        This trainer's place among several on one cluster (default: from ``TF_CONFIG``, else
        ``RANK``/``WORLD_SIZE``, else a single trainer; :func:`daskfeed.ranks.resolve_rank`).
        Each rank trains on its own shard of partitions, all with the same number of batches
        per epoch (the rest of a shard is dropped and counted); the data are scanned once for
        all ranks (:func:`daskfeed.ranks.join_scan`). Rank N > 0 writes to ``output/rank-N``.

    A manifest in ``output`` from an earlier run is reused, with its partitions and parse cache,
    whatever the budget, cluster shape, batch size or model; when the files or a setting that
    shapes it (label, vocabulary size, a read option) changed, the data are scanned again and
    the new manifest and cache replace the old ones.
    """
    from daskfeed._keras import keras
    from daskfeed.callbacks import (
        Checkpointer,
        EpochTelemetry,
        fit_from,
        make_early_stopping,
        report_early_stopping,
        resume_early_stopping,
    )
    from daskfeed.exceptions import ManifestMismatchError
    from daskfeed.manifest import Manifest
    from daskfeed.model import default_model, load_builder
    from daskfeed.sequence import DaskSequence
    from daskfeed.watch import WatchCallback, history_plot, summary_lines

    t_run = time.perf_counter()
    if tensorboard:
        _require_tensorboard()

    opts = FitOptions.resolve(
        validation=validation, builder=model is not None, weight=weight, class_weight=class_weight,
        validation_split=validation_split, early_stopping=early_stopping, monitor=monitor,
        hidden=hidden, dropout=dropout, learning_rate=learning_rate)
    ranks = resolve_rank(rank, world_size)
    if ranks.several and not scheduler:
        _refuse("Expected one Dask cluster shared by the trainers (--scheduler or "
                "--scheduler-file) with several trainers.",
                f"{ranks.describe()} and no scheduler",
                "start 'dask scheduler' and 'dask worker' processes (see deploy/) and pass "
                "--scheduler to every rank; or --rank 0 --world-size 1 to train alone.")
    out = rank_output(os.fspath(output), ranks)
    os.makedirs(out, mode=0o700, exist_ok=True)
    keras.utils.set_random_seed(seed)
    builder = load_builder(model) if isinstance(model, str) else model
    from daskfeed import config
    from daskfeed.checkpoint import Cursor, open_store

    every = int(config.get("checkpoint-every", checkpoint_every))
    store, ckpt = open_store(out, resume=resume, echo=echo)
    # resuming: the same partitions and windows as the interrupted run, whatever the budget
    pinned: dict[str, Any] = {"window_rows": ckpt.cursor.window_rows} if ckpt else {}

    client, budget = open_cluster(memory_limit, nworkers=nworkers, nthreads=nthreads,
                                  scheduler=scheduler, security=security,
                                  dashboard_address=dashboard_address, processes=processes,
                                  echo=echo)
    from daskfeed.dashboard import EpochSpans, install, scan_span

    links = install(client)  # daskfeed's page and daskfeed_* metrics on the scheduler
    link = links.dashboard if links else getattr(client, "dashboard_link", None) or None
    if link:
        echo(f"dashboard: {link}")
    if links:
        echo(f"daskfeed page: {links.page} (Prometheus: {links.metrics})")
    seqs: list[Any] = []  # what to close at the end (sequences, the shared scan's lock)
    try:
        with RSSSampler() as rss:
            shared = _join_scan(client, ranks, echo, data=data, validation=validation,
                                label=label, vocabulary_size=vocabulary_size, sep=sep,
                                encoding=encoding, na_values=na_values, dtype=dtype,
                                bad_lines=bad_lines, blocksize=blocksize,
                                validation_split=opts.validation_split, seed=seed)
            seqs += [shared] if shared is not None else []
            cached = ((shared.get("train") if shared is not None else None)
                      or _cached_manifest(os.path.join(out, "manifest.json")))
            block = _layout(blocksize, budget, cached, cache, echo)
            common = {"label": label, "batch_size": batch_size, "client": client,
                      "window_bytes": budget.window_bytes, "blocksize": block,
                      "as_matrix": as_matrix, "encoding": encoding, "timeout": timeout,
                      "cache": cache, "bad_lines": bad_lines, "sep": sep, "na_values": na_values,
                      "vocabulary_size": vocabulary_size, "dtype": dtype,
                      "storage_options": storage_options, "spans": EpochSpans(),
                      "scan_progress": _scan_bar(echo)}
            if ckpt:
                common["blocksize"] = ckpt.cursor.blocksize
            split: dict[str, Any] = ({"validation_split": opts.validation_split, "subset": "training"}
                     if opts.validation_split else {})
            if cached is not None and opts.class_weight == "balanced" and not cached.label_counts:
                cached = None  # made before the scan kept label counts: rescan
            if scheduler and cached is not None:  # before any window is sent to a worker
                check_worker_memory(client, _largest_partition(cached), what="partition")
            t0 = time.perf_counter()
            try:
                with scan_span(client, name="train"):
                    train_seq = DaskSequence(data, features=features, exclude=exclude, seed=seed,
                                             prefetch_bytes=budget.prefetch * 2 // 3,
                                             manifest=cached, weight=opts.weight,
                                             shard=ranks.shard, **split, **common, **pinned)
            except ManifestMismatchError as err:
                if cached is None:
                    raise
                # other files, or a setting that shapes the manifest changed: rebuild it
                echo(f"rescanning: {str(err).splitlines()[0]}")
                cached = None
                with scan_span(client, name="train"):
                    train_seq = DaskSequence(data, features=features, exclude=exclude, seed=seed,
                                             prefetch_bytes=budget.prefetch * 2 // 3,
                                             weight=opts.weight, shard=ranks.shard, **split,
                                             **common, **pinned)
            seqs.append(train_seq)
            manifest: Manifest = train_seq.manifest
            if ckpt:  # refuse other data, batch size, seed, features before anything is trained
                ckpt.cursor.check(Cursor.of(train_seq, ckpt.cursor.epoch, ckpt.cursor.batch),
                                  where=ckpt.path)
            manifest.to_json(os.path.join(out, "manifest.json"))
            how = "manifest reused" if manifest is cached else f"scanned in {time.perf_counter() - t0:.1f}s"
            echo(f"train data: {manifest.summary()} ({how})")
            echo(train_seq.cache_status)
            echo(f"features ({len(train_seq.features)}): {', '.join(train_seq.features)}")
            nwin = len(train_seq.plan.windows)
            echo(f"{len(train_seq)} batches of {train_seq.batch_size} per epoch; rows shuffled in "
                 f"{nwin} window{'s' if nwin > 1 else ''} of ~{train_seq.rows // nwin:,} rows")
            if ranks.several:
                echo(shard_line(ranks, train_seq))
            with scan_span(client, name="validation"):
                val_seq = _validation_sequence(
                    data, validation, train_seq, opts, common, budget.prefetch // 3, echo,
                    manifest=shared.get("validation") if shared is not None else None)
            if val_seq is not None:
                seqs.append(val_seq)
            if shared is not None:  # the other ranks reuse what this one scanned
                shared.share(train=manifest, validation=val_seq.manifest if val_seq else None)
            if scheduler:  # workers too small for these windows: say so before training
                check_worker_memory(client, _planned_window_bytes(train_seq, val_seq))
            if opts.weight:
                echo(f"sample weights: column {opts.weight!r} (not a feature); loss and "
                     f"weighted_ metrics weighted"
                     + ("" if val_seq is None else ", validation too" if val_seq.weight else
                        "; validation unweighted (its data have no such column)"))
            class_weights = _class_weights(manifest, opts.class_weight, echo)
            # written now, not at the end: an interrupted run keeps its quarantined lines
            bad_report = _bad_lines(out, bad_lines, manifest is cached, train_seq, val_seq)
            if builder is not None:
                net = _built(builder, manifest, model, opts, echo)
            else:
                net = default_model(train_seq, hidden=opts.hidden or DEFAULT_HIDDEN,
                                    dropout=opts.dropout or 0.0,
                                    learning_rate=DEFAULT_LEARNING_RATE
                                    if opts.learning_rate is None else opts.learning_rate)
                echo(f"default model: hidden {list(opts.hidden or DEFAULT_HIDDEN)}, dropout "
                     f"{opts.dropout or 0.0:g}, Adam(learning_rate={opts.learning_rate:g})")
            stopper = make_early_stopping(opts.patience, opts.monitor, net, echo)
            telemetry = EpochTelemetry(train_seq, rss)
            start_epoch = start_batch = 0
            if ckpt:
                ckpt.restore(net)  # weights + optimizer state (its iteration count checked)
                start_epoch, start_batch = ckpt.cursor.epoch, ckpt.cursor.batch
                echo(f"resuming from {ckpt.path}: epoch {start_epoch + 1}/{epochs} at batch "
                     f"{start_batch + 1}/{len(train_seq)} (optimizer iteration {ckpt.iterations})"
                     if start_epoch < epochs else
                     f"{ckpt.path} is at the end of epoch {start_epoch}: nothing left to train "
                     "(raise --epochs to train more)")
                if resume_early_stopping(stopper, ckpt, net, echo):
                    start_epoch, start_batch = max(start_epoch, epochs), 0
            echo(f"checkpoints: {f'every {every} batches and ' if every else ''}at epoch ends in "
                 f"{store.directory} (the last {store.keep} kept)")
            checkpointer = Checkpointer(store, train_seq, every=every, telemetry=telemetry,
                                        history=ckpt.history if ckpt else [],
                                        early_stopping=stopper)
            if verbose == "auto":
                verbose = 1 if sys.stdout.isatty() else 2
            watch = WatchCallback(client, train_seq, validation=val_seq, budget_bytes=budget.total,
                                  rss_sampler=rss, epochs=epochs)  # the daskfeed page, live
            callbacks = [telemetry, *([stopper] if stopper else []), checkpointer, watch,
                         *([keras.callbacks.TensorBoard(os.fspath(tensorboard))] if tensorboard else [])]
            try:
                fit_from(net, train_seq, epochs=epochs, epoch=start_epoch, batch=start_batch,
                         validation_data=val_seq, shuffle=False, verbose=verbose,
                         callbacks=callbacks, class_weight=class_weights)
            except Exception as err:
                _reraise_feed_error(err, train_seq, val_seq)
                raise
            history = checkpointer.history
            stopping = report_early_stopping(stopper, epochs, echo)
            net.save(os.path.join(out, "model.keras"))
            history_plot(history, os.path.join(out, "history.png"))
            with open(os.path.join(out, "history.json"), "w", encoding="utf-8") as f:
                json.dump({"epochs": history, "memory_limit_bytes": budget.total,
                           "budget": budget.__dict__, "rows_per_epoch": train_seq.rows,
                           "peak_rss_bytes": rss.overall_peak,
                           "bad_lines": bad_report,
                           "sample_weight": opts.weight,
                           "class_weight": ({str(k): v for k, v in class_weights.items()}
                                            if class_weights else None),
                           "validation_split": _split_report(train_seq, val_seq),
                           "early_stopping": stopping,
                           "ranks": shard_report(ranks, train_seq),
                           "resumed_from": ({"checkpoint": ckpt.path, "epoch": ckpt.cursor.epoch,
                                             "batch": ckpt.cursor.batch} if ckpt else None)},
                          f, indent=1)
        last = history[-1] if history else {}
        metric = next((k for k in ("val_weighted_accuracy", "val_accuracy",
                                   "val_weighted_mean_absolute_error", "val_mean_absolute_error",
                                   "val_loss") if k in last), None)
        if metric:
            echo(f"{metric.replace('_', ' ')}: {last[metric]:.4f}")
        for line in summary_lines(history, seconds=time.perf_counter() - t_run,
                                  budget_bytes=budget.total, peak_rss_bytes=rss.overall_peak,
                                  bad_rows=bad_report):
            echo(line)
        echo(f"wrote {out}/model.keras, manifest.json, history.json, history.png")
        return TrainResult(out, history, manifest, budget, link, net)
    finally:
        for s in seqs:
            s.close()
        close_client(client)


def _scan_bar(echo: Callable[[str], None]) -> Callable[[int, int, int, float, bool], None]:
    """A scan progress line every 10 % of the bytes (and at the end): rows/s, bytes, ETA."""
    from dask.utils import format_bytes

    shown = [-1]

    def show(rows: int, done: int, total: int, seconds: float, finished: bool) -> None:
        step = int(10 * done / total) if total else 0
        if finished or not done or step <= shown[0] or seconds < 2:  # small scans: no lines
            return
        shown[0] = step
        rate = done / seconds if seconds else 0.0
        eta = f", ETA {(total - done) / rate:.0f}s" if rate and done < total else ""
        echo(f"scan: {100 * done / total:.0f}% of {format_bytes(total)}, {rows:,} rows, "
             f"{rows / seconds:,.0f} rows/s{eta}")

    return show


def _require_tensorboard() -> None:
    """Refuse ``tensorboard=`` up front when the ``tensorboard`` package is missing."""
    import importlib.util

    from daskfeed.exceptions import DaskfeedError

    if importlib.util.find_spec("tensorboard") is None:
        raise DaskfeedError(
            "Expected the tensorboard package for --tensorboard. Received: it is not installed "
            "(tensorflow-cpu does not bring it).\nHint: pip install 'daskfeed[tensorboard]', or "
            "leave out --tensorboard."
        )


def _validation_sequence(data: Any, validation: Any, train_seq: Any, opts: FitOptions,
                         common: dict[str, Any], prefetch: int,
                         echo: Callable[[str], None], manifest: Any = None) -> Any:
    """The validation DaskSequence: of ``validation``, of the split's held-out part, or None.

    ``manifest``: one another rank published for it, reused if it still describes the data.
    """
    from daskfeed.sequence import DaskSequence

    if not (validation or opts.validation_split):
        return None
    same = {**common, "blocksize": train_seq.source.options.blocksize}
    if opts.validation_split:
        seq = _reusing(manifest, lambda m: DaskSequence(
            data, features=train_seq.features, shuffle=False, reference=train_seq.manifest,
            prefetch_bytes=prefetch, seed=train_seq.seed, validation_split=opts.validation_split,
            subset="validation", weight=opts.weight, manifest=m, **same))
        held = len((seq.manifest.split or {})["validation_partitions"])
        share = seq.manifest.rows / max(seq.manifest.rows + train_seq.manifest.rows, 1)
        coarse = ("; whole partitions: lower --blocksize for a split nearer "
                  f"{opts.validation_split:g}" if abs(share - opts.validation_split) >
                  0.5 * opts.validation_split else "")
        echo(f"validation split {opts.validation_split:g} by whole partitions (seed "
             f"{train_seq.seed}): {seq.manifest.rows:,} rows ({share:.1%}) in {held} of "
             f"{len(seq.manifest.partitions)} partitions held out{coarse}; training on the other "
             f"{train_seq.manifest.rows:,} rows (their statistics only)")
        return seq
    weight = opts.weight if opts.weight and _has_column(validation, opts.weight, common) else None
    seq = _reusing(manifest, lambda m: DaskSequence(
        validation, features=train_seq.features, shuffle=False, reference=train_seq.manifest,
        prefetch_bytes=prefetch, weight=weight, manifest=m, **common))
    echo(f"validation data: {seq.manifest.rows:,} rows in {len(seq.manifest.partitions)} partitions")
    return seq


def _planned_window_bytes(*seqs: Any) -> int:
    """CSV bytes of the largest planned window: its target rows, or one whole partition."""
    return max(max(int(seq.window_rows * seq.manifest.bytes_per_row), _largest_partition(seq.manifest))
               for seq in seqs if seq is not None)


def _largest_partition(manifest: Any) -> int:
    """CSV bytes of the manifest's largest partition (a window holds at least one)."""
    return int(max(manifest.counts, default=0) * manifest.bytes_per_row)


def _reusing(manifest: Any, make: Callable[[Any], Any]) -> Any:
    """``make(manifest)`` if that manifest still describes the data, else ``make(None)`` (a scan)."""
    from daskfeed.exceptions import ManifestMismatchError

    if manifest is None:
        return make(None)
    try:
        return make(manifest)
    except ManifestMismatchError:
        return make(None)


def _join_scan(client: Any, ranks: Any, echo: Callable[[str], None], **settings: Any) -> Any:
    """Several trainers: the scan lock of these data on the shared scheduler (None: one trainer)."""
    from daskfeed import config
    from daskfeed.ranks import join_scan, scan_key

    if not ranks.several:
        return None
    echo(f"trainer {ranks.describe()}")
    settings["vocabulary_size"] = int(config.get("vocabulary-size", settings["vocabulary_size"]))
    return join_scan(client, scan_key(**settings), echo=echo)


def _has_column(data: Any, name: str, common: dict[str, Any]) -> bool:
    """Whether the header of ``data`` names column ``name`` (one line read)."""
    import warnings

    from daskfeed.source import Source

    with warnings.catch_warnings():  # the DaskSequence says what the Source has to say
        warnings.simplefilter("ignore")
        src = Source(data, sep=common["sep"], encoding=common["encoding"], dtype=common["dtype"],
                     na_values=common["na_values"], bad_lines=common["bad_lines"],
                     blocksize=common["blocksize"], storage_options=common["storage_options"])
    return name in src.header()


def _split_report(train_seq: Any, val_seq: Any) -> dict[str, Any] | None:
    """What history.json says of a validation split (None: none)."""
    split = train_seq.manifest.split
    if not split:
        return None
    return {"fraction": split["validation_split"], "seed": split["seed"], "by": "partition",
            "validation_partitions": split["validation_partitions"],
            "training_rows": train_seq.manifest.rows,
            "validation_rows": val_seq.manifest.rows if val_seq is not None else None}


def _class_weights(manifest: Any, spec: Any, echo: Callable[[str], None]) -> dict[int, float] | None:
    """The class weights of ``spec`` from the manifest's label counts, echoed (None: none)."""
    if spec is None:
        return None
    weights = manifest.class_weights(spec)
    counts = ", ".join(f"{k}: {int(n):,}" for k, n in manifest.label_counts.items())
    shown = ", ".join(f"{k}: {w:.4g}" for k, w in weights.items())
    how = "balanced, from the label counts" if spec == "balanced" else "given; label counts"
    echo(f"class weights ({how} {counts}): {shown}")
    return weights


def _built(builder: Callable[..., Any], manifest: Any, model: Any, opts: FitOptions,
           echo: Callable[[str], None]) -> Any:
    """The builder's model, checked, compiled for the task if it comes uncompiled."""
    from daskfeed._keras import keras
    from daskfeed.exceptions import SchemaError
    from daskfeed.model import compile_for

    net = builder(manifest)
    if not isinstance(net, keras.Model):
        raise SchemaError(
            f"Expected the model builder to return a keras.Model. Received: "
            f"{type(net).__name__}.\nHint: return the model from your function."
        )
    if net.compiled and opts.learning_rate is not None:
        raise SchemaError(
            "Expected an uncompiled model from the builder to apply --learning-rate. Received: a "
            f"model compiled with {_describe_compile(net)}.\nHint: set the learning rate in your "
            "builder's compile, or return the model uncompiled."
        )
    if not net.compiled:
        lr = DEFAULT_LEARNING_RATE if opts.learning_rate is None else opts.learning_rate
        compile_for(net, manifest, learning_rate=lr, weighted=bool(opts.weight))
        echo(f"model from {model if isinstance(model, str) else 'the builder'} was not "
             f"compiled; compiled for the {manifest.task} label with {_describe_compile(net)}")
    return net


def _describe_compile(net: Any) -> str:
    """``loss …, optimizer Adam(learning_rate=0.001), metrics […]`` of a compiled model."""
    cfg = net.get_compile_config() or {}
    opt = net.optimizer
    lr = getattr(opt, "learning_rate", None)
    try:
        lr_text = f"(learning_rate={float(lr):g})" if lr is not None else ""
    except (TypeError, ValueError):  # a schedule
        lr_text = f"(learning_rate={type(lr).__name__})"
    metrics = cfg.get("metrics")
    names = [m if isinstance(m, str) else getattr(m, "name", type(m).__name__)
             for m in (metrics if isinstance(metrics, (list, tuple)) else [metrics] if metrics else [])]
    loss = cfg.get("loss", getattr(net, "loss", None))
    return (f"loss {loss if isinstance(loss, str) else getattr(loss, 'name', loss)}, optimizer "
            f"{type(opt).__name__}{lr_text}, metrics {names}")


def _reraise_feed_error(err: Exception, *seqs: Any) -> None:
    """Raise the daskfeed error behind ``err`` if a batch failed with one.

    Keras' TF backend reads batches inside a tf.data ``py_function``: an error raised by
    ``DaskSequence.__getitem__`` reaches ``fit``'s caller as a TF ``UnknownError`` holding its
    text. The sequence keeps the original (``failure``): raise that, clear and typed.
    """
    from daskfeed.exceptions import DaskfeedError

    if isinstance(err, DaskfeedError):
        return
    for seq in seqs:
        failure = getattr(seq, "failure", None)
        if failure is not None:
            raise failure from None


def _cached_manifest(path: str) -> Any:
    """The manifest an earlier run wrote to ``path`` (None: none, or unreadable)."""
    from daskfeed.manifest import Manifest

    if not os.path.exists(path):
        return None
    try:
        return Manifest.from_json(path)
    except Exception:
        return None


def _layout(blocksize: int | str | None, budget: Budget, cached: Any, cache: Any,
            echo: Callable[[str], None]) -> int:
    """CSV bytes per partition: asked for > the reused manifest's > what the budget gives.

    A manifest (and its parse cache) made under another budget is reused with its partitions:
    one scan per data set, whatever the budget. Without a parse cache, its partitions must
    also fit this budget's parse peak, else the data are scanned again in smaller ones.
    """
    from dask.utils import format_bytes

    from daskfeed import config

    asked = config.resolve_blocksize(blocksize, 0)
    if asked:
        if asked != budget.blocksize:
            echo(f"partitions of {format_bytes(asked)} (blocksize / daskfeed.blocksize; the "
                 f"budget alone gives {format_bytes(budget.blocksize)})")
        return asked
    reused = (cached.read_options or {}).get("blocksize") if cached is not None else None
    if reused and (cache is not False or reused <= budget.blocksize):
        return int(reused)
    return budget.blocksize


def _bad_lines(out: str, policy: str, reused: bool, *seqs: Any) -> dict[str, Any]:
    """Malformed lines skipped per data set; under quarantine their text goes to rejects.csv.

    When the manifest was reused from ``out`` (a rerun, ``--resume``), the rejects file that
    the scan of that manifest wrote is kept as it is.
    """
    import csv

    names = ("train", "validation")
    report: dict[str, Any] = {"policy": policy}
    rejects = []
    for name, seq in zip(names, seqs, strict=False):
        if seq is not None:
            report[name] = seq.manifest.bad_lines
            rejects += [(name, r["where"], r["line"]) for r in seq.manifest.rejects]
    if policy == "quarantine":
        path = os.path.join(out, "rejects.csv")
        report["rejects_file"] = path
        if reused and os.path.exists(path):
            return report
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["data", "where", "line"])
            w.writerows(rejects)
    return report

