"""The ``daskfeed`` command (also ``dask feed``): thin click commands over library functions.

The flags are :mod:`daskfeed.cli._flags`'. ``daskfeed --help`` loads neither keras nor pandas nor
distributed: a command imports the library modules that need them when it runs. Library
errors become one clear message and exit 1; bad flags exit 2 with usage; Ctrl-C and SIGTERM
stop a command within seconds (its :class:`~daskfeed.core._lifecycle.Stop`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from daskfeed.cli._flag_types import (
    column_list,
    data_urls,
    parse_storage_options,
    step_range,
    warn_secrets,
)
from daskfeed.cli._flags import (
    cache_choice,
    cluster_options,
    data_options,
    predict_timeout_option,
    scheduler_and_security,
    train_options,
)
from daskfeed.core import (
    Aborted,
    DaskfeedError,
    SettingError,
    Stop,
    one_line_warnings,
    raise_outside,
    redact_text,
)

if TYPE_CHECKING:
    from distributed import Client, Security

    from daskfeed.cluster import Budget


def format_bytes(n: int) -> str:
    """``1.95 GiB``: dask's spelling of a size (dask loaded when a command prints one)."""
    from dask.utils import format_bytes as spelled

    return str(spelled(n))


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM so it unwinds like Ctrl-C (clusters closed)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # once: a second SIGTERM while shutting down must not abort the shutdown itself
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise_outside(_terminate, frame)  # not inside a gc callback, where it would be dropped


def _terminate(frame: FrameType | None) -> None:
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
    env = "DASK_DASKFEED__WARNINGS"
    before = os.environ.get(env)
    os.environ[env] = "line"
    loaded = "dask.config" in sys.modules  # (a command that never loads dask leaves it unloaded:
    if loaded:                               # loaded later, it reads the environment)
        import dask.config

        setting = dask.config.set({"daskfeed.warnings": "line"})
    one_line_warnings(True)

    def undo() -> None:
        one_line_warnings(False)
        if before is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = before
        if loaded:
            setting.__exit__(None, None, None)
        elif "dask.config" in sys.modules:  # loaded by the command: as the environment says now
            import dask.config

            dask.config.refresh()

    return undo


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn daskfeed's user-facing errors into ``click.ClickException`` (exit 1, no traceback).

    A URL in the message is shown without credentials; credentials given on the command line
    are warned of first, once (:func:`~daskfeed.cli._flag_types.warn_secrets`).

    Ctrl-C (SIGINT) and SIGTERM stop the command the same way: the exception unwinds through
    ``train``, which closes the sequences and the local cluster (workers and ports gone), then
    one line is printed and the exit status is 130 (SIGINT) or 143 (SIGTERM). A command started
    with SIGINT ignored (a shell's background job without job control: a script's ``&``, a CI
    runner) listens to it all the same while it runs. The command's
    :class:`~daskfeed.core._lifecycle.Stop` is the click context's object (``find_object(Stop)``).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        main = threading.current_thread() is threading.main_thread()
        # started in a script's background (no job control), SIGINT comes ignored, and Python
        # keeps it so: Ctrl-C and `kill -INT` stop the command all the same
        deaf = main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        if deaf:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        stop = click.get_current_context().obj = Stop()
        previous = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
        unwatch = _watch_signals(stop) if main else None
        undo_warnings = _warnings_as_lines()
        warn_secrets(click.get_current_context())
        sigint = None  # SIGINT's handler while the stop message is printed (then restored)
        try:
            return fn(*args, **kwargs)
        except BaseException as err:
            stopping = isinstance(err, KeyboardInterrupt) or (main and stop.signum is not None)
            if not stopping:  # (a signal can surface as any error raised where it landed)
                if isinstance(err, DaskfeedError):  # (a URL in it: without credentials)
                    raise click.ClickException(redact_text(str(err))) from err
                raise
            if main:  # a second Ctrl-C while we print must not spew a traceback
                sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
            recorded = not isinstance(err, KeyboardInterrupt) or isinstance(err, Aborted)
            term = isinstance(err, Terminated) or (recorded and stop.signum == signal.SIGTERM)
            click.echo(f"daskfeed: stopped by {'SIGTERM' if term else 'Ctrl-C (SIGINT)'}; "
                       "cluster connections closed." + _resume_hint(kwargs), err=True)
            sys.exit(128 + (signal.SIGTERM if term else signal.SIGINT))
        finally:
            undo_warnings()
            if unwatch is not None:
                unwatch()
            if main and previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if sigint is not None:  # the command run in-process (a notebook, a test): Ctrl-C
                signal.signal(signal.SIGINT, sigint)  # works again once it returns
            if deaf:  # (in-process: the caller's disposition back)
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    return wrapper


