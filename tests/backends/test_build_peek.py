"""Keras reads a batch to build a new model (JAX, PyTorch, TensorFlow under a distribution
strategy): a resume at an epoch's last batch still trains that batch, then the next epoch, every
batch once; Keras' threads are one, so each epoch trains its own batches once; JAX's predict of a
model not built yet is one pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_backend_matrix import _env, needs

_SCRIPT = r"""
import json, sys
from distributed import Client, LocalCluster

import daskfeed
from daskfeed.adapters import keras
from daskfeed.training._callbacks import fit_from

TRAINED, STARTED = [], [False]


def key(batch):
    return round(float(batch[0]["x1"].astype("float64").sum()), 4)


class Recorded(daskfeed.DaskSequence):
    def __getitem__(self, index):
        batch = super().__getitem__(index)
        if STARTED[0]:
            TRAINED.append(key(batch))
        return batch


class Begins(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):  # (what was read before, to build the model, is not)
        STARTED[0] = True


if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        with Recorded(sys.argv[1], label="y", batch_size=100, client=client, seed=3) as seq:
            n = len(seq)
            truth = []
            for epoch, batches in ((1, [n - 1]), (2, range(n))):
                seq.set_epoch(epoch)
                truth += [key(seq[i]) for i in batches]
            seq.set_epoch(0)
            model = daskfeed.default_model(seq, hidden=(8,))
            fit_from(model, seq, epochs=3, epoch=1, batch=n - 1, handoff="pydataset",
                     shuffle=False, verbose=0, callbacks=[Begins()])
            print("REPORT " + json.dumps({"backend": keras.backend.backend(), "trained": TRAINED,
                                          "truth": truth}))
"""


def test_a_new_model_resumed_at_an_epochs_last_batch_trains_it_on_jax(tmp_path) -> None:
    needs("jax")
    report = _report(tmp_path, _SCRIPT, "jax")
    assert report["backend"] == "jax"
    # epoch 1's last batch, then epoch 2's batches, each once and in order
    assert report["trained"] == report["truth"], (len(report["trained"]), len(report["truth"]))


_READ_AHEAD = r"""
import json, sys, warnings
import numpy as np
from distributed import Client, LocalCluster

import daskfeed
from daskfeed.adapters import keras

SEEN, STARTED = [], [False]


class Record(keras.layers.Layer):  # the rows each step trains (fit runs eagerly)
    def call(self, x):
        if STARTED[0]:  # (not the build's call)
            SEEN.append(keras.ops.convert_to_numpy(x)[:, 0].copy())
        return x


