"""The backend matrix: TensorFlow, JAX and PyTorch run the same short train / resume / predict.

Each backend runs one script in a process of its own (Keras picks its backend once per process):
``train`` (the ``daskfeed train`` route) with mid-epoch checkpoints, resumed for one more epoch;
early stopping on a model that cannot improve; the Python route (``DaskSequence``,
``default_model``, ``fit_from``) interrupted mid-epoch and resumed from its checkpoint to the
weights of an uninterrupted fit; ``model.keras`` read back; ``predict`` out of core. In this
(TensorFlow) process, the run's ``serving/`` SavedModel scores as ``predict`` does: on JAX and
PyTorch it was written by a TensorFlow child process from ``model.keras``.

PyTorch comes with the ``torch`` extra (``make test-torch``, which sets
``DASKFEED_REQUIRE_TORCH=1``: missing, the test fails instead of skipping).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import write_wide_data

_SCRIPT = r"""
import json, sys
import numpy as np
from distributed import Client, LocalCluster

import daskfeed
from daskfeed.adapters import keras
from daskfeed.checkpoint import CheckpointStore
from daskfeed.training import Checkpointer, fit_from, train

data, out = sys.argv[1], sys.argv[2]
QUICK = dict(memory_limit="3GB", nworkers=1, dashboard_address="127.0.0.1:0", verbose=0,
             batch_size=256, cache=False, echo=lambda line: None)


def frozen(manifest):
    return daskfeed.default_model(manifest, hidden=(4,), learning_rate=0.0)


class Crash(Exception):
    pass


