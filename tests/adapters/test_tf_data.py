"""The tf.data hand-off (daskfeed.adapters._tf_data): with exactly the sequence's batches, epochs in step."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import daskfeed
from daskfeed import DaskfeedError, SettingError

BATCH = 256
NUMERIC = ["row_id", "level", "party_size", "attempt", "deaths", "hour"]


def make(id_data, client, **kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("window_rows", 2000)  # 7 windows: chunks cross window ends
    kw.setdefault("seed", 5)
    return daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client, **kw)


def epoch_batches(seq, epoch: int) -> list:
    seq.set_epoch(epoch)
    return [seq[i] for i in range(len(seq))]


def assert_same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert len(g) == len(w), i
        for a, b in zip(g, w, strict=True):
            if isinstance(b, dict):
                assert a.keys() == b.keys()
                for k in b:
                    assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (i, k)
            else:
                assert a.dtype == b.dtype and np.array_equal(a, b), i


def feed_of(seq, chunk: int):
    from daskfeed.adapters._tf_data import TFDataHandoff

    return TFDataHandoff(seq.stream, chunk_bytes=chunk * seq.batch_size * seq.encoding.bytes_per_row)


@pytest.mark.parametrize("settings,chunk", [
    ({}, 7),  # dict of columns, chunks across windows, the short last batch alone
    ({"as_matrix": True, "features": NUMERIC}, 1),
    ({"drop_remainder": True, "shuffle": False}, 1000),  # one chunk is the whole epoch
    ({"weight": "attempt"}, 5),  # (x, y, w)
])
def test_each_pass_is_the_next_epoch_of_the_sequence_batch_for_batch(id_data, client, settings,
                                                                     chunk):
    with make(id_data, client, **settings) as ref:
        want = {e: epoch_batches(ref, e) for e in range(3)}
    with make(id_data, client, manifest=ref.manifest, **settings) as seq:
        feed = feed_of(seq, chunk)
        assert feed.chunk == chunk
        ds = feed.dataset()
        assert int(ds.cardinality()) == len(seq)
        for e in range(3):
            assert_same_batches(list(ds.as_numpy_iterator()), want[e])
            stats = seq.stats_of(e)  # the feed reads ahead: the sequence may be past epoch e
            assert stats["epoch"] == e and stats["batches"] == len(want[e])
            assert stats["rows"] == sum(len(b[1]) for b in want[e])


def test_without_the_callback_a_pass_cut_short_is_followed_by_the_next_epoch(id_data, client):
    with make(id_data, client) as ref:
        want = {e: epoch_batches(ref, e) for e in range(3)}
    with make(id_data, client, manifest=ref.manifest) as seq:
        ds = feed_of(seq, 4).dataset()
        it = ds.as_numpy_iterator()
        assert_same_batches([next(it) for _ in range(10)], want[0][:10])
        del it  # thrown away mid-epoch (fit stopped)
        assert_same_batches(list(ds.as_numpy_iterator()), want[1])  # every row, once
        assert_same_batches(list(ds.as_numpy_iterator()), want[2])


def test_with_the_callback_a_pass_serves_the_epoch_keras_begins(id_data, client):
    """A tf.distribute strategy makes Keras read ahead before epoch 0: with the callback, an
    epoch read wholly ahead is served again, not counted twice; Keras' epochs map onto the
    sequence's from where it stood."""
    with make(id_data, client) as ref:
        want = {e: epoch_batches(ref, e) for e in range(4, 7)}
    with make(id_data, client, manifest=ref.manifest) as seq:
        seq.set_epoch(4)
        feed = feed_of(seq, 1000)  # a chunk holds the whole epoch
        ds, sync = feed.dataset(), feed.callback()
        assert_same_batches(list(ds.as_numpy_iterator()), want[4])  # the read-ahead pass
        sync.on_epoch_begin(0)  # Keras' first epoch: the sequence's epoch 4, served again
        assert_same_batches(list(ds.as_numpy_iterator()), want[4])
        assert seq.stats_of(4)["rows"] == id_data.train_rows
        sync.on_epoch_begin(1)
        assert_same_batches(list(ds.as_numpy_iterator()), want[5])
        it = ds.as_numpy_iterator()
        sync.on_epoch_begin(2)
        assert_same_batches([next(it) for _ in range(3)], want[6][:3])
        del it  # fit stopped in epoch 6; a new fit begins it again
        sync.on_epoch_begin(2)
        assert_same_batches(list(ds.as_numpy_iterator()), want[6])
        with pytest.raises(DaskfeedError, match="Keras began epoch 3"):
            feed_of(seq, 7).callback()  # a new feed at 7: fine
            seq.set_epoch(1, 3)
            resumed = feed_of(seq, 7)
            resumed.callback().on_epoch_begin(1)  # epoch 1 is the resumed one: fine
            resumed.callback().on_epoch_begin(3)


