"""Shuffle quality on label-sorted data, and what it does to a model's validation loss.

    .venv/bin/python benchmarks/shuffle.py             # 2,000,000 rows (about 5 min on 2 cores)
    .venv/bin/python benchmarks/shuffle.py --quick     # 200,000 rows
    .venv/bin/python benchmarks/shuffle.py --rows 20000000 --skip-loss

1. **Quality.** ``--rows`` quest-like rows in 400 files, the first half of the files all
   ``cleared = 0``, the second half all ``1`` (the worst case: data sorted by the label). A
   ``DaskSequence(glob, label="cleared", batch_size=1024, seed=1, window_rows=W, client=...)``
   is read ``--epochs`` times, no model; per epoch: the standard deviation of the full batches'
   label means, the iid expectation ``sqrt(p(1-p)/1024 · (N-1024)/(N-1))``, their ratio, and the
   share of batches with ``|mean - p| <= 2.576 · iid`` (the iid 99 % interval). With the parse
   cache on (the default: one global order per epoch) and with ``cache=False`` (windows of
   blocks shuffled, the old behaviour), each at the window sizes of a 2 GB and a 14 GB budget.
   Targets: ratio <= 1.1 and >= 97 % of batches inside. The sequence's own figures
   (``stats_of(epoch)``: ``label_spread``, ``inside_iid``) are printed beside ours.

   How W is chosen: as ``daskfeed train --memory-limit 2GB`` chooses it. ``Budget.split`` gives
   the budget's ``window_bytes`` and ``prefetch``; a sequence given those (what ``train`` gives
   its training sequence: ``window_bytes``, ``prefetch_bytes = prefetch * 2 // 3``) reports its
   ``window_rows``, the ``~R rows`` of train's line "rows shuffled within N windows of ~R rows".
   Both budgets may give the same W: windows are at most 1/8 of the data (so the cluster reads
   ahead), which caps a large budget's window on small data; the table then says so and the
   second budget is not read again. One LocalCluster of 2 workers, in the larger budget,
   serves every sequence (its memory limit is only a ceiling).

2. **Validation loss.** A drifting, label-sorted set (``--loss-rows``, 1,000,000; the clear rate
   depends on the features and drifts with ``day``; rows sorted by ``(cleared, day)`` across the
   files) and the same rows pre-shuffled across the files; ``daskfeed train`` (a subprocess)
   with ``--epochs 3 --batch-size 512 --memory-limit 4GB --seed 1`` and a random-sample
   validation set, on each; the ratio of the last epoch's ``val_loss`` sorted / pre-shuffled,
   (a) with the budget's blocks and (b) with ``--blocksize`` a hundredth of the data's bytes.
   A control shows the figure can tell a poor shuffle: the label-sorted pair again with
   ``--no-cache`` (windows of blocks; ``--skip-control`` leaves it out). Then the pair for
   time-ordered data with drift (rows sorted by ``day``; ``--skip-time``). Target: ratio <= 1.01.

   The data come in ``--loss-files`` (10) files: blocks never span files, so with files smaller
   than a hundredth of the data (200 files of 1M rows) (b) would be the same blocks as (a). In
   10 files (a) is 10 blocks, a tenth of the data each (the 4 GB budget's blocks are ~63 MB),
   and (b) ~100. The windows (at most 1/8 of the data) are the budget's in both: in the global
   order they decide how the order is read, not the order.

Data go to ``bench-out/shuffle/`` (made once, kept); the parse caches and train outputs to a
temporary directory (removed). Writes ``benchmarks/results/shuffle-DATE.json``: the command, the
load before and after, every epoch's figures.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Only light imports at the top: the LocalCluster's workers are spawned and import this script
# again (as __mp_main__); daskfeed.DaskSequence (keras) is imported inside the functions.
from common import code_state

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DASKFEED = os.path.join(os.path.dirname(sys.executable), "daskfeed")
LABEL = "cleared"
CLASSES = np.array(["warrior", "mage", "rogue", "priest", "hunter", "druid"])
CLASS_EFFECT = np.array([0.3, -0.2, 0.1, 0.4, -0.1, 0.0])
Z99 = 2.576
QUALITY_FILES = 400
BATCH = 1024


def _load() -> str:
    """The 1, 5 and 15 minute load averages and the cores (other work on the machine)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


