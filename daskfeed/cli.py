"""The ``daskfeed`` command (also ``dask feed``): thin click commands over library functions.

Nothing heavy is imported at module level: ``daskfeed --help`` loads neither keras nor
tensorflow. Library errors become one clear message and exit 1; bad flags exit 2 with usage.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from daskfeed import config
from daskfeed.exceptions import DaskfeedError, SchemaError
from daskfeed.lifecycle import Aborted, Stop
from daskfeed.options import TrainOptions


class ByteSize(click.ParamType):
    """A size such as ``64MiB`` or ``200MB`` (``dask.utils.parse_bytes``), positive; as bytes.

    ``parse_bytes`` reads ``""`` as 1 byte and takes negative sizes: both are refused here.
    """

    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        """Bytes as an int."""
        from dask.utils import parse_bytes

        if isinstance(value, int):
            n = value
        else:
            text = str(value).strip()
            try:
                n = int(parse_bytes(text)) if text else 0
            except (ValueError, TypeError):
                self.fail(f"expected a size such as 64MiB or 200MB. Received: {value!r}", param, ctx)
        if n <= 0:
            self.fail(f"expected a positive size such as 64MiB. Received: {value!r}", param, ctx)
        return n


class MemorySize(click.ParamType):
    """A size such as ``14GB`` or ``14GiB`` (``dask.utils.parse_bytes``), positive."""

    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        """Validate with ``parse_memory_limit``; keep the user's spelling for the echo."""
        from daskfeed.cluster import parse_memory_limit

        try:
            parse_memory_limit(value)
        except DaskfeedError as err:
            self.fail(str(err), param, ctx)
        return str(value)


