"""Predictions: ``daskfeed predict`` / :func:`predict`, a trained run applied to data of any size.

Blocks are scored on the cluster (:func:`daskfeed.inference._scoring.score_block`) at most a few at a
time; their tables come back in input order and are written as they arrive (CSV or Parquet,
atomically), or gathered into a DataFrame for small data.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from dask.utils import format_bytes

from daskfeed.cluster import (
    MIN_WORKER,
    Budget,
    ClusterSpec,
    close_client,
    default_nworkers,
    gathered_map,
    result_unless_paused,
)
from daskfeed.core import (
    BudgetError,
    DataNotFoundError,
    FeedTimeoutError,
    SchemaError,
    SettingError,
    config,
    writing,
)
from daskfeed.inference._scoring import (
    Scorer,
    TrainedRun,
    Unparsed,
    output_columns,
    output_schema,
    score_block,
)
from daskfeed.manifest import Manifest
from daskfeed.reading import Block, PathsLike, Source, SplitError, long_reads, refuse_missing_local

if TYPE_CHECKING:
    from distributed import Client, Future, Security

#: one block's scoring: its prediction table, rejected lines, unparsed values by column
Scored = tuple[pa.Table, int, dict[str, Unparsed]]

SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
# predict's own process holds Python, the scheduler, pyarrow and the writer, never TF: the model's
# share of the budget (config trainer-reserve) goes to each worker, which loads the model
CLIENT_RESERVE = 256 * 2**20


def _format(output: str) -> str:
    """The output file's format by its suffix; its directory checked (before any cluster starts)."""
    fmt = SUFFIXES.get(os.path.splitext(output)[1].lower())
    if fmt is None:
        raise SettingError(
            f"Expected an output file ending in .csv or .parquet. Received: {output!r}.\n"
            "Hint: e.g. --output predictions.parquet."
        )
    where = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(where):
        raise DataNotFoundError(
            f"Expected the output file in an existing directory. Received: --output {output!r}, "
            f"whose directory {where} does not exist.\nHint: create it first "
            f"(mkdir -p {where}), or write the file elsewhere.")
    if os.path.isdir(output):
        raise SettingError(f"Expected an output file. Received: --output {output!r}, a directory."
                          "\nHint: name a file in it, e.g. predictions.parquet.")
    return fmt


class _Sink:
    """Writes prediction tables to one CSV or Parquet file, or keeps them for a DataFrame."""

    def __init__(self, f: IO[bytes] | None, fmt: str | None, schema: pa.Schema) -> None:
        self.tables: list[pa.Table] = []
        self.writer: pq.ParquetWriter | pacsv.CSVWriter | None = None
        self.fmt = fmt
        if fmt == "parquet":
            self.writer = pq.ParquetWriter(f, schema)
        elif fmt == "csv":
            self.writer = pacsv.CSVWriter(f, schema)

    def add(self, table: pa.Table) -> None:
        if self.writer is None:
            self.tables.append(table)
        elif table.num_rows:
            self.writer.write_table(table)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _progress(echo: Callable[[str], None], total: int) -> Callable[[int, int, float], None]:
    """A progress line every 10 % of the blocks (and at the end): rows, rows/s, time left.

    Lines, not a redrawn bar: they read the same in a terminal, a log file and a notebook.
    """
    shown = [-1]

    def show(done: int, rows: int, seconds: float) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth > shown[0] or done == total:
            shown[0] = tenth
            left = (f"about {seconds * (total - done) / max(done, 1):.0f}s left" if done < total
                    else f"done in {seconds:.1f}s")
            echo(f"predict: {done}/{total} blocks ({done / max(total, 1):.0%}), {rows:,} rows, "
                 f"{rows / max(seconds, 1e-9):,.0f} rows/s, {left}")

    return show


def _timeout_error(client: Client, source: Source, at: int, pending: deque[Future[Scored]],
                   timeout: float) -> FeedTimeoutError:
    """Block ``at`` was not scored within ``timeout``.

    Named: the reads that hang (asked of the workers), else the blocks not scored yet (one of
    them holds a worker).
    """
    why = long_reads(client, timeout / 2)  # the read it waits behind began before its wait, or in it
    look = "the files named"
    if not why:
        late = [at] + [_block_of(f) for f in pending if not f.done()]
        more = " ..." if len(late) > 5 else ""
        names = "; ".join(source.blocks[i].describe() for i in late[:5])
        why = f"blocks not scored yet, one of them holding a worker: {names}{more}"
        look = "the workers on the dashboard"
    return FeedTimeoutError(
        f"Expected the scoring of block {at} ({source.blocks[at].describe()}) within "
        f"{timeout:g}s. Received: no result; {why}.\nHint: a read that blocks (hung storage, "
        f"a FIFO) never finishes: check {look}; for very slow storage raise --timeout "
        "(daskfeed.timeout).")


