"""The benchmark end to end on tiny data: the real CLI, every method, a JSON that adds up."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

METHODS = ("pyarrow_parse", "in_memory", "tf_data", "old_recipe", "daskfeed", "feed_only")


def _daskfeed(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "daskfeed.cli", "bench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_bench_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    proc = _daskfeed("--rows", "3000", "--data-dir", str(tmp_path / "data"), "--batch-size", "256",
                     "--memory-limit", "2GB", "--nworkers", "1", "--json", str(out), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "× fit" in proc.stdout and "targets (issue 3):" in proc.stdout
    res = json.loads(out.read_text())

    assert set(METHODS) <= set(res["methods"])
    rows = res["config"]["rows"]
    assert rows == 3000 and res["config"]["generated_rows"] == 3000
    for name in METHODS:
        m = res["methods"][name]
        assert m["rows"] == rows, name
        assert m["rows_per_s"] > 0 if name == "pyarrow_parse" else all(
            e["rows_per_s"] > 0 and e["seconds"] > 0 for e in m["epochs"]), name
        if name != "pyarrow_parse":
            assert len(m["epochs"]) == 3, name  # the default: epoch 1 and two steady ones
            for e in m["epochs"]:  # every epoch saw every row, in the expected number of steps
                assert e["rows"] == rows and e["steps"] == m["expected_steps"], (name, e)
    assert res["methods"]["old_recipe"]["expected_steps"] == 3  # one batch per 1000-row file
    assert res["methods"]["in_memory"]["expected_steps"] == math.ceil(3000 / 256)
    floor = res["methods"]["pydataset_floor"]  # the Keras adapter over arrays in memory
    assert floor["rows"] == 3000 and [e["steps"] for e in floor["epochs"]] == [math.ceil(3000 / 256)] * 3
    dsk = res["methods"]["daskfeed"]
    assert dsk["epoch1_cold_rows_per_s"] > 0 and dsk["peak_rss_bytes"] > dsk["trainer_rss_before_bytes"]
    assert all(0 <= e["data_wait_fraction"] <= 1 for e in dsk["epochs"])
    assert res["rows_consistent"] is True

    assert [t["target"] for t in res["targets"]] == ["epoch1_vs_load_fit", "epoch2_vs_fit",
                                                     "feed_vs_parse", "data_wait"]
    assert all(isinstance(t["pass"], bool) and t["value"] >= 0 for t in res["targets"])
    assert all(r["rows_per_s"] > 0 and r["x_fit"] > 0 for r in res["table"])
    for name, loss in res["losses"].items():  # same model, same data: a sane loss everywhere
        assert 0 < loss["train_loss"] < 1 and 0 < loss["val_loss"] < 1, (name, loss)


def test_bench_usage_errors(tmp_path):
    both = _daskfeed(str(tmp_path), "--rows", "2000", cwd=str(tmp_path))
    assert both.returncode == 2 and "either DATA or --rows" in both.stderr
    nothing = _daskfeed(str(tmp_path / "nowhere" / "*.csv"), cwd=str(tmp_path))
    assert nothing.returncode == 1 and "match none" in nothing.stderr and "Hint:" in nothing.stderr
    assert "Traceback" not in nothing.stderr


@pytest.mark.parametrize("bad", ["--epochs=1", "--memory-limit=-1GB"])
def test_bench_bad_flags(tmp_path, bad):
    proc = _daskfeed("--rows", "2000", bad, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
