"""model.keras is written whole or not at all: a save that fails halfway leaves the last good model."""

from __future__ import annotations

import os

import numpy as np
import pytest

from daskfeed.adapters import keras
from daskfeed.training._outputs import OutputLock, save_model


class _FailsWhileWritingWeights(keras.layers.Layer):
    """Its weights' write fails after Keras has begun writing the archive."""

    def call(self, x):
        return x

    def save_own_variables(self, store):
        raise OSError(28, "No space left on device")


def _model(extra: keras.layers.Layer | None = None) -> keras.Model:
    x = keras.Input(shape=(3,))
    h = keras.layers.Dense(2)(x)
    return keras.Model(x, extra(h) if extra is not None else h)


def test_a_save_that_fails_halfway_leaves_the_last_good_model(tmp_path):
    good = _model()
    path = save_model(good, str(tmp_path))
    assert path == str(tmp_path / "model.keras") and os.listdir(tmp_path) == ["model.keras"]
    before = (tmp_path / "model.keras").read_bytes()
    with pytest.raises(OSError, match="No space left"):
        save_model(_model(_FailsWhileWritingWeights()), str(tmp_path))
    assert (tmp_path / "model.keras").read_bytes() == before and os.listdir(tmp_path) == ["model.keras"]
    x = np.ones((4, 3), "float32")
    np.testing.assert_allclose(keras.models.load_model(path).predict(x, verbose=0),
                               good.predict(x, verbose=0))


