"""DaskSequence on a real LocalCluster: exactly-once, determinism, any order, threads, Keras."""

from __future__ import annotations

import pickle
import random
import threading
import warnings

import numpy as np
import pytest

import daskfeed
from daskfeed import SchemaError

BATCH = 256
WINDOW_ROWS = 2000  # ~3 files of 700 rows per window: rows mix across partitions


def make(id_data, client, **kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("window_rows", WINDOW_ROWS)
    kw.setdefault("seed", 11)
    return daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client, **kw)


def epoch_ids(seq, order=None):
    order = range(len(seq)) if order is None else order
    return {i: seq[i][0]["row_id"].astype(np.int64) for i in order}


def test_every_row_once_per_epoch_fixed_sizes_new_order(id_data, client):
    with make(id_data, client) as seq:
        n = id_data.train_rows
        assert len(seq) == -(-n // BATCH)
        previous = None
        for _epoch in range(3):
            batches = epoch_ids(seq)
            sizes = [len(batches[i]) for i in range(len(seq))]
            assert all(s == BATCH for s in sizes[:-1]) and sizes[-1] == n - BATCH * (len(seq) - 1)
            flat = np.concatenate([batches[i] for i in range(len(seq))])
            assert np.array_equal(np.sort(flat), np.arange(n)), "a row missing or repeated"
            if previous is not None:
                assert not np.array_equal(flat, previous), "epoch order did not change"
            previous = flat
            seq.on_epoch_end()


def test_rows_are_mixed_across_the_partitions_of_a_window(id_data, client):
    with make(id_data, client) as seq:
        files_per_batch = [len(np.unique(seq[i][0]["row_id"] // 700)) for i in range(len(seq) - 1)]
        assert np.mean(files_per_batch) > 2  # each window mixes ~3 files of 700 rows
        first = seq[0][0]["row_id"]
        assert not np.all(np.diff(first) == 1), "rows were not shuffled"


def test_same_batches_whatever_the_number_of_workers(id_data, client):
    from distributed import Client, LocalCluster

    with make(id_data, client) as seq:
        seq.set_epoch(1)  # compare epoch 1, not just epoch 0
        two = epoch_ids(seq)
        labels_two = [seq[i][1] for i in range(3)]
    with LocalCluster(n_workers=1, threads_per_worker=3, processes=False,
                      dashboard_address="127.0.0.1:0") as lc, \
            Client(lc) as one_worker:
        with make(id_data, one_worker) as seq1:
            seq1.set_epoch(1)
            one = epoch_ids(seq1, order=reversed(range(len(seq1))))  # futures finish in any order
            assert all(np.array_equal(seq1[i][1], labels_two[i]) for i in range(3))
    assert two.keys() == one.keys()
    assert all(np.array_equal(two[i], one[i]) for i in two)


def test_default_windows_do_not_depend_on_the_number_of_workers(id_data, client):
    from distributed import Client, LocalCluster

    from daskfeed.cluster._budget import Budget

    assert len({Budget.split("8GB", nworkers=n).window_bytes for n in (1, 2, 3, 4)}) == 1
    with make(id_data, client, window_rows=None) as seq:
        rows, first = seq.window_rows, seq[0][0]["row_id"].copy()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0") as lc, \
            Client(lc) as one_worker, make(id_data, one_worker, window_rows=None) as seq1:
        assert seq1.window_rows == rows
        assert np.array_equal(seq1[0][0]["row_id"], first)


def test_random_index_order_gives_the_same_batches(id_data, client):
    with make(id_data, client) as seq:
        sequential = epoch_ids(seq)
    with make(id_data, client, prefetch_bytes=200_000) as seq:
        order = list(range(len(seq)))
        random.Random(5).shuffle(order)
        shuffled = epoch_ids(seq, order)
        assert seq.epoch_stats()["batches"] == len(seq)
    assert all(np.array_equal(sequential[i], shuffled[i]) for i in sequential)


def test_concurrent_threads_get_correct_batches(id_data, client):
    """Three threads (evens, odds, backwards) that start together get the right batches.

    How many windows they compute depends on how the threads are scheduled, so it is not
    asserted here. On a busy machine the backward thread can read the whole epoch alone before
    the other two read anything; it looks like a reader in order (steps of one batch), so
    each window is let go once served, and the other two compute them again. The in-order rule
    itself is tested with a fixed order
    (``test_a_reader_asking_far_ahead_first_is_not_read_in_order``)."""
    with make(id_data, client) as seq:
        expected = epoch_ids(seq)
    with make(id_data, client) as seq:
        got: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []
        together = threading.Barrier(3)

        def reader(indices):
            try:
                together.wait()
                for i in indices:
                    got[i] = seq[i][0]["row_id"].astype(np.int64)
            except BaseException as e:
                errors.append(e)

        idx = list(range(len(seq)))
        threads = [threading.Thread(target=reader, args=(idx[k::2],)) for k in range(2)]
        threads += [threading.Thread(target=reader, args=(idx[::-1],))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert all(np.array_equal(got[i], expected[i]) for i in expected)
        assert len(got) == len(expected) and seq.epoch_stats()["batches"] == len(seq)


def test_a_reader_asking_far_ahead_first_is_not_read_in_order(id_data, client):
    """The last batch asked for first, then the first half in order, then the first ones again.

    What three threads reading evens, odds and backwards can do while the backward one waits
    for its window: the served windows must stay (the backward reader will ask for them
    again), not be let go as for a reader in order.
    """
    with make(id_data, client) as seq:
        expected = epoch_ids(seq)
    with make(id_data, client) as seq:
        n = len(seq)
        order = [n - 1, *range(n // 2), *range(8), *range(n // 2, n - 1)]
        got = [(i, seq[i][0]["row_id"].astype(np.int64)) for i in order]
        assert all(np.array_equal(ids, expected[i]) for i, ids in got)
        assert seq.epoch_stats()["windows_computed"] == len(seq.plan.windows)


def test_only_compact_arrays_with_manifest_encoding(id_data, client):
    with make(id_data, client, exclude=["row_id"]) as seq:
        x, y = seq[0]
        assert "row_id" not in x
        assert x["region"].dtype == np.int32 and x["level"].dtype == np.float32
        assert y.dtype == np.float32 and set(np.unique(y)) <= {0.0, 1.0}
        for name, arr in x.items():
            assert arr.shape == (BATCH,), name
            assert not np.isnan(arr).any() if arr.dtype == np.float32 else arr.min() >= 0
        vocab = seq.manifest.columns["region"].vocabulary
        assert x["region"].max() < len(vocab) + 2
        assert (x["class"] == 0).any() or seq.manifest.columns["class"].missing == 0


def test_as_matrix_orders_features_and_refuses_text(id_data, client):
    with make(id_data, client, features=["level", "deaths", "hour"], as_matrix=True) as seq:
        x, _ = seq[0]
        assert x.shape == (BATCH, 3) and x.dtype == np.float32
        assert x[:, 2].max() <= 23 and x[:, 0].min() >= 1
    with pytest.raises(SchemaError, match="as_matrix"):
        make(id_data, client, features=["level", "region"], as_matrix=True)


def test_unknown_feature_is_a_clear_error(id_data, client):
    with pytest.raises(SchemaError, match="did you mean 'level'"):
        make(id_data, client, features=["levle"])


def test_prepared_data_served_later_with_warnings_at_the_users_line(id_data, client):
    """Prepared (keras-free) does the scan; DaskSequence.of serves it and owns its client."""
    from daskfeed.batches import DataSettings, Prepared

    with pytest.warns(UserWarning, match="look like row ids") as caught:
        prepared = Prepared(id_data.train_glob, DataSettings.resolve(
            label="cleared", batch_size=BATCH, seed=11), client=client)
    assert {w.filename for w in caught} == {__file__}  # not a line inside daskfeed
    with pytest.warns(UserWarning, match="look like row ids") as caught:
        direct = make(id_data, client)
    assert {w.filename for w in caught} == {__file__}
    with direct, daskfeed.DaskSequence.of(prepared, window_rows=WINDOW_ROWS) as served:
        assert served.manifest is prepared.manifest and served.stream.client is client
        assert served.features == direct.features and len(served) == len(direct)
        a, b = epoch_ids(served), epoch_ids(direct)  # the same batches as one made at once
        assert all(np.array_equal(a[i], b[i]) for i in range(len(direct)))
        with pytest.raises(daskfeed.DaskfeedError, match="already handed"):  # one client, one owner
            daskfeed.DaskSequence.of(prepared)
    assert client.status == "running"  # a client given is not the sequence's to close


def test_pickle_holds_no_client_and_reconnects(id_data, client):
    with make(id_data, client) as seq:
        blob = pickle.dumps(seq)
        assert b"Client" not in blob
        copy = pickle.loads(blob)
        try:
            assert np.array_equal(copy[3][0]["row_id"], seq[3][0]["row_id"])
        finally:
            copy.close()


def test_dask_dataframe_input(client):
    import dask.dataframe as dd
    import pandas as pd

    pdf = pd.DataFrame({"row_id": np.arange(5000), "x": np.arange(5000) % 7 * 1.5,
                        "y": (np.arange(5000) % 3 == 0).astype(int)})
    ddf = dd.from_pandas(pdf, npartitions=7)
    with daskfeed.DaskSequence(ddf, label="y", client=client, batch_size=300, window_rows=1500) as seq:
        assert len(seq.manifest.blocks) == 7 and seq.manifest.rows == 5000
        ids = np.concatenate([seq[i][0]["row_id"] for i in range(len(seq))]).astype(int)
        assert np.array_equal(np.sort(ids), np.arange(5000))


def test_list_of_paths(id_data, client, tmp_path):
    import glob

    files = sorted(glob.glob(id_data.train_glob, recursive=True))[:3]
    with daskfeed.DaskSequence(files, label="cleared", client=client, batch_size=500) as seq:
        assert [p["path"] for p in seq.manifest.blocks] == files
        ids = np.concatenate([seq[i][0]["row_id"] for i in range(len(seq))]).astype(int)
        assert np.array_equal(np.sort(ids), np.arange(3 * 700))


def test_validation_set_encoded_with_the_training_manifest(id_data, client):
    with make(id_data, client) as train:
        with daskfeed.DaskSequence(id_data.validate_glob, label="cleared", client=client,
                                   reference=train.manifest, shuffle=False, batch_size=500) as val:
            assert val.features == train.features
            assert val.manifest.rows == id_data.validate_rows
            ids = np.concatenate([val[i][0]["row_id"] for i in range(len(val))])
            assert np.array_equal(ids, np.arange(id_data.validate_rows))  # unshuffled: file order
            val.on_epoch_end()
            assert val.epoch_stats()["windows_computed"] == 0  # same batches: kept, not recomputed


def test_keras_fit_shuffle_true_warns_once_and_stays_correct(id_data, client):
    from daskfeed.adapters._keras import keras

    seen: list[np.ndarray] = []

    class Spy(daskfeed.DaskSequence):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            seen.append(x[:, 0].copy())
            return x, y

    seq = Spy(id_data.train_glob, label="cleared", client=client, batch_size=BATCH,
              window_rows=WINDOW_ROWS, features=["row_id", "level"], as_matrix=True)
    seen.clear()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy", run_eagerly=False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        model.fit(seq, epochs=1, shuffle=True, verbose=0)
    hits = [w for w in rec if "random batch order" in str(w.message)]
    assert len(hits) == 1
    # the TF backend peeks at batches 0 and 1 first; the epoch itself delivers every row once
    epoch = seen[2:] if len(seen) == len(seq) + 2 else seen
    ids = np.concatenate(epoch).astype(int)
    assert np.array_equal(np.sort(ids), np.arange(id_data.train_rows))
    seq.close()


def test_tf_peek_does_not_trigger_extra_window_computes(id_data, client):
    from daskfeed.adapters._keras import keras

    with make(id_data, client, features=["level", "deaths"], as_matrix=True) as seq:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy")
        model.fit(seq, epochs=2, shuffle=False, verbose=0)
        # Keras' extra on_epoch_end at fit start is ignored: epochs 0 and 1 ran, now at 2
        assert seq.epoch == 2
        assert seq.last_epoch_stats["windows_computed"] == seq.last_epoch_stats["windows"]
        assert seq.last_epoch_stats["rows"] == id_data.train_rows


def test_incomplete_epoch_does_not_advance(id_data, client):
    with make(id_data, client) as seq:
        first = seq[0][0]["row_id"].copy()
        seq.on_epoch_end()  # what Keras does when fit starts, after peeking
        assert seq.epoch == 0 and np.array_equal(seq[0][0]["row_id"], first)
        for i in range(len(seq)):
            seq[i]
        seq.on_epoch_end()
        assert seq.epoch == 1 and not np.array_equal(seq[0][0]["row_id"], first)


def test_keras_thread_workers(id_data, client):
    from daskfeed.adapters._keras import keras

    with make(id_data, client, features=["level", "deaths"], as_matrix=True, workers=3) as seq:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy")
        hist = model.fit(seq, epochs=2, shuffle=False, verbose=0)
        assert len(hist.history["loss"]) == 2
        assert seq.last_epoch_stats["rows"] == id_data.train_rows


@pytest.mark.parametrize("left", [1, 2])
def test_fit_on_a_resumed_epoch_with_one_or_two_batches_left(id_data, client, left):
    """Keras peeks at batches 0 and 1 and calls on_epoch_end before training: when those are
    all that is left, the epoch must still be the one trained (and end only after it)."""
    from daskfeed.adapters._keras import keras

    with make(id_data, client, features=["row_id"], as_matrix=True, batch_size=1000) as seq:
        n = seq.plan.num_batches
        expected = np.concatenate([seq[i][0][:, 0] for i in range(n - left, n)])
        seq.set_epoch(0, start=n - left)
        seen: list[np.ndarray] = []

        class Record(keras.layers.Layer):
            def call(self, x):
                import tensorflow as tf

                tf.numpy_function(lambda v: seen.append(v[:, 0].copy()) or v, [x], tf.float32)
                return x

        model = keras.Sequential([keras.Input((1,)), Record(), keras.layers.Dense(1)])
        model.compile("sgd", "mse", run_eagerly=True)
        model.fit(seq, epochs=1, shuffle=False, verbose=0)
        assert np.array_equal(np.sort(np.concatenate(seen)), np.sort(expected))
        assert seq.epoch == 1 and seq.start == 0


def test_the_next_epochs_windows_are_fetched_ahead_within_the_budget(id_data, client):
    with make(id_data, client) as ref:
        want = [epoch_ids(ref)]
        ref.on_epoch_end()
        want.append(epoch_ids(ref))
    with make(id_data, client) as seq:
        got = [epoch_ids(seq)]
        cursor = seq.stream._cursor
        assert cursor._ahead is not None, "epoch 1's windows were not started during epoch 0"
        ahead = cursor._ahead
        assert cursor._next.epoch == 1 and ahead.submitted >= 1
        pf = cursor.prefetcher
        assert pf.held_bytes + pf.lent <= seq.prefetch_bytes and ahead.held_bytes <= pf.lent
        seq.on_epoch_end()
        assert cursor.prefetcher is ahead  # epoch 1 goes on with them
        got.append(epoch_ids(seq))
        assert seq.epoch_stats()["windows_computed"] == len(seq.plan.windows)  # none twice
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys() and all(np.array_equal(g[i], w[i]) for i in w)


def test_a_resumed_start_in_the_epoch_fetched_ahead_gets_its_batches(id_data, client):
    with make(id_data, client) as ref:
        ref.set_epoch(1)
        want = epoch_ids(ref)
    with make(id_data, client) as seq:
        epoch_ids(seq)  # epoch 1 is fetched ahead meanwhile
        seq.set_epoch(1, 9)
        got = epoch_ids(seq)
        assert len(got) == len(want) - 9
        assert all(np.array_equal(got[i], want[i + 9]) for i in got)
        assert seq.epoch_stats()["windows_computed"] <= len(seq.plan.windows)


def test_unshuffled_epochs_keep_their_windows_and_fetch_nothing_ahead(id_data, client):
    with make(id_data, client, shuffle=False) as seq:
        epoch_ids(seq)
        assert seq.stream._cursor._ahead is None
        seq.on_epoch_end()
        epoch_ids(seq)
        assert seq.epoch_stats()["windows_computed"] == 0


def test_nothing_is_fetched_ahead_past_the_runs_last_epoch(id_data, client):
    with make(id_data, client) as seq:
        assert seq.stream._cursor._ahead is not None  # epoch 1's windows, started with epoch 0's
        pf = seq.stream._cursor.prefetcher
        seq.set_last_epoch(0)  # a one-epoch run: they are dropped and the room given back
        assert seq.stream._cursor._ahead is None and pf.lent == 0
        epoch_ids(seq)
        assert seq.stream._cursor._ahead is None
        seq.set_last_epoch(None)  # not known after all: epoch 1 is fetched ahead again
        assert seq.stream._cursor._ahead is not None and seq.stream._cursor._next.epoch == 1


def test_one_memory_budget_starts_and_closes_its_own_cluster(id_data):
    """memory_limit= as TorchDataset takes it: a LocalCluster within the budget, the sizes from it."""
    from daskfeed.cluster import Budget

    seq = daskfeed.DaskSequence(id_data.train_glob, label="cleared", memory_limit="3GB",
                                nworkers=1, batch_size=BATCH)
    client = seq.stream.client
    (worker,) = client.scheduler_info()["workers"].values()
    budget = Budget.split("3GB", nworkers=1)
    assert worker["memory_limit"] == budget.worker < 3e9  # a share of the one budget
    assert seq.prefetch_bytes == budget.stream_share()
    ids = np.concatenate([seq[i][0]["row_id"] for i in range(len(seq))]).astype(int)
    assert np.array_equal(np.sort(ids), np.arange(id_data.train_rows))
    seq.close()
    assert client.status == "closed"


def test_a_budget_beside_a_running_cluster_is_this_process_own(id_data, client):
    # an address: the sequence's own connection, closed with it; the cluster stays up
    with daskfeed.DaskSequence(id_data.train_glob, label="cleared", memory_limit="1GB",
                               client=client.scheduler.address, batch_size=BATCH) as seq:
        own = seq.stream.client
        assert own is not client
        assert seq.prefetch_bytes == int(0.25 * 1e9) * 2 // 3
        assert seq.manifest.rows == id_data.train_rows
    assert own.status == "closed" and client.status == "running"


def test_an_argument_nobody_takes_is_named_before_any_work(id_data, client):
    with pytest.raises(daskfeed.SettingError) as err:
        daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client,
                              memory_limt="3GB")
    text = str(err.value)
    assert "Received: memory_limt='3GB', which neither takes." in text
    assert "workers, use_multiprocessing, max_queue_size" in text  # Keras' own, by name
    assert "Hint: did you mean 'memory_limt' -> 'memory_limit'?" in text
    with pytest.raises(daskfeed.SettingError, match="nworkers=2 without memory_limit"):
        daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client, nworkers=2)


def test_repr_of_a_sequence_not_built_yet_says_so():
    """A debugger shows ``self`` while ``__init__`` runs: its repr must not raise."""
    from daskfeed.adapters import DaskSequence

    assert repr(DaskSequence.__new__(DaskSequence)) == "<DaskSequence, not built yet>"