def _resume_hint(kwargs: dict[str, Any]) -> str:
    """For ``train``: where its checkpoints are and how to go on (empty for other commands)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.info_name != "train" or "output" not in kwargs:
        return ""
    where = os.path.join(kwargs["output"], "checkpoints")
    return (f"\nTo go on from the last checkpoint in {where} (the batch it was written at), run "
            "the same command again with --resume.")


@click.group(name="feed", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="daskfeed")
def cli() -> None:
    """Train Keras models on CSV data sets far larger than memory, fed by a Dask cluster."""


def _start_cluster(memory_limit: str | None, *, nworkers: int | None, nthreads: int,
                   scheduler: str | None, security: Security | None,
                   dashboard_address: str | None,
                   storage_options: dict[str, Any] | None = None) -> tuple[Client, Budget]:
    """A client and its budget, as ``train`` makes them (a LocalCluster or a running scheduler)."""
    from daskfeed.cluster import ClusterSpec

    spec = ClusterSpec.resolve(memory_limit=memory_limit, nworkers=nworkers, nthreads=nthreads,
                               scheduler=scheduler, security=security,
                               dashboard_address=dashboard_address)
    client, budget = spec.open(click.echo, storage_options=storage_options)
    if not scheduler and getattr(client, "dashboard_link", None):
        click.echo(f"dashboard: {client.dashboard_link}")
    return client, budget


def _run_train(data: list[str], label: str, validation: list[str], output: str,
               **kw: Any) -> None:
    """Map the flags onto :class:`TrainOptions` (the one place) and train."""
    scheduler, security = scheduler_and_security(kw)
    cache = cache_choice(kw)
    verbose, quiet = kw.pop("verbose"), kw.pop("quiet")
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose exclude each other")
    try:  # flags that exclude each other: a usage error, before any work
        from daskfeed.training import TrainOptions

        opts = TrainOptions.resolve(
            label=label, validation=validation or None, output=output, scheduler=scheduler, security=security,
            cache=cache, exclude=tuple(kw.pop("exclude") or ()),
            verbose=0 if quiet else "auto" if verbose is None else verbose, **kw)
    except SettingError as err:
        raise click.UsageError(str(err)) from err
    from daskfeed.training import train as run_train  # pandas, dask; keras once the data are ready

    run_train(data, label=label, validation=validation or None, options=opts,
              echo=(lambda _line: None) if quiet else click.echo,
              stop=click.get_current_context().find_object(Stop))


@cli.command()
@click.argument("data", nargs=-1, required=True, callback=data_urls)
@click.option("--label", required=True,
              help="The label column: 0/1 (binary), whole numbers or text class names "
                   "(classes), or other numbers (regression).")
@click.option("--validation", multiple=True, callback=data_urls,
              help="Validation data (path, glob or URL; repeatable).")
@click.option("--output", default="daskfeed-out", show_default=True,
              help="Directory for model.keras, manifest.json, history.json.")
@train_options
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
@click.option("--data-dir", default="data", show_default=True,
              help="Where the demo CSV files are written.")
@click.option("--rows", type=click.IntRange(1000), default=200_000, show_default=True)
@click.option("--validate-rows", type=click.IntRange(1000), default=50_000, show_default=True)
@click.option("--output", default="demo-out", show_default=True)
@train_options
@_friendly
def demo(data_dir: str, rows: int, validate_rows: int, output: str, **kw: Any) -> None:
    """Write quest-log demo data (the old 1000-row split layout) and train on it."""
    from daskfeed.cli._demo import write_demo_data

    demo_data = write_demo_data(data_dir, rows=rows, validate_rows=validate_rows, seed=kw["seed"])
    click.echo(f"demo data: {demo_data.train_rows:,} train rows, {demo_data.validate_rows:,} "
               f"validation rows in {os.path.abspath(data_dir)} (1000-row files)")
    if kw.get("memory_limit") is None:
        kw["memory_limit"] = "4GB"
    _run_train([demo_data.train_glob], "cleared", [demo_data.validate_glob], output, **kw)


@cli.command()
@click.argument("data", nargs=-1, required=True, callback=data_urls)
@click.option("--label", required=True,
              help="The label column: 0/1 (binary), whole numbers or text class names "
                   "(classes), or other numbers (regression).")
@click.option("--output", type=click.Path(dir_okay=False), default=None,
              help="Write the manifest JSON here.")
@cluster_options
@data_options
@_friendly
def scan(data: tuple[str, ...], label: str, output: str | None, **kw: Any) -> None:
    """Scan DATA once and print (or write) its manifest summary.

    Takes train's data options: the same --blocksize, --encoding, --bad-lines and
    --memory-limit give the same blocks, so a later train reuses the parse cache.
    """
    from daskfeed.reading import Listing, Source, refuse_missing_local
    from daskfeed.scanning import scan as run_scan  # pandas, pyarrow: only when it runs

    scheduler, security = scheduler_and_security(kw)
    cache = cache_choice(kw)
    refuse_missing_local(list(data))  # before a cluster starts
    listing = Listing(list(data), kw["storage_options"])  # while the cluster starts
    client, budget = _start_cluster(kw.pop("memory_limit"), nworkers=kw.pop("nworkers"),
                                    nthreads=kw.pop("nthreads"), scheduler=scheduler,
                                    security=security, dashboard_address=kw.pop("dashboard_address"),
                                    storage_options=kw["storage_options"])
    try:
        from daskfeed.cache import CacheChoice
        from daskfeed.core import config

        source = Source(listing, blocksize=config.resolve_blocksize(kw.pop("blocksize"),
                                                                       budget.blocksize),
                        encoding=kw.pop("encoding"), bad_lines=kw.pop("bad_lines"),
                        sep=kw.pop("sep"), na_values=kw.pop("na_values"), dtype=kw.pop("dtype"),
                        decimal=kw.pop("decimal"),
                        storage_options=kw.pop("storage_options"))
        part_cache, status = CacheChoice.resolve(cache).open(source, client)
        if source.options.blocksize != budget.blocksize:
            click.echo(f"blocks of {format_bytes(source.options.blocksize)} (--blocksize / "
                       f"daskfeed.blocksize; the budget alone gives {format_bytes(budget.blocksize)})")
        click.echo(status)
        m = run_scan(source, label=label, client=client, timeout=kw.pop("timeout"),
                     parse_cache=part_cache, vocabulary_size=kw.pop("vocabulary_size"))
    finally:
        from daskfeed.cluster import close_client

        close_client(client)
    if m.scan_line:
        click.echo(m.scan_line)
    click.echo(m.summary())
    for line in m.column_lines():
        click.echo(f"  {line}")
    if output:
        m.to_json(output)
        click.echo(f"wrote {output}")


@cli.group(name="cache")
def cache_group() -> None:
    """Show and remove the parse cache on this machine (one entry per part of a data set's files)."""


_CACHE_ROOT = click.option("--cache", "root", type=click.Path(file_okay=False), default=None,
                           help="The cache directory [default: daskfeed.cache-dir, else "
                                "~/.cache/daskfeed].")


@cache_group.command(name="list")
@_CACHE_ROOT
@_friendly
def cache_list(root: str | None) -> None:
    """List the cache entries with their size on disk and the data they hold."""
    from daskfeed.cache import (
        default_root,  # pyarrow: only when it runs
        gone_entries,
        list_entries,
    )
    from daskfeed.core import config

    root = config.cache_dir(root or None)
    entries = list_entries(root)
    where = root or default_root()
    if not entries:
        click.echo(f"no cache entries in {where}")
        return
    from daskfeed.scanning import ScanStore

    served = ScanStore(where).served()
    for e in entries:
        made = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created))
        key = os.path.basename(e.path)
        click.echo(f"{key}  {format_bytes(e.size):>10}  (of "
                   f"{format_bytes(e.csv_bytes)} input, {made})  {e.data}")
        click.echo(f"    serves: {'; '.join(served[key]) if key in served else 'no data set scanned since'}")
    total = sum(e.size for e in entries)
    click.echo(f"{len(entries)} entr{'ies' if len(entries) > 1 else 'y'} (one per part of a data "
               f"set's files, more for a part that grew), {format_bytes(total)} in {where}")
    gone = gone_entries(root)
    if gone:
        click.echo(f"{len(gone)} of them hold files that changed or went since "
                   f"({format_bytes(sum(e.size for e in gone))}): daskfeed cache clear --gone")


