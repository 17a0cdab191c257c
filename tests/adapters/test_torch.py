"""TorchDataset: every row once per epoch as torch tensors, exact resume from ``state_dict()``
(mid-epoch, through ``torch.save``, in a new dataset), shards by rank (given, or from
``torch.distributed``), one memory budget, a plain ``torch.nn`` loop, clear refusals.

PyTorch comes with the ``torch`` extra; without it these tests skip, and fail under
``DASKFEED_REQUIRE_TORCH=1`` (``make test-torch``).
"""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys

import numpy as np
import pytest

if importlib.util.find_spec("torch") is None:
    if os.environ.get("DASKFEED_REQUIRE_TORCH") == "1":
        raise RuntimeError("DASKFEED_REQUIRE_TORCH=1 but torch is not installed: "
                           "pip install -e '.[torch]'")
    pytest.skip("torch is not installed (pip install 'daskfeed[torch]')", allow_module_level=True)

import torch

import daskfeed

BATCH = 200  # id_data: 13,300 rows -> 67 batches per epoch, the last one of 100 rows


def _ds(id_data, client, **kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("seed", 7)
    kw.setdefault("window_rows", 2000)  # ~7 windows: a resumed epoch skips whole windows
    return daskfeed.TorchDataset(id_data.train_glob, label="cleared", client=client, **kw)


def _ids(batch) -> list[int]:
    x = batch[0]
    return x["row_id"].reshape(-1).to(torch.int64).tolist()


def test_every_row_once_per_epoch_as_tensors_then_the_next_epoch(id_data, client):
    with _ds(id_data, client) as ds:
        n = len(ds)
        assert n == 67 and ds.epoch == 0 and ds.rows == id_data.train_rows
        first = list(ds)
        assert len(first) == n and ds.epoch == 1  # read to its end: the next epoch
        x, y = first[0]
        assert isinstance(x, dict) and all(isinstance(v, torch.Tensor) for v in x.values())
        assert isinstance(y, torch.Tensor) and y.shape == (BATCH,) and y.dtype == torch.float32
        assert x["class"].dtype == torch.int32  # text: its codes
        ids0 = [r for b in first for r in _ids(b)]
        assert len(ids0) == len(set(ids0)) == id_data.train_rows
        second = [_ids(b) for b in ds]
        ids1 = [r for b in second for r in b]
        assert sorted(ids1) == sorted(ids0) and ids1 != ids0  # every row again, a new order
        assert ds.epoch == 2
        # a pass cut short leaves the dataset after the batches it yielded
        cut = iter(ds)
        assert _ids(next(cut)) and ds.state_dict()["batch"] == 1 and ds.epoch == 2


def test_a_reader_taking_exactly_len_batches_gets_the_next_epoch_from_a_new_iterator(id_data, client):
    """Keras' epochs over a DataLoader of known length: ``len`` batches, never the end of the
    iterator, then a new iterator. Each gets a whole epoch (an empty one came every other)."""
    with _ds(id_data, client) as ds:
        loader = torch.utils.data.DataLoader(ds, batch_size=None)
        epochs = []
        for _ in range(3):
            it = iter(loader)
            epochs.append([r for _ in range(len(loader)) for r in _ids(next(it))])
            assert ds.epoch == len(epochs) and ds.state_dict()["batch"] == 0
        assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
        assert len(set(epochs[0])) == id_data.train_rows and epochs[0] != epochs[1]
    with _ds(id_data, client) as ds:  # the stream's own iterator, batch by batch, alike
        stream = ds.stream
        it = iter(stream)
        first = [next(it) for _ in range(len(stream))]
        assert ds.epoch == 1 and len(list(iter(stream))) == len(first)


def test_state_dict_resumes_mid_epoch_exactly_in_a_new_dataset(id_data, client):
    k = 23
    with _ds(id_data, client) as ds:
        n = len(ds)
        list(ds)  # epoch 0
        it = iter(ds)
        committed = [_ids(next(it)) for _ in range(k)]  # epoch 1, batches 0 .. k-1
        saved = io.BytesIO()
        torch.save(ds.state_dict(), saved)  # beside a model's state, as a loop saves it
        rest = [_ids(b) for b in it]
        following = [_ids(b) for b in ds]  # epoch 2
        manifest = ds.manifest
    assert len(committed) + len(rest) == n
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    assert (state["epoch"], state["batch"]) == (1, k)
    with _ds(id_data, client, manifest=manifest) as resumed:
        resumed.load_state_dict(state)
        got = [_ids(b) for b in resumed]
        assert got == rest  # the uninterrupted epoch's batches from k on, in its order
        both = [r for b in committed + got for r in b]
        assert len(both) == len(set(both)) == id_data.train_rows  # the epoch, each row once
        assert resumed.epoch == 2 and [_ids(b) for b in resumed] == following
    # another seed's dataset refuses the state, naming what differs
    with _ds(id_data, client, manifest=manifest, seed=8) as other:
        with pytest.raises(daskfeed.CheckpointError, match=r"The TorchDataset state was made with "
                                                           r"seed=7; .* Received: seed=8"):
            other.load_state_dict(state)
    # a state saved by the daskfeed before the one resume state (version 1) still resumes
    old = {"version": 1, "epoch": 1, "start": k, "position": state["position"], "batch_size":
           state["batch_size"], "seed": 7, "shard": [0, 1], "fingerprint": state["fingerprint"]}
    with _ds(id_data, client, manifest=manifest) as resumed:
        resumed.load_state_dict(old)
        assert [_ids(b) for b in resumed] == rest


def test_shards_by_rank_are_disjoint_and_equal(id_data, client):
    with _ds(id_data, client) as whole:
        manifest, rows = whole.manifest, set(r for b in whole for r in _ids(b))
    shards = []
    for rank in range(2):
        with _ds(id_data, client, manifest=manifest, shard=(rank, 2)) as ds:
            assert ds.state_dict()["shard"] == [rank, 2]
            shards.append([_ids(b) for b in ds])
    assert len(shards[0]) == len(shards[1])  # equal full batches: ranks step together
    a, b = ({r for batch in s for r in batch} for s in shards)
    assert not a & b and (a | b) <= rows and len(a | b) >= 0.9 * len(rows)


def test_dataloader_matrix_and_a_plain_torch_loop_learns(id_data, client):
    from torch.utils.data import DataLoader

    numeric = ["level", "party_size", "gear_score", "attempt", "hour"]
    torch.manual_seed(0)
    with _ds(id_data, client, features=numeric, as_matrix=True, batch_size=256) as ds:
        mean = torch.tensor([ds.manifest.columns[c].mean for c in numeric])
        std = torch.tensor([ds.manifest.columns[c].var ** 0.5 for c in numeric])
        model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        losses = []
        loader = DataLoader(ds, batch_size=None)  # batches come batched
        for _epoch in range(3):
            total, count = 0.0, 0
            for x, y in loader:
                assert x.shape[1] == 5 and x.dtype == torch.float32
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    model((x - mean) / std).squeeze(1), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total, count = total + loss.item() * len(y), count + len(y)
            assert count == id_data.train_rows
            losses.append(total / count)
        assert losses[-1] < losses[0], losses
        with pytest.raises(daskfeed.DaskfeedError, match="num_workers=0"):
            next(iter(DataLoader(ds, batch_size=None, num_workers=1)))


def test_one_memory_budget_starts_and_closes_its_own_cluster(id_data, monkeypatch):
    from dask.system import CPU_COUNT

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        ds = daskfeed.TorchDataset(id_data.train_glob, label="cleared", memory_limit="3GB",
                                   nworkers=1, batch_size=512)
        # torch's threads for the budget: the cores its one worker thread leaves
        assert torch.get_num_threads() == max(1, CPU_COUNT - 1), ds.threads
        assert ds.threads.startswith(f"torch: {max(1, CPU_COUNT - 1)} thread(s) for the model")
        assert "OMP_NUM_THREADS" not in os.environ  # distributed's 1 is the worker's, not ours
        client = ds.stream.client
        info = client.scheduler_info()
        (worker,) = info["workers"].values()
        assert worker["memory_limit"] < 3e9  # a share of the one budget
        assert 0 < ds.stream.data.settings.prefetch_bytes < 3e9 * 0.2
        assert sum(len(b[1]) for b in ds) == id_data.train_rows
        ds.close()
        assert client.status == "closed"
    finally:
        torch.set_num_threads(before)


def test_a_budget_beside_a_running_cluster_is_this_process_own(id_data, client):
    # an address: the dataset's own connection, closed with it; the cluster stays up
    with daskfeed.TorchDataset(id_data.train_glob, label="cleared", memory_limit="1GB",
                               client=client.scheduler.address, batch_size=512) as ds:
        own = ds.stream.client
        assert own is not client
        assert ds.threads is None  # a cluster of the caller's: torch left as it is
        assert ds.stream.data.settings.prefetch_bytes == int(0.25 * 1e9) * 2 // 3
        assert sum(len(b[1]) for b in ds) == id_data.train_rows
    assert own.status == "closed" and client.status == "running"


def test_nworkers_without_a_budget_is_refused_as_by_dask_sequence(id_data, client):
    """``nworkers`` shapes the cluster started within ``memory_limit``: alone it is a mistake."""
    with pytest.raises(daskfeed.SettingError, match="nworkers=2 without memory_limit"):
        daskfeed.TorchDataset(id_data.train_glob, label="cleared", client=client, nworkers=2)


def test_import_daskfeed_loads_no_torch_and_the_dataset_no_keras():
    code = ("import sys, daskfeed\n"
            "before = 'torch' in sys.modules\n"
            "daskfeed.TorchDataset\n"
            "print(before, sorted(m for m in ('torch', 'keras', 'tensorflow', 'jax') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["False", "['torch']"], proc.stdout + proc.stderr[-2000:]


def test_a_weight_column_comes_as_a_third_tensor(client, tmp_path):
    import pandas as pd

    rng = np.random.default_rng(1)
    w = rng.uniform(0, 2, 900).round(3)
    pd.DataFrame({"x": rng.normal(size=900), "w": w, "y": rng.integers(0, 2, 900)}).to_csv(
        tmp_path / "d.csv", index=False)
    with daskfeed.TorchDataset(str(tmp_path / "d.csv"), label="y", weight="w", client=client,
                               batch_size=100, cache=False) as ds:
        batches = list(ds)
    assert len(batches) == 9 and all(len(b) == 3 for b in batches)
    x, y, sw = batches[0]
    assert list(x) == ["x"] and sw.dtype == torch.float32 and sw.shape == y.shape == (100,)
    got = np.concatenate([b[2].numpy() for b in batches])
    np.testing.assert_allclose(np.sort(got), np.sort(w), rtol=1e-6)  # every row's weight, once


_RANKS = r"""
import json, os, sys
import torch.distributed as dist
import daskfeed

glob, address, out = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
with daskfeed.TorchDataset(glob, label="cleared", client=address, batch_size=200, seed=7) as ds:
    ids = [int(r) for x, y in ds for r in x["row_id"].reshape(-1).tolist()]
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"shard": ds.state_dict()["shard"], "batches": len(ds), "ids": ids}, f)
dist.destroy_process_group()
"""


def test_ranks_of_torch_distributed_read_their_own_shards(id_data, client, tmp_path):
    import json
    import socket

    script = tmp_path / "ranks.py"
    script.write_text(_RANKS)
    with socket.socket() as s:  # a free port for the process group's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, str(script), id_data.train_glob, client.scheduler.address, str(tmp_path)],
        env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port)}, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [g["shard"] for g in got] == [[0, 2], [1, 2]] and got[0]["batches"] == got[1]["batches"]
    a, b = set(got[0]["ids"]), set(got[1]["ids"])
    assert not a & b and len(a | b) >= 0.9 * id_data.train_rows
