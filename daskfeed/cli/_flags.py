"""The CLI's flags: the groups commands share, and the values they pop into.

How one flag's value is read (types, callbacks) is :mod:`daskfeed.cli._flag_types`.

Nothing heavy at import: ``daskfeed --help`` loads neither keras nor pandas nor distributed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from daskfeed.cli._flag_types import (
    ByteSize,
    ConfigOption,
    Duration,
    MemorySize,
    column_list,
    dtype_pairs,
    layer_sizes,
    parse_storage_options,
    separator,
)

if TYPE_CHECKING:
    from distributed.security import Security

F = TypeVar("F", bound=Callable[..., Any])  # a click command's function


def _config_option(*decls: str, key: str, **kwargs: Any) -> Callable[[F], F]:
    return click.option(*decls, cls=ConfigOption, config_key=key, **kwargs)


def _apply(options: list[Callable[[F], F]], fn: F) -> F:
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def cluster_options(fn: F) -> F:
    """Where the work runs and within which memory: shared by train, demo and scan.

    Parameters
    ----------
    fn
        The command's function.

    Returns
    -------
    callable
        ``fn`` with the flags added.
    """
    return _apply([
        click.option("--memory-limit", type=MemorySize(), default=None,
                     help="Budget of the whole process tree (trainer + workers), e.g. 14GB or 14GiB. "
                          "Default: 75% of RAM."),
        click.option("--nworkers", type=click.IntRange(1), default=None,
                     help="Dask workers of the local cluster (default: cores, at most 4)."),
        click.option("--nthreads", type=click.IntRange(1), default=1, show_default=True,
                     help="Threads per worker."),
        _config_option("--dashboard-address", key="dashboard-address",
                       help="Where the Dask dashboard listens (a port the OS picks if taken)."),
        click.option("--scheduler", default=None,
                     help="Address (tcp://host:8786) of a running Dask scheduler to use instead "
                          "of a local cluster."),
        click.option("--scheduler-file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Scheduler file of a running Dask cluster."),
        click.option("--tls-ca-file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="CA certificate (PEM) of a tls:// scheduler and its workers."),
        click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="This client's certificate (PEM, signed by --tls-ca-file) for a tls:// "
                          "scheduler; may also hold the key."),
        click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="This client's private key (PEM) when not in --tls-cert."),
    ], fn)


def data_options(fn: F) -> F:
    """How the files are read (part of the manifest's fingerprint): shared by train, demo, scan.

    Parameters
    ----------
    fn
        The command's function.

    Returns
    -------
    callable
        ``fn`` with the flags added.
    """
    return _apply([
        click.option("--sep", "--delimiter", "sep", default=None, callback=separator,
                     show_default="',' (a tab when every file is .tsv)",
                     help="Field delimiter: ';', '|', or '\\t' (tab) for TSV."),
        click.option("--encoding", default="utf-8", show_default=True,
                     help="Text encoding of the CSV files (e.g. latin-1)."),
        click.option("--storage-options", multiple=True, callback=parse_storage_options,
                     metavar="JSON|KEY=VALUE|@FILE",
                     help="fsspec options for s3:// and other URLs, as JSON, KEY=VALUE pairs or "
                          "@FILE.json, a file holding a JSON object (repeatable), e.g. "
                          "endpoint_url=http://127.0.0.1:9000. Credentials: prefer the "
                          "environment (AWS_ACCESS_KEY_ID, AWS_PROFILE ...) on the trainer and "
                          "every worker, or @FILE.json (chmod 600): on the command line any user "
                          "of the machine can read them (warned). Values given are sent to the "
                          "workers and never printed."),
        click.option("--na-values", callback=column_list, default=None,
                     help="Comma-separated null markers that are missing in EVERY column, text "
                          "too (e.g. NA,N/A). Without it empty fields are missing everywhere and "
                          "NA, N/A, null, NaN... only in numeric columns."),
        click.option("--decimal", default=".", show_default=True,
                     help="The numbers' decimal point: ',' for files written as 1,5 (many "
                          "locales; then usually --sep ';')."),
        click.option("--dtype", callback=dtype_pairs, default=None,
                     help="Column types to force, COLUMN=TYPE[,...]: e.g. zip=string keeps a "
                          "column of digits as text (a category)."),
        _config_option("--vocabulary-size", key="vocabulary-size", type=click.IntRange(1),
                       help="Most frequent values kept per text column; the rest share one "
                            "out-of-vocabulary code."),
        _config_option("--blocksize", key="blocksize", type=ByteSize(),
                       help="CSV bytes per block, e.g. 16MiB. Without it (and without a "
                            "daskfeed.blocksize other than the shipped 64MiB) it follows from "
                            "--memory-limit."),
        click.option("--bad-lines", type=click.Choice(["error", "skip", "quarantine"]), default="error",
                     show_default=True,
                     help="Lines with the wrong number of fields: stop with an error, skip them "
                          "(counted), or quarantine them (train: also written to "
                          "OUTPUT/rejects.csv)."),
        click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
                     help="Directory of the parse cache (each CSV block parsed once, kept as Arrow; "
                          "later epochs read no CSV); an error if it lacks room. Default: "
                          "daskfeed.cache-dir, else ~/.cache/daskfeed, when the disk has room."),
        click.option("--no-cache", is_flag=True, help="Parse the CSV every epoch; write no cache."),
        _config_option("--timeout", key="timeout", type=Duration(),
                       help="Longest wait for one window of batches (or one scan task) from the "
                            "cluster (e.g. 300, 90s, 5min) before stopping with an error naming "
                            "its blocks."),
    ], fn)


def train_options(fn: F) -> F:
    """Everything ``train`` and ``demo`` take besides the data and the output.

    Parameters
    ----------
    fn
        The command's function.

    Returns
    -------
    callable
        ``fn`` with the flags added.
    """
    return _apply([
        click.option("--features", callback=column_list,
                     help="Comma-separated feature columns (default: all but label)."),
        click.option("--exclude", callback=column_list,
                     help="Comma-separated columns to leave out ('' or a leading comma: the "
                          "column with an empty header, e.g. the row numbers pandas writes)."),
        click.option("--epochs", type=click.IntRange(1), default=3, show_default=True),
        _config_option("--batch-size", key="batch-size", type=click.IntRange(1)),
        cluster_options,
        click.option("--model", default=None,
                     help="Your model builder, module:function or file.py:function, called with "
                          "the manifest (compiled for the label's task if it is not)."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--as-matrix", is_flag=True, help="Feed x as one float32 matrix of numeric features."),
        data_options,
        click.option("--verbose", type=click.IntRange(0, 2), default=None, help="Keras verbosity."),
        click.option("--quiet", "-q", is_flag=True,
                     help="Print only warnings and errors (no progress bars, no summary)."),
        click.option("--tensorboard", type=click.Path(file_okay=False), default=None,
                     help="Also write TensorBoard logs to this directory (Keras' callback)."),
        _config_option("--checkpoint-every", key="checkpoint-every", type=click.IntRange(0),
                       help="Batches between checkpoints (model + optimizer + data cursor) in "
                            "OUTPUT/checkpoints; epoch ends are always checkpointed; 0: only those."),
        click.option("--resume", is_flag=True,
                     help="Continue from the newest good checkpoint in OUTPUT at exactly its epoch "
                          "and batch (refused if data, batch size or seed changed). Batches trained "
                          "after that checkpoint were not committed and are trained again. Without "
                          "--resume, old checkpoints in OUTPUT are removed."),
        click.option("--skip-batches", default=None, metavar="E:S[-S],...",
                     help="Leave these batches of the global order out, e.g. 3:48200-48260,4:17 "
                          "(epoch:step or epoch:first-last, numbered as `daskfeed rows` and the "
                          "loss spikes number them): left out alike on every run and rank (ranks "
                          "keep equal step counts), kept in the checkpoints (a --resume goes on "
                          "skipping them and adds these), counted in the summary and history.json."),
        fit_options,
    ], fn)


def fit_options(fn: F) -> F:
    """Weights, validation split, early stopping and the default model's knobs (train, demo).

    Parameters
    ----------
    fn
        The command's function.

    Returns
    -------
    callable
        ``fn`` with the flags added.
    """
    return _apply([
        click.option("--weight", metavar="COL", default=None,
                     help="Column of per-row sample weights (>= 0; not a feature): batches are "
                          "(x, y, w); validation is weighted too when its data have the column."),
        click.option("--class-weight", metavar="balanced|JSON", default=None,
                     help="Class weights: 'balanced' (from the scan's label counts) or JSON such "
                          "as '{\"0\": 1, \"1\": 9}'. Printed and written to history.json. Not "
                          "with --weight."),
        click.option("--validation-split", type=click.FloatRange(0, 1, min_open=True, max_open=True),
                     default=None, metavar="FRACTION",
                     help="When no validation data are given, hold out about this fraction of "
                          "the data (whole blocks drawn with --seed) for validation; "
                          "statistics come from the rest."),
        click.option("--early-stopping", type=click.IntRange(0), default=None, metavar="PATIENCE",
                     help="Stop after PATIENCE epochs without improvement of --monitor and "
                          "restore the best epoch's weights; kept across --resume."),
        click.option("--monitor", default=None,
                     help="What early stopping watches [default: val_loss with validation data, "
                          "else loss]."),
        click.option("--hidden", callback=layer_sizes, default=None, metavar="N,N,...",
                     help="Hidden layer sizes of the default model [default: 64,64]."),
        click.option("--learning-rate", type=click.FloatRange(0, min_open=True), default=None,
                     help="Adam's learning rate [default: 0.001]; with --model, used if the "
                          "builder's model comes uncompiled."),
        click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=None,
                     help="Dropout after each hidden layer of the default model [default: 0]."),
        click.option("--handoff", type=click.Choice(["auto", "tf-data", "dataloader", "pydataset"]),
                     default=None,
                     help="How batches reach Keras: tf-data (a tf.data pipeline fed a chunk of "
                          "batches per Python call; TensorFlow only), dataloader (a torch "
                          "DataLoader of batches read a run at a time; PyTorch only), pydataset "
                          "(the PyDataset, one call per batch), auto: tf-data on TensorFlow, "
                          "dataloader on PyTorch, pydataset on JAX [default: daskfeed.handoff, "
                          "auto]. Same batches either way."),
        click.option("--feed", type=click.Choice(["auto", "windows", "batches"]), default=None,
                     help="Deprecated: --handoff's old name (windows = tf-data, batches = "
                          "pydataset); still taken, with a warning."),
    ], fn)


def scheduler_and_security(kw: dict[str, Any]) -> tuple[str | None, Security | None]:
    """Pop the scheduler and TLS flags: the scheduler address (or file) and a Security.

    Parameters
    ----------
    kw
        The command's keyword arguments; the scheduler and TLS flags are popped from it.

    Returns
    -------
    tuple
        The scheduler's address or file (None: a local cluster) and the TLS ``Security``
        (None: no TLS).

    Raises
    ------
    click.UsageError
        TLS flags without a scheduler.
    """
    scheduler_file = kw.pop("scheduler_file")
    scheduler = kw.pop("scheduler") or scheduler_file
    from daskfeed.cluster import make_security

    security = make_security(kw.pop("tls_ca_file"), kw.pop("tls_cert"), kw.pop("tls_key"))
    # a lost scheduler makes the client log each reconnect attempt with a traceback, and its
    # batched stream the write it was doing when the connection broke ("Batched Comm Closed", at
    # INFO with a traceback); daskfeed reports the loss itself, once, naming the window
    # (ClusterError). After distributed's import, which configures its loggers.
    import distributed  # noqa: F401

    logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
    logging.getLogger("distributed.batched").setLevel(logging.WARNING)  # its errors still show
    if security is not None and not scheduler:
        raise click.UsageError("--tls-ca-file/--tls-cert/--tls-key need --scheduler or --scheduler-file")
    return scheduler, security


def cache_choice(kw: dict[str, Any]) -> bool | str:
    """Pop ``--cache DIR`` / ``--no-cache``: False, a directory, or True (the default place).

    Parameters
    ----------
    kw
        The command's keyword arguments; ``cache_dir`` and ``no_cache`` are popped from it.

    Returns
    -------
    bool or str
        False (no cache), the cache's directory, or True (the default place).

    Raises
    ------
    click.UsageError
        Both flags given.
    """
    cache_dir, no_cache = kw.pop("cache_dir"), kw.pop("no_cache")
    if cache_dir and no_cache:
        raise click.UsageError("--cache DIR and --no-cache exclude each other")
    return False if no_cache else (cache_dir or True)


def predict_timeout_option(fn: F) -> F:
    """``predict``'s ``--timeout``: the longest wait for one block's scoring.

    Parameters
    ----------
    fn
        The command's function.

    Returns
    -------
    callable
        ``fn`` with the flag added.
    """
    return _config_option("--timeout", key="timeout", type=Duration(),
                          help="Longest wait for one block's scoring from the cluster (e.g. 300, "
                               "90s, 5min) before stopping with an error naming the block.")(fn)
