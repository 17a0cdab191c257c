"""Keras backends: JAX trains, fits, saves and predicts like TensorFlow (the rest of the suite);
numpy and openvino are refused with a clear message (PyTorch: tests/backends/). Each backend runs
in its own process (Keras picks its backend once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import write_wide_data

pytest.importorskip("jax")

# Run under KERAS_BACKEND=jax: train() on data with an int64 column beyond 2**24 (a timestamp,
# which JAX would narrow to int32 without 64-bit types), resumed for one more epoch from its
# checkpoint, a user model fit over a DaskSequence, predictions of the in-memory model and of the
# model.keras read back, on encoded rows.
_JAX_SCRIPT = r"""
import json, sys
import numpy as np
from distributed import Client, LocalCluster

import daskfeed
from daskfeed.adapters._keras import keras
from daskfeed.training._train import train

data, out = sys.argv[1], sys.argv[2]
if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    result = train(data, label="y", epochs=3, memory_limit="3GB", nworkers=1, output=out,
                   checkpoint_every=0, batch_size=256, cache=False, verbose=0,
                   echo=lambda line: None)
    report = {"backend": keras.backend.backend(), "loss": [e["loss"] for e in result.history]}
    # a fourth epoch from the checkpoint of the third: weights and optimizer state restored
    resumed = train(data, label="y", epochs=4, memory_limit="3GB", nworkers=1, output=out,
                    checkpoint_every=0, batch_size=256, cache=False, verbose=0, resume=True,
                    echo=lambda line: None)
    report["resumed_loss"] = [e["loss"] for e in resumed.history]
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        with daskfeed.DaskSequence(data, label="y", batch_size=256, client=client,
                                   shuffle=False, manifest=out + "/manifest.json") as seq:
            x, _ = seq[0]
            reloaded = keras.saving.load_model(out + "/model.keras")
            report["saved_vs_trained"] = float(np.abs(
                reloaded.predict(x, verbose=0) - resumed.model.predict(x, verbose=0)).max())
            report["ts_dtype"] = str(x["ts"].dtype)
            inputs = {n: keras.Input(shape=(1,), name=n, dtype=str(x[n].dtype)) for n in x}
            norm = [keras.layers.Normalization(mean=[seq.manifest.columns[n].mean],
                                               variance=[seq.manifest.columns[n].var],
                                               dtype="float64")(inputs[n]) for n in ("x1", "ts")]
            h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(norm))
            own = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
            own.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
            report["own_loss"] = own.fit(seq, epochs=3, shuffle=False, verbose=0).history["loss"]
            own.save(out + "/own.keras")
            report["own_saved_vs_trained"] = float(np.abs(
                keras.saving.load_model(out + "/own.keras").predict(x, verbose=0)
                - own.predict(x, verbose=0)).max())
    print("REPORT " + json.dumps(report))
"""


def _env(backend: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    return {**env, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


@pytest.fixture(scope="module")
def wide_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    """4 files: x1, a millisecond timestamp ts (int64, > 2**24), a category, label y from x1 and ts."""
    return write_wide_data(tmp_path_factory.mktemp("backends"))


@pytest.mark.slow  # a whole JAX fit, export and reload (~60 s in make test's 2 workers)
def test_jax_trains_fits_and_reloads(wide_data: str, tmp_path) -> None:
    script = tmp_path / "run_jax.py"
    script.write_text(_JAX_SCRIPT)
    out = str(tmp_path / "out")
    proc = subprocess.run([sys.executable, str(script), wide_data, out], capture_output=True,
                          text=True, env=_env("jax"), timeout=540, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["backend"] == "jax"
    assert report["ts_dtype"] == "int64"  # exact, not narrowed to int32
    assert report["loss"][-1] < report["loss"][0] * 0.9, report["loss"]
    assert report["loss"][-1] < 0.6, report["loss"]  # learns from the wide column too
    assert report["own_loss"][-1] < report["own_loss"][0], report["own_loss"]
    assert report["saved_vs_trained"] <= 1e-6
    assert report["own_saved_vs_trained"] <= 1e-6
    # resumed: the three epochs kept, a fourth trained on from where the third left off
    assert report["resumed_loss"][:3] == pytest.approx(report["loss"])
    assert len(report["resumed_loss"]) == 4 and report["resumed_loss"][3] < report["loss"][0]
    history = json.loads((tmp_path / "out" / "history.json").read_text())
    assert len(history["epochs"]) == 4 and history["resumed_from"]


def test_jax_without_64_bit_types_refuses_wide_columns(wide_data: str, tmp_path) -> None:
    code = ("import daskfeed\n"
            "from distributed import Client\n"
            "if __name__ == '__main__':\n"
            "    with Client(n_workers=1, threads_per_worker=1, dashboard_address='127.0.0.1:0') as c:\n"
            f"        daskfeed.DaskSequence({wide_data!r}, label='y', client=c)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env("jax", JAX_ENABLE_X64="0"), timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    assert "SettingError" in proc.stderr and "['ts']" in proc.stderr, proc.stderr[-3000:]
    assert "JAX_ENABLE_X64=1" in proc.stderr


@pytest.mark.parametrize("backend", ["numpy", "openvino"])
def test_other_backends_are_refused(backend: str, wide_data: str, tmp_path) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "daskfeed")
    proc = subprocess.run([exe, "train", wide_data, "--label", "y", "--output", str(tmp_path / "o")],
                          capture_output=True, text=True, env=_env(backend), timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"Received: KERAS_BACKEND={backend!r}" in proc.stderr
    assert "KERAS_BACKEND=jax" in proc.stderr and "Traceback" not in proc.stderr
