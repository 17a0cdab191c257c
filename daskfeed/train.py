"""Train: the whole job as a few named steps (cluster, data, model, callbacks, fit, outputs).

:func:`train` is the Python entry point; the CLI calls it with a :class:`TrainOptions`. It
imports keras (through the sequence, model and callbacks): the CLI imports it only to run.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskfeed._keras import keras
from daskfeed.callbacks import Checkpointer, EpochTelemetry, fit_from
from daskfeed.checkpoint import Checkpoint, CheckpointStore, open_store
from daskfeed.cluster import Budget, check_worker_memory, close_client, open_cluster
from daskfeed.cursor import Cursor
from daskfeed.dashboard import EpochSpans, install, scan_span
from daskfeed.early_stopping import (
    EarlyStopping,
    make_early_stopping,
    report_early_stopping,
    resume_early_stopping,
)
from daskfeed.exceptions import DaskfeedError, ManifestMismatchError, SchemaError
from daskfeed.files import refuse_missing_local
from daskfeed.layout import blocksize_for, largest_block, planned_window_bytes
from daskfeed.lifecycle import Stop
from daskfeed.manifest import Manifest, read_reusable
from daskfeed.model import model_for
from daskfeed.options import DataSpec, TrainOptions
from daskfeed.outputs import (
    bad_lines_report,
    class_weights,
    require_tensorboard,
    scan_bar,
    split_report,
    write_history,
)
from daskfeed.ranks import Rank, SharedScan, join_scan, rank_output, resolve_rank, scan_key, shard_line
from daskfeed.rss import RSSSampler
from daskfeed.sequence import DaskSequence
from daskfeed.serving import export as export_serving
from daskfeed.source import Source
from daskfeed.watch import WatchCallback, summary_lines

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["TrainResult", "train"]

Echo = Callable[[str], None]


@dataclass
class TrainResult:
    """What ``train`` produced: output files, per-epoch history, manifest, budget."""

    output: str
    history: list[dict[str, Any]]
    manifest: Manifest
    budget: Budget | None
    dashboard_link: str | None
    model: keras.Model | None = field(repr=False, default=None)

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's record."""
        return self.history[-1] if self.history else {}


@dataclass
class _Run:
    """What the steps of one run share: its settings, place, cluster and what to close."""

    data: DataSpec
    label: str
    validation: DataSpec | None
    opts: TrainOptions
    echo: Echo
    stop: Stop | None
    ranks: Rank
    out: str
    store: CheckpointStore
    ckpt: Checkpoint | None
    client: Client
    budget: Budget
    link: str | None
    spans: EpochSpans = field(default_factory=EpochSpans)  # one per run: both sequences' epochs
    closing: list[Any] = field(default_factory=list)  # sequences, the shared scan's lock

    def __post_init__(self) -> None:
        self.progress = scan_bar(self.echo)  # one progress bar for the run's scans


def train(data: DataSpec, *, label: str, validation: DataSpec | None = None,
          options: TrainOptions | None = None, echo: Echo = print, stop: Stop | None = None,
          **settings: Any) -> TrainResult:
    """Train a Keras model on ``data`` within a memory budget; write model, manifest, history.

    Parameters
    ----------
    data, validation
        Paths / globs / lists / URLs of the training and validation data.
    label
        The label column.
    options
        The resolved settings; or give them as keyword arguments (``settings``).
    echo
        Where progress lines go (the CLI's ``click.echo``; a no-op when quiet).
    stop
        Ends waits for data at once when requested (the CLI's signal watcher sets it);
        default: the process-wide stop request.
    **settings
        The settings by name (``epochs``, ``batch_size``, ``memory_limit``, ``model``,
        ``resume``, ...), as :meth:`TrainOptions.resolve` takes them; one not given takes its
        ``daskfeed.*`` config value.

    Returns
    -------
    TrainResult
        The output directory, the history, the manifest, the budget and the model.

    Raises
    ------
    DaskfeedError
        For bad data, settings or budgets, with what was expected, what was received and a hint.

    Notes
    -----
    A manifest in the output directory is reused, with its blocks and parse cache, whatever the
    budget, cluster shape, batch size or model; changed files or read settings rescan.
    """
    if options is not None and settings:
        raise TypeError(f"train() takes options= or settings, not both: {', '.join(sorted(settings))}")
    opts = options or TrainOptions.resolve(validation=validation, **settings)
    t_run = time.perf_counter()
    ranks, out, store, ckpt = _prepare(data, validation, opts, echo)
    client, budget, link = _connect(opts, echo)
    run = _Run(data, label, validation, opts, echo, stop, ranks, out, store, ckpt, client, budget,
               link)
    try:
        with RSSSampler() as rss:
            train_seq, val_seq, reused = _open_data(run)
            history, net, bad_report = _fit(run, train_seq, val_seq, reused, rss)
        _summary(run, history, bad_report, time.perf_counter() - t_run, rss)
        return TrainResult(run.out, history, train_seq.manifest, run.budget, run.link, net)
    finally:
        for s in run.closing:
            s.close()
        close_client(run.client)


