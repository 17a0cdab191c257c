"""KERAS_BACKEND=torch from the command line, and a clear error where torch is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from test_backend_matrix import needs


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


def test_torch_backend_without_torch_names_the_extra(tmp_path) -> None:
    # torch made unimportable in this child as Python documents it (sys.modules[name] = None)
    code = ("import sys\nsys.modules['torch'] = None\nimport daskfeed\n"
            "daskfeed.train('nothing.csv', label='y', output='o')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert "BackendError: Expected torch installed for KERAS_BACKEND=torch" in proc.stderr, \
        proc.stderr[-3000:]
    assert "pip install 'daskfeed[torch]'" in proc.stderr


@pytest.mark.slow  # a daskfeed train and a daskfeed predict on PyTorch (~1 min on 2 cores)
def test_cli_trains_exports_and_predicts_on_torch(tmp_path) -> None:
    needs("torch")
    rng = np.random.default_rng(0)
    for i in range(2):
        x1, x2 = rng.normal(size=1000), rng.normal(size=1000)
        pd.DataFrame({"x1": x1, "x2": x2, "c": rng.choice(["a", "b"], 1000),
                      "y": (x1 - x2 > 0).astype(int)}).to_csv(tmp_path / f"d{i}.csv", index=False)
    exe = os.path.join(os.path.dirname(sys.executable), "daskfeed")
    out = tmp_path / "out"
    run = subprocess.run([exe, "train", str(tmp_path / "d*.csv"), "--label", "y", "--epochs", "2",
                          "--batch-size", "64",
                          "--memory-limit", "3GB", "--nworkers", "1", "--no-cache",
                          "--dashboard-address", "127.0.0.1:0", "--output", str(out)],
                         capture_output=True, text=True, env=_env(), timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"wrote {out}/serving (SavedModel" in run.stdout and "by a TensorFlow process" in run.stdout
    assert (out / "serving" / "saved_model.pb").is_file() and (out / "model.keras").is_file()
    assert not list(out.glob(".export-*"))  # the model saved for the child is removed
    hist = json.loads((out / "history.json").read_text())
    epochs = hist["epochs"]
    assert len(epochs) == 2 and epochs[1]["loss"] < epochs[0]["loss"] and epochs[1]["accuracy"] > 0.8
    scored = tmp_path / "scored.csv"
    pred = subprocess.run([exe, "predict", str(out), str(tmp_path / "d*.csv"), "--output",
                           str(scored), "--memory-limit", "6GB", "--nworkers", "1"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert pred.returncode == 0, pred.stdout[-3000:] + pred.stderr[-3000:]
    frame = pd.read_csv(scored)
    assert len(frame) == 2000 and frame["probability_1"].between(0, 1).all()
