"""Checkpoint cursors count the batches trained, whatever Keras' ``steps_per_execution`` and version.

Keras 3.10 passes a group's *first* batch to ``on_train_batch_end`` when ``steps_per_execution``
is above 1, Keras 3.15 its last one; the :class:`~daskfeed.training._callbacks.Checkpointer` counts from
the optimizer's steps instead (issue 11, item 6). A recording model appends the row ids of every
batch it trains to a list, before its update: the length of that list is the truth the cursors
are checked against. Run these under another Keras by putting it first on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

BATCH = 400  # id_data: 13,300 rows -> 34 batches per epoch, the last one of 100 rows
EVERY = 5  # not a multiple of 4: with steps_per_execution=4 the multiples fall inside groups
FEATURES = ["row_id", "level", "deaths", "hour"]  # as_matrix: row_id is column 0
# next batches at which the mid-epoch checkpoints of an uninterrupted epoch are written
MID_EPOCH = {1: [5, 10, 15, 20, 25, 30], 4: [8, 12, 16, 20, 28, 32]}


def _seq(id_data, client, **kw):
    import daskfeed

    return daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client,
                                 batch_size=BATCH, seed=7, window_rows=2000, features=FEATURES,
                                 as_matrix=True, **kw)


def _ids(batch) -> list[int]:
    x, _ = batch
    return np.asarray(x)[:, 0].astype(np.int64).tolist()


def _model(manifest, sink: list, *, spe: int, gas: int | None = None, optimizer: bool = True,
           steps: int = 1):
    """A model recording the row ids of each batch it trains into ``sink``.

    ``steps`` optimizer steps per batch (2: a train_step the cursor cannot count on);
    ``optimizer=False``: compiled without an optimizer, its train_step updates nothing.
    """
    import tensorflow as tf

    import daskfeed
    from daskfeed.adapters._keras import keras

    def record(ids):
        sink.append(ids.numpy().reshape(-1).astype(np.int64).tolist())
        return 0

    class Recording(keras.Model):
        def train_step(self, data):
            token = tf.py_function(record, [data[0][:, 0]], tf.int32)
            with tf.control_dependencies([token]):
                if not optimizer:
                    return {"recorded": tf.cast(token, "float32")}
                logs = super().train_step(data)
                for _ in range(steps - 1):
                    logs = super().train_step(data)
                return logs

    base = daskfeed.default_model(manifest, features=FEATURES, as_matrix=True, hidden=(8,))
    m = Recording(base.inputs, base.outputs)
    opt = keras.optimizers.Adam(1e-2, gradient_accumulation_steps=gas) if optimizer else None
    m.compile(optimizer=opt, loss="binary_crossentropy", steps_per_execution=spe)
    return m


def _probe(checkpointer, sink: list):
    """A callback (placed after ``checkpointer``) pairing each new cursor with the batches trained."""
    from daskfeed.adapters._keras import keras

    class Probe(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.pairs: list = []

        def _look(self):
            for cursor in checkpointer.cursors[len(self.pairs):]:
                self.pairs.append((cursor, len(sink)))

        def on_train_batch_end(self, batch, logs=None):
            self._look()

        def on_epoch_end(self, epoch, logs=None):
            self._look()

    return Probe()


@pytest.mark.parametrize("spe,variant", [
    (1, "plain"), (4, "plain"), (4, "accumulating"), (4, "no optimizer"), (4, "two steps per batch"),
])
def test_cursors_are_the_batches_trained(id_data, client, tmp_path, spe, variant):
    from daskfeed.checkpoint._store import CheckpointStore
    from daskfeed.training._callbacks import Checkpointer, fit_from

    epochs = 2
    sink: list = []
    store = CheckpointStore(tmp_path / "checkpoints", keep=100)
    with _seq(id_data, client) as seq:
        n = len(seq)
        model = _model(seq.manifest, sink, spe=spe, gas=2 if variant == "accumulating" else None,
                       optimizer=variant != "no optimizer",
                       steps=2 if variant == "two steps per batch" else 1)
        cb = Checkpointer(store, seq, every=EVERY)
        probe = _probe(cb, sink)
        if variant == "two steps per batch":
            # the count is read when a checkpoint may be due: first after the group crossing EVERY
            with pytest.warns(UserWarning, match=r"puts the next batch at 16, but the group of "
                                                 r"steps Keras just ran puts it at 5 \.\. 8"):
                fit_from(model, seq, epochs=epochs, shuffle=False, verbose=0, callbacks=[cb, probe])
        else:
            fit_from(model, seq, epochs=epochs, shuffle=False, verbose=0, callbacks=[cb, probe])
    assert len(sink) == epochs * n == 68
    # every cursor is the true next batch: the batches trained when it was saved
    assert [c for c, _ in probe.pairs] == cb.cursors
    assert [trained for _, trained in probe.pairs] == [e * n + b for e, b in cb.cursors]
    expected = [(e, b) for e in range(epochs) for b in MID_EPOCH[spe]] + [(1, 0), (2, 0)]
    assert cb.cursors == sorted(expected)
    saved = [store.read(name) for name in store.names()]
    assert [(c.cursor.epoch, c.cursor.batch) for c in saved] == cb.cursors
    steps = {"no optimizer": None, "two steps per batch": 2}.get(variant, 1)
    for c in saved:  # the optimizer's raw step count, saved with the cursor
        want = None if steps is None else steps * (c.cursor.epoch * n + c.cursor.batch)
        assert c.iterations == want, (c.path, c.iterations)
    if variant == "accumulating":  # Keras 3.5+: the public count is the applied updates
        public = int(model.optimizer.iterations.numpy())
        assert public == (epochs * n // 2 if hasattr(model.optimizer, "_iterations") else epochs * n)


def test_the_step_count_is_read_where_a_cursor_is_needed(id_data, client, tmp_path, monkeypatch):
    """A read of the optimizer's count waits for the device: at each epoch's begin and where a
    checkpoint may be due, not after every batch (once cost ``daskfeed train`` ~5 % of an epoch)."""
    import daskfeed.training._callbacks as callbacks
    from daskfeed.checkpoint._store import CheckpointStore

    reads: list = []
    real = callbacks.optimizer_steps
    monkeypatch.setattr(callbacks, "optimizer_steps", lambda model: reads.append(1) or real(model))
    epochs, sink = 2, []
    store = CheckpointStore(tmp_path / "checkpoints", keep=100)
    with _seq(id_data, client) as seq:
        cb = callbacks.Checkpointer(store, seq, every=EVERY)
        callbacks.fit_from(_model(seq.manifest, sink, spe=1), seq, epochs=epochs, shuffle=False,
                           verbose=0, callbacks=[cb])
        n = len(seq)
    assert len(sink) == epochs * n
    assert cb.cursors == sorted([(e, b) for e in range(epochs) for b in MID_EPOCH[1]] + [(1, 0), (2, 0)])
    assert len(reads) == epochs * (1 + len(MID_EPOCH[1])), (len(reads), n)  # was 1 + n per epoch


@pytest.mark.parametrize("convention", ["first batch of the group (Keras 3.10)",
                                        "last batch of the group (Keras 3.15)"])
def test_cursor_does_not_depend_on_the_batch_keras_passes(id_data, client, tmp_path, convention):
    """The hooks called as either Keras version calls them, 4 steps per call, every=5."""
    from daskfeed.adapters._keras import keras
    from daskfeed.checkpoint._store import CheckpointStore
    from daskfeed.training._callbacks import Checkpointer

    keras.utils.set_random_seed(0)
    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(1)(inp))
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    with _seq(id_data, client) as seq:
        n = len(seq)
        seq.set_epoch(0, 2)  # a resumed epoch: 32 batches left, the groups end at 6, 10, .., 34
        cb = Checkpointer(CheckpointStore(tmp_path / "c", keep=100), seq, every=EVERY)
        cb.set_model(model)
        model.optimizer.iterations.assign(2)
        cb.on_epoch_begin(0)
        for begin in range(0, n - 2, 4):
            model.optimizer.iterations.assign(2 + min(begin + 4, n - 2))  # the group's steps
            cb.on_train_batch_begin(begin)
            cb.on_train_batch_end(begin if convention.startswith("first") else begin + 3)
        cb.on_epoch_end(0)
    assert cb.cursors == [(0, 6), (0, 10), (0, 18), (0, 22), (0, 26), (0, 30), (1, 0)]


class _Interrupt(Exception):
    pass


def _stop_after(sink: list, trained: int, how: str):
    """A callback ending the run once ``trained`` batches are in ``sink``: by raising
    (the process dies) or by ``model.stop_training``."""
    from daskfeed.adapters._keras import keras

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if len(sink) == trained:
                if how == "raise":
                    raise _Interrupt
                self.model.stop_training = True

    return Stop()


def _run(id_data, client, store, manifest, *, spe, until, how, epochs=3):
    """Train from the store's newest checkpoint (or from scratch) until ``until`` batches of
    this run are trained (None: to the end); return (batches trained, Checkpointer, fits)."""
    from daskfeed.training._callbacks import Checkpointer, fit_from

    ckpt = store.latest()
    sink: list = []
    fits: list = []
    with _seq(id_data, client, manifest=manifest) as seq:
        model = _model(manifest, sink, spe=spe)
        if ckpt is not None:
            ckpt.restore(model)
        cb = Checkpointer(store, seq, every=EVERY, history=ckpt.history if ckpt else [])
        callbacks = [cb] + ([_stop_after(sink, until, how)] if until else [])
        epoch, batch = (ckpt.cursor.epoch, ckpt.cursor.batch) if ckpt else (0, 0)
        try:
            fits = fit_from(model, seq, epochs=epochs, epoch=epoch, batch=batch, shuffle=False,
                            verbose=0, callbacks=callbacks)
        except _Interrupt:
            assert how == "raise"
    return sink, cb, fits


@pytest.mark.parametrize("spe,how", [  # make test: each spe once, each way once; all four slow
    (1, "raise"), pytest.param(4, "raise", marks=pytest.mark.slow),
    pytest.param(1, "stop", marks=pytest.mark.slow), (4, "stop")])
def test_interrupted_mid_epoch_then_resumed_trains_each_row_once(id_data, client, tmp_path, spe, how):
    from daskfeed.checkpoint._store import CheckpointStore

    epochs = 3
    with _seq(id_data, client) as seq:
        manifest, n = seq.manifest, len(seq)
        planned = []  # the batches of every epoch, in order
        for epoch in range(epochs):
            seq.set_epoch(epoch)
            planned += [_ids(seq[i]) for i in range(n)]
    store = CheckpointStore(tmp_path / "checkpoints")
    # run 1 ends after batch 24 of epoch 1, run 2 resumes and ends 8 batches later, run 3
    # finishes; a run that raises leaves its last checkpoint (every=5, groups of spe batches)
    committed: list = []
    for until, raised in [(n + 24, {1: 20, 4: 20}), (8, {1: 25, 4: 28})]:
        start = len(committed)
        trained, cb, fits = _run(id_data, client, store, manifest, spe=spe, until=until, how=how)
        assert trained == planned[start:start + until]  # the planned order, from the cursor on
        stop = start + until - n  # the next batch of epoch 1 when the run ended
        batch = raised[spe] if how == "raise" else stop
        if how == "stop":  # stopped: a checkpoint at the true next batch, no later epoch started
            assert len(fits) == 1 and cb.cursors[-1] == (1, stop)
        ckpt = store.latest()
        assert ckpt is not None and (ckpt.cursor.epoch, ckpt.cursor.batch) == (1, batch)
        assert ckpt.iterations == n + batch
        assert [h["epoch"] for h in ckpt.history] == [0]  # the cut epoch has no record
        committed += trained[: n + batch - start]  # later batches are lost, trained again
    trained, cb, fits = _run(id_data, client, store, manifest, spe=spe, until=None, how=how)
    assert committed + trained == planned  # each planned batch once, counting committed ones
    for epoch in range(epochs):
        rows = [r for b in (committed + trained)[epoch * n:(epoch + 1) * n] for r in b]
        assert len(rows) == len(set(rows)) == id_data.train_rows
    assert [h["epoch"] for h in cb.history] == [0, 1, 2] and len(fits) == 2
    assert cb.history[1]["resumed_at_batch"] == batch and "resumed_at_batch" not in cb.history[2]
    with open(os.path.join(store.latest().path, "state.json")) as f:
        assert json.load(f)["cursor"]["epoch"] == epochs
