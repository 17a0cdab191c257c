"""Polars as a fast path of daskfeed's parse: exactly pyarrow's table, or nothing (issue 46, item 1).

    .venv/bin/python -m pip install -e '.[bench]'   # (Polars)
    .venv/bin/python benchmarks/polars_path.py speed [--file CSV]   # one block, in turn, medians of 9
    .venv/bin/python benchmarks/polars_path.py task [--file CSV]    # + null markers, compact, statistics
    .venv/bin/python benchmarks/polars_path.py fuzz [--seed S] [--texts N]
    .venv/bin/python benchmarks/polars_path.py native [--file CSV] [--rounds N]   # a whole task

The prototype measured in ``docs/development.md`` ("Polars inside the pipeline, again"), kept
here so its figures can be made again; it is not daskfeed's parse. :func:`fast_read` parses a
block with Polars and returns what ``daskfeed.reading._tables.read_csv`` (pyarrow) returns for
the same arguments, or None where it cannot be sure (the caller would parse with pyarrow):

- options and bytes only: UTF-8, a one-byte separator that is no part of a number, a decimal
  point, bad lines an error, quoted line breaks allowed, no lone carriage return, no field that
  starts with ``+`` (Polars reads ``+5`` as 5 where pyarrow makes the column text or float);
- rows: Polars fills a short line with nulls and reads a blank line as a row of them; both
  leave the last column null, and there the separators are counted;
- types: inferred by Polars on 100 rows (every row costs 13× the parse); a column with a later
  value it refuses is read again as text; a text column whose first value pyarrow reads as a
  number, boolean, date or time is converted by pyarrow's own CSV converter from its values; a
  Boolean column is refused (Polars takes ``tRuE``);
- a quoted empty field (Polars: ``""``) made missing.

``fuzz`` compares it with ``read_csv`` on random texts and prints every difference; the two it
found (a field of spaces in a numeric column, a quote inside an unquoted field) are not handled.

``native`` asks whether a scan task written in Polars from end to end would pay (item 2: "Polars
pays only if the task after the parse is Polars' too"): one block's task as a scan task does it
(pyarrow's parse, the null-marker rule, the cache's form, the statistics and facts, the Arrow
file), against the same block parsed by Polars on one thread, its statistics in Polars'
expressions (missing values, bounds, mean, variance), whole numbers as ``Int32``, text as
``Categorical`` with its counts, written with ``write_ipc``: less than the task does (no marker
rule, no facts, no line count), so it bounds what such a task could gain. Each side in processes
of its own (Polars' threads fixed at its import; the workers' allocator settings for daskfeed's),
in turn A-B-A, ``--rounds`` processes of 5 runs each; the medians and their ratio.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from daskfeed.reading._lines import lone_cr
from daskfeed.reading._tables import ReadOptions

_RETRIES = 8  # columns re-read as text after Polars refused a value of its inferred type
_COLUMN = re.compile(r"at column '(.*?)' \(column number \d+\)")
_NUMBERLIKE = frozenset(b"0123456789.+-eE")


def fast_read(body: bytes, names: list[str], options: ReadOptions, forced: dict[str, pa.DataType],
              whole: bool, chunked: bool = False) -> pa.Table | None:
    """``body`` parsed by Polars as pyarrow would parse it; None where pyarrow must read it.

    Parameters
    ----------
    body
        Whole records, no header.
    names
        The header's column names.
    options
        How to parse it (:class:`~daskfeed.reading._tables.ReadOptions`).
    forced
        The columns read as text (the dtype overrides).
    whole
        Whether quoted fields may hold line breaks.
    chunked
        Keep Polars' chunks and its ``large_string`` (not one chunk of ``string``).

    Returns
    -------
    pyarrow.Table or None
        What :func:`~daskfeed.reading._tables.read_csv` returns for these arguments (one chunk
        per column), or None.
    """
    pl = _polars()
    if pl is None or not _plain(body, names, options, whole):
        return None
    text = set(forced)
    for _ in range(_RETRIES):
        try:
            df = pl.read_csv(
                body, has_header=False, new_columns=names, separator=options.sep,
                quote_char='"', schema_overrides=dict.fromkeys(text, pl.String),
                try_parse_dates=False, raise_if_empty=False, truncate_ragged_lines=False,
                empty_string_is_null=True, encoding="utf8")
        except pl.exceptions.ComputeError as err:  # a value not of the type inferred
            refused = _COLUMN.search(str(err))
            if refused is None or refused.group(1) in text or refused.group(1) not in names:
                return None
            text.add(refused.group(1))
            continue
        except Exception:  # (Polars cannot read it: pyarrow reads it, or says why)
            return None
        break
    else:
        return None
    if df.width != len(names) or not _rows_whole(df, body, options.sep):
        return None
    return _as_pyarrow(df, forced, options, chunked)


def _polars() -> Any:
    try:
        import polars
    except ImportError:
        return None
    return polars


def _plain(body: bytes, names: list[str], options: ReadOptions, whole: bool) -> bool:
    """Whether the options and the text's bytes are ones Polars reads as pyarrow does."""
    sep = options.sep.encode("utf-8")
    if (len(sep) != 1 or sep[0] in _NUMBERLIKE or sep in b'"\r\n' or not whole
            or options.decimal != "." or options.bad_lines != "error"
            or options.encoding.lower().replace("-", "").replace("_", "") not in ("utf8",)
            or len(set(names)) != len(names)):
        return False
    if body.find(b"\r") >= 0 and lone_cr(body):
        return False
    return not _signed(body, sep)