class Duration(click.ParamType):
    """A duration such as ``300``, ``300s`` or ``5min`` (``dask.utils.parse_timedelta``), positive."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        """Seconds as a float."""
        from dask.utils import parse_timedelta

        try:
            seconds = float(parse_timedelta(value, default="seconds"))
        except (ValueError, TypeError, KeyError):
            self.fail(f"expected a duration such as 300, 300s or 5min. Received: {value!r}", param, ctx)
        if seconds <= 0:
            self.fail(f"expected a positive duration. Received: {value!r}", param, ctx)
        return seconds


def _columns(ctx: Any, param: Any, value: str | None) -> list[str] | None:
    if value is None:
        return None
    cols = [c.strip() for c in value.split(",") if c.strip()]
    if not value.strip() or value.strip().startswith(","):  # '' or ",id": the unnamed column
        cols.insert(0, "")
    return cols


def _sizes(ctx: Any, param: Any, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"expected comma-separated layer sizes >= 1 such as 128,64. "
                                 f"Received: {value!r}")
    return sizes


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM so it unwinds like Ctrl-C (clusters closed)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    # once: a second SIGTERM while shutting down must not abort the shutdown itself
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def _watch_signals(stop: Stop) -> Callable[[], None]:
    """Request ``stop`` as soon as SIGTERM / SIGINT arrives; return the undo function.

    Python runs signal handlers in the main thread only between bytecodes; while it waits
    inside TensorFlow for a batch that is stuck on a hung read, the handler would run only
    after ``--timeout``. The C-level handler also writes the signal number to the wakeup fd at
    once: a thread reading it requests ``stop`` (which the command hands to the sequences),
    the wait for the window ends, TensorFlow returns, and the handler runs (exit 143 / 130).
    """
    r, w = socket.socketpair()
    w.setblocking(False)
    try:
        old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter: nothing to watch
        r.close()
        w.close()
        return lambda: None

    def watch() -> None:
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            stops = [b for b in data if b in (signal.SIGTERM, signal.SIGINT)]
            if stops:
                stop.request(stops[0])

    threading.Thread(target=watch, daemon=True, name="daskfeed-signals").start()

    def undo() -> None:
        signal.set_wakeup_fd(old)
        w.close()
        r.close()

    return undo


def _warnings_as_lines() -> Callable[[], None]:
    """Print warnings as one line, ``warning: <message>``, here and in local workers; undo fn.

    The workers of a local cluster are new processes: they read ``daskfeed.warnings`` from the
    environment and from the config the nanny hands them, and format their warnings the same
    way when they import daskfeed (the cluster's preload does).
    """
    import dask.config


    env = "DASK_DASKFEED__WARNINGS"
    before = os.environ.get(env)
    os.environ[env] = "line"
    setting = dask.config.set({"daskfeed.warnings": "line"})
    config.one_line_warnings(True)

    def undo() -> None:
        config.one_line_warnings(False)
        setting.__exit__(None, None, None)
        if before is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = before

    return undo


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn daskfeed's user-facing errors into ``click.ClickException`` (exit 1, no traceback).

    Ctrl-C (SIGINT) and SIGTERM stop the command the same way: the exception unwinds through
    ``train``, which closes the sequences and the local cluster (workers and ports gone), then
    one line is printed and the exit status is 130 (SIGINT) or 143 (SIGTERM). The command's
    :class:`~daskfeed.lifecycle.Stop` is the click context's object (``find_object(Stop)``).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        main = threading.current_thread() is threading.main_thread()
        stop = click.get_current_context().obj = Stop()
        previous = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
        unwatch = _watch_signals(stop) if main else None
        undo_warnings = _warnings_as_lines()
        try:
            return fn(*args, **kwargs)
        except BaseException as err:
            stopping = isinstance(err, KeyboardInterrupt) or (main and stop.signum is not None)
            if not stopping:  # (a signal can surface as any error raised where it landed)
                if isinstance(err, DaskfeedError):
                    raise click.ClickException(str(err)) from err
                raise
            if main:  # a second Ctrl-C while we print must not spew a traceback
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            recorded = not isinstance(err, KeyboardInterrupt) or isinstance(err, Aborted)
            term = isinstance(err, Terminated) or (recorded and stop.signum == signal.SIGTERM)
            click.echo(f"daskfeed: stopped by {'SIGTERM' if term else 'Ctrl-C (SIGINT)'}; "
                       "cluster connections closed.", err=True)
            sys.exit(128 + (signal.SIGTERM if term else signal.SIGINT))
        finally:
            undo_warnings()
            if unwatch is not None:
                unwatch()
            if main and previous is not None:
                signal.signal(signal.SIGTERM, previous)

    return wrapper


@click.group(name="feed", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="daskfeed")
def cli() -> None:
    """Train Keras models on CSV data sets far larger than memory, fed by a Dask cluster."""


class ConfigOption(click.Option):
    """A flag whose default is the ``daskfeed.<key>`` config value, resolved by the library.

    The flag's own default is ``None`` (so ``DASK_DASKFEED__BATCH_SIZE=512`` or a dask YAML
    file is not masked by a click default); ``--help`` shows the value in effect and its key,
    e.g. ``[default: 1024 (daskfeed.batch-size)]``.
    """

    def __init__(self, *args: Any, config_key: str, **kwargs: Any) -> None:
        kwargs["default"] = None
        super().__init__(*args, **kwargs)
        self.config_key = config_key

    def get_help_extra(self, ctx: click.Context) -> Any:
        """Click's help extras with the configured default."""
        extra = super().get_help_extra(ctx)
        value = config.get(self.config_key)
        shown = '""' if value == "" else "none" if value is None else str(value)
        if self.config_key == "blocksize" and not config.configured("blocksize"):
            shown = f"from the budget, at most {shown}"  # see config.resolve_blocksize
        extra["default"] = f"{shown} (daskfeed.{self.config_key})"
        return extra


def _config_option(*decls: str, key: str, **kwargs: Any) -> Callable[[Any], Any]:
    return click.option(*decls, cls=ConfigOption, config_key=key, **kwargs)