@cache_group.command(name="clear")
@click.argument("entries", nargs=-1)
@_CACHE_ROOT
@click.option("--all", "everything", is_flag=True,
              help="Remove every entry (asks first at a terminal; --yes in scripts).")
@click.option("--yes", "-y", is_flag=True, help="With --all: remove every entry without asking.")
@click.option("--gone", is_flag=True,
              help="Remove only the entries of files that changed or went since they were cached.")
@_friendly
def cache_clear(entries: tuple[str, ...], root: str | None, everything: bool, yes: bool,
                gone: bool) -> None:
    """Remove cache ENTRIES (names as `daskfeed cache list` shows them), or --all of them.

    No ENTRIES is never taken for all of them (an empty list from a command substitution would
    clear the whole cache): every entry goes only with --all, which asks first unless --yes
    (scripts). With --gone, the entries (parts of a data set) whose files changed or went
    since: never read again.
    """
    from daskfeed.cache import (
        clear,
        default_root,  # pyarrow: only when it runs
        gone_entries,
        list_entries,
    )
    from daskfeed.core import config

    root = config.cache_dir(root or None)
    if gone:
        from daskfeed.scanning import ScanStore

        stale = [os.path.basename(e.path) for e in gone_entries(root)]
        removed = clear(root, stale) if stale else []
        records = ScanStore(root or default_root()).prune()
        click.echo(f"removed {len(removed)} cache entr{'y' if len(removed) == 1 else 'ies'} of "
                   f"files changed or gone, {format_bytes(sum(e.size for e in removed))}, and "
                   f"{records} scan record(s) no data set's last scan uses")
        return
    if everything and entries:
        raise click.UsageError(f"Expected ENTRIES or --all. Received: --all and {len(entries)} "
                               "ENTRIES.\nHint: name the entries to remove some, or --all alone "
                               "to remove every one.")
    if not everything and not entries:
        raise click.UsageError(
            "Expected the cache ENTRIES to remove (names as 'daskfeed cache list' shows them), or "
            "--all. Received: no ENTRIES" + (" (--yes alone removes nothing)" if yes else "")
            + ".\nHint: an empty list (a $(...) that printed nothing) never clears the whole "
            "cache: pass --all --yes to remove every entry, --gone to remove those of files "
            "changed or gone.")
    known = {os.path.basename(e.path) for e in list_entries(root)}
    unknown = [e for e in entries if e not in known]
    if unknown:
        raise click.BadParameter(f"no cache entry {unknown[0]!r} in {root or default_root()} "
                                 "(see: daskfeed cache list)", param_hint="ENTRIES")
    if everything and known and not yes:
        listed = list_entries(root)
        total = format_bytes(sum(e.size for e in listed))
        if not sys.stdin.isatty():
            raise click.UsageError(f"removing all {len(listed)} cache entries ({total}) in "
                                   f"{root or default_root()} needs --all --yes when not asked at "
                                   "a terminal; or name the entries (see: daskfeed cache list)")
        click.confirm(f"Remove all {len(listed)} cache entries ({total}) in "
                      f"{root or default_root()}?", abort=True)
    removed = clear(root, list(entries) or None)
    kept = len(set(entries) or known) - len(removed)
    click.echo(f"removed {len(removed)} cache entr{'y' if len(removed) == 1 else 'ies'}, "
               f"{format_bytes(sum(e.size for e in removed))}"
               + (f"; {kept} kept: in use by a running trainer (or not removable)" if kept else ""))