def _signed(body: bytes, sep: bytes) -> bool:
    """Whether some field of ``body`` may start with ``+`` (Polars reads ``+5`` as 5, pyarrow not)."""
    at = body.find(b"+")
    while at >= 0:
        if at == 0 or body[at - 1 : at] in (sep, b"\n", b"\r", b'"', b" ", b"\t"):
            return True
        at = body.find(b"+", at + 1)
    return False


def _rows_whole(df: Any, body: bytes, sep: str) -> bool:
    """Whether each of Polars' rows is a whole record (no short line filled, no blank line read)."""
    last = df.get_column(df.columns[-1])
    if not df.height or not last.null_count():
        return True
    if df.width == 1:  # (a blank line or an empty field: the same null)
        return False
    inside = 0
    if body.find(b'"') >= 0:  # separators inside quoted text
        import polars as pl

        texts = [c for c, t in df.schema.items() if t == pl.String]
        if texts:
            counts = df.select([pl.col(c).str.count_matches(sep, literal=True).sum() for c in texts])
            inside = int(sum(counts.row(0)))
    return body.count(sep.encode("utf-8")) == df.height * (df.width - 1) + inside


def _as_pyarrow(df: Any, forced: dict[str, pa.DataType], options: ReadOptions,
                chunked: bool) -> pa.Table | None:
    """Polars' columns as pyarrow parses them (None: pyarrow must read the text)."""
    import polars as pl

    types = df.schema
    if any(t not in (pl.Int64, pl.Float64, pl.String) for t in types.values()):
        return None  # (Boolean: Polars takes tRuE; others are not inferred with these options)
    texts = [c for c, t in types.items() if t == pl.String]
    facts = df.select([pl.col(c).filter(pl.col(c) != "").first().alias(f"f{i}")
                       for i, c in enumerate(texts)]
                      + [(pl.col(c) == "").sum().alias(f"e{i}") for i, c in enumerate(texts)]
                      ).row(0) if texts else ()
    first, empties = facts[: len(texts)], facts[len(texts) :]
    quoted_empty = [c for c, n in zip(texts, empties, strict=True) if n]
    if quoted_empty:  # a quoted empty field: pyarrow's missing value
        df = df.with_columns([pl.when(pl.col(c) == "").then(None).otherwise(pl.col(c)).alias(c)
                              for c in quoted_empty])
    table = df.to_arrow() if chunked else df.rechunk().to_arrow(compat_level=pl.CompatLevel.newest())
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name not in types or types[name] != pl.String:
            columns.append(column)
            continue
        value = first[texts.index(name)]
        if name in forced or (value is not None and _only_text(value, options)):
            columns.append(column.cast(pa.string()))
        elif value is None:  # only empty fields: pyarrow's null column
            columns.append(pa.chunked_array([pa.nulls(len(column))]))
        else:
            columns.append(_converted(df.get_column(name), options))
    return pa.Table.from_arrays(columns, names=table.column_names)


