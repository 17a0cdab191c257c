"""Train: the whole job as a few named steps (cluster, data, model, callbacks, fit, outputs).

:func:`train` is the Python entry point; the CLI calls it with a :class:`TrainOptions`. The
steps up to the training data (checks, cluster, scan) need no keras, which takes seconds to
load: a run says where to watch it at once, and a mistake in the data or the settings is said
without waiting for TensorFlow. Keras loads in a thread meanwhile, once the data are seen to
have what the settings name (:class:`~daskfeed.training._keras_load.KerasLoad`); the keras half,
:mod:`daskfeed.training._fit`, is imported after.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from daskfeed.batches import (
    DataSettings,
    Prepared,
    Skips,
    blocksize_for,
    largest_block,
    planned_window_bytes,
)
from daskfeed.checkpoint import Checkpoint, CheckpointStore, open_store
from daskfeed.cluster import Budget, check_worker_memory
from daskfeed.core import ManifestMismatchError, RSSSampler, SettingError, Stop, warn_user
from daskfeed.core import choose as choose_backend
from daskfeed.dashboard import install, scan_span
from daskfeed.inference import RUNNING_MANIFEST
from daskfeed.manifest import (
    Manifest,
    id_like,
    id_warning,
    joined,
    read_reusable,
    refuse_single_class,
)
from daskfeed.reading import Listing, Source, refuse_missing_local
from daskfeed.training._keras_load import KerasLoad
from daskfeed.training._options import DataSpec, TrainOptions
from daskfeed.training._order_record import forget_order
from daskfeed.training._outputs import OutputLock, numbered, require_tensorboard, scan_bar
from daskfeed.training._ranks import (
    Rank,
    SharedScan,
    join_scan,
    rank_output,
    resolve_rank,
    scan_key,
    shard_line,
)
from daskfeed.training._run import Echo, Run
from daskfeed.training._started import keep_started, resume_data

if TYPE_CHECKING:
    from distributed import Client
    from keras import Model

    from daskfeed.adapters import DaskSequence


@dataclass
class TrainResult:
    """What ``train`` produced: output files, per-epoch history, manifest, budget.

    ``history`` holds one record per epoch as ``history.json`` does, ``epoch`` numbered from 1
    as the screen, ``history.json`` and the dashboard page number them; ``final`` is the last.
    """

    output: str
    history: list[dict[str, Any]]
    manifest: Manifest
    budget: Budget | None
    dashboard_link: str | None
    model: Model | None = field(repr=False, default=None)

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's record."""
        return self.history[-1] if self.history else {}