def _prepare(data: DataSpec, validation: DataSpec | None, opts: TrainOptions,
             echo: Echo) -> tuple[Rank, str, CheckpointStore, Checkpoint | None]:
    """Check what can be checked before any cluster: paths, TensorBoard, ranks, the checkpoint.

    Returns the rank, the output directory, its checkpoint store and the checkpoint to resume.
    """
    for spec in (data, validation):
        if spec is not None:
            refuse_missing_local(spec)
    if opts.tensorboard:
        require_tensorboard()
    ranks = resolve_rank(opts.cluster.rank, opts.cluster.world_size)
    if ranks.several and not opts.cluster.scheduler:
        raise SchemaError(
            "Expected one Dask cluster shared by the trainers (--scheduler or --scheduler-file) "
            f"with several trainers. Received: {ranks.describe()} and no scheduler.\nHint: start "
            "'dask scheduler' and 'dask worker' processes (see deploy/) and pass --scheduler to "
            "every rank; or --rank 0 --world-size 1 to train alone.")
    out = rank_output(opts.output, ranks)
    os.makedirs(out, mode=0o700, exist_ok=True)
    keras.utils.set_random_seed(opts.data.seed)
    store, ckpt = open_store(out, resume=opts.resume, echo=echo)
    return ranks, out, store, ckpt


def _connect(opts: TrainOptions, echo: Echo) -> tuple[Client, Budget, str | None]:
    """Start or reach the cluster, install daskfeed's page and metrics, say where to watch.

    Returns the client, the budget it works in and the dashboard's address.
    """
    c = opts.cluster
    client, budget = open_cluster(
        c.memory_limit, nworkers=c.nworkers, nthreads=c.nthreads, scheduler=c.scheduler,
        security=c.security, dashboard_address=c.dashboard_address, processes=c.processes,
        trainer_reserve=c.trainer_reserve, window_bytes=c.window_bytes,
        max_blocksize=c.max_blocksize, echo=echo)
    links = install(client)
    link = links.dashboard if links else getattr(client, "dashboard_link", None) or None
    if link:
        echo(f"dashboard: {link}")
    if links:
        echo(f"daskfeed page: {links.page} (Prometheus: {links.metrics})")
    return client, budget, link