@cli.command()
@click.argument("run_dir", metavar="OUTPUT")
@click.argument("data", nargs=-1, required=True, callback=data_urls)
@click.option("--output", "destination", required=True, type=click.Path(dir_okay=False),
              help="Where the predictions go: FILE.csv or FILE.parquet.")
@click.option("--keep", default=None, help="Columns of DATA passed through, e.g. ids: A,B (into a CSV as "
              "written, into Parquet as read).")
@click.option("--blocksize", default=None, help="CSV bytes per block (default: from the budget).")
@click.option("--features", callback=column_list, default=None,
              help="Only for a model that takes one matrix of the features (trained as one "
                   "matrix): its feature columns, in order (A,B,...).")
@click.option("--storage-options", multiple=True, callback=parse_storage_options,
              metavar="JSON|KEY=VALUE|@FILE",
              help="fsspec options for s3:// and other URLs, as train takes them (credentials: "
                   "the environment or @FILE.json).")
@predict_timeout_option
@click.option("--quiet", is_flag=True, help="Print only warnings and errors.")
@cluster_options
@_friendly
def predict(run_dir: str, data: tuple[str, ...], destination: str, keep: str | None,
            blocksize: str | None, features: list[str] | None,
            storage_options: dict[str, Any] | None, timeout: str | None, quiet: bool,
            **kw: Any) -> None:
    """Score DATA with the model a train run wrote to OUTPUT, encoded exactly as in training."""
    from daskfeed.inference import predict as run_predict  # keras: only when it runs

    scheduler, security = scheduler_and_security(kw)
    run_predict(run_dir, list(data), output=destination, features=features,
                storage_options=storage_options,
                keep=[k for k in (keep or "").split(",") if k], blocksize=blocksize,
                memory_limit=kw["memory_limit"], nworkers=kw["nworkers"],
                nthreads=kw["nthreads"], scheduler=scheduler, security=security,
                dashboard_address=kw["dashboard_address"], timeout=timeout, echo=click.echo,
                quiet=quiet)