def _in_order(client: Client, source: Source, scorer: Scorer, keep: tuple[str, ...],
              schema: pa.Schema, in_flight: int, timeout: float,
              as_text: bool = False) -> Iterator[Scored]:
    """Submit blocks, at most ``in_flight`` at a time, and yield their results in block order.

    Each block's result is waited for at most ``timeout`` seconds (then a FeedTimeoutError
    names it). ``as_text``: the kept columns as their fields' text (a CSV output).
    """
    pending: deque[Future[Scored]] = deque()
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    blocks: Iterator[tuple[int, Block]] = iter(enumerate(source.blocks))
    try:
        while True:
            while len(pending) < in_flight:
                item = next(blocks, None)
                if item is None:
                    break
                i, block = item
                pending.append(client.submit(score_block, i, block, source.options, scorer, keep,
                                             schema, as_text, key=f"daskfeed-predict-{token}-{i}",
                                             priority=-i, pure=False))
            if not pending:
                return
            future = pending.popleft()
            at = _block_of(future)
            try:
                result = result_unless_paused(future, what="the scoring of a block", timeout=timeout)
            except TimeoutError as err:  # a hung block may hold the worker another one waits for
                raise _timeout_error(client, source, at, pending, timeout) from err
            except SplitError as err:  # a speculated start failed: the rest of the file exactly
                if err.path in source.splits:
                    raise
                for f in pending:
                    f.cancel()
                pending.clear()
                source.split_exactly(err.path, gathered_map(client), done=at)
                blocks = iter(list(enumerate(source.blocks))[at:])
                token += "-exact"  # new keys: the failed ones may still be known
                continue
            yield result
            future.release()
    finally:
        for future in pending:
            future.cancel()


def _block_of(future: Future[Scored]) -> int:
    """The block a scoring is of: its key (a str, see :func:`_in_order`) ends ``-<index>``."""
    return int(str(future.key).rsplit("-", 1)[1])