def _only_text(value: str, options: ReadOptions) -> bool:
    """Whether pyarrow reads ``value`` as text only (no number, boolean, date, time, null)."""
    body = ('"' + value.replace('"', '""') + '"\n').encode("utf-8")
    return pa.types.is_string(_pyarrow_column(body, options).type)


def _converted(series: Any, options: ReadOptions) -> pa.ChunkedArray:
    """A column's values (as Polars read their text) converted by pyarrow's CSV converter."""
    import polars as pl

    quoted = pl.select(
        pl.when(series.is_null()).then(pl.lit(""))
        .otherwise(pl.lit('"') + series.str.replace_all('"', '""', literal=True) + pl.lit('"'))
    ).to_series()
    body = (quoted.str.join("\n").item() + "\n").encode("utf-8")
    return _pyarrow_column(body, options)


def _pyarrow_column(body: bytes, options: ReadOptions) -> pa.ChunkedArray:
    """One column of one value a line (an empty line: missing), by pyarrow's CSV converter."""
    return pacsv.read_csv(
        pa.BufferReader(body),
        read_options=pacsv.ReadOptions(column_names=["c"], use_threads=False,
                                       block_size=min(len(body) + 1, 2**31 - 1)),
        parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(strings_can_be_null=True, null_values=[""],
                                             timestamp_parsers=[], decimal_point=options.decimal),
    ).column(0)


DEFAULT_FILE = "bench-out/scan-big/log_quest/splited/split_data_00000.csv"


def _block(path: str) -> tuple[bytes, list[str]]:
    """The first 64 MiB of whole records of ``path`` after its header, and its column names."""
    with open(path, "rb") as f:
        raw = f.read(64 << 20)
    raw = raw[: raw.rfind(b"\n") + 1]
    head = raw.find(b"\n") + 1
    return raw[head:], raw[:head].decode().strip().split(",")


def speed(path: str, task: bool) -> None:
    """Time ``read_csv`` (pyarrow) against :func:`fast_read` (and bare Polars) in turn, 9 rounds."""
    import polars as pl

    from daskfeed.cache import compact
    from daskfeed.reading._files import Block
    from daskfeed.reading._tables import read_csv, with_markers
    from daskfeed.scanning._stats import StatsAccumulator, table_facts

    body, names = _block(path)
    options, block = ReadOptions(), Block(path, 0, len(body), 0)

    def after(table: pa.Table) -> None:
        if task:
            table = with_markers(table, {}, options, block)
            acc = StatsAccumulator(names[-1])
            acc.add(table, compact(table))
            acc.flush()
            table_facts(table, names[-1])

    runs: dict[str, list[float]] = {"pyarrow": [], "polars path": [], "polars path, chunked": [],
                                    "bare polars": []}
    for _ in range(9):
        for name, parse in (("pyarrow", lambda: read_csv(body, names, block, options, None, {}, True)),
                            ("polars path", lambda: fast_read(body, names, options, {}, True)),
                            ("polars path, chunked",
                             lambda: fast_read(body, names, options, {}, True, chunked=True)),
                            ("bare polars", lambda: pl.read_csv(body, has_header=False,
                                                                new_columns=names))):
            t = time.perf_counter()
            out = parse()
            if name != "bare polars":
                after(out)
            runs[name].append(time.perf_counter() - t)
    base = statistics.median(runs["pyarrow"])
    for name, seconds in runs.items():
        med = statistics.median(seconds)
        print(f"{name:22s} {med:.3f} s   pyarrow's time / this: {base / med:.3f}")


_VALUES = ["1", "-2", "007", "+5", " 5", "5 ", "3.5", ".5", "5.", "1e5", "1E+5", "inf", "-inf",
           "NaN", "nan", "Infinity", "true", "False", "TRUE", "tRuE", "0", "", '""', '"x"',
           '"a,b"', '"a\nb"', '"a""b"', "abc", "x y", " ", "2020-01-01", "12:00:00",
           "2020-01-01T10:00:00Z", "99999999999999999999", "0x10", "1_000", "-0", "-0.0",
           "1e400", 'ab"c', "é", "\t5"]