@cli.command()
@click.argument("run_dir", metavar="OUTPUT")
@click.option("--epoch", type=click.IntRange(min=1), required=True,
              help="The epoch, from 1 (as the progress bar counts).")
@click.option("--step", "steps", callback=step_range, required=True, metavar="S|A-B",
              help="The step of the epoch, from 1: the epoch order's batch (all trainers'); with "
                   "--rank, that trainer's own step. A-B: steps A to B (a step column first).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="A trainer of a run with several: --step counts its own batches.")
@click.option("--show", is_flag=True, help="Add each row's values as the scan read them.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="How the rows are printed.")
@click.option("--storage-options", multiple=True, callback=parse_storage_options,
              metavar="JSON|KEY=VALUE|@FILE",
              help="fsspec options for data on s3:// and other URLs, as train took them (to check "
                   "the files unchanged).")
@_friendly
def rows(run_dir: str, epoch: int, steps: range, rank: int | None, show: bool, fmt: str,
         storage_options: dict[str, Any] | None) -> None:
    """The rows of one training step of the run in OUTPUT: file and line of each.

    Recomputed from the run's order (no per-step log), right across resumes with another
    budget or number of trainers.
    """
    several = len(steps) > 1
    if show:  # the rows' values, read from the parse cache: pandas and pyarrow
        from daskfeed.training import batch_rows

        frame = batch_rows(run_dir, epoch=epoch, step=steps if several else steps[0], rank=rank,
                           show=True, storage_options=storage_options)
        a, count = dict(frame.attrs), len(frame)
        if fmt == "csv":
            text = frame.to_csv(index=False)
        elif fmt == "json":
            text = frame.to_json(orient="records", lines=True, default_handler=str)
        else:
            text = frame.to_string(index=False) + "\n"
    else:  # the order and the manifest only: numpy (see daskfeed/cli/_row_table.py)
        from daskfeed.cli._row_table import render
        from daskfeed.training import trace_steps

        found = trace_steps(run_dir, epoch=epoch, steps=steps, rank=rank,
                            storage_options=storage_options)
        a, count, text = found.attrs, len(found.files), render(found, fmt, several)
    if fmt != "table":
        click.echo(text, nl=False)
        return
    if not several:
        who = f", trainer {a['rank']}'s step {a['step']}" if a["rank"] is not None else ""
        by = f"{a['world']} trainer(s)" if a["world"] else "trainers not on record"
        click.echo(f"epoch {a['epoch']}, batch {a['batch']:,} of the epoch's order{who} "
                   f"({count:,} rows; trained by {by}):")
    else:
        who = f"trainer {a['rank']}'s steps" if a["rank"] is not None else "steps"
        click.echo(f"epoch {a['epoch']}, {who} {steps[0]:,} to {steps[-1]:,} ({count:,} rows):")
    click.echo(text, nl=False)
    left_out = a.get("skipped_steps") or ([steps[0]] if a["skipped"] else [])
    if left_out:
        click.echo(f"skipped (--skip-batches), never trained: step{'s' if len(left_out) > 1 else ''} "
                   f"{', '.join(f'{s:,}' for s in left_out[:20])}{' ...' if len(left_out) > 20 else ''}")


@cli.command(name="export")
@click.argument("run_dir", metavar="OUTPUT")
@_friendly
def export_serving(run_dir: str) -> None:
    """Write OUTPUT/serving/, a SavedModel taking raw column values (train writes it too)."""
    from daskfeed.inference import export  # tensorflow: only when it runs

    export(run_dir, echo=click.echo)

def main() -> None:
    """The ``daskfeed`` command: the click group, then an exit that skips TensorFlow's teardown.

    Once TensorFlow is loaded, the interpreter's own teardown takes about a second after a
    command has finished (0.95 s after a small ``fit``, against 0.2 s for a LocalCluster
    alone). By then the command has written and closed everything, so the process ends as
    the interpreter would, less that teardown: non-daemon threads joined and the hooks of
    ``threading`` and ``atexit`` run (the cluster, the prefetchers, logging), the standard
    streams flushed, then ``os._exit`` with the command's exit status.
    """
    try:
        cli.main(prog_name="daskfeed")
    except SystemExit as done:
        if "tensorflow" not in sys.modules:
            raise
        status = done.code
    else:  # pragma: no cover  (click's standalone mode always exits)
        status = 0
    if isinstance(status, int) or status is None:
        code = status or 0
    else:  # sys.exit("message"): printed, status 1, as the interpreter does
        print(status, file=sys.stderr)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # joins threads, runs their exit hooks
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