# -- data ---------------------------------------------------------------------------------
def quest_rows(rng: np.random.Generator, n: int, day: np.ndarray | None = None,
               drift: float = 1.5) -> dict[str, np.ndarray]:
    """``n`` quest-log rows; ``cleared`` drawn from the features and ``day`` (the drift).

    Parameters
    ----------
    rng
        The random generator.
    n
        Rows.
    day
        Each row's day (0..364), default uniform.
    drift
        Log-odds the clear rate gains from the first day to the last.

    Returns
    -------
    dict
        Column name → numpy array, ``cleared`` last.
    """
    day = rng.integers(0, 365, n) if day is None else day
    cls = rng.integers(0, len(CLASSES), n)
    level = rng.integers(1, 61, n)
    party = rng.integers(1, 6, n)
    attempt = rng.integers(1, 11, n)
    deaths = rng.poisson(1.5, n)
    hour = rng.integers(0, 24, n)
    duration = np.round(rng.lognormal(6.0, 0.5, n) * (1 + 0.1 * deaths), 1)
    z = (-0.2 + 0.05 * (level - 30) + 0.35 * (party - 3) - 0.6 * (deaths - 1.5) + 0.08 * (attempt - 5)
         + CLASS_EFFECT[cls] + drift * (day / 364 - 0.5))
    cleared = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int8)
    return {"player_class": CLASSES[cls], "level": level, "party_size": party, "attempt": attempt,
            "duration_s": duration, "deaths": deaths, "hour": hour, "day": day, LABEL: cleared}


