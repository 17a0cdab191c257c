"""The scan from the shell against pyarrow reading the same files (issue 31, item 2).

    .venv/bin/python benchmarks/scan_rate.py                    # big files and 20,000 small ones
    .venv/bin/python benchmarks/scan_rate.py --sets big --rounds 5

Two data sets of demo quest logs (written once under ``bench-out/``): ``big``, 16M rows in four
files of about 225 MB; ``small``, 20,000 files of 1000 rows (1.13 GB). Per set, in A-B-A order
(``--rounds`` pairs, medians, and the ratio pair by pair), each a whole process as a user runs it:

- ``pyarrow``: ``python benchmarks/scan_rate.py --pyarrow GLOB``: ``pyarrow.csv.read_csv`` of
  every file, all columns, in a thread pool of one thread per core (pyarrow threading inside each
  file too): how a pyarrow user reads a directory of CSV files;
- ``daskfeed``: ``daskfeed scan GLOB --label cleared --cache FRESH`` (process start, the local
  cluster, the types, statistics and vocabularies, and the parse cache written, as ``daskfeed
  train`` scans), a fresh cache directory each round.

daskfeed is byte-compiled first, as an installed wheel has it (:func:`common.byte_compile`).
Writes ``<out>/scan-rate-<name>.json`` and ``.txt``. The page cache is warmed by one untimed
pyarrow read first. ``--parsers polars,duckdb`` instead times the CSV readers alone against
pyarrow's (each as its users write it, see :func:`other_read`), in turn, whole processes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = {"big": (16_000_000, 4_000_000), "small": (20_000_000, 1000)}  # rows, rows per file


def pyarrow_read(pattern: str) -> int:
    """Every file of ``pattern`` read by ``pyarrow.csv.read_csv`` in a thread pool; the rows."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.csv as pacsv

    files = sorted(glob.glob(pattern, recursive=True))
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return sum(pool.map(lambda f: pacsv.read_csv(f).num_rows, files))


def other_read(engine: str, pattern: str) -> int:
    """Every file of ``pattern`` read whole into memory by ``engine`` as its users write it; the rows.

    ``polars``: ``polars.scan_csv(GLOB).collect()`` (polars lists and reads the files in
    parallel); ``duckdb``: ``SELECT * FROM read_csv(GLOB)`` fetched as an Arrow table.
    """
    if engine == "polars":
        import polars as pl

        return pl.scan_csv(pattern).collect().height
    import duckdb

    rel = duckdb.sql(f"SELECT * FROM read_csv('{pattern}')")
    assert rel is not None
    return rel.to_arrow_table().num_rows


def one_thread(path: str, rounds: int) -> dict[str, float]:
    """The parse of the first 64 MiB of ``path`` by pyarrow and by polars on one thread: MB/s.

    What a scan task's parse would run at (a worker parses on one thread); run in turn, in a
    process of its own (polars fixes its threads when it is imported: ``POLARS_MAX_THREADS=1``).
    """
    import io

    import polars as pl
    import pyarrow as pa
    import pyarrow.csv as pacsv

    with open(path, "rb") as f:
        body = f.read(64 << 20)
    body = body[: body.rfind(b"\n") + 1]
    pa.set_cpu_count(1)
    read = {"pyarrow": lambda: pacsv.read_csv(io.BytesIO(body), read_options=pacsv.ReadOptions(
                use_threads=False, block_size=1 << 26)),
            "polars": lambda: pl.read_csv(io.BytesIO(body))}  # (one thread: POLARS_MAX_THREADS=1)
    seconds: dict[str, list[float]] = {k: [] for k in read}
    for _ in range(rounds):
        for k, parse in read.items():
            t = time.perf_counter()
            parse()
            seconds[k].append(time.perf_counter() - t)
    return {k: len(body) / statistics.median(v) / 1e6 for k, v in seconds.items()}


def parsers(pattern: str, nbytes: int, rounds: int, engines: list[str]) -> dict[str, Any]:
    """The CSV readers alone, in turn (pyarrow first): seconds, medians, MB/s, rate against pyarrow."""
    cmds = {e: [sys.executable, os.path.abspath(__file__), *(["--pyarrow", pattern] if e == "pyarrow"
                                                               else ["--read", e, pattern])]
            for e in ["pyarrow", *engines]}
    for cmd in cmds.values():
        _timed(cmd)  # page cache warm, imports compiled: not counted
    out: dict[str, list[float]] = {e: [] for e in cmds}
    for _ in range(rounds):
        for e, cmd in cmds.items():
            out[e].append(_timed(cmd))
    med = {k: statistics.median(v) for k, v in out.items()}
    return {"seconds": out, "median_s": med, "mb_per_s": {k: nbytes / v / 1e6 for k, v in med.items()},
            "rate_vs_pyarrow": {k: med["pyarrow"] / v for k, v in med.items()},
            "commands": {k: " ".join(v[1:]) for k, v in cmds.items()}}


def data(name: str, root: str) -> tuple[str, int]:
    """The set ``name`` under ``root`` (written if missing): its glob and bytes."""
    from daskfeed import write_demo_data

    rows, per_file = SETS[name]
    demo = write_demo_data(os.path.join(root, f"scan-{name}"), rows=rows, validate_rows=1000,
                           rows_per_file=per_file)
    files = glob.glob(demo.train_glob, recursive=True)
    return demo.train_glob, sum(os.path.getsize(f) for f in files)


