"""Train: cluster + budget + sequences + model + telemetry + outputs (used by the CLI).

``train(...)`` is also the Python entry point for the whole job; it imports keras only when
called, so the CLI's ``--help`` stays light.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from daskfeed.cluster import Budget, close_client, connect, start_local_cluster

__all__ = ["RSSSampler", "TrainResult", "default_memory_limit", "train"]


class RSSSampler:
    """Samples the RSS of this process and all its children (the workers) in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        import psutil

        self._proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self.overall_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="daskfeed-rss", daemon=True)

    def sample(self) -> int:
        """Current RSS of the process tree in bytes."""
        import psutil

        total = 0
        for p in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = self.sample()
            self.peak = max(self.peak, rss)
            self.overall_peak = max(self.overall_peak, rss)

    def reset_peak(self) -> None:
        """Start a new peak (e.g. at each epoch)."""
        self.peak = self.sample()

    def __enter__(self) -> RSSSampler:
        self.reset_peak()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


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


def default_memory_limit() -> int:
    """75 % of this machine's RAM."""
    import psutil

    return int(psutil.virtual_memory().total * 0.75)


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

    A manifest in ``output`` from an earlier run is reused, with its partitions and parse cache,
    whatever the budget, cluster shape, batch size or model; when the files or a setting that
    shapes it (label, vocabulary size, a read option) changed, the data are scanned again and
    the new manifest and cache replace the old ones.
    """
    from daskfeed._keras import keras
    from daskfeed.exceptions import ManifestMismatchError
    from daskfeed.manifest import Manifest
    from daskfeed.model import EpochTelemetry, compile_for, default_model, load_builder
    from daskfeed.sequence import DaskSequence

    out = os.fspath(output)
    os.makedirs(out, mode=0o700, exist_ok=True)
    keras.utils.set_random_seed(seed)
    builder = load_builder(model) if isinstance(model, str) else model
    from daskfeed import config
    from daskfeed.checkpoint import Checkpointer, Cursor, fit_from, open_store

    every = int(config.get("checkpoint-every", checkpoint_every))
    store, ckpt = open_store(out, resume=resume, echo=echo)
    # resuming: the same partitions and windows as the interrupted run, whatever the budget
    pinned: dict[str, Any] = {"window_rows": ckpt.cursor.window_rows} if ckpt else {}

    shown = memory_limit if isinstance(memory_limit, str) else None
    limit = memory_limit if memory_limit is not None else default_memory_limit()
    if scheduler:
        client = connect(scheduler, security=security)
        try:
            budget = Budget.remote(limit, client)
        except BaseException:
            close_client(client)
            raise
        echo(f"connected to {client.scheduler.address}: {budget.nworkers} workers × "
             f"{budget.worker / 1e9:.2f} GB ({budget.nthreads} threads); memory limit of this "
             f"trainer process {shown or f'{budget.total / 1e9:.2f}GB'}: prefetch "
             f"{budget.prefetch / 1e9:.2f} GB, shuffle windows of {budget.window_bytes / 2**20:.0f} MiB CSV")
    else:
        budget = Budget.split(limit, nworkers=nworkers, nthreads=nthreads)
        echo(f"memory limit: {budget.describe(shown)}")
        client = start_local_cluster(budget, dashboard_address=dashboard_address,
                                     processes=processes)
    link = client.dashboard_link if getattr(client, "dashboard_link", None) else None
    if link:
        echo(f"dashboard: {link}")
    seqs: list[Any] = []
    try:
        with RSSSampler() as rss:
            cached = _cached_manifest(os.path.join(out, "manifest.json"))
            block = _layout(blocksize, budget, cached, cache, echo)
            common = {"label": label, "batch_size": batch_size, "client": client,
                      "window_bytes": budget.window_bytes, "blocksize": block,
                      "as_matrix": as_matrix, "encoding": encoding, "timeout": timeout,
                      "cache": cache, "bad_lines": bad_lines, "sep": sep, "na_values": na_values,
                      "vocabulary_size": vocabulary_size, "dtype": dtype}
            if ckpt:
                common["blocksize"] = ckpt.cursor.blocksize
            t0 = time.perf_counter()
            try:
                train_seq = DaskSequence(data, features=features, exclude=exclude, seed=seed,
                                         prefetch_bytes=budget.prefetch * 2 // 3, manifest=cached,
                                         **common, **pinned)
            except ManifestMismatchError as err:
                if cached is None:
                    raise
                # other files, or a setting that shapes the manifest changed: rebuild it
                echo(f"rescanning: {str(err).splitlines()[0]}")
                cached = None
                train_seq = DaskSequence(data, features=features, exclude=exclude, seed=seed,
                                         prefetch_bytes=budget.prefetch * 2 // 3, **common, **pinned)
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
            val_seq = None
            if validation:
                val_seq = DaskSequence(validation, features=train_seq.features, shuffle=False,
                                       reference=manifest, prefetch_bytes=budget.prefetch // 3,
                                       **common)
                seqs.append(val_seq)
                echo(f"validation data: {val_seq.manifest.rows:,} rows in "
                     f"{len(val_seq.manifest.partitions)} partitions")
            # written now, not at the end: an interrupted run keeps its quarantined lines
            bad_report = _bad_lines(out, bad_lines, manifest is cached, train_seq, val_seq)
            if builder is not None:
                net = builder(manifest)
                if not isinstance(net, keras.Model):
                    from daskfeed.exceptions import SchemaError

                    raise SchemaError(
                        f"Expected the model builder to return a keras.Model. Received: "
                        f"{type(net).__name__}.\nHint: return the model from your function."
                    )
                if not net.compiled:
                    compile_for(net, manifest)
                    echo(f"model from {model if isinstance(model, str) else 'the builder'} was not "
                         f"compiled; compiled for the {manifest.task} label with "
                         f"{_describe_compile(net)}")
            else:
                net = default_model(manifest, features=train_seq.features, as_matrix=as_matrix)
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
            echo(f"checkpoints: {f'every {every} batches and ' if every else ''}at epoch ends in "
                 f"{store.directory} (the last {store.keep} kept)")
            checkpointer = Checkpointer(store, train_seq, every=every, telemetry=telemetry,
                                        history=ckpt.history if ckpt else [])
            if verbose == "auto":
                verbose = 1 if sys.stdout.isatty() else 2
            try:
                fit_from(net, train_seq, epochs=epochs, epoch=start_epoch, batch=start_batch,
                         validation_data=val_seq, shuffle=False, verbose=verbose,
                         callbacks=[telemetry, checkpointer])
            except Exception as err:
                _reraise_feed_error(err, train_seq, val_seq)
                raise
            history = checkpointer.history
            net.save(os.path.join(out, "model.keras"))
            with open(os.path.join(out, "history.json"), "w", encoding="utf-8") as f:
                json.dump({"epochs": history, "memory_limit_bytes": budget.total,
                           "budget": budget.__dict__, "rows_per_epoch": train_seq.rows,
                           "peak_rss_bytes": rss.overall_peak,
                           "bad_lines": bad_report,
                           "resumed_from": ({"checkpoint": ckpt.path, "epoch": ckpt.cursor.epoch,
                                             "batch": ckpt.cursor.batch} if ckpt else None)},
                          f, indent=1)
        last = history[-1] if history else {}
        metric = next((k for k in ("val_accuracy", "val_mean_absolute_error", "val_loss")
                       if k in last), None)
        if metric:
            echo(f"{metric.replace('_', ' ')}: {last[metric]:.4f}")
        echo(f"wrote {out}/model.keras, manifest.json, history.json")
        return TrainResult(out, history, manifest, budget, link, net)
    finally:
        for s in seqs:
            s.close()
        close_client(client)


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