def _apply(options: list[Callable[[Any], Any]], fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Where the work runs and within which memory: shared by train, demo and scan."""
    return _apply([
        click.option("--memory-limit", type=MemorySize(), default=None,
                     help="Budget of the whole process tree (trainer + workers), e.g. 14GB or 14GiB. "
                          "Default: 75% of RAM."),
        click.option("--nworkers", type=click.IntRange(1), default=None,
                     help="Dask workers of the local cluster (default: cores, at most 4)."),
        click.option("--nthreads", type=click.IntRange(1), default=1, show_default=True,
                     help="Threads per worker."),
        _config_option("--dashboard-address", key="dashboard-address",
                       help="Where the Dask dashboard listens (next free port if taken)."),
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


def _separator(ctx: Any, param: Any, value: str) -> str:
    text = {"\\t": "\t", "tab": "\t", "TAB": "\t"}.get(value, value)
    if len(text) != 1:
        raise click.BadParameter(f"expected one character such as ',' ';' or '\\t' (tab). "
                                 f"Received: {value!r}")
    return text


def _dtypes(ctx: Any, param: Any, value: str | None) -> dict[str, str] | None:
    if not value:
        return None
    pairs = [p.strip() for p in value.split(",") if p.strip()]
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise click.BadParameter(f"expected COLUMN=TYPE pairs such as zip=string. Received: {bad[0]!r}")
    return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in pairs)}


def _storage_options(ctx: Any, param: Any, value: tuple[str, ...]) -> dict[str, Any] | None:
    """``--storage-options`` JSON or KEY=VALUE pairs (repeatable) → one dict for fsspec.

    ``KEY=VALUE`` values are JSON when they parse (``anon=true``, ``max_concurrency=4``), else
    text; a dotted key nests (``client_kwargs.region_name=eu-west-1``). Values are never
    echoed: they may hold credentials.
    """
    import json

    merged: dict[str, Any] = {}
    for item in value:
        text = item.strip()
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as err:
                raise click.BadParameter(f"expected a JSON object such as '{{\"anon\": true}}'. "
                                         f"Received text that is not JSON ({err.msg} at "
                                         f"character {err.pos}).") from None
            if not isinstance(parsed, dict):
                raise click.BadParameter("expected a JSON object {...}")
            merged.update(parsed)
            continue
        for pair in text.split():
            key, eq, raw = pair.partition("=")
            if not eq or not key:
                raise click.BadParameter(f"expected KEY=VALUE pairs such as endpoint_url=http://"
                                         f"127.0.0.1:9000 or a JSON object. Received an item "
                                         f"without '=' (key {key[:40]!r}).")
            try:
                val: Any = json.loads(raw)
            except ValueError:
                val = raw
            *parents, last = key.split(".")
            node = merged
            for name in parents:
                node = node.setdefault(name, {})
            node[last] = val
    return merged or None


def _data_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How the files are read (part of the manifest's fingerprint): shared by train, demo, scan."""
    return _apply([
        click.option("--sep", "--delimiter", "sep", default=",", show_default=True,
                     callback=_separator, help="Field delimiter: ';', '|', or '\\t' (tab) for TSV."),
        click.option("--encoding", default="utf-8", show_default=True,
                     help="Text encoding of the CSV files (e.g. latin-1)."),
        click.option("--storage-options", multiple=True, callback=_storage_options,
                     metavar="JSON|KEY=VALUE",
                     help="fsspec options for s3:// and other URLs, as JSON or KEY=VALUE pairs "
                          "(repeatable), e.g. endpoint_url=http://127.0.0.1:9000. Credentials: "
                          "prefer the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE ...) on the "
                          "trainer and every worker; values given here are sent to the workers "
                          "and never printed."),
        click.option("--na-values", callback=_columns, default=None,
                     help="Comma-separated null markers that are missing in EVERY column, text "
                          "too (e.g. NA,N/A). Without it empty fields are missing everywhere and "
                          "NA, N/A, null, NaN... only in numeric columns."),
        click.option("--dtype", callback=_dtypes, default=None,
                     help="Column types to force, COLUMN=TYPE[,...]: e.g. zip=string keeps a "
                          "column of digits as text (a category)."),
        _config_option("--vocabulary-size", key="vocabulary-size", type=click.IntRange(1),
                       help="Most frequent values kept per text column; the rest share one "
                            "out-of-vocabulary code."),
        _config_option("--blocksize", key="blocksize", type=ByteSize(),
                       help="CSV bytes per partition, e.g. 16MiB. Without it (and without a "
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
                            "its partitions."),
    ], fn)


def _train_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    return _apply([
        click.option("--features", callback=_columns,
                     help="Comma-separated feature columns (default: all but label)."),
        click.option("--exclude", callback=_columns,
                     help="Comma-separated columns to leave out ('' or a leading comma: the "
                          "column with an empty header, e.g. the row numbers pandas writes)."),
        click.option("--epochs", type=click.IntRange(1), default=3, show_default=True),
        _config_option("--batch-size", key="batch-size", type=click.IntRange(1)),
        _cluster_options,
        click.option("--model", default=None,
                     help="Your model builder, module:function or file.py:function, called with "
                          "the manifest (compiled for the label's task if it is not)."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--as-matrix", is_flag=True, help="Feed x as one float32 matrix of numeric features."),
        _data_options,
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
        _fit_options,
    ], fn)


def _fit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Weights, validation split, early stopping and the default model's knobs (train, demo)."""
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
                          "the data (whole partitions drawn with --seed) for validation; "
                          "statistics come from the rest."),
        click.option("--early-stopping", type=click.IntRange(0), default=None, metavar="PATIENCE",
                     help="Stop after PATIENCE epochs without improvement of --monitor and "
                          "restore the best epoch's weights; kept across --resume."),
        click.option("--monitor", default=None,
                     help="What early stopping watches [default: val_loss with validation data, "
                          "else loss]."),
        click.option("--hidden", callback=_sizes, default=None, metavar="N,N,...",
                     help="Hidden layer sizes of the default model [default: 64,64]."),
        click.option("--learning-rate", type=click.FloatRange(0, min_open=True), default=None,
                     help="Adam's learning rate [default: 0.001]; with --model, used if the "
                          "builder's model comes uncompiled."),
        click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=None,
                     help="Dropout after each hidden layer of the default model [default: 0]."),
    ], fn)