_POOLS = {"int": ["1", "-2", "007", "0", "12345", "-0", " 5", ""],
          "float": ["3.5", ".5", "5.", "1e5", "1E+5", "-0.0", "2.25", ""],
          "text": ["abc", "x y", '"a,b"', '"a\nb"', '"a""b"', "é", ""],
          "date": ["2020-01-01", "1999-12-31", ""], "bool": ["true", "false", "True", "FALSE", ""],
          "empty": ["", '""'], "mixed": _VALUES}


def _text(rng: random.Random, junk: float, short: float) -> tuple[bytes, list[str]]:
    """A random CSV text (no header) and its column names."""
    ncols = rng.randint(1, 4)
    pools = [_POOLS[rng.choice(sorted(_POOLS))] for _ in range(ncols)]
    lines = []
    for _ in range(rng.randint(1, 250)):
        if rng.random() < short:
            lines.append("")
            continue
        n = ncols - (rng.random() < short)
        lines.append(",".join(rng.choice(pools[c]) if rng.random() > junk else rng.choice(_VALUES)
                              for c in range(n)))
    eol = "\r\n" if rng.random() < 0.2 else "\n"
    return (eol.join(lines) + eol).encode(), [f"c{i}" for i in range(ncols)]


def fuzz(seed: int, texts: int, junk: float, short: float) -> int:
    """Random texts through both; every difference printed; the number of differences."""
    from daskfeed.core import DataError
    from daskfeed.reading._files import Block
    from daskfeed.reading._tables import read_csv

    rng, options = random.Random(seed), ReadOptions()
    fast = diffs = 0
    for _ in range(texts):
        body, names = _text(rng, junk, short)
        try:
            ref = read_csv(body, names, Block("x.csv", 0, len(body), 0), options, None, {}, True)
        except DataError:
            ref = None
        got = fast_read(body, names, options, {}, True)
        if got is None:
            continue
        fast += 1
        if ref is None:
            diffs += 1
            print("DIFF: the fast path read what pyarrow refuses:", repr(body[:200]))
            continue
        for name in names:
            a, b = ref.column(name), got.column(name)
            if a.type != b.type or repr(a.to_pylist()) != repr(b.to_pylist()):
                diffs += 1
                print(f"DIFF column {name}: pyarrow {a.type}, fast path {b.type}:", repr(body[:200]))
                break
    print(f"{texts} texts, {fast} on the fast path, {diffs} different")
    return diffs


def _task_daskfeed(body: bytes, names: list[str], path: str, out: str) -> dict[str, float]:
    """A scan task's work on one block (see ``native``): seconds of each phase."""
    import pyarrow.ipc as ipc

    from daskfeed.cache import compact
    from daskfeed.reading._files import Block
    from daskfeed.reading._tables import read_csv, with_markers
    from daskfeed.scanning._stats import StatsAccumulator, table_facts

    options, block = ReadOptions(), Block(path, 0, len(body), 0)
    t0 = time.perf_counter()
    table = with_markers(read_csv(body, names, block, options, None, {}, True), {}, options, block)
    t1 = time.perf_counter()
    coded = compact(table)
    t2 = time.perf_counter()
    acc = StatsAccumulator(names[-1])
    acc.add(table, coded)
    acc.flush()
    table_facts(table, names[-1])
    t3 = time.perf_counter()
    whole = coded.unify_dictionaries().combine_chunks()
    with pa.OSFile(out, "wb") as f, ipc.new_file(f, whole.schema) as w:
        for batch in whole.to_batches(max_chunksize=65536):
            w.write_batch(batch)
    t4 = time.perf_counter()
    return {"parse": t1 - t0, "form": t2 - t1, "statistics": t3 - t2, "file": t4 - t3}


