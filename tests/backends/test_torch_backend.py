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
                         capture_output=True, text=True,
                         env={k: v for k, v in _env().items() if k != "OMP_NUM_THREADS"},
                         timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    from dask.system import CPU_COUNT  # torch computes on the cores its one worker leaves

    assert f"torch: {max(1, CPU_COUNT - 1)} thread(s) for the model (the {CPU_COUNT} core(s) " \
        in run.stdout, run.stdout
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


_HANDOFFS = r"""
import json, sys
import numpy as np
from distributed import Client, LocalCluster

import daskfeed
import daskfeed.adapters._torch as handoff_module
from daskfeed.adapters import chosen_handoff, keras
from daskfeed.training._callbacks import EpochTelemetry, fit_from

SEEN = []  # the first feature's sum of each batch the dataloader hand-off hands out
_tensors = handoff_module._tensors


def seen(part):
    if isinstance(part, dict):
        SEEN.append(round(float(part["x1"].astype("float64").sum()), 4))
    return _tensors(part)


handoff_module._tensors = seen


class Begins(keras.callbacks.Callback):
    started = False

    def on_train_begin(self, logs=None):  # (fit_from's first fit; the model is built after it)
        if not self.started:
            SEEN.clear()  # what was read before (to build the model) is not trained
        self.started = True

if __name__ == "__main__":
    data = sys.argv[1]
    report = {"auto": chosen_handoff("auto")}
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        kw = dict(label="y", batch_size=100, client=client, seed=3)
        weights, initial = {}, None
        for handoff in ("dataloader", "pydataset"):
            with daskfeed.DaskSequence(data, **kw) as seq, \
                    daskfeed.DaskSequence(data, shuffle=False, **kw) as val:
                model = daskfeed.default_model(seq, hidden=(8,))
                # the same start (a seed alone is not: the cluster's threads draw from Python's
                # random numbers, which Keras' initializers seed from)
                initial = model.get_weights() if initial is None else initial
                model.set_weights(initial)
                tel = EpochTelemetry(seq)
                hist = fit_from(model, seq, epochs=3, handoff=handoff, validation_data=val,
                                callbacks=[tel], shuffle=False, verbose=0)
                report[handoff] = {
                    "epochs": [[r["rows"], r["batches"], r["data_wait_seconds"] is not None]
                               for r in tel.epochs],
                    "val_loss": [v for h in hist for v in h.history["val_loss"]],
                    "batches": len(seq), "rows": seq.rows}
                weights[handoff] = model.get_weights()
                # a resumed epoch by a new model (Keras reads a batch to build it first): epoch
                # 1 from its batch 5, then epoch 2
                fresh = daskfeed.default_model(seq, hidden=(8,))
                fresh.set_weights(initial)
                fit_from(fresh, seq, epochs=3, epoch=1, batch=5, handoff=handoff, shuffle=False,
                         verbose=0)
                weights[handoff + "-resumed"] = fresh.get_weights()
            # from epoch 1's last batch: the one Keras read first to build a new model (the
            # PyDataset's epoch of that one batch begins and ends around that read)
            with daskfeed.DaskSequence(data, **kw) as seq:
                n = len(seq)
                truth = []
                for e, batches in ((1, [n - 1]), (2, range(n))):
                    seq.set_epoch(e)
                    truth += [round(float(seq[i][0]["x1"].astype("float64").sum()), 4)
                              for i in batches]
                seq.set_epoch(0)
                fresh = daskfeed.default_model(seq, hidden=(8,))
                fresh.set_weights(initial)
                fit_from(fresh, seq, epochs=3, epoch=1, batch=n - 1, handoff=handoff,
                         shuffle=False, verbose=0, callbacks=[Begins()])
                weights[handoff + "-last"] = fresh.get_weights()
                if handoff == "dataloader":
                    report["last"] = [SEEN == truth, len(SEEN), len(truth)]
            if handoff == "dataloader":  # Keras takes no class_weight with a DataLoader
                report["class_weight"] = chosen_handoff("auto", {0: 1.0, 1: 2.0})
                try:
                    chosen_handoff("dataloader", {0: 1.0, 1: 2.0})
                except daskfeed.SettingError as err:
                    report["refused"] = str(err).splitlines()[0]
    report["same_weights"] = max(float(np.abs(a - b).max()) for a, b in
                                 zip(weights["dataloader"], weights["pydataset"]))
    report["same-resumed"] = max(float(np.abs(a - b).max()) for a, b in
                                 zip(weights["dataloader-resumed"], weights["pydataset-resumed"]))
    report["same-last"] = max(float(np.abs(a - b).max()) for a, b in
                              zip(weights["dataloader-last"], weights["pydataset-last"]))
    print("REPORT " + json.dumps(report))
"""


def test_the_dataloader_handoff_trains_what_the_pydataset_trains(tmp_path) -> None:
    """``auto`` on PyTorch hands ``fit`` a DataLoader of runs of batches: each epoch every row
    once, the same weights and validation losses as the PyDataset's (the same batches in the same
    order), resumed epochs too (from a batch, and from the last one: the batch Keras reads to
    build a new model is served again, by either hand-off), the wait for data measured in the
    trainer's thread, and the PyDataset with a class_weight (Keras takes none with a
    DataLoader)."""
    needs("torch")
    from helpers import write_wide_data

    (tmp_path / "data").mkdir()
    data = write_wide_data(tmp_path / "data")
    script = tmp_path / "handoffs.py"
    script.write_text(_HANDOFFS)
    proc = subprocess.run([sys.executable, str(script), data], capture_output=True, text=True,
                          env=_env(OMP_NUM_THREADS="1"), timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(next(ln for ln in proc.stdout.splitlines()
                             if ln.startswith("REPORT "))[len("REPORT "):])
    assert report["auto"] == "dataloader"
    loader, pydataset = report["dataloader"], report["pydataset"]
    assert loader["epochs"] == [[loader["rows"], loader["batches"], True]] * 3
    assert loader["epochs"] == pydataset["epochs"]
    assert len(loader["val_loss"]) == 3
    assert loader["val_loss"] == pytest.approx(pydataset["val_loss"], abs=1e-6)
    assert report["same_weights"] < 1e-6
    assert report["same-resumed"] < 1e-6
    assert report["last"][0], report["last"]  # epoch 1's last batch, then epoch 2, once each
    assert report["same-last"] < 1e-6  # the PyDataset trains that batch too, then epoch 2
    assert report["class_weight"] == "pydataset"
    assert report["refused"].startswith("Expected no class_weight with the dataloader hand-off")