def test_a_stream_serves_epoch_after_epoch_through_one_iterator(id_data, client):
    """What fit_inputs hands fit (with steps_per_epoch=len(seq)): one iterator for every epoch."""
    import tensorflow as tf

    with make(id_data, client) as ref:
        want = {e: epoch_batches(ref, e) for e in range(6)}
    with make(id_data, client, manifest=ref.manifest) as seq:
        feed = feed_of(seq, 4)  # an epoch's batches are not a multiple of the chunk
        ds, sync = feed.dataset(stream=True), feed.callback()
        assert int(ds.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
        it = ds.as_numpy_iterator()
        for e in range(3):
            sync.on_epoch_begin(e)  # after the first epoch: no new pass, the iterator reads on
            assert_same_batches([next(it) for _ in range(len(seq))], want[e])
            assert seq.stats_of(e)["rows"] == id_data.train_rows
        assert feed._passes == 0
        feed.close()  # fit ended, having read ahead into epoch 3
        again = feed_of(seq, 4)  # the next fit's stream: from where the sequence stands
        it = again.dataset(stream=True).as_numpy_iterator()
        again.callback().on_epoch_begin(0)
        assert_same_batches([next(it) for _ in range(len(seq))], want[again.epoch])
        with pytest.raises(ValueError, match="from an epoch's start"):
            seq.set_epoch(again.epoch + 1, 2)
            feed_of(seq, 4).dataset(stream=True)


def test_a_resumed_epochs_dataset_serves_that_epoch_only(id_data, client):
    with make(id_data, client) as ref:
        want = epoch_batches(ref, 1)
    with make(id_data, client, manifest=ref.manifest) as seq:
        seq.set_epoch(1, 9)
        ds = seq.to_tf_dataset()
        assert int(ds.cardinality()) == len(want) - 9
        assert_same_batches(list(ds.as_numpy_iterator()), want[9:])
        with pytest.raises(Exception, match=r"serves epoch 1 from batch 9 \(a resumed epoch\) only"):
            list(ds.as_numpy_iterator())


def test_a_closed_sequence_is_a_clear_error(id_data, client):
    seq = make(id_data, client)
    ds = seq.to_tf_dataset()
    seq.close()
    with pytest.raises(Exception, match="this feed is closed"):
        list(ds.as_numpy_iterator())


def _model(manifest, weights=None):
    model = daskfeed.default_model(manifest, hidden=(16,))
    if weights is not None:
        model.set_weights(weights)
    return model


def test_fit_from_trains_the_same_batches_whatever_the_feed(id_data, client):
    """Same batches in the same order, validation included: the same weights and history."""
    from daskfeed.training._callbacks import EpochTelemetry, fit_from

    results = {}
    with make(id_data, client) as train:
        manifest = train.manifest
    initial = _model(manifest).get_weights()
    for handoff in ("tf-data", "pydataset"):
        with make(id_data, client, manifest=manifest) as train, \
                daskfeed.DaskSequence(id_data.validate_glob, label="cleared", client=client,
                                      batch_size=BATCH, shuffle=False, reference=manifest,
                                      features=train.features) as val:
            model = _model(manifest, initial)
            telemetry = EpochTelemetry(train)
            fits = fit_from(model, train, epochs=2, handoff=handoff, validation_data=val, shuffle=False,
                            verbose=0, callbacks=[telemetry])
            results[handoff] = (model.get_weights(), fits[0].history, telemetry.epochs,
                             int(model.optimizer.iterations.numpy()), len(train))
    (w1, h1, t1, it1, n), (w2, h2, t2, it2, _) = results["tf-data"], results["pydataset"]
    assert it1 == it2 == 2 * n
    for a, b in zip(w1, w2, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert h1.keys() == h2.keys() and "val_loss" in h1
    for k in h1:
        assert h1[k] == pytest.approx(h2[k], rel=1e-5), k
    assert [(r["epoch"], r["rows"], r["batches"]) for r in t1] == \
        [(r["epoch"], r["rows"], r["batches"]) for r in t2] == \
        [(e, id_data.train_rows, n) for e in range(2)]


def test_the_handoff_setting_is_checked_and_its_old_names_still_work(tmp_path):
    import dask.config

    from daskfeed.adapters import chosen_handoff
    from daskfeed.adapters._tf_data import uses_tf_data
    from daskfeed.training._options import TrainOptions

    assert uses_tf_data("auto") and uses_tf_data("tf-data") and not uses_tf_data("pydataset")
    assert [chosen_handoff(h) for h in ("auto", "tf-data", "pydataset")] == \
        ["tf-data", "tf-data", "pydataset"]
    with pytest.raises(SettingError, match=r"Expected the PyTorch backend with the dataloader "
                                           r"hand-off .* Received: KERAS_BACKEND='tensorflow'"):
        chosen_handoff("dataloader")
    with pytest.raises(SettingError, match=r"Expected the hand-off to be one of auto, tf-data, "
                                           r"dataloader, pydataset\. Received: handoff='tfdata'\."):
        TrainOptions.resolve(handoff="tfdata")
    with pytest.raises(SettingError, match="Expected the hand-off to be one of"):
        uses_tf_data("tfdata")
    with pytest.warns(FutureWarning, match=r"feed='windows' is the old name of the hand-off "
                                           r"'tf-data'"):
        assert TrainOptions.resolve(feed="windows").fit.handoff == "tf-data"
    with pytest.warns(FutureWarning, match=r"daskfeed\.feed is the old name of daskfeed\.handoff"), \
            dask.config.set({"daskfeed.feed": "pydataset"}):
        assert TrainOptions.resolve().fit.handoff == "pydataset"
    with pytest.raises(SettingError, match="Expected one hand-off"):
        TrainOptions.resolve(feed="batches", handoff="pydataset")


def test_jax_hands_off_a_pydataset_and_refuses_tf_data():
    code = ("from daskfeed.adapters import chosen_handoff\n"
            "from daskfeed.adapters._tf_data import uses_tf_data\n"
            "assert not uses_tf_data('auto') and chosen_handoff('auto') == 'pydataset'\n"
            "uses_tf_data('tf-data')\n")
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode != 0
    assert "SettingError: Expected the TensorFlow backend with the tf-data hand-off" in proc.stderr, \
        proc.stderr[-2000:]


def test_a_stop_reaches_a_reader_waiting_in_the_queue(id_data, client, tmp_path):
    """A stop request while the dataset's reader waits inside TensorFlow on an empty queue (every
    chunk read, the next window stuck on a file that never yields a byte): the reader gets an
    error saying so at once, not a wait for good (it used to: the producer ended silently, and
    a signal's handler never runs while the main thread is inside TensorFlow)."""
    import shutil
    import sys
    import threading
    import time

    from helpers import wait_for

    from daskfeed.core import Stop

    src = id_data.train_glob.split("*")[0]
    for f in sorted(__import__("pathlib").Path(src).rglob("*.csv")):
        shutil.copy(f, tmp_path / f.name)
    stop = Stop()
    seq = daskfeed.DaskSequence(str(tmp_path / "*.csv"), label="cleared", client=client,
                                batch_size=BATCH, window_rows=1400, cache=False, seed=1,
                                timeout=120, stop=stop)
    plan = seq.plan
    others = {seq.source.blocks[p].path for w in plan.windows[:-1] for p in w.blocks}
    victim = next(seq.source.blocks[p].path for p in plan.windows[-1].blocks
                  if seq.source.blocks[p].path not in others)
    os.remove(victim)
    os.mkfifo(victim)
    outcome: list = []

    def read() -> None:
        try:
            for _ in seq.to_tf_dataset():
                pass
            outcome.append("ended")
        except BaseException as err:  # recorded, asserted below
            outcome.append(err)

    def producer_waits() -> bool:  # the feed's producer waits for the FIFO's window
        for frame in sys._current_frames().values():
            while frame is not None:
                if frame.f_code.co_name == "_abort" or (
                        frame.f_code.co_name == "_wait"
                        and frame.f_code.co_filename.endswith(os.path.join("batches", "_prefetch.py"))):
                    return True
                frame = frame.f_back
        return False

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        wait_for(producer_waits, 120, "the feed to wait for the FIFO's window")
        t0 = time.monotonic()
        stop.request()
        reader.join(60)
        took = time.monotonic() - t0
        assert not reader.is_alive(), "the reader still waits in the queue after the stop"
        assert len(outcome) == 1 and "stopping" in str(outcome[0]), outcome
        assert took < 30, took
    finally:
        seq.close()
        try:  # the worker reading the FIFO gets its end of file
            os.close(os.open(victim, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