def _timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def measure(pattern: str, nbytes: int, rounds: int, cache: str, memory_limit: str) -> dict[str, Any]:
    """A-B-A rounds of the two commands on ``pattern``: seconds, medians, MB/s, ratios."""
    py = [sys.executable, os.path.abspath(__file__), "--pyarrow", pattern]
    scan = [os.path.join(os.path.dirname(sys.executable), "daskfeed"), "scan", pattern,
            "--label", "cleared", "--cache", cache, "--memory-limit", memory_limit]
    _timed(py)  # page cache warm, not counted
    out: dict[str, list[float]] = {"pyarrow": [], "daskfeed": []}
    for _ in range(rounds):
        out["pyarrow"].append(_timed(py))
        shutil.rmtree(cache, ignore_errors=True)
        out["daskfeed"].append(_timed(scan))
    out["pyarrow"].append(_timed(py))  # A-B-A: the anchor last too
    shutil.rmtree(cache, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in out.items()}
    # each daskfeed round against the mean of the pyarrow runs either side of it
    pairs = [(out["pyarrow"][i] + out["pyarrow"][i + 1]) / 2 / out["daskfeed"][i] for i in range(rounds)]
    return {"seconds": out, "median_s": med, "mb_per_s": {k: nbytes / v / 1e6 for k, v in med.items()},
            "rate_ratio_pairs": pairs, "rate_ratio_median": statistics.median(pairs),
            "commands": {"pyarrow": " ".join(py[1:]), "daskfeed": " ".join(scan)}}


def main(argv: list[str] | None = None) -> None:
    """Run the rounds per set (or, with ``--pyarrow``, the pyarrow read) and write the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pyarrow", metavar="GLOB", help="(internal) read GLOB with pyarrow and exit")
    p.add_argument("--read", nargs=2, metavar=("ENGINE", "GLOB"), help="(internal) read GLOB with "
                   "polars or duckdb and exit")
    p.add_argument("--one-thread", metavar="FILE", help="(internal) pyarrow and polars on one "
                   "thread, one 64 MiB block of FILE; JSON of MB/s")
    p.add_argument("--parsers", default="", help="instead of the scan: pyarrow against these "
                   "readers, comma-separated (polars, duckdb; pip install them first)")
    p.add_argument("--sets", default="big,small", help="comma-separated: big, small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--data-root", default="bench-out")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=time.strftime("%Y-%m-%d"))
    a = p.parse_args(argv)
    if a.pyarrow:
        print(pyarrow_read(a.pyarrow))
        return
    if a.read:
        print(other_read(*a.read))
        return
    if a.one_thread:
        print(json.dumps(one_thread(a.one_thread, max(5, a.rounds))))
        return
    from common import byte_compile, code_state, write_results

    byte_compile()

    res: dict[str, Any] = {"what": "daskfeed scan (statistics and parse cache) vs pyarrow read_csv, "
                                   "whole processes from the shell, A-B-A",
                           "command": "python benchmarks/scan_rate.py " + " ".join(argv or sys.argv[1:]),
                           "load_before": os.getloadavg(), "code": code_state(), "sets": {}}
    lines = []
    for name in a.sets.split(","):
        pattern, nbytes = data(name, a.data_root)
        if a.parsers:
            r = parsers(pattern, nbytes, a.rounds, a.parsers.split(","))
            res["what"] = "CSV readers alone, whole processes from the shell, in turn"
            res["sets"][name] = {**r, "bytes": nbytes}
            lines.append(f"{name:6s} {nbytes / 1e9:.2f} GB  " + "  ".join(
                f"{e} {r['median_s'][e]:.2f} s ({r['rate_vs_pyarrow'][e]:.2f}x pyarrow's rate)"
                for e in r["median_s"]))
            if "polars" in r["median_s"] and name == "big":
                mbs = r["one_thread_mb_per_s"] = json.loads(subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--one-thread",
                     sorted(glob.glob(pattern, recursive=True))[0]], check=True, capture_output=True,
                    text=True, env={**os.environ, "POLARS_MAX_THREADS": "1"}).stdout)
                lines.append(f"       one thread, a 64 MiB block: pyarrow {mbs['pyarrow']:.0f} MB/s, "
                             f"polars {mbs['polars']:.0f} MB/s ({mbs['polars'] / mbs['pyarrow']:.2f}x)")
            print("\n".join(lines[-2:] if name == "big" and "polars" in r["median_s"] else lines[-1:]),
                  flush=True)
            continue
        r = measure(pattern, nbytes, a.rounds, os.path.join(a.data_root, "scan-rate-cache"),
                    a.memory_limit)
        r["bytes"] = nbytes
        res["sets"][name] = r
        lines.append(f"{name:6s} {nbytes / 1e9:.2f} GB  pyarrow {r['median_s']['pyarrow']:.2f} s "
                     f"({r['mb_per_s']['pyarrow']:.0f} MB/s)  "
                     f"daskfeed scan {r['median_s']['daskfeed']:.2f} s "
                     f"({r['mb_per_s']['daskfeed']:.0f} MB/s)  rate ratio {r['rate_ratio_median']:.3f} "
                     f"(pairs {', '.join(f'{x:.3f}' for x in r['rate_ratio_pairs'])})")
        print(lines[-1], flush=True)
    res["load_after"] = os.getloadavg()
    write_results(a.out, f"scan-rate-{a.name}", res,
                  [*lines, f"load before/after: {res['load_before']} / {res['load_after']}",
                   f"command: {res['command']}"])


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
