"""Keras loads while the cluster starts once the data are seen to have what the settings name."""

from __future__ import annotations

import pytest

from daskfeed.batches import StreamState
from daskfeed.checkpoint import Checkpoint
from daskfeed.reading import Listing
from daskfeed.training._keras_load import KerasLoad
from daskfeed.training._options import TrainOptions


def _data(tmp_path, header: bytes, name: str = "a.csv") -> str:
    (tmp_path / name).write_bytes(header + b"1,0,3\n2,1,4\n")
    return str(tmp_path / "*.csv")


def _peeked(pattern: str, label: str, **settings) -> KerasLoad:
    loading = KerasLoad()
    loading.ahead(label, TrainOptions.resolve(**settings), Listing(pattern), None)
    assert loading.peeking is not None
    loading.peeking.join()
    return loading


def _cursor(label: str, features: tuple[str, ...]) -> Checkpoint:
    cur = StreamState(epoch=1, batch=3, seed=0, batch_size=2, fingerprint="f", num_batches=4, rows=8,
                 window_rows=8, blocksize=2**20, shuffle=True, drop_remainder=False, label=label,
                 features=features)
    return Checkpoint(path="ckpt", cursor=cur)


def test_a_header_naming_the_label_and_the_features_starts_the_load(tmp_path):
    loading = _peeked(_data(tmp_path, b"a,y,b\n"), "y", features=["a", "b"])
    try:
        assert loading.thread is not None
    finally:
        loading.join()


@pytest.mark.parametrize(("header", "label", "settings"), [
    (b"a,y,b\n", "nope", {}),  # a wrong label: said by the scan with no keras loaded
    (b"a,y,b\n", "y", {"features": ["a", "zz"]}),  # a feature not there
    (b"a,y,b\n", "y", {"weight": "w"}),  # a weight column not there
    (b"a;y;b\n", "y", {}),  # another separator: one column named 'a;y;b'
    (b"\xff\xfea\x00,\x00y\x00\n\x00", "y", {}),  # not UTF-8 text: the scan says so
])
def test_a_header_without_what_the_settings_name_leaves_the_load_to_the_scan(tmp_path, header,
                                                                             label, settings):
    loading = _peeked(_data(tmp_path, header), label, **settings)
    assert loading.thread is None
    loading.join()


def test_a_listing_that_finds_nothing_starts_nothing(tmp_path):
    loading = _peeked(str(tmp_path / "none" / "*.csv"), "y")
    assert loading.thread is None


def test_no_load_starts_once_the_run_is_over(tmp_path):
    loading = KerasLoad()
    loading.join()  # the run ended (an error before the header was read)
    loading.start()
    assert loading.thread is None


def test_a_started_load_imports_only_once_the_clusters_start_allows_it(monkeypatch):
    import daskfeed.training._keras_load as keras_load

    calls: list[bool] = []
    loading = KerasLoad()
    monkeypatch.setattr(keras_load, "_import_keras", lambda: calls.append(loading._allowed))
    loading.start()
    assert loading.thread is not None and loading.thread.is_alive()  # (waiting for allow)
    loading.allow()
    loading.join()  # (allowed before: join waits for the load)
    assert calls == [True]


def test_a_run_that_ends_before_its_cluster_started_loads_nothing(monkeypatch):
    import daskfeed.training._keras_load as keras_load

    calls: list[bool] = []
    monkeypatch.setattr(keras_load, "_import_keras", lambda: calls.append(True))
    loading = KerasLoad()
    loading.start()  # (the header named the label; then the cluster's start failed)
    loading.join()
    assert calls == []
    assert loading.thread is not None and not loading.thread.is_alive()


def test_a_resumed_run_with_its_checkpoints_label_starts_at_once():
    opts = TrainOptions.resolve(features=["a"])
    same, other = KerasLoad(), KerasLoad()
    same.ahead("y", opts, None, _cursor("y", ("a", "b")))
    other.ahead("z", opts, None, _cursor("y", ("a", "b")))  # refused by the cursor's check
    try:
        assert same.thread is not None and same.peeking is None
        assert other.thread is None
    finally:
        same.join()