def _scheduler_and_security(kw: dict[str, Any]) -> tuple[str | None, Any]:
    """Pop the scheduler and TLS flags: the scheduler address (or file) and a Security."""
    from daskfeed.cluster import make_security

    scheduler_file = kw.pop("scheduler_file")
    scheduler = kw.pop("scheduler") or scheduler_file
    security = make_security(kw.pop("tls_ca_file"), kw.pop("tls_cert"), kw.pop("tls_key"))
    # a lost scheduler makes the client log each reconnect attempt with a traceback; daskfeed
    # reports the loss itself, once, naming the window (ClusterError). After distributed's import,
    # which configures its loggers.
    import distributed  # noqa: F401

    logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
    if security is not None and not scheduler:
        raise click.UsageError("--tls-ca-file/--tls-cert/--tls-key need --scheduler or --scheduler-file")
    return scheduler, security


def _cache_choice(kw: dict[str, Any]) -> bool | str:
    """Pop ``--cache DIR`` / ``--no-cache``: False, a directory, or True (the default place)."""
    cache_dir, no_cache = kw.pop("cache_dir"), kw.pop("no_cache")
    if cache_dir and no_cache:
        raise click.UsageError("--cache DIR and --no-cache exclude each other")
    return False if no_cache else (cache_dir or True)


def _start_cluster(memory_limit: str | None, *, nworkers: int | None, nthreads: int,
                   scheduler: str | None, security: Any, dashboard_address: str | None) -> Any:
    """A client and its budget, as ``train`` makes them (a LocalCluster or a running scheduler)."""
    from daskfeed.cluster import open_cluster

    client, budget = open_cluster(memory_limit, nworkers=nworkers, nthreads=nthreads,
                                  scheduler=scheduler, security=security,
                                  dashboard_address=dashboard_address, echo=click.echo)
    if not scheduler and getattr(client, "dashboard_link", None):
        click.echo(f"dashboard: {client.dashboard_link}")
    return client, budget


