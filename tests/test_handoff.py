"""Window handoff on a real LocalCluster: files the trainer maps, against the ordinary gather."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np

import daskfeed
from daskfeed.handoff import WindowFile, open_window, write_window

BATCH = 256
WINDOW_ROWS = 2000
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


def make(id_data, client, **kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("window_rows", WINDOW_ROWS)
    kw.setdefault("seed", 11)
    return daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client, **kw)


def _files(seq) -> list[str]:
    d = seq._owner.handoff_dir
    return [os.path.join(d, f) for f in os.listdir(d)]


def test_write_and_map_a_window_bit_for_bit(tmp_path):
    from daskfeed.feed import WindowData

    x = {"a": np.arange(5, dtype=np.int64), "b": np.linspace(0, 1, 5).astype(np.float32)}
    data = WindowData(x, np.array([1, 0, 1, 1, 0], dtype=np.float32), np.ones(5, np.float32))
    handle = write_window(data, str(tmp_path / "w.window"))
    assert isinstance(handle, WindowFile) and len(handle) == 5
    back = open_window(handle)
    assert not (tmp_path / "w.window").exists()  # unlinked once mapped
    assert list(back.x) == ["a", "b"] and all(np.array_equal(back.x[k], x[k]) for k in x)
    assert back.x["a"].dtype == np.int64 and np.array_equal(back.y, data.y)
    assert np.array_equal(back.w, data.w)
    empty = WindowData(np.zeros((0, 3), np.float32), np.zeros(0, np.float32))
    mapped = open_window(write_window(empty, str(tmp_path / "e.window")))
    assert mapped.x.shape == (0, 3) and len(mapped) == 0


def test_handoff_and_gather_serve_the_same_batches(id_data, client):
    with make(id_data, client) as files, make(id_data, client, handoff=False) as gathered:
        assert files._owner.handoff_dir is not None and gathered._owner.handoff_dir is None
        for _epoch in range(2):
            assert len(files) == len(gathered)
            for i in range(len(files)):
                a, b = files[i], gathered[i]
                for k in b[0]:
                    assert a[0][k].dtype == b[0][k].dtype and np.array_equal(a[0][k], b[0][k])
                assert np.array_equal(a[1], b[1])
            files.on_epoch_end()
            gathered.on_epoch_end()
        assert files.epoch == gathered.epoch == 2


def test_window_files_stay_within_the_prefetch_budget_and_go_at_close(id_data, client):
    budget = 3 * WINDOW_ROWS * 64  # a few windows' worth of encoded bytes
    with make(id_data, client, prefetch_bytes=budget) as seq:
        window = seq.encoding.bytes_per_row * WINDOW_ROWS
        for _epoch in range(2):
            for i in range(len(seq)):
                seq[i]
                on_disk = sum(os.path.getsize(f) for f in _files(seq))
                assert on_disk <= seq.prefetch_bytes + window, (on_disk, seq.prefetch_bytes)
            seq.on_epoch_end()
        served = seq.last_epoch_stats["windows_computed"]
        assert served >= len(seq.plan.windows)
        directory = seq._owner.handoff_dir
        assert os.path.isdir(directory)
    assert not os.path.exists(directory)


KILLED = r'''
import os, signal, sys
import daskfeed
from distributed import Client
client = Client(sys.argv[2])
seq = daskfeed.DaskSequence(sys.argv[1], label="cleared", client=client, batch_size=256,
                            window_rows=2000, seed=1)
seq[0]
print(seq._owner.handoff_dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_killed_trainers_window_files_are_removed_by_the_next(id_data, client, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), id_data.train_glob,
                           client.scheduler.address], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    left = proc.stdout.strip().splitlines()[-1]
    assert os.path.isdir(left)  # nothing ran at the kill
    with make(id_data, client) as seq:
        assert seq._owner.handoff_dir != left
    assert not os.path.exists(left)
