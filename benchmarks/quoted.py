r"""One big CSV with quoted line breaks (issue 31): split into blocks at the parser's rate.

Two files of the same rows and the same bytes: in one, 10 % of the rows have a text field holding
a line break (``"first line 12\nsecond, line 12"``); in the other that break is a space. Each is
scanned as a user scans it, ``daskfeed scan FILE --label y`` from the shell (process start, the
local cluster, the statistics and the parse cache included), in A-B-A order with a fresh cache
directory each time; medians of the rounds and their ratio (target: the file with line breaks
at >= 0.8x the rate of the one without). The rows the scan counts are checked against pyarrow
reading the whole file (``newlines_in_values=True``), and its blocks must be >= 4.

Run: ``make bench-quoted`` (``python benchmarks/quoted.py [--mb 1000] [--rounds 3]``); results as
JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np


def write(path: str, mb: int, breaks: bool, seed: int = 0) -> int:
    """About ``mb`` MB of rows (id, note, four numbers, a 0/1 label); the rows written."""
    rng = np.random.default_rng(seed)
    n = 200_000  # rows per chunk
    rows = 0
    sep = "\n" if breaks else " "
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,note,x1,x2,x3,x4,y\n")
        while f.tell() < mb * 1e6:
            ids = np.arange(rows, rows + n)
            x = rng.random((n, 4))
            y = (x[:, 0] + rng.normal(0, 0.3, n) > 0.5).astype(int)
            quoted = rng.random(n) < 0.10
            lines = []
            for i, q, xs, label in zip(ids.tolist(), quoted.tolist(), x.round(5).tolist(), y.tolist(),
                                       strict=True):
                note = f'"first line {i}{sep}second, line {i}"' if q else f"plain note {i % 1000}"
                lines.append(f"{i},{note},{xs[0]},{xs[1]},{xs[2]},{xs[3]},{label}\n")
            f.write("".join(lines))
            rows += n
    return rows


def pyarrow_rows(path: str) -> int:
    """Rows pyarrow reads from the whole file, quoted line breaks allowed."""
    import pyarrow.csv as pacsv

    reader = pacsv.open_csv(path, parse_options=pacsv.ParseOptions(newlines_in_values=True),
                            read_options=pacsv.ReadOptions(block_size=256 << 20))
    return sum(batch.num_rows for batch in reader)


def scan(path: str, work: str, tag: str) -> tuple[float, dict]:
    """``daskfeed scan`` from the shell into a fresh cache; seconds and the manifest."""
    cache, out = os.path.join(work, f"cache-{tag}"), os.path.join(work, f"manifest-{tag}.json")
    shutil.rmtree(cache, ignore_errors=True)
    exe = os.path.join(os.path.dirname(sys.executable), "daskfeed")
    t0 = time.perf_counter()
    subprocess.run([exe, "scan", path, "--label", "y", "--cache", cache, "--output", out,
                    "--dashboard-address", "127.0.0.1:0"], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    shutil.rmtree(cache, ignore_errors=True)
    with open(out, encoding="utf-8") as f:
        return seconds, json.load(f)


def main() -> None:
    """Write both files, scan them A-B-A, check the rows, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default="bench-quoted")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    files = {k: os.path.join(args.work, f"{k}.csv") for k in ("breaks", "flat")}
    rows = {}
    for k, path in files.items():
        rows[k] = write(path, args.mb, k == "breaks")
    assert pyarrow_rows(files["breaks"]) == rows["breaks"]
    times: dict[str, list[float]] = {"breaks": [], "flat": []}
    manifests = {}
    for r in range(args.rounds):  # A-B-A: with breaks, without, with ...
        for k in ("breaks", "flat") if r % 2 == 0 else ("flat", "breaks"):
            seconds, manifests[k] = scan(files[k], args.work, f"{k}-{r}")
            times[k].append(seconds)
            print(f"round {r} {k}: {seconds:.1f} s", flush=True)
    m = manifests["breaks"]
    assert m["rows"] == rows["breaks"], (m["rows"], rows["breaks"])
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = {k: os.path.getsize(path) / 1e6 for k, path in files.items()}
    result: dict[str, Any] = {
        "what": "daskfeed scan of one CSV, 10 % of rows with a quoted line break vs none",
        "command": f"python benchmarks/quoted.py --mb {args.mb} --rounds {args.rounds}",
        "file_mb": mb, "rows": rows["breaks"], "blocks": len(m["blocks"]),
        "decided_exactly": sorted(m.get("splits", {})),
        "seconds": times, "median_s": med,
        "mb_per_s": {k: mb[k] / med[k] for k in med},
        "rate_ratio_breaks_over_flat": (mb["breaks"] / med["breaks"]) / (mb["flat"] / med["flat"]),
        "rows_equal_pyarrow_whole": True,
    }
    assert result["blocks"] >= 4, result["blocks"]
    os.makedirs("benchmarks/results", exist_ok=True)
    out = f"benchmarks/results/quoted-{time.strftime('%Y-%m-%d')}.json"
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    for path in files.values():
        os.remove(path)


if __name__ == "__main__":
    main()