def _run_train(data: list[str], label: str, validation: list[str], output: str,
               **kw: Any) -> None:
    """Map the flags onto :class:`TrainOptions` (the one place) and train."""
    from daskfeed.train import train as run_train  # keras: only when a command runs

    scheduler, security = _scheduler_and_security(kw)
    cache = _cache_choice(kw)
    verbose, quiet = kw.pop("verbose"), kw.pop("quiet")
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose exclude each other")
    try:  # flags that exclude each other: a usage error, before any work
        opts = TrainOptions.resolve(
            validation=validation or None, output=output, scheduler=scheduler, security=security,
            cache=cache, exclude=tuple(kw.pop("exclude") or ()),
            verbose=0 if quiet else "auto" if verbose is None else verbose, **kw)
    except SchemaError as err:
        raise click.UsageError(str(err)) from err
    run_train(data, label=label, validation=validation or None, options=opts,
              echo=(lambda _line: None) if quiet else click.echo,
              stop=click.get_current_context().find_object(Stop))


@cli.command()
@click.argument("data", nargs=-1, required=True)
@click.option("--label", required=True, help="The label column (numeric: 0/1, class ids or values).")
@click.option("--validation", multiple=True, help="Validation data (path, glob or URL; repeatable).")
@click.option("--output", default="daskfeed-out", show_default=True,
              help="Directory for model.keras, manifest.json, history.json.")
@_train_options
@click.option("--rank", type=click.IntRange(0), default=None,
              help="This trainer's rank among --world-size trainers on one --scheduler: it "
                   "trains on its own shard; all ranks get the same number of batches and share "
                   "one scan. Default: from TF_CONFIG, else RANK/WORLD_SIZE, else one trainer. "
                   "Rank N > 0 writes to OUTPUT/rank-N.")
@click.option("--world-size", type=click.IntRange(1), default=None,
              help="How many trainers (ranks) share the data (with --rank).")
@_friendly
def train(data: tuple[str, ...], label: str, validation: tuple[str, ...], output: str, **kw: Any) -> None:
    """Train a Keras model on DATA (paths, globs such as "logs/**/*.csv", or URLs)."""
    _run_train(list(data), label, list(validation), output, **kw)


@cli.command()
@click.option("--data-dir", default="demo-data", show_default=True,
              help="Where the demo CSV files are written.")
@click.option("--rows", type=click.IntRange(1000), default=200_000, show_default=True)
@click.option("--validate-rows", type=click.IntRange(1000), default=50_000, show_default=True)
@click.option("--output", default="demo-out", show_default=True)
@_train_options
@_friendly
def demo(data_dir: str, rows: int, validate_rows: int, output: str, **kw: Any) -> None:
    """Write quest-log demo data (the old 1000-row split layout) and train on it."""
    from daskfeed.demo import write_demo_data

    demo_data = write_demo_data(data_dir, rows=rows, validate_rows=validate_rows, seed=kw["seed"])
    click.echo(f"demo data: {demo_data.train_rows:,} train rows, {demo_data.validate_rows:,} "
               f"validation rows in {os.path.abspath(data_dir)} (1000-row files)")
    if kw.get("memory_limit") is None:
        kw["memory_limit"] = "4GB"
    _run_train([demo_data.train_glob], "cleared", [demo_data.validate_glob], output, **kw)


@cli.command()
@click.argument("data", nargs=-1, required=True)
@click.option("--label", required=True, help="The label column (numeric).")
@click.option("--output", type=click.Path(dir_okay=False), default=None,
              help="Write the manifest JSON here.")