def steps(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    report = {"backend": keras.backend.backend()}
    # the daskfeed train route: 2 epochs with mid-epoch checkpoints, then a third resumed
    result = train(data, label="y", epochs=2, output=out + "/run", checkpoint_every=5, **QUICK)
    report["loss"] = [e["loss"] for e in result.history]
    resumed = train(data, label="y", epochs=3, output=out + "/run", checkpoint_every=5,
                    resume=True, **QUICK)
    report["resumed_loss"] = [e["loss"] for e in resumed.history]
    # early stopping: a model that never changes stops after patience 1
    lines = []
    train(data, label="y", epochs=6, output=out + "/stop", model=frozen, validation_split=0.25,
          early_stopping=1, **{**QUICK, "echo": lines.append})
    report["stopping"] = [ln for ln in lines if "stopped after" in ln]
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        kw = dict(label="y", batch_size=200, client=client, seed=3)
        # the Python route, uninterrupted ...
        with daskfeed.DaskSequence(data, **kw) as seq:
            manifest, n = seq.manifest, len(seq)
            ref = daskfeed.default_model(seq, hidden=(8,))
            initial = ref.get_weights()
            fit_from(ref, seq, epochs=2, shuffle=False, verbose=0)

        class CrashAt(keras.callbacks.Callback):  # the process "dies" after 7 batches of epoch 1
            def on_train_batch_end(self, batch, logs=None):
                if steps(self.model) == n + 7:
                    raise Crash

        # ... and interrupted mid-epoch 1, then resumed from its last checkpoint (batch 5)
        store = CheckpointStore(out + "/ckpt")
        with daskfeed.DaskSequence(data, manifest=manifest, **kw) as seq:
            m1 = daskfeed.default_model(seq, hidden=(8,))
            m1.set_weights(initial)
            try:
                fit_from(m1, seq, epochs=2, shuffle=False, verbose=0,
                         callbacks=[Checkpointer(store, seq, every=5), CrashAt()])
            except Crash:
                pass
        ckpt = store.latest()
        report["cursor"] = [ckpt.cursor.epoch, ckpt.cursor.batch, ckpt.iterations, n]
        with daskfeed.DaskSequence(data, manifest=manifest, window_rows=ckpt.cursor.window_rows,
                                   **kw) as seq:
            m2 = daskfeed.default_model(seq, hidden=(8,))
            ckpt.restore(m2)
            fit_from(m2, seq, epochs=2, epoch=ckpt.cursor.epoch, batch=ckpt.cursor.batch,
                     shuffle=False, verbose=0)
        report["resume_vs_uninterrupted"] = max(
            float(np.abs(a - b).max()) for a, b in zip(m2.get_weights(), ref.get_weights()))
        report["steps"] = [steps(m2), steps(ref)]
        # model.keras read back predicts as the trained model
        with daskfeed.DaskSequence(data, label="y", batch_size=256, client=client, shuffle=False,
                                   manifest=out + "/run/manifest.json") as seq:
            x, _ = seq[0]
            reloaded = keras.saving.load_model(out + "/run/model.keras")
            report["saved_vs_trained"] = float(np.abs(
                reloaded.predict(x, verbose=0) - resumed.model.predict(x, verbose=0)).max())
            report["ts_dtype"] = str(x["ts"].dtype)
    scored = daskfeed.predict(out + "/run", data, memory_limit="6GB", nworkers=1, quiet=True)
    scored.to_csv(out + "/scored.csv", index=False)
    print("REPORT " + json.dumps(report))
"""


def _env(backend: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    return {**env, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}


def needs(backend: str) -> None:
    """Skip without the backend's package, or fail under ``DASKFEED_REQUIRE_TORCH=1`` (torch)."""
    if backend == "tensorflow" or importlib.util.find_spec(backend) is not None:
        return
    if backend == "torch" and os.environ.get("DASKFEED_REQUIRE_TORCH") == "1":
        pytest.fail("DASKFEED_REQUIRE_TORCH=1 but torch is not installed: pip install -e '.[torch]'")
    pytest.skip(f"{backend} is not installed (pip install 'daskfeed[{backend}]')")


@pytest.fixture(scope="module")
def wide_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    """4 files: x1, a millisecond timestamp ts (int64, > 2**24), a category, label y from x1 and ts."""
    return write_wide_data(tmp_path_factory.mktemp("matrix"))


@pytest.mark.slow  # a whole run per backend (~1-2 min each on 2 cores)
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_train_resume_early_stop_predict_and_serving(backend: str, wide_data: str, tmp_path) -> None:
    needs(backend)
    import tensorflow as tf

    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), wide_data, str(out)], capture_output=True,
                          text=True, env=_env(backend), timeout=560, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["backend"] == backend
    assert report["ts_dtype"] == "int64"  # exact, not narrowed
    assert report["loss"][-1] < report["loss"][0], report["loss"]
    # resumed: the two epochs kept, a third trained on from the checkpoint of the second
    assert report["resumed_loss"][:2] == pytest.approx(report["loss"])
    assert len(report["resumed_loss"]) == 3 and report["resumed_loss"][2] < report["loss"][0]
    history = json.loads((out / "run" / "history.json").read_text())
    assert len(history["epochs"]) == 3 and history["resumed_from"]
    assert report["stopping"] and "stopped after epoch 2 of 6" in report["stopping"][0]
    # interrupted after 7 batches of epoch 1 (its last checkpoint at batch 5), resumed: the
    # uninterrupted run's weights, every batch trained once
    epoch, batch, iterations, n = report["cursor"]
    assert (epoch, batch, iterations) == (1, 5, n + 5)
    assert report["steps"] == [2 * n, 2 * n]
    assert report["resume_vs_uninterrupted"] <= 1e-5
    assert report["saved_vs_trained"] <= 1e-6
    # predict out of core and serving/ (a TensorFlow SavedModel, whatever trained it) agree
    scored = pd.read_csv(out / "scored.csv")
    rows = pd.concat([pd.read_csv(p) for p in sorted(glob.glob(wide_data))])
    assert len(scored) == len(rows) == 6000
    assert ((scored["probability_1"] > 0.5) == rows["y"].to_numpy().astype(bool)).mean() > 0.8
    loaded = tf.saved_model.load(str(out / "run" / "serving"))
    served = loaded.serve({"x1": tf.constant(rows["x1"].to_numpy(np.float64)),
                           "ts": tf.constant(rows["ts"].to_numpy(np.float64)),
                           "cat": tf.constant(rows["cat"].tolist())})
    probs = served["probabilities"].numpy()
    # serving/ computes on TensorFlow: JAX's float32 layers differ from TensorFlow's by up to
    # ~1e-4 here (the same model.keras on the same encoded rows: 1.3e-5 after one epoch; the
    # float64 normalization of the int64 timestamp is exact on both); PyTorch's agree to 1e-5
    tolerance = 5e-4 if backend == "jax" else 1e-5
    assert np.abs(probs[:, 1] - scored["probability_1"].to_numpy()).max() <= tolerance