def _open_data(run: _Run) -> tuple[DaskSequence, DaskSequence | None, bool]:
    """The training and validation sequences (scanned, or from a reused manifest), described.

    Returns the two sequences and whether the training manifest was reused.
    """
    opts, echo = run.opts, run.echo
    shared = _join_scan(run)
    cached = ((shared.get("train") if shared is not None else None)
              or _cached_manifest(os.path.join(run.out, "manifest.json")))
    if cached is not None and opts.fit.class_weight == "balanced" and not cached.label_counts:
        cached = None  # made before the scan kept label counts: rescan
    if opts.cluster.scheduler and cached is not None:  # before any window is sent to a worker
        check_worker_memory(run.client, largest_block(cached), what="block")
    t0 = time.perf_counter()
    train_seq = _train_sequence(run, cached)
    run.closing.append(train_seq)
    manifest = train_seq.manifest
    if run.ckpt:  # refuse other data, batch size, seed, features before anything is trained
        cur = run.ckpt.cursor
        cur.check(Cursor.of(train_seq, cur.epoch, cur.batch), where=run.ckpt.path)
    manifest.to_json(os.path.join(run.out, "manifest.json"))
    how = "manifest reused" if manifest is cached else f"scanned in {time.perf_counter() - t0:.1f}s"
    echo(f"train data: {manifest.summary()} ({how})")
    echo(train_seq.cache_status)
    echo(f"features ({len(train_seq.features)}): {', '.join(train_seq.features)}")
    nwin = len(train_seq.plan.windows)
    echo(f"{len(train_seq)} batches of {train_seq.batch_size} per epoch; rows shuffled in "
         f"{nwin} window{'s' if nwin > 1 else ''} of ~{train_seq.rows // nwin:,} rows")
    if run.ranks.several:
        echo(shard_line(run.ranks, train_seq))
    with scan_span(run.client, name="validation"):
        val_seq = _validation_sequence(run, train_seq,
                                       shared.get("validation") if shared is not None else None)
    if val_seq is not None:
        run.closing.append(val_seq)
    if shared is not None:  # the other ranks reuse what this one scanned
        shared.share(train=manifest, validation=val_seq.manifest if val_seq else None)
    if opts.cluster.scheduler:  # workers too small for these windows: say so before training
        check_worker_memory(run.client, planned_window_bytes(train_seq, val_seq))
    return train_seq, val_seq, manifest is cached


def _sequence_settings(run: _Run, blocksize: int) -> dict[str, Any]:
    """What the training and validation sequences share: client, reading, batching, watching."""
    d = run.opts.data
    return {"label": run.label, "batch_size": d.batch_size, "client": run.client,
            "window_bytes": run.budget.window_bytes, "as_matrix": d.as_matrix,
            "timeout": d.timeout, "cache": d.cache, "vocabulary_size": d.vocabulary_size,
            "spans": run.spans, "scan_progress": run.progress, "stop": run.stop,
            **d.read(blocksize)}


def _train_sequence(run: _Run, cached: Manifest | None) -> DaskSequence:
    """The training sequence: of the reused manifest, else (or when it no longer fits) scanned."""
    d, fit, ckpt, budget = run.opts.data, run.opts.fit, run.ckpt, run.budget
    block = ckpt.cursor.blocksize if ckpt else blocksize_for(d.blocksize, budget, cached, d.cache, run.echo)
    split: dict[str, Any] = ({"validation_split": fit.validation_split, "subset": "training"}
             if fit.validation_split else {})
    # resuming: the same blocks and windows as the interrupted run, whatever the budget
    pinned: dict[str, Any] = {"window_rows": ckpt.cursor.window_rows} if ckpt else {}

    def make(manifest: Manifest | None) -> DaskSequence:
        with scan_span(run.client, name="train"):
            return DaskSequence(run.data, features=list(d.features) if d.features else None,
                                exclude=d.exclude, seed=d.seed, manifest=manifest,
                                prefetch_bytes=budget.prefetch * 2 // 3,
                                weight=fit.weight, shard=run.ranks.shard, **split,
                                **_sequence_settings(run, block), **pinned)

    if cached is None:
        return make(None)
    try:
        return make(cached)
    except ManifestMismatchError as err:
        # other files, or a setting that shapes the manifest changed: rebuild it
        run.echo(f"rescanning: {str(err).splitlines()[0]}")
        return make(None)