def write_files(cols: dict[str, np.ndarray], directory: str, files: int, start: int = 0) -> None:
    """The rows in ``files`` consecutive CSV files ``part-00000.csv`` ... (row order kept)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    os.makedirs(directory, exist_ok=True)
    table = pa.table(cols)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        pacsv.write_csv(table.slice(bounds[i], bounds[i + 1] - bounds[i]),
                        os.path.join(directory, f"part-{start + i:05d}.csv"))


def _done(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, "_complete"))


def _mark(directory: str, info: dict[str, Any]) -> None:
    with open(os.path.join(directory, "_complete"), "w", encoding="utf-8") as f:
        json.dump(info, f)


def quality_data(rows: int, base: str) -> str:
    """``rows`` rows in 400 files, files 0..199 all ``cleared = 0``, 200..399 all ``1``; the glob."""
    d = os.path.join(base, f"quality-{rows}")
    if not _done(d):
        shutil.rmtree(d, ignore_errors=True)
        rng = np.random.default_rng(33)
        per = np.diff(np.linspace(0, rows, QUALITY_FILES + 1).astype(int))
        for i, n in enumerate(per):
            cols = quest_rows(rng, int(n))
            cols[LABEL] = np.full(int(n), int(i >= QUALITY_FILES // 2), dtype=np.int8)
            write_files(cols, d, 1, start=i)
        _mark(d, {"rows": rows, "files": QUALITY_FILES})
    return os.path.join(d, "*.csv")


def loss_data(rows: int, files: int, base: str, order: str) -> dict[str, str]:
    """Globs of the ``order``-sorted rows, the same rows pre-shuffled, a random validation sample.

    ``order`` is ``"label"`` (rows sorted by ``(cleared, day)``) or ``"time"`` (by ``day``).
    """
    d = os.path.join(base, f"loss-{rows}-{files}files-{order}")
    names = ("sorted", "shuffled", "validation")
    if not _done(d):
        shutil.rmtree(d, ignore_errors=True)
        rng = np.random.default_rng(1 if order == "label" else 2)
        cols = quest_rows(rng, rows)
        key = np.lexsort((cols["day"], cols[LABEL])) if order == "label" else np.argsort(cols["day"],
                                                                                         kind="stable")
        write_files({k: v[key] for k, v in cols.items()}, os.path.join(d, "sorted"), files)
        mix = rng.permutation(rows)
        write_files({k: v[mix] for k, v in cols.items()}, os.path.join(d, "shuffled"), files)
        write_files(quest_rows(rng, max(rows // 10, 10_000)), os.path.join(d, "validation"), 4)
        _mark(d, {"rows": rows, "files": files, "clear_rate": float(cols[LABEL].mean())})
    return {k: os.path.join(d, k, "*.csv") for k in names}


# -- 1. quality ---------------------------------------------------------------------------
def window_rows_of(data: str, budget: Any, client: Any, cache: str) -> int:
    """Rows per window ``daskfeed train`` plans in ``budget`` (its training sequence's settings)."""
    from daskfeed import DaskSequence

    with DaskSequence(data, label=LABEL, batch_size=BATCH, seed=1, client=client, cache=cache,
                      window_bytes=budget.window_bytes, prefetch_bytes=budget.prefetch * 2 // 3) as seq:
        return int(seq.window_rows)


def epoch_quality(means: list[float], p: float, rows: int) -> dict[str, Any]:
    """The spread of the full batches' label means against an iid shuffle's."""
    iid = math.sqrt(p * (1 - p) / BATCH * (rows - BATCH) / (rows - 1))
    m = np.asarray(means)
    sd = float(m.std(ddof=1))
    return {"rows": rows, "p": round(p, 6), "full_batches": len(m), "sd": round(sd, 6),
            "iid_sd": round(iid, 6), "ratio": round(sd / iid, 4),
            "inside_99": round(float(np.mean(np.abs(m - p) <= Z99 * iid)), 4)}


def read_quality(data: str, client: Any, window_rows: int, cache: str | bool,
                 epochs: int) -> dict[str, Any]:
    """Read ``epochs`` epochs of the sequence, no model; each epoch's spread (ours and its own)."""
    from daskfeed import DaskSequence

    t0 = time.perf_counter()
    seq = DaskSequence(data, label=LABEL, batch_size=BATCH, seed=1, window_rows=window_rows,
                       client=client, cache=cache)
    out: dict[str, Any] = {"global_order": bool(seq.global_order), "order_line": seq.stream.order_line(),
                           "window_rows": int(seq.window_rows), "windows": len(seq.plan.windows),
                           "open_seconds": round(time.perf_counter() - t0, 2), "epochs": []}
    try:
        for e in range(epochs):
            t = time.perf_counter()
            means, total, rows = [], 0.0, 0
            for i in range(len(seq)):
                y = np.asarray(seq[i][1], dtype=np.float64).ravel()
                total, rows = total + float(y.sum()), rows + len(y)
                if len(y) == BATCH:
                    means.append(float(y.mean()))
            seconds = time.perf_counter() - t
            seq.on_epoch_end()
            own = seq.stats_of(e)
            out["epochs"].append({"epoch": e + 1, **epoch_quality(means, total / rows, rows),
                                  "seconds": round(seconds, 2),
                                  "own_label_spread": own.get("label_spread"),
                                  "own_inside_iid": own.get("inside_iid")})
    finally:
        seq.close()
    return out


def quality(rows: int, base: str, tmp: str, epochs: int, budgets: list[str],
            echo: Any) -> dict[str, Any]:
    """Part 1: every (order, budget) on the label-sorted data."""
    from daskfeed import Budget
    from daskfeed.cluster import close_client, start_local_cluster

    t = time.perf_counter()
    data = quality_data(rows, base)
    echo(f"  data: {rows:,} rows in {QUALITY_FILES} files ({time.perf_counter() - t:.0f}s)")
    splits = {b: Budget.split(b, nworkers=2) for b in budgets}
    largest = max(splits.values(), key=lambda b: b.total)
    client = start_local_cluster(largest, dashboard_address="")
    cache = os.path.join(tmp, "cache-quality")
    runs: list[dict[str, Any]] = []
    try:
        windows = {b: window_rows_of(data, s, client, cache) for b, s in splits.items()}
        echo("  window rows from the budgets: "
             + ", ".join(f"{b} -> {w:,} (window_bytes {splits[b].window_bytes / 1e6:.0f} MB)"
                         for b, w in windows.items()))
        for order, c in (("global", cache), ("windows", False)):
            read: dict[int, dict[str, Any]] = {}
            for b in budgets:
                w = windows[b]
                if w not in read:
                    t = time.perf_counter()
                    read[w] = read_quality(data, client, w, c, epochs)
                    echo(f"  {order:7s} {b:>5s}: W={w:,}, {read[w]['windows']} windows, "
                         f"{time.perf_counter() - t:.0f}s; load {_load()}")
                    same_as = None
                else:
                    same_as = next(x for x in budgets if windows[x] == w)
                runs.append({"order": order, "cache": order == "global", "budget": b,
                             "same_as": same_as, **read[w]})
    finally:
        close_client(client)
    return {"rows": rows, "files": QUALITY_FILES, "batch_size": BATCH, "seed": 1, "epochs": epochs,
            "window_rows": windows,
            "budgets": {b: {**s.__dict__, "describe": s.describe(b)} for b, s in splits.items()},
            "cluster": f"LocalCluster, 2 workers, in {largest.total / 1e9:g} GB",
            "runs": runs}


# -- 2. validation loss -------------------------------------------------------------------
def train(data: str, validation: str, out: str, cache: str | None, blocksize: int | None,
          epochs: int) -> dict[str, Any]:
    """``daskfeed train`` on ``data`` (a subprocess); its val_loss per epoch and order line.

    ``cache``: a fresh parse cache directory, or None for ``--no-cache``.
    """
    argv = [DASKFEED, "train", data, "--label", LABEL, "--epochs", str(epochs), "--batch-size", "512",
            "--memory-limit", "4GB", "--seed", "1", "--validation", validation, "--output", out,
            *(["--cache", cache] if cache else ["--no-cache"]), "--verbose", "0"]
    if blocksize:
        argv += ["--blocksize", str(blocksize)]
    t = time.perf_counter()
    if cache:
        os.makedirs(cache, exist_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    with open(out + ".log", "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"daskfeed train failed ({proc.returncode}): {shlex.join(argv)}\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    with open(os.path.join(out, "history.json"), encoding="utf-8") as f:
        hist = json.load(f)
    line = next((ln.strip() for ln in proc.stdout.splitlines() if "batches of 512 per epoch" in ln), "")
    return {"command": shlex.join([os.path.relpath(argv[0], ROOT), *argv[1:]]),
            "seconds": round(time.perf_counter() - t, 1), "order_line": line,
            "val_loss": [round(float(r["val_loss"]), 5) for r in hist["epochs"]],
            "loss": [round(float(r["loss"]), 5) for r in hist["epochs"]],
            "label_spread": [r.get("label_spread") for r in hist["epochs"]],
            "inside_iid": [r.get("inside_iid") for r in hist["epochs"]]}


def loss(rows: int, files: int, base: str, tmp: str, epochs: int, orders: list[str],
         control: bool, echo: Any) -> dict[str, Any]:
    """Part 2: sorted vs pre-shuffled, by ``daskfeed train``, for each order and layout.

    Label-sorted: the budget's blocks, blocks of 1/100 of the data, and (``control``) the budget's
    blocks with ``--no-cache`` (windows of blocks: what the figure looks like when the shuffle is
    poor). Time-sorted: the budget's blocks.
    """
    out: list[dict[str, Any]] = []
    for order in orders:
        globs = loss_data(rows, files, base, order)
        nbytes = sum(os.path.getsize(f) for f in glob.glob(globs["sorted"]))
        layouts: list[tuple[str, int | None, bool]] = [("budget's blocks", None, True)]
        if order == "label":
            layouts.append(("blocks of 1/100", -(-nbytes // 100), True))
            if control:
                layouts.append(("--no-cache (control)", None, False))
        for name, bs, cached in layouts:
            rec: dict[str, Any] = {"order": order, "layout": name, "blocksize": bs, "cache": cached}
            for data in ("sorted", "shuffled"):
                tag = f"{order}-{data}-{len(out)}"
                rec[data] = train(globs[data], globs["validation"], os.path.join(tmp, tag),
                                  os.path.join(tmp, "cache-" + tag) if cached else None, bs, epochs)
                echo(f"  {order}-sorted data, {data:8s} {name}: val_loss "
                     f"{rec[data]['val_loss']} ({rec[data]['seconds']:.0f}s); load {_load()}")
            rec["ratio"] = round(rec["sorted"]["val_loss"][-1] / rec["shuffled"]["val_loss"][-1], 4)
            out.append(rec)
    return {"rows": rows, "files": files, "data_bytes": nbytes, "epochs": epochs, "batch_size": 512,
            "memory_limit": "4GB", "runs": out}


# -- report -------------------------------------------------------------------------------
def _layout_of(line: str) -> str:
    """E.g. ``10 blocks, 8 windows`` from train's line on how rows are ordered."""
    m = re.search(r"(\d+) (units|buckets), each a stratified sample of all (\d+) blocks, read in "
                  r"(\d+) window", line)
    if m:
        return f"global: {m.group(3)} blocks, {m.group(1)} {m.group(2)}"
    m = re.search(r"within (\d+) windows?", line)
    return f"{m.group(1)} windows of blocks" if m else "?"


def table(res: dict[str, Any]) -> str:
    """The printed report."""
    lines: list[str] = []
    q = res.get("quality")
    if q:
        r0 = q["runs"][0]["epochs"][0]
        lines += [f"1. shuffle quality: {q['rows']:,} rows in {q['files']} files sorted by label "
                  f"(p = {r0['p']:.3f}), batch {q['batch_size']}, seed 1, iid sd {r0['iid_sd']:.5f}; "
                  f"{q['cluster']}",
                  "   targets: ratio <= 1.10, inside the iid 99% interval >= 97%; own: the sequence's "
                  "stats_of(epoch)",
                  f"{'order':22s} {'budget':>6s} {'window rows':>11s} {'windows':>7s} {'epoch':>5s} "
                  f"{'sd':>8s} {'ratio':>7s} {'inside':>7s} {'own ratio':>9s} {'own inside':>10s} "
                  f"{'read s':>6s}  met"]
        for r in q["runs"]:
            name = "global (cache on)" if r["cache"] else "windows (cache=False)"
            if r["same_as"]:
                lines.append(f"{name:22s} {r['budget']:>6s} {r['window_rows']:>11,} {r['windows']:>7d}"
                             f"   (same window as {r['same_as']}: the same batches)")
                continue
            for e in r["epochs"]:
                met = e["ratio"] <= 1.1 and e["inside_99"] >= 0.97
                own_r = "-" if e["own_label_spread"] is None else f"{e['own_label_spread']:.3f}"
                own_i = "-" if e["own_inside_iid"] is None else f"{100 * e['own_inside_iid']:.1f}%"
                lines.append(f"{name:22s} {r['budget']:>6s} {r['window_rows']:>11,} {r['windows']:>7d} "
                             f"{e['epoch']:>5d} {e['sd']:>8.5f} {e['ratio']:>6.3f}x "
                             f"{100 * e['inside_99']:>6.1f}% {own_r:>9s} {own_i:>10s} {e['seconds']:>6.1f}"
                             f"  {'yes' if met else 'NO'}")
        lines.append("")
    lo = res.get("loss")
    if lo:
        lines += [f"2. validation loss after {lo['epochs']} epochs, sorted / pre-shuffled: "
                  f"{lo['rows']:,} rows in {lo['files']} files ({lo['data_bytes'] / 1e6:.0f} MB), "
                  f"daskfeed train --batch-size {lo['batch_size']} --memory-limit {lo['memory_limit']} "
                  "--seed 1; target ratio <= 1.01",
                  f"{'data':12s} {'layout':22s} {'order (train says)':30s} {'sorted':>7s} "
                  f"{'shuffled':>8s} {'ratio':>7s} {'spread s/sh':>11s}  met"]
        for r in lo["runs"]:
            sp = [r[d]["label_spread"][-1] for d in ("sorted", "shuffled")]
            spread = "/".join("-" if v is None else f"{v:.2f}" for v in sp)
            lines.append(f"{r['order'] + '-sorted':12s} {r['layout']:22s} "
                         f"{_layout_of(r['sorted']['order_line']):30s} "
                         f"{r['sorted']['val_loss'][-1]:>7.4f} {r['shuffled']['val_loss'][-1]:>8.4f} "
                         f"{r['ratio']:>6.4f}x {spread:>11s}"
                         f"  {'yes' if r['ratio'] <= 1.01 else 'NO'}")
        lines.append("   spread: the last epoch's label_spread in history.json (batch label-mean sd / iid)")
        lines.append("")
    lines.append(f"load before {res['load_before']}, after {res['load_after']}; "
                 f"{res['seconds'] / 60:.1f} min")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    p = argparse.ArgumentParser(prog="benchmarks/shuffle.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000,
                   help="rows of the quality data (20000000: the large case) [2,000,000]")
    p.add_argument("--loss-rows", type=int, default=1_000_000, help="rows of the loss data [1,000,000]")
    p.add_argument("--loss-files", type=int, default=10, help="files of the loss data [10]")
    p.add_argument("--quick", action="store_true", help="200,000 rows in both parts")
    p.add_argument("--epochs", type=int, default=3, help="epochs of each part [3]")
    p.add_argument("--budgets", default="2GB,14GB", help="budgets whose windows part 1 reads [2GB,14GB]")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-loss", action="store_true")
    p.add_argument("--skip-time", action="store_true", help="no time-sorted data in part 2")
    p.add_argument("--skip-control", action="store_true", help="no --no-cache control in part 2")
    p.add_argument("--data-dir", default=None, help="where the data are written [bench-out/shuffle]")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results directory")
    p.add_argument("--name", default=None, help="file name stem [shuffle-DATE]")
    a = p.parse_args(argv)
    if a.quick:
        a.rows = a.loss_rows = 200_000
    command = shlex.join(["benchmarks/shuffle.py", *(argv if argv is not None else sys.argv[1:])])
    base = a.data_dir or os.path.join(ROOT, "bench-out", "shuffle")
    t0 = time.perf_counter()
    res: dict[str, Any] = {"command": command, "load_before": _load(), "code": code_state(),
                           "started": datetime.datetime.now().isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory(prefix="shuffle-bench-") as tmp:
        if not a.skip_quality:
            print(f"1. shuffle quality ({a.rows:,} rows; load {_load()})", flush=True)
            res["quality"] = quality(a.rows, base, tmp, a.epochs, a.budgets.split(","),
                                     lambda s: print(s, flush=True))
        if not a.skip_loss:
            print(f"2. validation loss ({a.loss_rows:,} rows; load {_load()})", flush=True)
            orders = ["label"] if a.skip_time else ["label", "time"]
            res["loss"] = loss(a.loss_rows, a.loss_files, base, tmp,
                               a.epochs, orders, not a.skip_control, lambda s: print(s, flush=True))
    res["load_after"] = _load()
    res["seconds"] = round(time.perf_counter() - t0, 1)
    text = table(res)
    res["table"] = text
    stem = os.path.join(a.out, a.name or f"shuffle-{datetime.date.today().isoformat()}")
    os.makedirs(a.out, exist_ok=True)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    print("\n" + text)
    print(f"\nwrote {os.path.relpath(stem, ROOT)}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