def test_a_second_run_on_a_held_output_is_refused_naming_the_holder(tmp_path):
    """One run at a time in a directory: the second says who holds it, before any cluster."""
    import subprocess
    import sys

    import daskfeed
    from daskfeed.core import SettingError

    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "d.csv").write_text("x,y\n1,0\n2,1\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom daskfeed.training._outputs import OutputLock\n"
         f"lock = OutputLock({str(out)!r})\nprint('held', flush=True)\nsys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SettingError) as err:
            daskfeed.train(str(tmp_path / "d.csv"), label="y", output=str(out), quiet=True)
        assert f"{out} is held by another daskfeed train (pid {holder.pid} on " in str(err.value)
        assert "Hint: wait for that run to end, stop it, or give this one another --output" in str(err.value)
    finally:
        holder.communicate("go\n")
    OutputLock(str(out)).release()  # given back when its process ended


def test_run_json_ties_the_model_to_its_manifest_and_readers_refuse_another(tmp_path):
    from daskfeed.core import ManifestMismatchError
    from daskfeed.inference import check_record, publish_manifest, write_record

    out = str(tmp_path)
    assert check_record(out) is None  # an older daskfeed's directory: read as before
    (tmp_path / "model.keras").write_bytes(b"model of run 1")
    (tmp_path / "manifest.running.json").write_text('{"vocabulary": ["a", "b"]}')
    publish_manifest(out)
    assert not (tmp_path / "manifest.running.json").exists()
    record = write_record(out, "run-one")
    assert set(record["files"]) == {"model.keras", "manifest.json"}
    assert check_record(out) == "run-one"
    # a rerun that was cut short copied nothing over: its manifest waits beside them
    (tmp_path / "manifest.running.json").write_text('{"vocabulary": ["b", "a"]}')
    assert check_record(out) == "run-one"
    # the same columns with other vocabularies beside the model: refused by name
    (tmp_path / "manifest.json").write_text('{"vocabulary": ["b", "a"]}')
    with pytest.raises(ManifestMismatchError) as err:
        check_record(out)
    assert ("Expected model.keras and manifest.json of one run in " in str(err.value)
            and "(run run-one, as its run.json records them). Received: manifest.json changed "
            "since that run finished (a run is training there, or was cut short" in str(err.value))
    (tmp_path / "run.json").write_text("not json")
    with pytest.raises(ManifestMismatchError, match="Received: a file that is not one"):
        check_record(out)


def test_a_chart_that_cannot_be_drawn_leaves_the_runs_records_and_is_said(tmp_path, monkeypatch):
    """history.png is the one output a failing import or draw may cost: the model, history.json
    and run.json are written, the warning says why, and the closing line does not list it.

    The chart's process finds a matplotlib whose import fails (stop 64's CI: a dependency
    missing), first on the path the trainer gives it."""
    import json

    import daskfeed

    _broken_matplotlib(tmp_path / "site", monkeypatch)
    rng = np.random.default_rng(0)
    (tmp_path / "d.csv").write_text("x,z,y\n" + "".join(
        f"{a:.3f},{b:.3f},{int(a > 0)}\n" for a, b in rng.normal(size=(400, 2))))
    out = tmp_path / "out"
    out.mkdir()
    (out / "history.png").write_bytes(b"an earlier run's chart")
    lines: list[str] = []
    with pytest.warns(UserWarning, match=r"history\.png not written \(ModuleNotFoundError: No "
                      r"module named 'cycler'\)\. The model and history\.json are"):
        daskfeed.train(str(tmp_path / "d.csv"), label="y", output=str(out), epochs=1,
                       batch_size=100, memory_limit="2GB", nworkers=1, dashboard_address="",
                       echo=lines.append)
    assert (out / "model.keras").is_file() and (out / "run.json").is_file()
    assert len(json.loads((out / "history.json").read_text())["epochs"]) == 1
    assert not (out / "history.png").exists()  # (not the earlier run's)
    assert f"wrote {out}/model.keras, manifest.json, history.json, run.json" in lines


def _broken_matplotlib(site, monkeypatch) -> None:
    """A ``matplotlib`` whose import fails, first on the path a chart's process is given."""
    (site / "matplotlib").mkdir(parents=True)
    (site / "matplotlib" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'cycler'\")\n")
    monkeypatch.syspath_prepend(str(site))  # (this process has its matplotlib, or none loaded)


RECORDS = [{"epoch": 0, "loss": 0.7, "accuracy": 0.5, "val_loss": 0.72, "rows": 100},
           {"epoch": 1, "loss": 0.5, "accuracy": 0.75, "val_loss": float("nan"), "rows": 100}]


def test_a_chart_drawn_aside_is_put_in_place_by_finish_alone(tmp_path):
    """The process draws to a name of its own; the chart is at its path only once finished."""
    from daskfeed.training._chart import ChartProcess

    path = str(tmp_path / "history.png")
    chart = ChartProcess(RECORDS, path)
    assert chart.finish() == path
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    chart.close()  # (after finish: nothing to remove, the chart stays)
    assert os.listdir(tmp_path) == ["history.png"]


def test_a_chart_not_finished_leaves_nothing(tmp_path):
    """A run that fails after training closes its chart unfinished: no chart of its epochs."""
    from daskfeed.training._chart import ChartProcess

    chart = ChartProcess(RECORDS, str(tmp_path / "history.png"))
    chart.close()
    assert os.listdir(tmp_path) == []


def test_a_chart_whose_process_fails_says_why(tmp_path, monkeypatch):
    from daskfeed.training._chart import ChartError, ChartProcess

    _broken_matplotlib(tmp_path / "site", monkeypatch)
    chart = ChartProcess(RECORDS, str(tmp_path / "history.png"))
    with pytest.raises(ChartError, match=r"^ModuleNotFoundError: No module named 'cycler'$"):
        chart.finish()
    assert sorted(os.listdir(tmp_path)) == ["site"]


def test_a_chart_without_an_interpreter_to_start_is_drawn_here(tmp_path, monkeypatch):
    """No process can be started (``sys.executable`` is not there): drawn by finish() itself."""
    import sys

    from daskfeed.training._chart import ChartProcess

    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    path = str(tmp_path / "history.png")
    assert ChartProcess(RECORDS, path).finish() == path
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
