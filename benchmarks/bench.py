"""Benchmark: daskfeed against in-memory ``fit``, tf.data and the old recipe, in ONE run.

DESIGN.md's performance protocol: same data, same model (:func:`common.quest_mlp`), same batch
size, same machine, and ratios against references measured in the same run.

    .venv/bin/python benchmarks/bench.py --rows 2000000            # demo data, every method
    .venv/bin/python benchmarks/bench.py "data/**/*.csv" --validation "val/**/*.csv"
    .venv/bin/python benchmarks/bench.py --rows 1000000 --scale 1,4,8 --memory-limit 2GB

Order (fixed): pyarrow parse (also warms the page cache), in-memory A1, daskfeed, in-memory A2
(A-B-A: noise hits the ceiling and daskfeed alike), the PyDataset floor, tf.data without cache,
with ``.cache(file)``, with ``.cache()``, the old recipe, daskfeed's feed alone. One tiny fit
first pays TensorFlow's start-up costs for everyone. Every fit runs ``--epochs`` epochs (≥ 4):
epoch 1 is timed from the method's start (its reading, and daskfeed's cluster start and scan,
included), the steady figure is the median of the later ones. The batch size defaults to the
demo files' 1000 rows, the old recipe's batch. Writes ``<out>/<name>.json``, ``.png`` and
``.txt``.

``--scale 1,4,8`` instead runs daskfeed alone at each multiple of ``--rows`` with the same
``--memory-limit``, each in a fresh process, and reports rows/s and peak tree RSS per scale.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Only light imports here: Dask's worker processes are spawned, and a spawned process imports
# this script again (as __mp_main__) before it runs anything; keras would cost each worker 0.5 GB.
import report
from common import DEFAULT_FEATURES, LABEL, code_state, load_numpy, resolve_files, warm_up

ORDER = ("pyarrow_parse", "in_memory_A1", "daskfeed", "in_memory_A2", "pydataset_floor",
         "daskfeed_batches", "tf_data_nocache", "tf_data_cache_disk", "tf_data_cache_ram",
         "old_recipe", "feed_only")
HERE = os.path.dirname(os.path.abspath(__file__))


def _load() -> str:
    """The 1, 5 and 15 minute load averages and the cores (other work on the machine)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def _machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    versions = {}
    for pkg in ("daskfeed", "keras", "tensorflow", "tensorflow-cpu", "dask", "distributed", "pyarrow",
                "pandas", "numpy"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return {"cpus": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
            "platform": platform.platform(), "python": platform.python_version(), "versions": versions,
            "code": code_state()}


def run(data: str | Sequence[str], *, validation: str | Sequence[str] | None = None, label: str = LABEL,
        features: Sequence[str] = DEFAULT_FEATURES, batch_size: int = 1000, epochs: int = 4,
        memory_limit: str = "4GB", nworkers: int | None = None, methods: Sequence[str] = ORDER,
        command: str = "", echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``methods`` (in :data:`ORDER`) on the same data and model; return :func:`report.summarize`.

    Parameters
    ----------
    data, validation
        Local CSV files: paths, directories or globs. ``validation`` gives every fit a
        validation loss (outside the timed part), for the sanity check.
    label, features
        The 0/1 label and the numeric feature columns of the model.
    batch_size
        Rows per batch for every method (the old recipe's batch is a file: keep them equal).
    epochs
        Epochs per fit, ≥ 4: epoch 1 and at least three steady ones.
    memory_limit, nworkers
        daskfeed's budget for the whole process tree, and its local workers (also the old
        recipe's worker processes).
    methods
        Which methods to run.
    command
        The command line, kept in the result.
    echo
        Where progress lines go.
    """
    import anchors
    import ours

    from daskfeed import Budget

    if epochs < 4:
        raise ValueError(f"Expected epochs >= 4 (epoch 1 and three steady ones). Received: {epochs}.")
    unknown = sorted(set(methods) - set(ORDER))
    if unknown:
        raise ValueError(f"Expected methods among {', '.join(ORDER)}. Received: {unknown}.")
    files = resolve_files(data)
    features = list(features)
    nworkers = Budget.split(memory_limit, nworkers=nworkers).nworkers  # refuses a budget too small
    workdir = tempfile.mkdtemp(prefix="daskfeed-bench-")
    out: dict[str, Any] = {}
    todo = [m for m in ORDER if m in methods]
    load_before = _load()
    t_all = time.perf_counter()
    try:
        echo(f"bench: {len(files)} files, batch {batch_size}, {epochs} epochs, load {load_before}; "
             f"order: {', '.join(todo)}")
        warm = warm_up(batch_size, len(features))
        echo(f"  TensorFlow warm-up fit {warm:.1f}s (not counted)")
        val = load_numpy(resolve_files(validation), features, label) if validation else None
        stats: Any = None
        xy: Any = None
        rows = 0

        def need_stats() -> tuple[Any, Any]:
            # the anchors' normalization, computed outside their timing (in their favour)
            x, y = xy if xy is not None else load_numpy(files, features, label)
            return (x.mean(axis=0).tolist(), x.var(axis=0).tolist()), (x, y)

        for name in todo:
            t0 = time.perf_counter()
            if name == "pyarrow_parse":
                out[name] = anchors.pyarrow_parse(files, [*features, label])
            elif name.startswith("in_memory"):
                out[name], stats, xy = anchors.in_memory(files, features, label, batch_size, epochs, val)
            elif name in ("daskfeed", "daskfeed_batches"):
                handoff = "pydataset" if name == "daskfeed_batches" else "auto"
                out[name] = ours.daskfeed_fit(data, features, label, batch_size, epochs, memory_limit,
                                              nworkers, val, workdir, tag=name, handoff=handoff)
            elif name == "feed_only":
                out[name] = ours.feed_only(data, features, label, batch_size, epochs, memory_limit,
                                           nworkers, workdir)
            else:
                if stats is None:
                    stats, xy = need_stats()
                rows = len(xy[1])
                if name == "pydataset_floor":
                    out[name] = anchors.pydataset_floor(xy[0], xy[1], stats, batch_size, epochs)
                elif name.startswith("tf_data"):
                    cache = {"tf_data_nocache": None, "tf_data_cache_ram": "",
                             "tf_data_cache_disk": os.path.join(workdir, "tf-cache")}[name]
                    out[name] = anchors.tf_data(files, features, label, batch_size, epochs, rows, stats,
                                                val, cache)
                    if cache is None:  # every row delivered (counted outside the timing)
                        out[name]["rows_counted"] = anchors.count_rows(
                            anchors.tf_dataset(files, features, label, batch_size))
                elif name == "old_recipe":
                    out[name] = anchors.old_recipe(files, features, label, epochs, rows, stats, val,
                                                   workers=nworkers, batch_size=batch_size)
            m = out[name]
            if name == "pyarrow_parse":
                shown = f"{m['rows_per_s']:,.0f} rows/s"
            else:
                rates = ", ".join(f"{e['rows_per_s']:,.0f}" for e in m["epochs"])
                shown = (f"epoch 1 from start {m['epochs'][0]['rows_per_s_from_start']:,.0f} rows/s, "
                         f"epochs {rates}")
            echo(f"  {name}: {shown} ({time.perf_counter() - t0:.0f}s; load {_load()})")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = next((m["rows"] for m in out.values()), 0)
    config = {"data": data if isinstance(data, str) else list(data), "files": len(files), "rows": rows,
              "label": label, "features": features, "batch_size": batch_size, "epochs": epochs,
              "memory_limit": memory_limit, "nworkers": nworkers, "order": todo,
              "seconds": round(time.perf_counter() - t_all, 1), "warm_up_seconds": round(warm, 2),
              "load": f"before {load_before}; after {_load()}", "machine": _machine(), "command": command}
    return report.summarize(out, config)


def demo_data(rows: int, data_dir: str | None, echo: Callable[[str], None] = print) -> tuple[str, str]:
    """Demo quest logs (1000-row files) of ``rows`` rows; globs of the train and validation sets."""
    from daskfeed import write_demo_data

    vrows = min(50_000, max(1000, rows // 10))
    root = data_dir or os.path.join("bench-out", f"data-{rows}")
    t0 = time.perf_counter()
    demo = write_demo_data(root, rows=rows, validate_rows=vrows)
    echo(f"demo data: {rows:,} train + {vrows:,} validation rows in {os.path.abspath(root)} "
         f"({time.perf_counter() - t0:.1f}s, reused when already there)")
    return demo.train_glob, demo.validate_glob


def run_scales(rows: int, scales: Sequence[int], *, memory_limit: str, epochs: int, batch_size: int,
               nworkers: int | None, command: str, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Daskfeed alone at ``rows × scale`` rows for each scale, same budget, each in a fresh process."""
    out = []
    for s in scales:
        n = rows * s
        demo_data(n, None, echo)
        with tempfile.TemporaryDirectory(prefix="daskfeed-scale-") as tmp:
            argv = [sys.executable, os.path.abspath(__file__), "--rows", str(n), "--methods", "daskfeed",
                    "--memory-limit", memory_limit, "--epochs", str(epochs), "--batch-size", str(batch_size),
                    "--no-validation", "--out", tmp, "--name", "scale", "--no-png"]
            if nworkers:
                argv += ["--nworkers", str(nworkers)]
            echo(f"  scale {s}×: {shlex.join(argv[1:])} (load {_load()})")
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(tmp, "scale.json"), encoding="utf-8") as f:
                res = json.load(f)
        d = res["methods"]["daskfeed"]
        from common import steady

        rec = {"scale": s, "rows": d["rows"], "data_bytes": d["data_bytes"],
               "budget_bytes": d["budget"]["total"], "windows": d["windows"], "window_rows": d["window_rows"],
               "epoch1_rows_per_s": d["epochs"][0]["rows_per_s_from_start"],
               "steady_rows_per_s": steady(d["epochs"]), "peak_rss_bytes": d["peak_rss_bytes"],
               "data_wait_fraction": steady(d["epochs"], "data_wait_fraction"),
               "epochs": d["epochs"], "load": res["config"]["load"]}
        echo(f"  scale {s}×: steady {rec['steady_rows_per_s']:,.0f} rows/s, peak tree RSS "
             f"{rec['peak_rss_bytes'] / 1e9:.2f} GB")
        out.append(rec)
    config = {"base_rows": rows, "scales": list(scales), "memory_limit": memory_limit, "epochs": epochs,
              "batch_size": batch_size, "nworkers": nworkers, "machine": _machine(), "command": command}
    return {"config": config, "scales": out}


def _png(write: Callable[[dict[str, Any], str], None], res: dict[str, Any], path: str) -> bool:
    """Write the chart if matplotlib is there (``pip install -e ".[bench]"``); whether it was."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('no PNG: matplotlib is not installed (pip install -e ".[bench]")', file=sys.stderr)
        return False
    write(res, path)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    p = argparse.ArgumentParser(prog="benchmarks/bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="*", help="CSV files, directories or globs (or --rows N)")
    p.add_argument("--rows", type=int, help="generate this many demo rows (1000-row files) instead")
    p.add_argument("--data-dir", help="where --rows writes the demo data [bench-out/data-ROWS]")
    p.add_argument("--validation", nargs="*", default=None, help="validation data (loss sanity check)")
    p.add_argument("--no-validation", action="store_true", help="skip the validation loss")
    p.add_argument("--label", default=LABEL)
    p.add_argument("--features", default=",".join(DEFAULT_FEATURES), help="comma-separated")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=4, help="per fit, >= 4 [4]")
    p.add_argument("--memory-limit", default="4GB", help="daskfeed's budget for the process tree [4GB]")
    p.add_argument("--nworkers", type=int, default=None, help="daskfeed's workers = the old recipe's")
    p.add_argument("--methods", default=",".join(ORDER), help="comma-separated subset of the order")
    p.add_argument("--scale", default=None, help="e.g. 1,4,8: daskfeed alone at these multiples of --rows")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results directory")
    p.add_argument("--name", default=None, help="file name stem [bench-ROWS or scale-ROWS]")
    p.add_argument("--no-png", action="store_true")
    a = p.parse_args(argv)
    if bool(a.data) == (a.rows is not None):
        p.error("give either DATA or --rows N (generate demo data), not both")
    if a.rows is not None and a.rows < 1000:
        p.error(f"--rows must be at least 1000 (one demo file). Received: {a.rows}")
    if a.epochs < 4:
        p.error(f"--epochs must be at least 4 (epoch 1 and three steady ones). Received: {a.epochs}")
    command = shlex.join(["benchmarks/bench.py", *(argv if argv is not None else sys.argv[1:])])
    os.makedirs(a.out, exist_ok=True)
    if a.scale:
        if a.rows is None:
            p.error("--scale needs --rows (the 1× size)")
        scales = [int(s) for s in a.scale.split(",")]
        res = run_scales(a.rows, scales, memory_limit=a.memory_limit, epochs=a.epochs,
                         batch_size=a.batch_size, nworkers=a.nworkers, command=command)
        stem = os.path.join(a.out, a.name or f"scale-{a.rows}")
        report.write_json(res, stem + ".json")
        text = report.format_scale(res)
        if not a.no_png:
            a.no_png = not _png(report.write_scale_png, res, stem + ".png")
    else:
        if a.rows is not None:
            data, vglob = demo_data(a.rows, a.data_dir)
            validation = None if a.no_validation else (a.validation or vglob)
        else:
            data = a.data if len(a.data) > 1 else a.data[0]
            validation = None if a.no_validation else a.validation
        try:
            res = run(data, validation=validation, label=a.label, features=a.features.split(","),
                      batch_size=a.batch_size, epochs=a.epochs, memory_limit=a.memory_limit,
                      nworkers=a.nworkers, methods=a.methods.split(","), command=command)
        except (ValueError, FileNotFoundError) as err:
            print(f"Error: {err}", file=sys.stderr)
            return 1
        if a.rows is not None:
            res["config"]["generated_rows"] = a.rows
        stem = os.path.join(a.out, a.name or f"bench-{res['config']['rows']}")
        report.write_json(res, stem + ".json")
        text = report.format_table(res)
        if not a.no_png and res["table"]:
            a.no_png = not _png(report.write_png, res, stem + ".png")
    with open(stem + ".txt", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print("\n" + text)
    print(f"\nwrote {stem}.json, {stem}.txt" + ("" if a.no_png else f", {stem}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
