"""The CLI's flags: their types, the groups commands share, and the values they pop into.

Nothing heavy at import: ``daskfeed --help`` loads neither keras nor pandas nor distributed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
from dask.utils import parse_bytes, parse_timedelta

from daskfeed import config
from daskfeed.cluster import parse_memory_limit
from daskfeed.exceptions import DaskfeedError
from daskfeed.remote import make_security

if TYPE_CHECKING:
    from distributed.security import Security

__all__ = ["ByteSize", "ConfigOption", "Duration", "MemorySize", "cache_choice", "cluster_options",
           "data_options", "fit_options", "parse_storage_options", "scheduler_and_security",
           "train_options"]

F = TypeVar("F", bound=Callable[..., Any])  # a click command's function


class ByteSize(click.ParamType):
    """A size such as ``64MiB`` or ``200MB`` (``dask.utils.parse_bytes``), positive; as bytes.

    ``parse_bytes`` reads ``""`` as 1 byte and takes negative sizes: both are refused here.
    """

    name = "size"

    def convert(self, value: str | int, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Bytes as an int.

        Parameters
        ----------
        value
            The flag's text (or a size already in bytes).
        param, ctx
            The flag and the command's context (for the error message).

        Returns
        -------
        int
            The size in bytes.

        Raises
        ------
        click.BadParameter
            When ``value`` is not one (exit 2 with click's usage line).
        """
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

    def convert(self, value: str | int, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """Validate with ``parse_memory_limit``; keep the user's spelling for the echo.

        Parameters
        ----------
        value
            The flag's text.
        param, ctx
            The flag and the command's context (for the error message).

        Returns
        -------
        str
            ``value`` as the user spelled it.

        Raises
        ------
        click.BadParameter
            When ``value`` is not one (exit 2 with click's usage line).
        """
        try:
            parse_memory_limit(value)
        except DaskfeedError as err:
            self.fail(str(err), param, ctx)
        return str(value)


class Duration(click.ParamType):
    """A duration such as ``300``, ``300s`` or ``5min`` (``dask.utils.parse_timedelta``), positive."""

    name = "duration"

    def convert(self, value: str | float, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Seconds as a float.

        Parameters
        ----------
        value
            The flag's text (or a number of seconds).
        param, ctx
            The flag and the command's context (for the error message).

        Returns
        -------
        float
            The duration in seconds.

        Raises
        ------
        click.BadParameter
            When ``value`` is not one (exit 2 with click's usage line).
        """
        try:
            seconds = float(parse_timedelta(value, default="seconds"))
        except (ValueError, TypeError, KeyError):
            self.fail(f"expected a duration such as 300, 300s or 5min. Received: {value!r}", param, ctx)
        if seconds <= 0:
            self.fail(f"expected a positive duration. Received: {value!r}", param, ctx)
        return seconds


def _columns(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    cols = [c.strip() for c in value.split(",") if c.strip()]
    if not value.strip() or value.strip().startswith(","):  # '' or ",id": the unnamed column
        cols.insert(0, "")
    return cols


def _sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
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

    def get_help_extra(self, ctx: click.Context) -> click.types.OptionHelpExtra:
        """Click's help extras with the configured default.

        Parameters
        ----------
        ctx
            The command's context.

        Returns
        -------
        click.types.OptionHelpExtra
            Click's extras, ``default`` showing the value in effect and its config key.
        """
        extra = super().get_help_extra(ctx)
        value = config.get(self.config_key)
        shown = '""' if value == "" else "none" if value is None else str(value)
        if self.config_key == "blocksize" and not config.configured("blocksize"):
            shown = f"from the budget, at most {shown}"  # see config.resolve_blocksize
        extra["default"] = f"{shown} (daskfeed.{self.config_key})"
        return extra


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


def _separator(ctx: click.Context, param: click.Parameter, value: str) -> str:
    text = {"\\t": "\t", "tab": "\t", "TAB": "\t"}.get(value, value)
    if len(text) != 1:
        raise click.BadParameter(f"expected one character such as ',' ';' or '\\t' (tab). "
                                 f"Received: {value!r}")
    return text


def _dtypes(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, str] | None:
    if not value:
        return None
    pairs = [p.strip() for p in value.split(",") if p.strip()]
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise click.BadParameter(f"expected COLUMN=TYPE pairs such as zip=string. Received: {bad[0]!r}")
    return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in pairs)}


def parse_storage_options(ctx: click.Context | None, param: click.Parameter | None,
                          value: tuple[str, ...]) -> dict[str, Any] | None:
    """``--storage-options`` JSON or KEY=VALUE pairs (repeatable) → one dict for fsspec.

    ``KEY=VALUE`` values are JSON when they parse (``anon=true``, ``max_concurrency=4``), else
    text; a dotted key nests (``client_kwargs.region_name=eu-west-1``). Values are never
    echoed: they may hold credentials.

    Parameters
    ----------
    ctx, param
        Click's context and flag (unused: a click callback).
    value
        The flag's values, one per ``--storage-options``.

    Returns
    -------
    dict or None
        The merged options (fsspec's keyword arguments); None when none were given.

    Raises
    ------
    click.BadParameter
        An item that is neither a JSON object nor KEY=VALUE pairs.
    """
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
        click.option("--sep", "--delimiter", "sep", default=",", show_default=True,
                     callback=_separator, help="Field delimiter: ';', '|', or '\\t' (tab) for TSV."),
        click.option("--encoding", default="utf-8", show_default=True,
                     help="Text encoding of the CSV files (e.g. latin-1)."),
        click.option("--storage-options", multiple=True, callback=parse_storage_options,
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
        click.option("--features", callback=_columns,
                     help="Comma-separated feature columns (default: all but label)."),
        click.option("--exclude", callback=_columns,
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
        click.option("--hidden", callback=_sizes, default=None, metavar="N,N,...",
                     help="Hidden layer sizes of the default model [default: 64,64]."),
        click.option("--learning-rate", type=click.FloatRange(0, min_open=True), default=None,
                     help="Adam's learning rate [default: 0.001]; with --model, used if the "
                          "builder's model comes uncompiled."),
        click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=None,
                     help="Dropout after each hidden layer of the default model [default: 0]."),
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
    security = make_security(kw.pop("tls_ca_file"), kw.pop("tls_cert"), kw.pop("tls_key"))
    # a lost scheduler makes the client log each reconnect attempt with a traceback; daskfeed
    # reports the loss itself, once, naming the window (ClusterError). After distributed's import,
    # which configures its loggers.
    import distributed  # noqa: F401

    logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
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
