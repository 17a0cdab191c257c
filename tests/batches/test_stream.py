"""BatchStream, the keras-free batch core: exactly once per epoch, resumable state, no keras."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from daskfeed.batches import STATE_VERSION, BatchStream, DataSettings, Prepared
from daskfeed.core import CheckpointError

BATCH = 256
WINDOW_ROWS = 2000


def test_every_row_once_an_epoch_and_a_new_order_the_next(id_data, client):
    prepared = Prepared(id_data.train_glob, client=client, settings=DataSettings.resolve(
        label="cleared", batch_size=BATCH, seed=11, features=["row_id", "level"]))
    stream = BatchStream(prepared, window_rows=WINDOW_ROWS)
    try:
        n = id_data.train_rows
        assert len(stream) == -(-n // BATCH)
        epochs = []
        for epoch in range(2):
            assert stream.epoch == epoch
            batches = [x["row_id"].astype(np.int64) for x, _ in stream]  # one epoch per iter()
            assert [len(b) for b in batches[:-1]] == [BATCH] * (len(batches) - 1)
            flat = np.concatenate(batches)
            assert np.array_equal(np.sort(flat), np.arange(n)), "a row missing or repeated"
            epochs.append(flat)
            assert stream.last_epoch_stats["rows"] == n and stream.last_epoch_stats["epoch"] == epoch
        assert stream.epoch == 2  # the iterator moved on at each epoch's end
        assert not np.array_equal(epochs[0], epochs[1]), "the order did not change"
        assert stream.assembly_seconds > 0
    finally:
        stream.close()
    assert stream.closed
    with pytest.raises(Exception, match="closed"):
        stream.batch(0)


@pytest.mark.parametrize("seed", [5, 12])
def test_the_trainer_reading_windows_itself_serves_the_workers_batches(id_data, client, seed):
    """``daskfeed.window-reads``: on this machine's cluster the trainer reads the global order's
    windows itself (no task on the cluster), and serves exactly the batches the workers' reads
    give, in every epoch."""
    import dask.config
    from distributed import get_task_stream

    def epochs(reads: str) -> tuple[list[np.ndarray], BatchStream, list[str]]:
        with dask.config.set({"daskfeed.window-reads": reads}):
            settings = DataSettings.resolve(label="cleared", batch_size=BATCH, seed=seed,
                                            features=["row_id", "level"])
        assert settings.window_reads == reads
        stream = BatchStream(Prepared(id_data.train_glob, client=client, settings=settings),
                             window_rows=WINDOW_ROWS)
        try:
            assert stream.global_order
            with get_task_stream(client) as tasks:  # the tasks the cluster ran meanwhile
                got = [np.concatenate([x["row_id"] for x, _ in stream]) for _ in range(2)]
        finally:
            stream.close()
        return got, stream, [str(t["key"]) for t in tasks.data]

    here, stream_here, ran_here = epochs("auto")
    assert stream_here._windows.here is not None
    assert not [k for k in ran_here if "daskfeed-window" in k]  # none on the cluster
    there, stream_there, ran_there = epochs("workers")
    assert stream_there._windows.here is None
    assert [k for k in ran_there if "daskfeed-window" in k]
    for a, b in zip(here, there, strict=True):
        assert np.array_equal(a, b)  # the same rows in the same order
        assert np.array_equal(np.sort(a), np.arange(id_data.train_rows))  # each row once
    assert not np.array_equal(here[0], here[1])


def test_window_reads_takes_auto_or_workers_only():
    import dask.config

    from daskfeed.batches._here import _this_machine
    from daskfeed.core import SettingError

    with dask.config.set({"daskfeed.window-reads": "trainer"}), \
            pytest.raises(SettingError, match="auto or workers"):
        DataSettings.resolve(label="y")
    assert DataSettings.resolve(label="y").window_reads == "auto"
    assert _this_machine("127.0.0.1") and _this_machine("::1") and _this_machine("localhost")
    assert not _this_machine("192.0.2.7")  # TEST-NET-1: never an address of this machine


def test_runs_of_batches_are_the_batches_iter_gives_and_resume_exactly(id_data, client):
    """``runs(k)`` (what TorchDataset reads): the same batches, epoch after epoch, as views of
    arrays of their own; a state taken inside a run resumes after the last batch yielded."""
    def stream() -> BatchStream:
        return BatchStream(Prepared(id_data.train_glob, client=client, settings=DataSettings.resolve(
            label="cleared", batch_size=BATCH, seed=4, features=["row_id", "level"])),
            window_rows=WINDOW_ROWS)

    plain, runs = stream(), stream()
    try:
        for _ in range(2):  # two epochs: the stream moves on after each, either way
            want = [(x["row_id"].copy(), y.copy()) for x, y in plain]
            got = list(runs.runs(7))
            assert len(got) == len(want)
            for (x, y), (wx, wy) in zip(got, want, strict=True):
                assert np.array_equal(x["row_id"], wx) and np.array_equal(y, wy)
                assert x["row_id"].flags.writeable and y.flags.writeable
        assert runs.epoch == plain.epoch == 2
        whole = [x["row_id"].copy() for x, _ in plain]  # epoch 2
        it = runs.runs(5)
        first = [next(it)[0]["row_id"].copy() for _ in range(8)]  # inside the second run
        state = json.loads(json.dumps(runs.get_state()))
        assert (state["epoch"], state["batch"]) == (2, 8)
    finally:
        plain.close()
        runs.close()
    again = stream()
    try:
        again.set_state(state)
        rest = [x["row_id"].copy() for x, _ in again.runs(3)]
    finally:
        again.close()
    assert all(np.array_equal(a, b) for a, b in zip(first + rest, whole, strict=True))


def test_state_after_any_batch_resumes_exactly(id_data, client):
    """Grain's convention: get_state between two batches; a new stream set to it goes on."""
    prepared = Prepared(id_data.train_glob, client=client, settings=DataSettings.resolve(
        label="cleared", batch_size=BATCH, seed=3, features=["row_id"]))
    with_ids = BatchStream(prepared, window_rows=WINDOW_ROWS)
    try:
        whole = [x["row_id"].copy() for x, _ in with_ids]  # epoch 0 uninterrupted
        with_ids.set_state(with_ids.get_state(0, 0))
        it = iter(with_ids)
        first = [next(it)[0]["row_id"].copy() for _ in range(7)]
        state = json.loads(json.dumps(with_ids.get_state()))  # plain values, as persisted
        assert (state["version"], state["epoch"], state["batch"], state["position"]) == (
            STATE_VERSION, 0, 7, 7)
        assert (state["seed"], state["batch_size"], state["features"]) == (3, BATCH, ["row_id"])
        copy = pickle.loads(pickle.dumps(with_ids))  # another process's stream would do the same
        try:
            copy.set_state(state)
            rest = [x["row_id"].copy() for x, _ in copy]
            after = copy.get_state()
            assert (after["epoch"], after["batch"], after["position"]) == (1, 0, 0)
        finally:
            copy.close()
        got = first + rest
        assert len(got) == len(whole) and all(np.array_equal(a, b) for a, b in zip(got, whole, strict=True))
        with pytest.raises(ValueError, match="start"):  # (a batch past the epoch, no position)
            with_ids.set_state({**state, "batch": len(whole), "position": None})
    finally:
        with_ids.close()


