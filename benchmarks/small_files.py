"""Many small files: daskfeed's scan against pyarrow reading every file, and listing/planning cost.

    .venv/bin/python benchmarks/small_files.py                       # 20,000 × 1000 rows; 20k/100k/200k
    .venv/bin/python benchmarks/small_files.py --files 2000 --listing 2000,5000 --passes 1   # quick

Part 1, scan: ``--files`` demo files of 1000 rows (the old hand-split layout) on a LocalCluster
inside ``--memory-limit`` (started once, not timed). Per pass (median of ``--passes``):

- ``pyarrow_threadpool``: ``pyarrow.csv.read_csv`` of every file (all columns) in a thread pool
  of one thread per core, as a pyarrow user reads a directory of CSV files;
- ``pyarrow_dataset``: ``pyarrow.dataset.dataset(files, format="csv").to_table()``;
- ``daskfeed_scan``: ``daskfeed.scan(glob, label=...)`` (listing, one pass on the cluster,
  the manifest built), no parse cache;
- ``daskfeed_scan_cached``: the same with a fresh parse cache (what ``DaskSequence`` and
  ``daskfeed train`` do: the scan also writes every parsed block for later epochs).

plus ``manifest.json``'s bytes per block.

Part 2, listing and planning: ``--listing`` counts of tiny files (hard links of one 2-line CSV:
no disk blocks, the same directory entries and ``stat`` calls as real files), and per count:
``expand_paths`` (the listing), ``Source(...)`` (listing + blocks), ``Source.fingerprint``,
and ``make_plan`` for the count's blocks of 1000 rows (pure: also measured at 1M
directly). Listing times are fitted linearly in the count and extrapolated to 1M files.
Writes ``<out>/small-files.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
HERE = os.path.dirname(os.path.abspath(__file__))


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def scan_vs_pyarrow(nfiles: int, root: str, memory_limit: str, passes: int, label: str = "cleared"
                    ) -> dict[str, Any]:
    """Part 1 (see the module's docstring)."""
    import pyarrow.csv as pacsv
    import pyarrow.dataset as pads

    import daskfeed
    from daskfeed import Budget, Source, write_demo_data
    from daskfeed.cluster import close_client, start_local_cluster

    t_gen, demo = _timed(lambda: write_demo_data(root, rows=nfiles * 1000, validate_rows=1000))
    pattern = demo.train_glob
    files = [f.path for f in Source(pattern).files]
    nbytes = sum(os.path.getsize(f) for f in files)

    def threadpool() -> int:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            return sum(pool.map(lambda f: pacsv.read_csv(f).num_rows, files))

    def dataset() -> int:
        return pads.dataset(files, format="csv").to_table().num_rows

    threadpool()  # page cache warm for every variant (not counted)
    budget = Budget.split(memory_limit)
    t_cluster, client = _timed(lambda: start_local_cluster(budget, dashboard_address=""))
    times: dict[str, list[float]] = {"pyarrow_threadpool": [], "pyarrow_dataset": [], "daskfeed_scan": [],
                                     "daskfeed_scan_cached": []}
    rows: dict[str, int] = {}
    manifest_bytes = partitions = 0
    try:
        from daskfeed.cache import open_cache

        for p in range(passes):
            for name, fn in (("pyarrow_threadpool", threadpool), ("pyarrow_dataset", dataset)):
                s, rows[name] = _timed(fn)
                times[name].append(s)
            s, m = _timed(lambda: daskfeed.scan(pattern, label=label, client=client,
                                                blocksize=budget.blocksize))
            times["daskfeed_scan"].append(s)
            rows["daskfeed_scan"] = m.rows
            with tempfile.TemporaryDirectory(prefix="daskfeed-sf-cache-") as cdir:
                def cached() -> Any:
                    src = Source(pattern, blocksize=budget.blocksize)
                    cache, _ = open_cache(src, cdir, required=True, client=client)
                    return daskfeed.scan(src, label=label, client=client, parse_cache=cache)

                s, m2 = _timed(cached)
                times["daskfeed_scan_cached"].append(s)
                rows["daskfeed_scan_cached"] = m2.rows
            print(f"  pass {p + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items())
                  + f" (load {_load()})", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "manifest.json")
            m.to_json(path)
            manifest_bytes = os.path.getsize(path)
            partitions = len(m.blocks)
    finally:
        close_client(client)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = min(("pyarrow_threadpool", "pyarrow_dataset"), key=lambda k: med[k])
    return {"files": len(files), "rows": rows, "csv_bytes": nbytes, "generate_seconds": round(t_gen, 1),
            "cluster_start_seconds": round(t_cluster, 2), "budget": budget.describe(memory_limit),
            "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "median_seconds": {k: round(v, 3) for k, v in med.items()},
            "rows_per_s": {k: round(rows[k] / v, 1) for k, v in med.items()},
            "pyarrow_reference": best,
            "scan_x_pyarrow": round(med["daskfeed_scan"] / med[best], 2),
            "scan_cached_x_pyarrow": round(med["daskfeed_scan_cached"] / med[best], 2),
            "manifest_json_bytes": manifest_bytes, "partitions": partitions,
            "manifest_bytes_per_partition": round(manifest_bytes / max(partitions, 1), 1)}


def _tiny_files(root: str, n: int) -> str:
    """``n`` tiny CSV files under ``root/n``, 1000 per directory; their glob.

    In each directory one real 2-line file and 999 hard links to it (a file system caps the
    links of one file, ext4 at 65,000).
    """
    import shutil

    base = os.path.join(root, f"n{n}")
    shutil.rmtree(base, ignore_errors=True)
    src = ""
    for i in range(n):
        path = os.path.join(base, f"d{i // 1000:04d}", f"split_data_{i:07d}.csv")
        if i % 1000 == 0:
            os.makedirs(os.path.dirname(path))
            src = path
            with open(src, "w", encoding="utf-8") as f:
                f.write("level,party_size,cleared\n1,2,0\n")
        else:
            os.link(src, path)
    return os.path.join(base, "**", "*.csv")


def listing_and_planning(counts: list[int], root: str, plan_counts: list[int]) -> dict[str, Any]:
    """Part 2 (see the module's docstring)."""
    import numpy as np

    from daskfeed import make_plan
    from daskfeed.reading import Source, expand_paths

    listing = []
    for n in counts:
        t_make, pattern = _timed(lambda n=n: _tiny_files(root, n))
        t_expand, files = _timed(lambda pattern=pattern: expand_paths(pattern))
        t_source, src = _timed(lambda pattern=pattern: Source(pattern))
        t_fp, _ = _timed(src.fingerprint)
        assert len(files) == n == src.npartitions, (len(files), n, src.npartitions)
        listing.append({"files": n, "expand_paths_seconds": round(t_expand, 3),
                        "source_seconds": round(t_source, 3), "fingerprint_seconds": round(t_fp, 3),
                        "create_seconds": round(t_make, 1)})
        print(f"  {n:,} files: expand_paths {t_expand:.2f}s, Source {t_source:.2f}s, fingerprint "
              f"{t_fp:.2f}s (load {_load()})", flush=True)
        import shutil

        shutil.rmtree(os.path.dirname(os.path.dirname(pattern)), ignore_errors=True)
    planning = []
    for n in sorted(set(counts) | set(plan_counts)):
        counts_n = [1000] * n
        # windows of 64 blocks (64k rows), batches of 1024, as a window of a 4GB budget holds
        t_plan, plan = _timed(lambda c=counts_n: make_plan(c, batch_size=1024, epoch=1, seed=0,
                                                           window_rows=64_000))
        t_batches, _ = _timed(lambda plan=plan: [plan.batch(i) for i in range(0, plan.num_batches, 97)])
        planning.append({"partitions": n, "make_plan_seconds": round(t_plan, 4), "windows": len(plan.windows),
                         "batches": plan.num_batches,
                         "batch_lookup_us": round(1e6 * t_batches / len(range(0, plan.num_batches, 97)), 2)})
        print(f"  make_plan {n:,} blocks: {t_plan:.3f}s", flush=True)
    x = np.array([r["files"] for r in listing], float)
    fit = {}
    for key in ("expand_paths_seconds", "source_seconds", "fingerprint_seconds"):
        y = np.array([r[key] for r in listing])
        slope, intercept = np.polyfit(x, y, 1) if len(x) > 1 else (y[0] / x[0], 0.0)
        # also a power law t = c·n^k (listing grows a little faster than linearly)
        k, logc = np.polyfit(np.log(x), np.log(np.maximum(y, 1e-6)), 1) if len(x) > 1 else (1.0, 0.0)
        fit[key] = {"per_file_us": round(1e6 * slope, 2), "intercept_s": round(float(intercept), 3),
                    "at_1M_files_s": round(float(slope * 1e6 + intercept), 1),
                    "power": round(float(k), 3),
                    "at_1M_files_power_s": round(float(np.exp(logc) * 1e6**k), 1)}
    return {"listing": listing, "planning": planning, "linear_fit": fit}


def format_text(res: dict[str, Any]) -> str:
    """The results as text."""
    lines = []
    s = res.get("scan")
    if s:
        lines += [f"scan of {s['files']:,} files × 1000 rows ({s['csv_bytes'] / 1e9:.2f} GB CSV), median of "
                  f"{len(s['seconds']['daskfeed_scan'])} passes, page cache warm; {s['budget']}",
                  f"{'method':<24} {'seconds':>8} {'rows/s':>12} {'× pyarrow best':>15}"]
        best = s["median_seconds"][s["pyarrow_reference"]]
        for k, v in s["median_seconds"].items():
            lines.append(f"{k:<24} {v:>8.2f} {s['rows_per_s'][k]:>12,.0f} {v / best:>15.2f}")
        lines.append(f"manifest.json: {s['manifest_json_bytes']:,} bytes for {s['partitions']:,} blocks "
                     "= "
                     f"{s['manifest_bytes_per_partition']:.0f} bytes per block")
        lines.append("")
    lst = res.get("listing")
    if lst:
        lines.append(f"{'files':>9} {'expand_paths s':>15} {'Source() s':>11} {'fingerprint s':>14}")
        for r in lst["listing"]:
            lines.append(f"{r['files']:>9,} {r['expand_paths_seconds']:>15.2f} {r['source_seconds']:>11.2f} "
                         f"{r['fingerprint_seconds']:>14.2f}")
        for k, f in lst["linear_fit"].items():
            what = k.replace("_seconds", "")
            lines.append(f"  {what}: {f['per_file_us']:.1f} µs/file + {f['intercept_s']:.2f}s "
                         f"→ 1M files ≈ {f['at_1M_files_s']:.0f}s linear, "
                         f"≈ {f['at_1M_files_power_s']:.0f}s as n^{f['power']:.2f} (extrapolated)")
        lines.append(f"{'blocks':>10} {'make_plan s':>12} {'windows':>8} {'batches':>9} "
                     f"{'batch() µs':>11}")
        for r in lst["planning"]:
            lines.append(f"{r['partitions']:>10,} {r['make_plan_seconds']:>12.3f} {r['windows']:>8,} "
                         f"{r['batches']:>9,} {r['batch_lookup_us']:>11.1f}")
    code = res.get("code") or {}
    lines += ["", f"load before/after: {res['load']}", f"command: {res['command']}",
              f"code: {code.get('commit')}" + (f" + uncommitted {', '.join(code['uncommitted'])}"
                                               if code.get("uncommitted") else "")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="benchmarks/small_files.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=20_000, help="1000-row files for the scan [20000]; 0: skip")
    p.add_argument("--listing", default="20000,100000,200000", help="tiny-file counts; empty: skip")
    p.add_argument("--plan", default="1000000", help="extra block counts for make_plan alone")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--data-dir", default=None, help="where the scan's files go [bench-out/small-files-N]")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="small-files")
    a = p.parse_args(argv)
    res: dict[str, Any] = {"command": shlex.join(["benchmarks/small_files.py",
                                                  *(argv if argv is not None else sys.argv[1:])])}
    sys.path.insert(0, HERE)
    from common import code_state

    res["code"] = code_state()
    before = _load()
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, a.name)

    def save() -> str:  # after each part: a later part's failure keeps the earlier figures
        res["load"] = f"before {before}; after {_load()}"
        with open(stem + ".json", "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
        text = format_text(res)
        with open(stem + ".txt", "w", encoding="utf-8") as f:
            f.write(text + "\n")
        return text

    if a.files:
        root = a.data_dir or os.path.join("bench-out", f"small-files-{a.files}")
        print(f"scan: {a.files:,} files of 1000 rows in {root}", flush=True)
        res["scan"] = scan_vs_pyarrow(a.files, root, a.memory_limit, a.passes)
        save()
    counts = [int(c) for c in a.listing.split(",") if c]
    if counts:
        where = "bench-out" if os.path.isdir("bench-out") else None
        with tempfile.TemporaryDirectory(prefix="daskfeed-listing-", dir=where) as tmp:
            res["listing"] = listing_and_planning(counts, tmp, [int(c) for c in a.plan.split(",") if c])
    text = save()
    print("\n" + text + f"\n\nwrote {stem}.json, {stem}.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