@_cluster_options
@_data_options
@_friendly
def scan(data: tuple[str, ...], label: str, output: str | None, **kw: Any) -> None:
    """Scan DATA once and print (or write) its manifest summary.

    Takes train's data options: the same --blocksize, --encoding, --bad-lines and
    --memory-limit give the same partitions, so a later train reuses the parse cache.
    """
    from dask.utils import format_bytes

    from daskfeed.cluster import close_client
    from daskfeed.scanner import scan as run_scan
    from daskfeed.source import Source

    scheduler, security = _scheduler_and_security(kw)
    cache = _cache_choice(kw)
    client, budget = _start_cluster(kw.pop("memory_limit"), nworkers=kw.pop("nworkers"),
                                    nthreads=kw.pop("nthreads"), scheduler=scheduler,
                                    security=security, dashboard_address=kw.pop("dashboard_address"))
    try:
        from daskfeed import config
        from daskfeed.cache import open_cache

        source = Source(list(data), blocksize=config.resolve_blocksize(kw.pop("blocksize"),
                                                                       budget.blocksize),
                        encoding=kw.pop("encoding"), bad_lines=kw.pop("bad_lines"),
                        sep=kw.pop("sep"), na_values=kw.pop("na_values"), dtype=kw.pop("dtype"),
                        storage_options=kw.pop("storage_options"))
        part_cache, status = (None, "cache: off") if cache is False else open_cache(
            source, (None if cache is True else cache) or config.get("cache-dir"),
            compression=config.get("cache-compression"), required=cache is not True, client=client)
        if source.options.blocksize != budget.blocksize:
            click.echo(f"partitions of {format_bytes(source.options.blocksize)} (--blocksize / "
                       f"daskfeed.blocksize; the budget alone gives {format_bytes(budget.blocksize)})")
        click.echo(status)
        m = run_scan(source, label=label, client=client, timeout=kw.pop("timeout"),
                     partition_cache=part_cache, vocabulary_size=kw.pop("vocabulary_size"))
    finally:
        close_client(client)
    click.echo(m.summary())
    for line in m.column_lines():
        click.echo(f"  {line}")
    if output:
        m.to_json(output)
        click.echo(f"wrote {output}")


@cli.group(name="cache")
def cache_group() -> None:
    """Show and remove the parse cache on this machine (one entry per data set)."""


_CACHE_ROOT = click.option("--cache", "root", type=click.Path(file_okay=False), default=None,
                           help="The cache directory [default: daskfeed.cache-dir, else "
                                "~/.cache/daskfeed].")


@cache_group.command(name="list")
@_CACHE_ROOT
def cache_list(root: str | None) -> None:
    """List the cache entries with their size on disk and the data they hold."""
    import time as _time

    from dask.utils import format_bytes

    from daskfeed.cache import default_root
    from daskfeed.cache_entries import list_entries

    root = root or config.get("cache-dir")
    entries = list_entries(root)
    where = root or default_root()
    if not entries:
        click.echo(f"no cache entries in {where}")
        return
    for e in entries:
        made = _time.strftime("%Y-%m-%d %H:%M", _time.localtime(e.created))
        click.echo(f"{os.path.basename(e.path)}  {format_bytes(e.size):>10}  (of "
                   f"{format_bytes(e.csv_bytes)} input, {made})  {e.data}")
    total = sum(e.size for e in entries)
    click.echo(f"{len(entries)} entr{'ies' if len(entries) > 1 else 'y'}, {format_bytes(total)} in "
               f"{where}")


@cache_group.command(name="clear")
@click.argument("entries", nargs=-1)
@_CACHE_ROOT
def cache_clear(entries: tuple[str, ...], root: str | None) -> None:
    """Remove cache ENTRIES (names as `daskfeed cache list` shows them), or all of them."""
    from dask.utils import format_bytes

    from daskfeed.cache import default_root
    from daskfeed.cache_entries import clear, list_entries

    root = root or config.get("cache-dir")
    known = {os.path.basename(e.path) for e in list_entries(root)}
    unknown = [e for e in entries if e not in known]
    if unknown:
        raise click.BadParameter(f"no cache entry {unknown[0]!r} in {root or default_root()} "
                                 "(see: daskfeed cache list)", param_hint="ENTRIES")
    removed = clear(root, list(entries) or None)
    click.echo(f"removed {len(removed)} cache entr{'y' if len(removed) == 1 else 'ies'}, "
               f"{format_bytes(sum(e.size for e in removed))}")


if __name__ == "__main__":  # pragma: no cover
    cli()