def test_a_state_of_other_settings_is_refused_before_anything_is_served(id_data, client):
    """The stream checks a state it is given: another seed's batches are another order."""
    settings = DataSettings.resolve(label="cleared", batch_size=BATCH, seed=3, features=["row_id"])
    with_ids = BatchStream(Prepared(id_data.train_glob, client=client, settings=settings),
                           window_rows=WINDOW_ROWS)
    try:
        state = {**with_ids.get_state(0, 5), "seed": 4}
        with pytest.raises(CheckpointError) as err:
            with_ids.set_state(state)
        assert str(err.value) == (
            "The resume state was made with seed=4; resuming needs the same batches. Received: "
            "seed=3.\nHint: build it with seed=4, or start from the beginning (without this "
            "state).")
        assert (with_ids.epoch, with_ids.start) == (0, 0)  # left where it stood
    finally:
        with_ids.close()


def test_skipped_batches_leave_the_order_as_it_is_and_a_state_carries_them(id_data, client):
    """Skipping batches 2-3 of epoch 1 (from 1) serves the same order without them; the order's
    numbering stands (order_batch); a state taken after some batches, given to a stream that
    skips nothing, goes on skipping them; a later skip set adds to them."""
    def stream(skips=None):
        settings = DataSettings.resolve(label="cleared", batch_size=BATCH, seed=6,
                                        features=["row_id"], skip_batches=skips)
        return BatchStream(Prepared(id_data.train_glob, client=client, settings=settings),
                           window_rows=WINDOW_ROWS)

    plain, skipping, later = stream(), stream("1:2-3,2:1"), stream("1:30")
    early = None
    try:
        whole = [x["row_id"].copy() for x, _ in plain]
        n = len(whole)
        assert len(skipping) == n - 2
        assert [skipping.order_batch(j) for j in range(4)] == [0, 3, 4, 5]
        assert [skipping.order_batch(j, epoch=1) for j in range(2)] == [1, 2]  # (another epoch's)
        it = iter(skipping)
        first = [next(it)[0]["row_id"].copy() for _ in range(4)]
        state = json.loads(json.dumps(skipping.get_state()))
        assert (state["position"], state["skips"]) == (6, [[0, 1, 2], [1, 0, 0]])
        later.set_state(state)  # its own skip: batch 30 of epoch 1, after the state's place
        assert later.skips.text() == "1:2-3,1:30,2:1"
        rest = [x["row_id"].copy() for x, _ in later]
        got = first + rest
        expected = [whole[g] for g in range(n) if g not in (1, 2, 29)]
        assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in
                                                 zip(got, expected, strict=True))
        assert later.last_epoch_stats["skipped_batches"] == 3
        assert len(later) == n - 1 and later.order_batch(0) == 1  # epoch 2: its batch 1 skipped
        early = stream("1:1")
        with pytest.warns(UserWarning, match="1:1: trained before the checkpoint"):
            early.set_state(state)
    finally:
        for s in (plain, skipping, later, early):
            if s is not None:
                s.close()