def _task_polars(body: bytes, names: list[str], path: str, out: str) -> dict[str, float]:
    """The same block's task in Polars from end to end (see ``native``): seconds of each phase."""
    import polars as pl

    t0 = time.perf_counter()
    df = pl.read_csv(body, has_header=False, new_columns=names)
    t1 = time.perf_counter()
    numbers = [c for c, t in df.schema.items() if t.is_numeric()]
    texts = [c for c, t in df.schema.items() if t == pl.String]
    stats = df.select([e for c in numbers for e in (
        pl.col(c).null_count().alias(f"{c}:missing"), pl.col(c).min().alias(f"{c}:min"),
        pl.col(c).max().alias(f"{c}:max"), pl.col(c).mean().alias(f"{c}:mean"),
        pl.col(c).var().alias(f"{c}:var"))])
    t2 = time.perf_counter()

    def narrow(c: str) -> pl.Expr:
        lo, hi = stats[f"{c}:min"][0], stats[f"{c}:max"][0]
        fits = df.schema[c] == pl.Int64 and lo is not None and -(2**31) <= lo and hi < 2**31
        return pl.col(c).cast(pl.Int32) if fits else pl.col(c)

    coded = df.select([narrow(c) for c in numbers] + [pl.col(c).cast(pl.Categorical) for c in texts])
    for c in texts:
        coded[c].value_counts()
    t3 = time.perf_counter()
    coded.write_ipc(out, compression="uncompressed")
    t4 = time.perf_counter()
    return {"parse": t1 - t0, "form": t3 - t2, "statistics": t2 - t1, "file": t4 - t3}


def native_one(side: str, path: str) -> None:
    """(A child process of ``native``.) One side's task on the block, 5 runs: JSON of medians."""
    import json
    import os
    import tempfile

    if side == "daskfeed":  # as a local worker's preload sets its heap (a worker of 1.26 GB)
        from daskfeed.cluster._heap import serve_from_heap

        serve_from_heap(1_260_000_000)
    body, names = _block(path)
    task = _task_daskfeed if side == "daskfeed" else _task_polars
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(5):
            t = time.perf_counter()
            phases = task(body, names, path, os.path.join(tmp, "block.arrow"))
            runs.append({**phases, "task": time.perf_counter() - t})
    print(json.dumps({k: statistics.median(r[k] for r in runs) for k in runs[0]}))


def native(path: str, rounds: int) -> None:
    """``native``: each side in processes of its own, in turn A-B-A; medians and the ratio."""
    import json
    import os
    import subprocess

    env = {"daskfeed": {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "1",
                        "MALLOC_TRIM_THRESHOLD_": "65536"},
           "polars": {"POLARS_MAX_THREADS": "1"}}
    found: dict[str, list[dict[str, float]]] = {"daskfeed": [], "polars": []}
    order = ["daskfeed", *(["polars", "daskfeed"] * rounds)]
    for side in order:
        out = subprocess.run([sys.executable, __file__, "native-one", side, "--file", path],
                             env={**os.environ, **env[side]}, capture_output=True, text=True, check=True)
        found[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(side, {k: round(v, 3) for k, v in found[side][-1].items()}, flush=True)
    med = {side: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for side, runs in found.items()}
    for side, m in med.items():
        print(f"{side:9s} " + "  ".join(f"{k} {v:.3f} s" for k, v in m.items()))
    print(f"Polars task's speed / daskfeed task's: {med['daskfeed']['task'] / med['polars']['task']:.3f} "
          f"(the parse alone {med['daskfeed']['parse'] / med['polars']['parse']:.3f})")


def main(argv: list[str] | None = None) -> None:
    """Run ``speed``, ``task``, ``fuzz`` or ``native``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["speed", "task", "fuzz", "native", "native-one"])
    p.add_argument("side", nargs="?", choices=["daskfeed", "polars"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--file", default=DEFAULT_FILE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--texts", type=int, default=1500)
    p.add_argument("--junk", type=float, default=0.01, help="share of fields from any column's values")
    p.add_argument("--short", type=float, default=0.002, help="share of short and of blank lines")
    a = p.parse_args(argv)
    if a.what == "fuzz":
        sys.exit(1 if fuzz(a.seed, a.texts, a.junk, a.short) else 0)
    if a.what == "native-one":
        native_one(a.side, a.file)
        return
    if a.what == "native":
        native(a.file, a.rounds)
        return
    speed(a.file, a.what == "task")


if __name__ == "__main__":
    main()