_FIRST_USE = r"""
import importlib.util, json, sys
from daskfeed.training._keras_load import KerasLoad
k = KerasLoad(); k.start(); k.allow(); k.join()
out = {"loaded": "keras" in sys.modules,
       "put_off": [p for p in ("matplotlib", "jax") if p not in sys.modules and importlib.util.find_spec(p)]}
from keras.src.visualization import plot_bounding_box_gallery, plot_image_gallery
fig = plot_image_gallery.plt.figure()  # the stand-in imports pyplot now
out["pyplot"] = type(fig).__name__ == "Figure" and "matplotlib.pyplot" in sys.modules
out["patches"] = plot_bounding_box_gallery.patches.Patch.__module__ == "matplotlib.patches"
if importlib.util.find_spec("jax"):
    lite = sys.modules["tensorflow.lite.python.lite"]
    out["jit"] = float(lite._jit(lambda v: v * 2)(3.0))  # TF Lite's jax.jit, imported now
print(json.dumps(out))
"""


def test_keras_loads_without_the_optional_packages_train_never_uses_and_they_work_at_first_use():
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", _FIRST_USE], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] and "matplotlib" in out["put_off"]  # matplotlib: a dependency
    assert out["pyplot"] and out["patches"]
    if "jit" in out:
        assert "jax" in out["put_off"] and out["jit"] == 6.0


def test_an_import_put_off_is_refused_to_the_loading_thread_only(tmp_path, monkeypatch):
    import importlib
    import sys
    import threading

    from daskfeed.training._deferred import REFUSE

    (tmp_path / "dfdeferred_pkg").mkdir()
    (tmp_path / "dfdeferred_pkg" / "__init__.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[BaseException | int] = []

    def load() -> None:
        with REFUSE.refusing({"dfdeferred_pkg"}):
            try:
                importlib.import_module("dfdeferred_pkg")
            except ModuleNotFoundError as err:
                seen.append(err)

    loader = threading.Thread(target=load)
    try:
        loader.start()
        loader.join()
        seen.append(importlib.import_module("dfdeferred_pkg").VALUE)  # another thread: imported
    finally:
        sys.modules.pop("dfdeferred_pkg", None)
    assert isinstance(seen[0], ModuleNotFoundError) and seen[1] == 3
    assert any(f is REFUSE for f in sys.meta_path)  # kept after the refusal (see the next test)


def test_an_import_walking_the_finders_as_a_refusal_ends_skips_none(tmp_path):
    """importlib walks ``sys.meta_path`` itself as it imports. A refusal that ends in another
    thread while this thread's import is between two finders leaves the walk whole: the finder
    after is still asked and the module is found (a finder taken out of the list there made the
    walk skip one, and an installed module was reported missing)."""
    import importlib
    import importlib.abc
    import importlib.util
    import sys
    import threading

    from daskfeed.training._deferred import REFUSE

    path = tmp_path / "dfdeferred_late.py"
    path.write_text("VALUE = 5\n")
    entered, ending = threading.Event(), threading.Event()

    def load() -> None:
        with REFUSE.refusing({"dfdeferred_other"}):
            entered.set()
            ending.wait()

    class EndsTheRefusal(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "dfdeferred_late" and not ending.is_set():
                ending.set()
                loader.join()  # the refusal ends between this finder and the next
            return None

    class Finds(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path_=None, target=None):
            return importlib.util.spec_from_file_location(name, path) if name == "dfdeferred_late" \
                else None

    loader = threading.Thread(target=load)
    loader.start()
    assert entered.wait(60)
    at = sys.meta_path.index(REFUSE)
    probe, finds = EndsTheRefusal(), Finds()
    sys.meta_path[at + 1:at + 1] = [probe, finds]
    try:
        assert importlib.import_module("dfdeferred_late").VALUE == 5
        assert ending.is_set() and not loader.is_alive()
    finally:
        ending.set()
        loader.join()
        sys.meta_path[:] = [f for f in sys.meta_path if f is not probe and f is not finds]
        sys.modules.pop("dfdeferred_late", None)