def test_a_stream_owns_the_client_it_was_handed(id_data, client):
    prepared = Prepared(id_data.train_glob, client=client, settings=DataSettings.resolve(
        label="cleared", batch_size=BATCH, features=["level"]))
    stream = BatchStream(prepared)
    assert stream.client is client and not stream.owns_client  # given: not the stream's to close
    with pytest.raises(Exception, match="already handed"):
        BatchStream(prepared)  # one client, one owner
    stream.close()
    assert client.status == "running"


def test_the_batch_core_imports_no_keras(id_data):
    """A whole epoch served by the batch core in a process where keras never loads."""
    code = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from distributed import Client
        from daskfeed.batches import BatchStream, DataSettings, Prepared
        with Client(n_workers=1, threads_per_worker=1, processes=False) as client:
            p = Prepared({id_data.train_glob!r}, DataSettings.resolve(
                label="cleared", batch_size=512, features=["row_id", "level"]), client=client)
            s = BatchStream(p)
            rows = np.sort(np.concatenate([x["row_id"] for x, _ in s]))
            s.close()
        print(json.dumps({{"rows": int(len(rows)), "exact": bool((rows == np.arange(len(rows))).all()),
                          "loaded": sorted(m for m in ("keras", "tensorflow", "jax", "torch")
                                           if m in sys.modules)}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rows": id_data.train_rows, "exact": True, "loaded": []}