class Begins(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        STARTED[0] = True


if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seq = daskfeed.DaskSequence(sys.argv[1], label="y", batch_size=1000, client=client,
                                        seed=3, features=["x1"], as_matrix=True, workers=4,
                                        max_queue_size=10)
        with seq:
            n = len(seq)
            want = []
            for epoch in range(3):
                seq.set_epoch(epoch)
                want.append([seq[i][0][:, 0].copy() for i in range(n)])
            seq.set_epoch(0)
            model = keras.Sequential([keras.Input((1,)), Record(), keras.layers.Dense(1)])
            model.compile("sgd", "mse", run_eagerly=True)
            model.fit(seq, epochs=3, shuffle=False, verbose=0, callbacks=[Begins()])
            trained = SEEN

            def where(b):
                return next((f"{e}:{i}" for e in range(3) for i in range(n)
                             if np.array_equal(b, want[e][i])), "?")

            print("REPORT " + json.dumps({
                "backend": keras.backend.backend(), "batches": n, "epoch": seq.epoch,
                "trained": [where(b) for b in trained],
                "warned": [str(w.message) for w in caught if "workers=4" in str(w.message)]}))
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_threads_are_one_so_each_epoch_trains_its_own_batches_once(tmp_path, backend) -> None:
    # Keras' enqueuer hands out first what its threads read ahead before a pass stopped: after
    # the build's pass, fit(epochs=3) trained epoch 0's batches 1-5 twice, epoch 2's never
    needs(backend)
    report = _report(tmp_path, _READ_AHEAD, backend)
    assert report["backend"] == backend and report["batches"] == 6
    assert len(report["warned"]) == 1 and "as workers=1" in report["warned"][0]
    assert report["trained"] == [f"{e}:{i}" for e in range(3) for i in range(6)]
    assert report["epoch"] == 3


_PREDICT = r"""
import json, sys
from distributed import Client, LocalCluster

import daskfeed
from daskfeed.adapters import keras

if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        with daskfeed.DaskSequence(sys.argv[1], label="y", batch_size=6000, client=client, seed=3,
                                   features=["x1", "ts"], as_matrix=True) as seq:
            model = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(1)])  # not built
            first = model.predict(seq, verbose=0)
            unbuilt = seq.epoch
            model.predict(seq, verbose=0)
            print("REPORT " + json.dumps({"backend": keras.backend.backend(), "rows": len(first),
                                          "batches": len(seq), "unbuilt": unbuilt,
                                          "built": seq.epoch - unbuilt}))
"""


def test_jax_predict_of_a_model_not_built_yet_is_one_pass(tmp_path) -> None:
    # JAX's predict reads a batch itself to build the model (no _symbolic_build among its
    # frames); with one batch an epoch that read was the whole epoch, and predict served the next
    needs("jax")
    report = _report(tmp_path, _PREDICT, "jax")
    assert report["backend"] == "jax" and report["rows"] == 6000 and report["batches"] == 1
    # each predict one pass over one epoch of the order, the build's read included (it made
    # the first predict two: the sequence stood at epoch 2 after it)
    assert report["unbuilt"] == report["built"] == 1


_STRATEGY = r"""
import json, sys
import numpy as np
from distributed import Client, LocalCluster

import daskfeed
from daskfeed.training._callbacks import fit_from

if __name__ == "__main__":
    import tensorflow as tf

    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        with daskfeed.DaskSequence(sys.argv[1], label="y", batch_size=100, client=client,
                                   seed=3) as seq:
            n = len(seq)
            truth = []
            for epoch, batches in ((1, [n - 1]), (2, range(n))):
                seq.set_epoch(epoch)
                truth += [seq[i] for i in batches]
            seq.set_epoch(0)
            strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
            with strategy.scope():
                resumed = daskfeed.default_model(seq, hidden=(8,))
                reference = daskfeed.default_model(seq, hidden=(8,))
            start = resumed.get_weights()
            reference.set_weights(start)
            fit_from(resumed, seq, epochs=3, epoch=1, batch=n - 1, handoff="pydataset",
                     shuffle=False, verbose=0)
            for x, y in truth:  # epoch 1's last batch, then epoch 2's, one by one
                reference.train_on_batch(x, y)
            def gap(a, b):
                return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))
            print("REPORT " + json.dumps({"replicas": strategy.num_replicas_in_sync,
                                          "batches": len(truth),
                                          "gap": gap(resumed.get_weights(), reference.get_weights()),
                                          "moved": gap(resumed.get_weights(), start)}))
"""


def test_a_model_under_a_strategy_resumed_at_an_epochs_last_batch_trains_it(tmp_path) -> None:
    # TensorFlow under a distribution strategy reads a batch to build (_maybe_symbolic_build)
    report = _report(tmp_path, _STRATEGY, "tensorflow")
    assert report["replicas"] == 1 and report["batches"] == 61
    # the same weights as the batches trained one by one (the build's pass ending the resumed
    # epoch trained epoch 2's first batch in its place: 0.0097 away), and training moved them
    assert report["gap"] < 1e-6 and report["moved"] > 1e-3


def _report(tmp_path, script: str, backend: str) -> dict:
    """Run ``script`` on the wide data in a fresh process on ``backend``: its ``REPORT`` JSON."""
    from helpers import write_wide_data

    (tmp_path / "data").mkdir()
    data = write_wide_data(tmp_path / "data")
    path = tmp_path / "script.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path), data], capture_output=True, text=True,
                          env=_env(backend), timeout=600, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("REPORT "):])