def train(data: DataSpec, *, label: str, validation: DataSpec | None = None,
          options: TrainOptions | None = None, echo: Echo = print, quiet: bool = False,
          stop: Stop | None = None, **settings: Any) -> TrainResult:
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
        Where progress lines go (the CLI's ``click.echo``).
    quiet
        Say nothing but warnings and errors (as ``--quiet``): no progress lines, and Keras'
        own output off unless ``verbose`` is given.
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
    if quiet:
        echo = _silent
        if options is None:
            settings.setdefault("verbose", 0)
    opts = options or TrainOptions.resolve(label=label, validation=validation, **settings)
    if opts.data.label != label:  # options resolved without it (or for another label)
        opts = replace(opts, data=replace(opts.data, label=label))
    t_run = time.perf_counter()
    choose_backend()  # a backend daskfeed does not run on is refused at once
    held = _prepare(data, validation, opts, echo)
    try:
        return _run(data, label, validation, opts, echo, stop, held, t_run)
    finally:
        held.lock.release()  # (a process killed gives it back too)


@dataclass(frozen=True)
class _Held:
    """What :func:`_prepare` checked and holds before any cluster.

    The rank, the output directory, its checkpoint store, the checkpoint to resume (or None)
    and the directory's lock (held before any checkpoint is looked at: one run at a time).
    """

    ranks: Rank
    out: str
    store: CheckpointStore
    ckpt: Checkpoint | None
    lock: OutputLock


def _run(data: DataSpec, label: str, validation: DataSpec | None, opts: TrainOptions, echo: Echo,
         stop: Stop | None, held: _Held, t_run: float) -> TrainResult:
    """The run, once its output directory is held: cluster, data, fit, outputs."""
    ranks, out, store, ckpt = held.ranks, held.out, held.store, held.ckpt
    # the files listed while the cluster starts (resuming: the run's own files, see resume_data)
    so = dict(opts.data.read.storage_options) or None
    listing = Listing(data, so) if ckpt is None else None
    val_listing = Listing(validation, so) if validation is not None else None
    loading = KerasLoad()
    try:
        loading.ahead(label, opts, listing, ckpt)  # (while the cluster starts)
        client, budget, link = _connect(opts, echo, loading.allow)
        run = Run(data, label, validation, opts, echo, stop, ranks, out, store, ckpt, client,
                  budget, link, listing=listing, val_listing=val_listing)
    except BaseException:
        loading.join()
        raise
    run.progress = loading.once_scanning(scan_bar(echo))
    try:
        with RSSSampler() as rss:
            train_seq, val_seq, reused = _open_data(run)
            from daskfeed.training import _fit as fitting  # loaded with the training sequence

            history, net, bad_report, stopping = fitting.fit(run, train_seq, val_seq, reused, rss)
        fitting.summary(run, history, bad_report, time.perf_counter() - t_run, rss, stopping,
                        train_seq.stream.built_line())
        return TrainResult(run.out, numbered(history), train_seq.manifest, run.budget, run.link,
                           net)
    finally:
        run.close()
        loading.join()  # an error said before keras loaded: stderr is the process's own again


def _prepare(data: DataSpec, validation: DataSpec | None, opts: TrainOptions,
             echo: Echo) -> _Held:
    """Check what can be checked before any cluster: paths, TensorBoard, ranks, the checkpoint."""
    for spec in (data, validation):
        if spec is not None:
            refuse_missing_local(spec)
    if opts.tensorboard:
        require_tensorboard()
    ranks = resolve_rank(opts.cluster.rank, opts.cluster.world_size)
    if ranks.several and not opts.cluster.scheduler:
        raise SettingError(
            "Expected one Dask cluster shared by the trainers (--scheduler or --scheduler-file) "
            f"with several trainers. Received: {ranks.describe()} and no scheduler.\nHint: start "
            "'dask scheduler' and 'dask worker' processes (see deploy/) and pass --scheduler to "
            "every rank; or --rank 0 --world-size 1 to train alone.")
    out = rank_output(opts.output, ranks)
    os.makedirs(out, mode=0o700, exist_ok=True)
    lock = OutputLock(out)
    try:
        store, ckpt = open_store(out, resume=opts.resume, echo=echo)
        if opts.resume:
            ckpt = _elastic(ranks, opts.output, store, ckpt, echo)
        if ckpt is None:  # a fresh run: the order of the one before it no longer describes out/
            forget_order(out)
    except BaseException:
        lock.release()
        raise
    return _Held(ranks, out, store, ckpt, lock)


def _elastic(ranks: Rank, output: str, store: CheckpointStore, ckpt: Checkpoint | None,
             echo: Echo) -> Checkpoint | None:
    """The checkpoint a rank resumes from when the number of trainers changed: rank 0's.

    Rank 0's checkpoint (in ``output``) says how many trainers the run had. With another
    number now, every rank resumes from it: its model, and its position in the global order,
    which the new trainers share out among themselves. A rank's own older checkpoints (of the
    old layout) are removed, and rank 0's is copied in their place (rank 0 removes its older
    checkpoints as it writes new ones). Checkpoints of windows of blocks stay as they are (the cursor
    check refuses another number of trainers for them, with a hint).
    """
    chief = ckpt if ranks.rank == 0 else CheckpointStore(os.path.join(output, "checkpoints")).latest()
    if chief is None or not chief.cursor.global_order or chief.cursor.shard[1] == ranks.world_size:
        return ckpt
    source = chief.path
    if ranks.rank > 0:  # a copy of its own: rank 0 prunes its checkpoints as it trains on
        store.clear()
        os.makedirs(store.directory, mode=0o700, exist_ok=True)
        name = os.path.basename(chief.path)
        shutil.copytree(chief.path, os.path.join(store.directory, name))
        chief = store.read(name)
    who = "every rank" if ranks.several else "the trainer"
    echo(f"the run had {chief.cursor.shard[1]} trainer(s), now {ranks.world_size}: {who} resumes "
         f"from rank 0's checkpoint {source}, at batch {chief.cursor.at + 1} of epoch "
         f"{chief.cursor.epoch + 1}'s global order")
    return chief


def _connect(opts: TrainOptions, echo: Echo,
             spawning: Callable[[], None]) -> tuple[Client, Budget, str | None]:
    """Start or reach the cluster, install daskfeed's page and metrics, say where to watch.

    ``spawning``: called as the cluster's workers start (keras' load may then begin). Returns
    the client, the budget it works in and the dashboard's address.
    """
    client, budget = opts.cluster.open(echo, storage_options=dict(opts.data.read.storage_options),
                                       spawning=spawning)
    links = install(client)
    link = links.dashboard if links else getattr(client, "dashboard_link", None) or None
    if link:
        echo(f"dashboard: {link}")
    if links:
        echo(f"daskfeed page: {links.page} (charts: {links.charts}, Prometheus: {links.metrics})")
    return client, budget, link


def _open_data(run: Run) -> tuple[DaskSequence, DaskSequence | None, bool]:
    """The training and validation sequences (scanned, or from a reused manifest), described.

    Returns the two sequences and whether the training manifest was reused.
    """
    opts, echo = run.opts, run.echo
    if run.ckpt:  # on the files the run started with (new ones join at the next run)
        run.data = resume_data(run)
    shared = _join_scan(run)
    cached = ((shared.get("train") if shared is not None else None)
              or _cached_manifest(os.path.join(run.out, RUNNING_MANIFEST))  # (a run cut short)
              or _cached_manifest(os.path.join(run.out, "manifest.json")))
    if cached is not None and opts.fit.class_weight == "balanced" and not cached.label_counts:
        cached = None  # made before the scan kept label counts: rescan
    if opts.cluster.scheduler and cached is not None:  # before any window is sent to a worker
        check_worker_memory(run.client, largest_block(cached), what="block")
    t0 = time.perf_counter()
    train_seq = _train_sequence(run, cached)
    run.closing.append(train_seq)
    manifest = train_seq.manifest
    refuse_single_class(manifest)  # before any fit, whatever the model
    if run.ckpt:  # refuse other data, batch size, seed, features before anything is trained
        cur = run.ckpt.cursor
        cur.check(train_seq.stream.state(cur.epoch, cur.batch), f"The checkpoint {run.ckpt.path}")
    # manifest.json is published beside the model it trains, at the end (inference._runs)
    manifest.to_json(os.path.join(run.out, RUNNING_MANIFEST))
    if not run.ckpt and run.ranks.rank == 0:
        keep_started(opts.output, train_seq.source)
    took = time.perf_counter() - t0
    how = ("manifest reused" if manifest is cached else
           f"nothing scanned: every part as the last scan found it, in {took:.1f}s"
           if manifest.scanned_parts == 0 else f"scanned in {took:.1f}s")
    if manifest is not cached and manifest.scan_line:
        echo(manifest.scan_line)
    echo(f"train data: {manifest.summary()} ({how})")
    echo(train_seq.cache_status)
    echo(f"features ({len(train_seq.features)}): {', '.join(train_seq.features)}")
    skips = train_seq.stream.skips  # (this run's: a resume adds its checkpoint's when it starts)
    echo(f"{len(train_seq)} batches of {train_seq.batch_size} "
         + (f"in epoch {train_seq.epoch + 1} (--skip-batches {skips.text()}: an epoch with skipped "
            "batches has fewer)" if skips else "per epoch")
         + f"; {train_seq.stream.order_line()}")
    if run.ranks.several:
        echo(shard_line(run.ranks, train_seq))
    with scan_span(run.client, name="validation"):
        val_seq = _validation_sequence(run, train_seq,
                                       shared.get("validation") if shared is not None else None)
    if val_seq is not None:
        run.closing.append(val_seq)
        if opts.data.validation_split and not opts.data.features:
            _warn_split_ids(train_seq, val_seq)
    if shared is not None:  # the other ranks reuse what this one scanned
        shared.share(train=manifest, validation=val_seq.manifest if val_seq else None)
    if opts.cluster.scheduler:  # workers too small for these windows: say so before training
        check_worker_memory(run.client, planned_window_bytes(train_seq, val_seq))
    return train_seq, val_seq, manifest is cached


def _warn_split_ids(train_seq: DaskSequence, val_seq: DaskSequence) -> None:
    """Warn of numeric row ids that only the whole data show (a split's parts each miss some rows).

    Row numbers are consecutive over the data, not over the blocks either part holds; the
    training part already warned of the ids it could see (names, text) on its own.
    """
    seen = id_like(train_seq.manifest.columns, train_seq.features)
    numeric = [n for n in train_seq.features if n not in seen
               and train_seq.manifest.columns[n].kind == "numeric"
               and n in val_seq.manifest.columns]
    whole = {n: joined(train_seq.manifest.columns[n], val_seq.manifest.columns[n]) for n in numeric}
    if ids := id_like(whole, numeric):
        warn_user(id_warning(ids))


def _silent(line: str) -> None:
    """``echo`` of a quiet run: progress lines go nowhere."""


def _train_settings(run: Run, blocksize: int) -> DataSettings:
    """The training data's settings: resolved at the entry, with what the run decided since.

    The block size (asked for, a reused manifest's or the budget's), this rank's shard, the
    budget's shares of prefetch and window bytes; nothing else is looked up or copied.
    """
    d, budget = run.opts.data, run.budget
    return replace(d, read=replace(d.read, blocksize=blocksize), blocksize_given=True,
                   shard=run.ranks.shard, prefetch_bytes=budget.stream_share(),
                   window_bytes=budget.window_bytes)


def _serving(run: Run) -> dict[str, Any]:
    """What the training and validation sequences share when serving: spans, stop request."""
    return {"spans": run.spans, "stop": run.stop}


def _train_sequence(run: Run, cached: Manifest | None) -> DaskSequence:
    """The training sequence: of the reused manifest, else (or when it no longer fits) scanned.

    The data are prepared before keras is imported: a mistake in them or in the settings is
    said without waiting seconds for TensorFlow to load.
    """
    d, ckpt, budget = run.opts.data, run.ckpt, run.budget
    block = ckpt.cursor.blocksize if ckpt else blocksize_for(d.asked_blocksize, budget, cached,
                                                             d.cache.on, run.echo)
    # resuming: the same blocks as the interrupted run, whatever the budget; windows of blocks
    # are part of their order (the global order's windows are this budget's)
    pinned: dict[str, Any] = ({"window_rows": ckpt.cursor.window_rows}
                              if ckpt and not ckpt.cursor.global_order else {})
    settings = _train_settings(run, block)

    def prepare(manifest: Manifest | None) -> Prepared:
        with scan_span(run.client, name="train"):
            return Prepared(run.listing or run.data, settings, client=run.client, manifest=manifest,
                            scan_progress=run.progress)

    if cached is None:
        prepared = prepare(None)
    else:
        try:
            prepared = prepare(cached)
        except ManifestMismatchError as err:
            # other files, or a setting that shapes the manifest changed: routine, said as such
            run.echo(f"rescanning: {err.change or str(err).splitlines()[0]}")
            prepared = prepare(None)
    from daskfeed.adapters import DaskSequence  # keras: once the training data are ready

    return DaskSequence.of(prepared, **_serving(run), **pinned)


def _validation_sequence(run: Run, train_seq: DaskSequence,
                         manifest: Manifest | None) -> DaskSequence | None:
    """The validation sequence: of ``validation``, of the split's held-out part, or None.

    ``manifest``: one another rank published for it, reused if it still describes the data.
    """
    d, echo = run.opts.data, run.echo
    if not (run.validation or d.validation_split):
        return None
    from daskfeed.adapters import DaskSequence

    train = train_seq.stream.data.settings
    same = replace(train, features=tuple(train_seq.features), exclude=(), shuffle=False,
                   shard=(0, 1), prefetch_bytes=run.budget.validation_share(),
                   skip_batches=Skips())

    def serve(data: DataSpec | Listing, settings: DataSettings, m: Manifest | None) -> DaskSequence:
        prepared = Prepared(data, settings, client=run.client, manifest=m,
                            reference=train_seq.manifest, scan_progress=run.progress)
        return DaskSequence.of(prepared, **_serving(run))

    if d.validation_split:
        held_out = replace(same, subset="validation")  # of the training files as listed for it
        seq = _reusing(manifest, lambda m: serve(run.listing or run.data, held_out, m))
        held = len((seq.manifest.split or {})["validation_partitions"])
        share = seq.manifest.rows / max(seq.manifest.rows + train_seq.manifest.rows, 1)
        coarse = ("; whole blocks: lower --blocksize for a split nearer "
                  f"{d.validation_split:g}" if abs(share - d.validation_split) >
                  0.5 * d.validation_split else "")
        echo(f"validation split {d.validation_split:g} by whole blocks (seed "
             f"{train_seq.seed}): {seq.manifest.rows:,} rows ({share:.1%}) in {held} of "
             f"{len(seq.manifest.blocks)} blocks held out{coarse}; training on the other "
             f"{train_seq.manifest.rows:,} rows (their statistics only)")
        return seq
    assert run.validation is not None
    validation = run.val_listing or run.validation
    block = train_seq.source.options.blocksize
    weight = d.weight if d.weight and _has_column(run, validation, d.weight, block) else None
    plain = replace(same, weight=weight, validation_split=0.0, subset=None)
    seq = _reusing(manifest, lambda m: serve(validation, plain, m))
    echo(f"validation data: {seq.manifest.rows:,} rows in {len(seq.manifest.blocks)} blocks")
    return seq


def _reusing(manifest: Manifest | None,
             make: Callable[[Manifest | None], DaskSequence]) -> DaskSequence:
    """``make(manifest)`` if that manifest still describes the data, else ``make(None)`` (a scan)."""
    if manifest is None:
        return make(None)
    try:
        return make(manifest)
    except ManifestMismatchError:
        return make(None)


def _join_scan(run: Run) -> SharedScan | None:
    """Several trainers: the scan lock of these data on the shared scheduler (None: one trainer)."""
    if not run.ranks.several:
        return None
    run.echo(f"trainer {run.ranks.describe()}")
    d = run.opts.data
    key = scan_key(data=run.data, validation=run.validation, label=run.label,
                   vocabulary_size=d.vocabulary_size, read=replace(d.read, storage_options=()),
                   asked_blocksize=d.asked_blocksize, validation_split=d.validation_split,
                   seed=d.seed)
    shared = join_scan(run.client, key, wait=run.opts.cluster.rank_wait, echo=run.echo)
    run.closing.append(shared)
    return shared


def _has_column(run: Run, data: DataSpec | Listing, name: str, blocksize: int) -> bool:
    """Whether the header of ``data`` names column ``name`` (one line read)."""
    options = replace(run.opts.data.read, blocksize=blocksize)
    if isinstance(data, Listing):  # what its listing says is said once, here or later: not lost
        data.files(dict(options.storage_options))
    with warnings.catch_warnings():  # the DaskSequence says what the Source has to say
        warnings.simplefilter("ignore")
        src = Source(data, options=options)
    return name in src.header()


def _cached_manifest(path: str) -> Manifest | None:
    """The manifest an earlier run wrote to ``path`` (None: none, unreadable, or an older format)."""
    return read_reusable(path)
