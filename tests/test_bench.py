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

    from daskfeed.bench import TARGETS

    methods = res["methods"]
    assert set(METHODS) <= set(methods)
    rows = res["config"]["rows"]
    assert rows == 3000 and res["config"]["generated_rows"] == 3000
    for name in METHODS:
        m = methods[name]
        assert m["rows"] == rows, name
        if name == "pyarrow_parse":  # the reference rate is the best of its variants
            assert m["rows_per_s"] == max(m["variants_rows_per_s"].values())
            assert m["variants_rows_per_s"][m["reference"]] == m["rows_per_s"]
            continue
        assert len(m["epochs"]) == 3, name  # the default: epoch 1 and two steady ones
        assert [e["epoch"] for e in m["epochs"]] == [1, 2, 3], name
        for e in m["epochs"]:  # every epoch saw every row, in the expected number of steps
            assert e["rows"] == rows and e["steps"] == m["expected_steps"], (name, e)
            # a rate is the epoch's rows over its seconds (both as reported)
            assert e["rows_per_s"] == pytest.approx(rows / e["seconds"], rel=0.01), (name, e)
    assert methods["old_recipe"]["expected_steps"] == 3  # one batch per 1000-row file
    assert methods["in_memory"]["expected_steps"] == math.ceil(3000 / 256)
    floor = methods["pydataset_floor"]  # the Keras adapter over arrays in memory
    assert floor["rows"] == 3000 and [e["steps"] for e in floor["epochs"]] == [math.ceil(3000 / 256)] * 3
    dsk = methods["daskfeed"]
    assert dsk["epoch1_cold_rows_per_s"] < dsk["epoch1_from_files_rows_per_s"]  # + cluster start
    assert dsk["peak_rss_bytes"] > dsk["trainer_rss_before_bytes"]
    for e in dsk["epochs"]:  # the wait is part of the epoch; its fraction is of the epoch's
        assert 0 <= e["data_wait_seconds"] <= e["seconds"], e  # training part (no longer)
        assert e["data_wait_seconds"] / e["seconds"] - 0.01 <= e["data_wait_fraction"] <= 1, e
    assert res["rows_consistent"] is True and set(res["rows_seen"].values()) == {rows}

    # the summary adds up: each target's value is computed from the measurements above, and
    # passes exactly when it is on the right side of its threshold
    def steady(m):
        return max(m["epochs"][1:], key=lambda e: e["rows_per_s"])

    ceiling = steady(methods["in_memory"])["rows_per_s"]
    values = {
        "epoch1_vs_load_fit": dsk["epoch1_from_files_rows_per_s"]
        / methods["in_memory"]["load_fit_epoch1_rows_per_s"],
        "epoch2_vs_fit": steady(dsk)["rows_per_s"] / ceiling,
        "feed_vs_parse": steady(methods["feed_only"])["rows_per_s"] / methods["pyarrow_parse"]["rows_per_s"],
        "data_wait": steady(dsk)["data_wait_fraction"],
    }
    assert [t["target"] for t in res["targets"]] == [key for key, *_ in TARGETS] == list(values)
    for t, (key, _, threshold, higher) in zip(res["targets"], TARGETS, strict=True):
        assert t["threshold"] == threshold, t
        assert t["value"] == pytest.approx(values[key], rel=1e-3, abs=1e-4), t
        assert t["pass"] is (values[key] >= threshold if higher else values[key] < threshold), t
    assert any(r["x_fit"] == 1.0 for r in res["table"])  # the ceiling row
    for r in res["table"]:  # every ratio is against the in-memory steady fit
        assert r["x_fit"] == pytest.approx(r["rows_per_s"] / ceiling, abs=1e-3), r
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