def _validation_sequence(run: _Run, train_seq: DaskSequence,
                         manifest: Manifest | None) -> DaskSequence | None:
    """The validation sequence: of ``validation``, of the split's held-out part, or None.

    ``manifest``: one another rank published for it, reused if it still describes the data.
    """
    fit, echo = run.opts.fit, run.echo
    if not (run.validation or fit.validation_split):
        return None
    same = {**_sequence_settings(run, train_seq.source.options.blocksize),
            "features": train_seq.features, "shuffle": False, "reference": train_seq.manifest,
            "prefetch_bytes": run.budget.prefetch // 3}
    if fit.validation_split:
        seq = _reusing(manifest, lambda m: DaskSequence(
            run.data, seed=train_seq.seed, validation_split=fit.validation_split,
            subset="validation", weight=fit.weight, manifest=m, **same))
        held = len((seq.manifest.split or {})["validation_partitions"])
        share = seq.manifest.rows / max(seq.manifest.rows + train_seq.manifest.rows, 1)
        coarse = ("; whole blocks: lower --blocksize for a split nearer "
                  f"{fit.validation_split:g}" if abs(share - fit.validation_split) >
                  0.5 * fit.validation_split else "")
        echo(f"validation split {fit.validation_split:g} by whole blocks (seed "
             f"{train_seq.seed}): {seq.manifest.rows:,} rows ({share:.1%}) in {held} of "
             f"{len(seq.manifest.partitions)} blocks held out{coarse}; training on the other "
             f"{train_seq.manifest.rows:,} rows (their statistics only)")
        return seq
    assert run.validation is not None
    block = train_seq.source.options.blocksize
    weight = fit.weight if fit.weight and _has_column(run, run.validation, fit.weight, block) else None
    seq = _reusing(manifest, lambda m: DaskSequence(run.validation, weight=weight, manifest=m,
                                                    **same))
    echo(f"validation data: {seq.manifest.rows:,} rows in {len(seq.manifest.partitions)} blocks")
    return seq


def _fit(run: _Run, train_seq: DaskSequence, val_seq: DaskSequence | None, reused: bool,
         rss: RSSSampler) -> tuple[list[dict[str, Any]], keras.Model, dict[str, Any]]:
    """Build the model and its callbacks, fit from the start or the checkpoint, write outputs.

    Returns the history, the model and the bad-lines report.
    """
    opts, echo, ckpt = run.opts, run.echo, run.ckpt
    if opts.fit.weight:
        echo(f"sample weights: column {opts.fit.weight!r} (not a feature); loss and weighted_ "
             "metrics weighted" + ("" if val_seq is None else ", validation too" if val_seq.weight
                                   else "; validation unweighted (its data have no such column)"))
    weights = class_weights(train_seq.manifest, opts.fit.class_weight, echo)
    # written now, not at the end: an interrupted run keeps its quarantined lines
    bad_report = bad_lines_report(run.out, opts.data.bad_lines, reused, train_seq, val_seq)
    net = model_for(opts.model, train_seq, opts.fit, echo)
    stopper = make_early_stopping(opts.fit.patience, opts.fit.monitor, net, echo)
    telemetry = EpochTelemetry(train_seq, rss)
    epoch, batch = _start_point(run, net, stopper, len(train_seq))
    every = opts.checkpoint_every
    echo(f"checkpoints: {f'every {every} batches and ' if every else ''}at epoch ends in "
         f"{run.store.directory} (the last {run.store.keep} kept)")
    checkpointer = Checkpointer(run.store, train_seq, every=every, telemetry=telemetry,
                                history=ckpt.history if ckpt else [], early_stopping=stopper)
    watch = WatchCallback(run.client, train_seq, validation=val_seq, budget_bytes=run.budget.total,
                          rss_sampler=rss, epochs=opts.epochs)  # the daskfeed page, live
    callbacks = [telemetry, *([stopper] if stopper else []), checkpointer, watch,
                 *([keras.callbacks.TensorBoard(opts.tensorboard)] if opts.tensorboard else [])]
    try:
        fit_from(net, train_seq, epochs=opts.epochs, epoch=epoch, batch=batch, feed=opts.fit.feed,
                 validation_data=val_seq, shuffle=False, verbose=opts.verbose,
                 callbacks=callbacks, class_weight=weights)
    except Exception as err:
        _reraise_feed_error(err, train_seq, val_seq)
        raise
    history = checkpointer.history
    stopping = report_early_stopping(stopper, opts.epochs, echo)
    net.save(os.path.join(run.out, "model.keras"))
    try:  # serving/: the same model taking raw column values
        export_serving(run.out, model=net, features=list(train_seq.features), echo=echo)
    except (DaskfeedError, ValueError, TypeError) as err:  # model.keras stands; say why not
        warnings.warn(f"serving/ not written: {err}", stacklevel=2)
    write_history(run.out, history, budget=run.budget, rows=train_seq.rows,
                  peak_rss=rss.overall_peak, bad_lines=bad_report, weight=opts.fit.weight,
                  class_weights=weights, split=split_report(train_seq, val_seq),
                  early_stopping=stopping, ranks=run.ranks, train_seq=train_seq, ckpt=ckpt)
    return history, net, bad_report


def _start_point(run: _Run, net: keras.Model, stopper: EarlyStopping | None, batches: int) -> tuple[int, int]:
    """Epoch and batch to start at: 0, 0, or the checkpoint's (its weights and optimizer loaded)."""
    ckpt, epochs = run.ckpt, run.opts.epochs
    if ckpt is None:
        return 0, 0
    ckpt.restore(net)  # weights + optimizer state (its iteration count checked)
    epoch, batch = ckpt.cursor.epoch, ckpt.cursor.batch
    run.echo(f"resuming from {ckpt.path}: epoch {epoch + 1}/{epochs} at batch {batch + 1}/"
             f"{batches} (optimizer iteration {ckpt.iterations})" if epoch < epochs else
             f"{ckpt.path} is at the end of epoch {epoch}: nothing left to train (raise "
             "--epochs to train more)")
    if resume_early_stopping(stopper, ckpt, net, run.echo):
        return max(epoch, epochs), 0
    return epoch, batch


def _summary(run: _Run, history: list[dict[str, Any]], bad_report: dict[str, Any], seconds: float,
             rss: RSSSampler) -> None:
    """The closing lines: the validation figure, the summary, what was written."""
    last = history[-1] if history else {}
    metric = next((k for k in ("val_weighted_accuracy", "val_accuracy",
                               "val_weighted_mean_absolute_error", "val_mean_absolute_error",
                               "val_loss") if k in last), None)
    if metric:
        run.echo(f"{metric.replace('_', ' ')}: {last[metric]:.4f}")
    for line in summary_lines(history, seconds=seconds, budget_bytes=run.budget.total,
                              peak_rss_bytes=rss.overall_peak, bad_rows=bad_report):
        run.echo(line)
    run.echo(f"wrote {run.out}/model.keras, manifest.json, history.json, history.png")


def _reusing(manifest: Manifest | None,
             make: Callable[[Manifest | None], DaskSequence]) -> DaskSequence:
    """``make(manifest)`` if that manifest still describes the data, else ``make(None)`` (a scan)."""
    if manifest is None:
        return make(None)
    try:
        return make(manifest)
    except ManifestMismatchError:
        return make(None)


def _join_scan(run: _Run) -> SharedScan | None:
    """Several trainers: the scan lock of these data on the shared scheduler (None: one trainer)."""
    if not run.ranks.several:
        return None
    run.echo(f"trainer {run.ranks.describe()}")
    d = run.opts.data
    key = scan_key(data=run.data, validation=run.validation, label=run.label,
                   vocabulary_size=d.vocabulary_size, sep=d.sep, encoding=d.encoding,
                   na_values=d.na_values, dtype=d.dtype, bad_lines=d.bad_lines,
                   blocksize=d.blocksize, validation_split=run.opts.fit.validation_split,
                   seed=d.seed)
    shared = join_scan(run.client, key, wait=run.opts.cluster.rank_wait, echo=run.echo)
    run.closing.append(shared)
    return shared


def _has_column(run: _Run, data: DataSpec, name: str, blocksize: int) -> bool:
    """Whether the header of ``data`` names column ``name`` (one line read)."""
    with warnings.catch_warnings():  # the DaskSequence says what the Source has to say
        warnings.simplefilter("ignore")
        src = Source(data, **run.opts.data.read(blocksize))
    return name in src.header()


def _reraise_feed_error(err: Exception, *seqs: DaskSequence | None) -> None:
    """Raise the daskfeed error behind ``err`` if a batch failed with one.

    Keras' TF backend reads batches inside a tf.data ``py_function``: an error raised by
    ``DaskSequence.__getitem__`` reaches ``fit``'s caller as a TF ``UnknownError`` holding its
    text. The sequence keeps the original (``failure``): raise that, clear and typed.
    """
    if isinstance(err, DaskfeedError):
        return
    for seq in seqs:
        failure = getattr(seq, "failure", None)
        if failure is not None:
            raise failure from None


def _cached_manifest(path: str) -> Manifest | None:
    """The manifest an earlier run wrote to ``path`` (None: none, unreadable, or an older format)."""
    return read_reusable(path)
