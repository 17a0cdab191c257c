"""The benchmarks (benchmarks/) end to end on tiny data: every method, JSON that adds up, the PNG."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys

import helpers
import pytest

ROOT = str(helpers.ROOT)
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)

FITS = ("in_memory_A1", "daskfeed", "in_memory_A2", "pydataset_floor", "daskfeed_batches",
        "tf_data_nocache", "tf_data_cache_disk", "tf_data_cache_ram", "old_recipe")


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _run(script: str, *args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a whole benchmark run (~80 s): make test-slow / make bench
def test_bench_end_to_end(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench.py", "--rows", "3000", "--data-dir", str(tmp_path / "data"), "--memory-limit", "2GB",
                "--nworkers", "1", "--out", str(out), "--name", "b", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "×ceil" in proc.stdout and "targets (issue 15):" in proc.stdout
    res = json.loads((out / "b.json").read_text())
    if _has_matplotlib():  # the PNG needs the bench extra
        assert (out / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "command: benchmarks/bench.py --rows 3000" in (out / "b.txt").read_text()
    cfg, methods = res["config"], res["methods"]
    assert cfg["rows"] == 3000 and cfg["generated_rows"] == 3000 and cfg["batch_size"] == 1000
    assert cfg["order"][:4] == ["pyarrow_parse", "in_memory_A1", "daskfeed", "in_memory_A2"]  # A-B-A
    assert set(methods) == {*FITS, "pyarrow_parse", "feed_only"}
    for name in (*FITS, "feed_only"):
        m = methods[name]
        assert m["rows"] == 3000 and len(m["epochs"]) == 4, name
        e1 = m["epochs"][0]
        # epoch 1 from the method's start includes the epoch itself and what came before it
        assert e1["seconds_from_start"] >= e1["seconds"], name
        assert e1["rows_per_s_from_start"] == pytest.approx(3000 / e1["seconds_from_start"], rel=0.01)
        for e in m["epochs"]:
            assert e["rows_per_s"] == pytest.approx(e["rows"] / e["seconds"], rel=0.01), (name, e)
        assert m.get("peak_rss_bytes", 1) > 0, name
    for name in ("in_memory_A1", "in_memory_A2", "daskfeed", "pydataset_floor", "daskfeed_batches",
                 "feed_only"):
        assert [e["steps"] for e in methods[name]["epochs"]] == [math.ceil(3000 / 1000)] * 4, name
    # the old recipe: one batch per 1000-row file, as many worker processes as daskfeed's workers
    old = methods["old_recipe"]
    assert [e["steps"] for e in old["epochs"]] == [3] * 4
    assert old["workers"] == cfg["nworkers"] == 1 and old["mode"] == "processes"
    assert methods["tf_data_nocache"]["rows_counted"] == 3000  # every row, counted outside the timing
    assert {methods[k]["cache"] for k in FITS if k.startswith("tf_data")} == {
        "no cache", ".cache(filename) on disk", ".cache() in RAM"}
    dsk = methods["daskfeed"]
    assert dsk["epochs"][0]["seconds_from_start"] >= (dsk["cluster_start_seconds"] + dsk["scan_seconds"]
                                                      + dsk["epochs"][0]["seconds"])
    assert (dsk["handoff"], methods["daskfeed_batches"]["handoff"]) == ("auto", "pydataset")
    for m in (dsk, methods["daskfeed_batches"]):
        for e in m["epochs"]:
            assert e["assembly_seconds"] >= 0 and e["wait_seconds"] >= 0, e
            assert e["rows_served"] == 3000
        # with 3 batches an epoch the tf.data hand-off reads the next epoch during this one: its
        # assembly and its waits (its epoch's, as daskfeed train's history reports them) may
        # exceed one Keras epoch's seconds, but they are parts of the run
        run = m["epochs"][0]["seconds_from_start"] + sum(e["seconds"] for e in m["epochs"][1:])
        assert sum(e["wait_seconds"] for e in m["epochs"]) <= run, m["epochs"]
        assert sum(e["assembly_seconds"] for e in m["epochs"]) <= run, m["epochs"]
    assert methods["pyarrow_parse"]["columns"] == [*cfg["features"], cfg["label"]]  # feed's columns

    # the ceiling: median of A1's and A2's steady epochs; epoch 1: mean of both from their start
    later = [e["rows_per_s"] for k in ("in_memory_A1", "in_memory_A2") for e in methods[k]["epochs"][1:]]
    assert res["ceiling"]["steady"] == pytest.approx(statistics.median(later))
    first = [methods[k]["epochs"][0]["rows_per_s_from_start"] for k in ("in_memory_A1", "in_memory_A2")]
    assert res["ceiling"]["epoch1"] == pytest.approx(statistics.mean(first))
    table = {r["method"]: r for r in res["table"]}
    for name in FITS:  # steady = median of epochs 2..4; ratios against the ceiling
        r = table[name]
        assert r["steady_rows_per_s"] == pytest.approx(
            statistics.median(e["rows_per_s"] for e in methods[name]["epochs"][1:]), abs=0.1)
        ceil = res["ceiling"]
        assert r["steady_x_ceiling"] == pytest.approx(r["steady_rows_per_s"] / ceil["steady"], abs=1e-3)
        assert r["epoch1_x_ceiling"] == pytest.approx(r["epoch1_rows_per_s"] / ceil["epoch1"], abs=1e-3)
    parse = methods["pyarrow_parse"]["rows_per_s"]
    assert table["feed_only"]["x_parse"]["steady"] == pytest.approx(
        table["feed_only"]["steady_rows_per_s"] / parse, abs=1e-3)
    targets = {t["target"]: t for t in res["targets"]}
    tf_best = max(methods[k]["epochs"][0]["rows_per_s_from_start"] for k in FITS if k.startswith("tf_data"))
    assert targets["epoch1_vs_tf_data"]["value"] == pytest.approx(
        dsk["epochs"][0]["rows_per_s_from_start"] / tf_best, rel=1e-3)
    assert targets["peak_rss_in_budget"]["value"] == pytest.approx(dsk["peak_rss_bytes"] / 2e9, rel=1e-3)
    for t in res["targets"]:
        assert t["pass"] is (t["value"] >= t["threshold"] if t["target"] != "peak_rss_in_budget"
                             else t["value"] <= t["threshold"]), t
    assert res["sanity"]["rows_consistent"] is True
    for name, loss in res["sanity"]["losses"].items():  # same model, same data: a sane loss
        assert 0 < loss["train_loss"] < 1 and 0 < loss["val_loss"] < 1, (name, loss)


def test_bench_usage_errors(tmp_path):
    both = _run("bench.py", str(tmp_path), "--rows", "2000", cwd=str(tmp_path))
    assert both.returncode == 2 and "either DATA or --rows" in both.stderr
    nothing = _run("bench.py", str(tmp_path / "nowhere" / "*.csv"), "--out", str(tmp_path), cwd=str(tmp_path))
    assert nothing.returncode == 1 and "match none" in nothing.stderr and "Hint:" in nothing.stderr
    assert "Traceback" not in nothing.stderr
    few = _run("bench.py", "--rows", "2000", "--epochs", "3", cwd=str(tmp_path))
    assert few.returncode == 2 and "at least 4" in few.stderr


def test_small_files_quick(tmp_path):
    proc = _run("small_files.py", "--files", "20", "--listing", "30,60", "--plan", "5000", "--passes", "1",
                "--memory-limit", "2GB", "--data-dir", str(tmp_path / "sf"), "--out", str(tmp_path),
                cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "small-files.json").read_text())
    scan = res["scan"]
    assert scan["files"] == 20 and set(scan["rows"].values()) == {20_000}
    assert scan["partitions"] == 20 and scan["manifest_bytes_per_partition"] > 0
    assert [r["files"] for r in res["listing"]["listing"]] == [30, 60]
    assert [r["partitions"] for r in res["listing"]["planning"]] == [30, 60, 5000]
    assert res["listing"]["planning"][-1]["batches"] == math.ceil(5000 * 1000 / 1024)


def test_profile_summary_adds_up():
    from profile_trainer import summarize

    raw = ("thread (0x1) (idle);main (bench.py:1);fit (keras/src/trainers/trainer.py:10) 30\n"
           "thread (0x2);run (x.py:1);__getitem__ (daskfeed/sequence.py:632);"
           "_get (daskfeed/sequence.py:650) 10\n"
           "thread (0x2);run (x.py:1);__getitem__ (daskfeed/sequence.py:632) 10\n")
    res = summarize(raw, rate=100, batches=5)
    assert res["samples"] == 50 and res["cpu_ms_per_batch_total"] == pytest.approx(1e3 * 50 / 100 / 5)
    own = {r["function"]: r["samples"] for r in res["self"]}
    incl = {r["function"]: r["samples"] for r in res["inclusive"]}
    assert own == {"fit (keras:trainer.py)": 30, "_get (daskfeed:sequence.py)": 10,
                   "__getitem__ (daskfeed:sequence.py)": 10}
    assert incl["__getitem__ (daskfeed:sequence.py)"] == 20 and incl["run (x.py)"] == 20
    assert {r["function"]: r["samples"] for r in res["threads"]} == {"thread (0x1)": 30, "thread (0x2)": 20}


@pytest.mark.slow
def test_bench_scales(tmp_path):
    proc = _run("bench.py", "--rows", "1000", "--scale", "1,2", "--memory-limit", "2GB", "--nworkers", "1",
                "--out", str(tmp_path), "--name", "s", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "s.json").read_text())
    assert [(r["scale"], r["rows"]) for r in res["scales"]] == [(1, 1000), (2, 2000)]
    assert all(r["budget_bytes"] == 2e9 and r["peak_rss_bytes"] > 0 for r in res["scales"])
    assert (tmp_path / "s.png").exists() or not _has_matplotlib()


@pytest.mark.slow  # two models × four fits and a cluster (~25 s): make test-slow / make bench
def test_gpu_bench_figures_add_up(tmp_path):
    """benchmarks/gpu.py on any device: each model's row is made of its own runs' figures."""
    proc = _run("gpu.py", "--rows", "4000", "--data-dir", str(tmp_path / "d"), "--models", "8,8;16",
                "--memory-limit", "2GB", "--out", str(tmp_path), "--name", "g", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "g.json").read_text())
    assert res["config"]["device"]["backend"] == "tensorflow" and res["config"]["rows"] == 4000
    assert [r["hidden"] for r in res["rows"]] == [[8, 8], [16]]
    for r in res["rows"]:
        ceil = statistics.median(statistics.median(e["rows_per_s"] for e in c["epochs"][1:])
                                 for c in r["ceiling_runs"])
        ours = r["daskfeed"]
        assert len(r["ceiling_runs"]) == 2 and r["ceiling_steady_rows_per_s"] == pytest.approx(ceil, rel=1e-3)
        assert r["steady_ratio"] == pytest.approx(r["daskfeed_steady_rows_per_s"] / ceil, rel=1e-2)
        assert r["floor_ratio"] == pytest.approx(r["floor_steady_rows_per_s"] / ceil, rel=1e-2)
        assert r["ceiling_step_ms"] == pytest.approx(1e3 * 1000 / ceil, rel=1e-2)
        assert [e["rows_served"] for e in ours["epochs"]] == [4000] * 4  # every row, every epoch
        waits = [e["data_wait_fraction"] for e in ours["epochs"]]
        assert all(0.0 <= w <= 1.0 for w in waits) and r["data_wait_epoch1"] == waits[0]
        assert r["data_wait_steady"] == pytest.approx(statistics.median(waits[1:]), abs=1e-4)
    text = (tmp_path / "g.txt").read_text()
    assert "benchmarks/gpu.py --rows 4000" in text and "8-8" in text and "16 " in text