def predict(
    output_dir: str | os.PathLike[str],
    data: PathsLike,
    *,
    output: str | os.PathLike[str] | None = None,
    keep: Sequence[str] = (),
    features: Sequence[str] | None = None,
    memory_limit: str | int | None = None,
    nworkers: int | None = None,
    nthreads: int = 1,
    scheduler: str | None = None,
    security: Security | None = None,
    blocksize: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    processes: bool = True,
    dashboard_address: str | None = None,
    timeout: float | str | None = None,
    echo: Callable[[str], None] = print,
    quiet: bool = False,
) -> pd.DataFrame | str:
    """Score ``data`` with the model a ``daskfeed train`` run wrote to ``output_dir``.

    Out of core: each block of ``data`` is read on a worker with the read options of the
    training manifest, encoded with the training statistics by the training encoding (exactly
    as training encoded its batches), and scored by the run's ``model.keras``, loaded once
    per worker. Rows keep their input order; a label column in ``data`` is ignored.

    Parameters
    ----------
    output_dir
        The training run's ``--output`` directory (``model.keras``, ``manifest.json``).
    data
        Paths / globs / a list / URLs of CSV or Parquet files with the training header.
    output
        A ``.csv`` or ``.parquet`` file, written as the blocks finish (atomically: it
        appears when complete). None: return a DataFrame (for data that fit in memory).
    keep
        Columns of ``data`` passed through in front of the predictions (e.g. ids): in a CSV
        output as written (each field's text, ``007`` and ``2013-01-01T10:00:00Z`` as they
        are), in a Parquet output and the DataFrame as read (numbers, dates as UTC instants).
    features
        Only for a model over one matrix (``as_matrix``): its feature columns, in order.
    memory_limit, nworkers, nthreads, scheduler, security, processes, dashboard_address
        The cluster and its budget (:class:`~daskfeed.cluster.ClusterSpec`, as ``train``
        describes it); each worker loads the model, so by default only as many workers as the
        budget gives a copy each.
    blocksize
        CSV bytes per block; default: what the budget gives.
    storage_options
        fsspec options for ``s3://`` and other URLs.
    timeout
        Longest wait for one block's scoring (seconds, or ``"5min"``; default
        ``daskfeed.timeout``), then a FeedTimeoutError names the block.
    echo, quiet
        Where progress lines go; ``quiet``: none.

    Returns
    -------
    pandas.DataFrame or str
        The kept columns, ``prediction`` (the value; for a class label the most probable
        class: its name, or its id for numeric classes) and ``probability_<class>`` for each
        class; or the path written when ``output`` is given. The DataFrame's
        ``attrs["unparsed"]`` counts by column the values neither missing nor read (a date
        column's ``yesterday``, a number column's ``12x``): they were scored with the training
        mean, as missing values are, and a closing line says so (``serving/`` counts the same
        values in its ``unparsed`` output).

    Raises
    ------
    DataNotFoundError
        When ``output_dir`` holds no trained run, or ``data`` matches no file.
    SchemaError
        When ``data`` lacks a feature or ``keep`` column, or a kept column is named as a
        prediction column.
    SettingError
        When ``output`` has another suffix or is a directory.
    """
    wait = config.timeout(timeout)
    run = TrainedRun.open(output_dir, features)
    refuse_missing_local(data)  # before a cluster starts
    keep = tuple(keep)
    fmt = _format(os.fspath(output)) if output is not None else None
    clash = sorted(set(keep) & set(output_columns(run.manifest)))
    if clash:
        raise SchemaError(f"Expected kept columns other than the prediction columns. Received: "
                          f"--keep {','.join(clash)}.\nHint: rename that column in the data.")
    say = (lambda _line: None) if quiet else echo
    client, budget = _open_cluster(memory_limit, nworkers=nworkers, nthreads=nthreads,
                                   scheduler=scheduler, security=security, processes=processes,
                                   dashboard_address=dashboard_address,
                                   storage_options=storage_options, echo=say)
    try:
        source = _source(data, run.manifest, blocksize or budget.blocksize, storage_options)
        _check_header(source, run, keep)
        schema = output_schema(run, keep, as_text=fmt == "csv")  # a CSV: the fields as written
        in_flight = max(1, min(2 * budget.nworkers * budget.nthreads,
                               budget.prefetch // max(1, _result_bytes(source, run, schema))))
        if output is None:
            unparsed: dict[str, Unparsed] = {}
            df = _score(client, source, run, keep, schema, in_flight, wait, None, say,
                        unparsed).to_pandas()
            df.attrs["unparsed"] = {name: u.count for name, u in unparsed.items()}
            return df
        with writing(output, "wb") as f:
            _score(client, source, run, keep, schema, in_flight, wait, (f, fmt), say)
        say(f"wrote {os.fspath(output)}")
        return os.fspath(output)
    finally:
        close_client(client)


def _open_cluster(memory_limit: str | int | None, *, nworkers: int | None, nthreads: int,
                  scheduler: str | None, security: Security | None, processes: bool,
                  dashboard_address: str | None, storage_options: dict[str, Any] | None,
                  echo: Callable[[str], None]) -> tuple[Client, Budget]:
    """The cluster predict scores on: this process keeps its share, each worker a model's.

    Without ``nworkers`` (on a local cluster of processes), as many workers as the budget
    gives a copy of the model each. A budget too small says what this process holds.
    """
    spec = ClusterSpec.resolve(memory_limit=memory_limit, nworkers=nworkers, nthreads=nthreads,
                               scheduler=scheduler, security=security, processes=processes,
                               dashboard_address=dashboard_address)
    model_reserve = spec.trainer_reserve  # each worker loads the model: a trainer's share
    own = _own_reserve()
    if nworkers is None and not scheduler and processes:
        nworkers = _workers_that_fit(spec.total, own, model_reserve)
    try:
        client, budget = spec.open(echo, nworkers=nworkers, storage_options=storage_options,
                                   trainer_reserve=own if processes else own + model_reserve,
                                   worker_reserve=model_reserve if processes else 0)
        if not scheduler and spec.dashboard_address and getattr(client, "dashboard_link", None):
            echo(f"dashboard: {client.dashboard_link}")  # where to watch it, as train says
        return client, budget
    except BudgetError as e:
        raise BudgetError(
            f"{e}\n(In predict the trainer's share is this process's: {format_bytes(own)}, what "
            f"it holds now and room to write. Each worker loads the model: "
            f"{format_bytes(model_reserve)}, config daskfeed.trainer-reserve.)"
        ) from None


def _own_reserve() -> int:
    """The share of the budget for the calling process: what it holds already plus room to work.

    From the CLI that is small (Python, pandas, pyarrow, dask). From a notebook or a script
    that trained a model first, it includes TF, the model and the caller's data, which the
    same budget covers.
    """
    return max(CLIENT_RESERVE, psutil.Process().memory_info().rss + CLIENT_RESERVE // 2)


def _workers_that_fit(total: int, own: int, model_reserve: int) -> int:
    """The default worker count, fewer where the budget cannot give each its copy of the model."""
    fit = (total - own - 32 * 2**20) // (MIN_WORKER + model_reserve)
    return int(max(1, min(default_nworkers(), fit)))


def _score(client: Client, source: Source, run: TrainedRun, keep: tuple[str, ...],
           schema: pa.Schema, in_flight: int, timeout: float, sink_to: tuple[IO[bytes], str | None] | None,
           say: Callable[[str], None], unparsed: dict[str, Unparsed] | None = None) -> pa.Table:
    """Score every block in order into the file (or a table, returned, when there is none).

    ``unparsed`` (when given) is filled with the values neither missing nor read, by column.
    """
    sink = _Sink(*sink_to, schema) if sink_to else _Sink(None, None, schema)
    show = _progress(say, source.npartitions)
    rows = rejected = done = 0
    found: dict[str, Unparsed] = {} if unparsed is None else unparsed
    t0 = time.perf_counter()
    try:
        for table, bad, odd in _in_order(client, source, run.scorer, keep, schema, in_flight,
                                         timeout, as_text=sink.fmt == "csv"):
            sink.add(table)
            rows, rejected, done = rows + table.num_rows, rejected + bad, done + 1
            for name, u in odd.items():
                found[name] = found[name].plus(u) if name in found else u
            show(done, rows, time.perf_counter() - t0)
    finally:
        sink.close()
    if rejected:
        say(f"predict: {rejected:,} malformed line(s) skipped (bad_lines="
            f"{source.options.bad_lines!r}, as in training): no prediction for them")
    if found:
        say(_unparsed_line(found, run))
    return pa.concat_tables(sink.tables) if sink.tables else schema.empty_table()


def _unparsed_line(found: dict[str, Unparsed], run: TrainedRun) -> str:
    """The closing line on values neither missing nor read: how many, by column, the first."""
    kinds = {run.manifest.columns[n].kind for n in found}
    what = " or ".join(w for k, w in (("datetime", "a date"), ("numeric", "a number")) if k in kinds)
    each = "; ".join(f"{name!r} {u.count:,} (first {u.first} in {u.where})"
                     for name, u in found.items())
    total = sum(u.count for u in found.values())
    return (f"predict: {total:,} value(s) not missing but not {what} were scored with the "
            f"training mean, as missing values are: {each} (serving/ counts them in its "
            "'unparsed' output)")


def _source(data: PathsLike, manifest: Manifest, blocksize: int | str,
            storage_options: dict[str, Any] | None) -> Source:
    """The data, read with the options the training data were read with."""
    o = manifest.read_options or {}
    source = Source(data, blocksize=blocksize, sep=o.get("sep", ","),
                    encoding=o.get("encoding", "utf-8"), dtype=o.get("dtype") or None,
                    storage_options=storage_options, bad_lines=o.get("bad_lines", "error"),
                    na_values=o.get("na_values") or None, decimal=o.get("decimal", "."))
    source.use_splits(manifest.splits)  # the training files, read where the scan read them
    return source


def _check_header(source: Source, run: TrainedRun, keep: Sequence[str]) -> None:
    """Refuse data whose header lacks a feature or a kept column, before any block is read."""
    header = source.header()
    missing = [n for n in (*run.features, *keep) if n not in header]
    if missing:
        first = source.files[0].path if source.files else "the data"
        raise SchemaError(
            f"Expected every feature column the model was trained on"
            f"{' and the --keep columns' if keep else ''} in the data. Received: {first} has no "
            f"column {', '.join(map(repr, missing))} (its columns: {header[:20]}).\nHint: the "
            f"model takes {', '.join(run.features)}; the label {run.manifest.label!r} may be "
            "left out."
        )


def _result_bytes(source: Source, run: TrainedRun, schema: pa.Schema) -> int:
    """Estimated bytes of one block's prediction table (rows from the training bytes per row)."""
    rows = source.options.blocksize / max(run.manifest.bytes_per_row, 1.0)
    return int(rows * 8 * len(schema))
