"""Memory soak (slow): `daskfeed train --memory-limit 2GB` over 1x, 4x, 6.25x and 8x the budget.

The data come from the demo generator: a few distinct 1M-row files (~56 MB each), copied until
the set reaches the size (the values repeat; the memory behaviour is the same as for distinct
files). The RSS of the whole process tree (the CLI process, which is the trainer, and every
worker process) is sampled from outside every 0.1 s for the whole run: scan, epoch and saving.
The peak must stay under the budget and flat as the data grow.

Run: ``make soak`` (or ``pytest --runslow tests/test_soak.py``). DASKFEED_SOAK_DIR keeps the
generated data between runs (default: a temporary directory, removed afterwards). Figures are
appended to ``$DASKFEED_SOAK_DIR/soak.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from daskfeed.rss import tree_rss

BUDGET = 2_000_000_000
SIZES = (1, 4, 6.25, 8)
DISTINCT_FILES = 8
ROWS_PER_FILE = 1_000_000

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def soak_dir(tmp_path_factory):
    keep = os.environ.get("DASKFEED_SOAK_DIR")
    root = keep or str(tmp_path_factory.mktemp("soak"))
    os.makedirs(root, exist_ok=True)
    yield root
    if not keep:
        shutil.rmtree(root, ignore_errors=True)


def _pool(root: str) -> list[str]:
    """The 8x set: distinct demo files, then copies of them, ~56 MB each."""
    import pandas as pd

    from daskfeed.demo import generate_rows

    pool = os.path.join(root, "pool")
    os.makedirs(pool, exist_ok=True)
    distinct = []
    for i in range(DISTINCT_FILES):
        path = os.path.join(pool, f"quests_{i:04d}.csv")
        if not os.path.exists(path):
            tmp = path + ".tmp"
            pd.DataFrame(generate_rows(ROWS_PER_FILE, seed=7, stream=i)).to_csv(tmp, index=False)
            os.replace(tmp, path)
        distinct.append(path)
    files = list(distinct)
    i = len(files)
    while sum(os.path.getsize(f) for f in files) < max(SIZES) * BUDGET:
        path = os.path.join(pool, f"quests_{i:04d}.csv")
        if not os.path.exists(path):
            shutil.copyfile(distinct[i % DISTINCT_FILES], path + ".tmp")
            os.replace(path + ".tmp", path)
        files.append(path)
        i += 1
    return files


def _subset(root: str, files: list[str], nbytes: float) -> tuple[str, int]:
    """A directory of hard links to the first files of the pool that reach ``nbytes``."""
    d = os.path.join(root, f"set_{nbytes / 1e9:.1f}GB")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    total = 0
    for f in files:
        if total >= nbytes:
            break
        os.link(f, os.path.join(d, os.path.basename(f)))
        total += os.path.getsize(f)
    return d, total


@pytest.mark.timeout(4 * 3600)  # one train over up to 16 GB of CSV; the suite's default is 600 s
@pytest.mark.parametrize("times", SIZES)
def test_peak_rss_stays_under_2gb_as_the_data_grow(soak_dir, times):
    import psutil

    files = _pool(soak_dir)
    data, nbytes = _subset(soak_dir, files, times * BUDGET)
    out = os.path.join(soak_dir, f"out_{times}x")
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
           "XDG_CACHE_HOME": os.path.join(soak_dir, "cache")}
    cmd = [exe, "train", os.path.join(data, "*.csv"), "--label", "cleared", "--epochs", "1",
           "--memory-limit", "2GB", "--batch-size", "4096", "--dashboard-address", "127.0.0.1:0",
           "--verbose", "0", "--output", out]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    ps = psutil.Process(proc.pid)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            samples.append(tree_rss(ps))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        stdout, stderr = proc.communicate(timeout=3 * 3600)
    finally:
        stop.set()
        thread.join()
        if proc.poll() is None:  # the test is failing: never leave the run behind
            proc.kill()
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, stderr[-3000:]
    hist = json.loads(open(os.path.join(out, "history.json"), encoding="utf-8").read())
    peak = max(samples)
    record = {"times_budget": times, "csv_bytes": nbytes, "files": len(os.listdir(data)),
              "rows": hist["rows_per_epoch"], "budget": BUDGET, "peak_rss_bytes": peak,
              "peak_rss_reported": hist["peak_rss_bytes"], "samples": len(samples),
              "seconds": round(seconds, 1), "rows_per_s": hist["epochs"][0].get("rows_per_s"),
              "data_wait_fraction": hist["epochs"][0].get("data_wait_fraction"),
              "stdout": stdout.splitlines()[:12]}
    with open(os.path.join(soak_dir, "soak.json"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    shutil.rmtree(os.path.join(soak_dir, "cache"), ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    assert hist["epochs"][0]["rows"] == hist["rows_per_epoch"] > times * BUDGET / 60
    assert peak <= BUDGET, f"peak RSS {peak / 1e9:.2f} GB > 2 GB at {times}x"
    runs = [json.loads(line) for line in open(os.path.join(soak_dir, "soak.json"), encoding="utf-8")]
    base = [r for r in runs if r["times_budget"] == 1]
    if base and times > 1:  # flat: the peak does not grow with the data (latest 1x run)
        assert peak <= 1.25 * base[-1]["peak_rss_bytes"] + 100e6, (peak, base[-1]["peak_rss_bytes"])
