"""The held buckets taken by an idle worker and mapped by the trainer: the same rows, no leftovers.

On a real LocalCluster of this machine (its workers see the parse cache's directory).
"""

from __future__ import annotations

import os
import pickle

import dask.config
import numpy as np
import pytest

import daskfeed
from daskfeed.batches import _buckets, _held_aside, _memory_buckets
from daskfeed.core import DataError


def _sequence(data, client, cache, features=("uid", "level", "region"), **kw):
    with dask.config.set({"daskfeed.buckets-in-memory": True}):
        return daskfeed.DaskSequence(data, label="cleared", client=client, cache=cache,
                                     batch_size=50, features=list(features), seed=3,
                                     window_rows=600, **kw)


def _epoch(seq):
    return [(x["uid"].tolist(), x["region"].tolist(), y.tolist())
            for x, y in (seq[i] for i in range(len(seq)))]


def _arrays(held):
    xs = held.x.items() if isinstance(held.x, dict) else [("x", held.x)]
    return [(k, a.dtype.str, a.tolist()) for k, a in [*xs, ("y", held.y), ("w", held.w)]
            if a is not None]


def _leftovers(cache):
    return [n for _, dirs, _ in os.walk(cache) for n in dirs if n.startswith(_held_aside.PREFIX)]


def test_rows_taken_by_a_worker_are_the_rows_taken_here(data, client, tmp_path, monkeypatch):
    """Every batch of two epochs the same; the trainer maps the worker's files read-only and
    removes them at once."""
    cache = tmp_path / "c"
    with _sequence(data, client, cache) as aside:
        epochs = [_epoch(aside)]
        aside.on_epoch_end()
        epochs.append(_epoch(aside))
        memory = aside.stream.buckets.files
        assert memory.aside is client
        assert ", taken by a worker)" in aside.stream.built_line()
        assert isinstance(memory._held.y, np.memmap) and not memory._held.y.flags.writeable
        assert _leftovers(cache) == []
    monkeypatch.setattr(_buckets, "can_take_aside", lambda client, estimate: False)
    with _sequence(data, client, cache) as here:
        assert here.stream.buckets.files.aside is None
        assert ", taken by a worker" not in here.stream.built_line()
        mine = [_epoch(here)]
        here.on_epoch_end()
        mine.append(_epoch(here))
    assert epochs == mine and epochs[0] != epochs[1]


@pytest.mark.parametrize("take_bytes", [_memory_buckets.TAKE_BYTES, 1], ids=["whole", "runs"])
@pytest.mark.parametrize("as_matrix", [False, True], ids=["columns", "matrix"])
def test_the_files_a_take_is_encoded_into_are_its_arrays(data, client, tmp_path, monkeypatch,
                                                         take_bytes, as_matrix):
    """What a worker writes (here, in this process), mapped: exactly ``take_rows()``'s arrays
    and starts, encoded whole or a run of 1,024 rows at a time into the files."""
    monkeypatch.setattr(_memory_buckets, "TAKE_BYTES", take_bytes)
    features = ("uid", "level") if as_matrix else ("uid", "level", "region")
    with _sequence(data, client, tmp_path / "c", features, as_matrix=as_matrix) as seq:
        copy = pickle.loads(pickle.dumps(seq.stream.buckets.files))  # (nothing held yet)
    held, starts = copy.take_rows()
    directory = tmp_path / "held"
    directory.mkdir()
    mapped, mapped_starts = _held_aside._mapped(_held_aside._take_into(copy, str(directory)))
    assert os.listdir(directory) == []  # (removed once mapped)
    assert _arrays(mapped) == _arrays(held) and len(mapped) == 12 * 214
    assert mapped_starts.tolist() == starts.tolist()


def test_a_take_a_worker_cannot_do_is_done_here_and_says_what_is_wrong(data, client, tmp_path):
    """A block gone from the parse cache: the worker's take fails, nothing is left behind, and
    the trainer's own take raises the data's error, as without a worker."""
    cache = tmp_path / "c"
    with _sequence(data, client, cache) as seq:
        memory = pickle.loads(pickle.dumps(seq.stream.buckets.files))
    os.remove(memory.cache.lookup(0)[0][0])
    assert _held_aside.take_aside(memory, client, lambda: None) is None
    assert _leftovers(cache) == []
    with pytest.raises(DataError, match="Expected block 0 in the parse cache"):
        memory.take()


def test_a_take_abandoned_while_a_worker_takes_stops_with_its_error(data, client, tmp_path):
    with _sequence(data, client, tmp_path / "c") as seq:
        memory = pickle.loads(pickle.dumps(seq.stream.buckets.files))

    class Closed(Exception):
        pass

    with pytest.raises(Closed):
        _held_aside.take_aside(memory, client, lambda: Closed("the reader was closed"))
    assert _leftovers(tmp_path / "c") == []


def test_a_directory_left_by_a_trainer_that_is_gone_is_swept_by_the_next_take(tmp_path):
    """This host's, of a process that no longer runs: removed; a live one's, another host's
    and a link named like a gone one's (and what it points at): left."""
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = socket.gethostname()
    names = {"gone": f"{_held_aside.PREFIX}{host}-{dead}-abc",
             "live": f"{_held_aside.PREFIX}{host}-{os.getpid()}-abc",
             "other": f"{_held_aside.PREFIX}elsewhere.example-{dead}-abc"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "y.npy").write_bytes(b"")
    # a link named as a dead trainer's directory: the link is not ours to follow
    kept = tmp_path.parent / f"{tmp_path.name}-kept"
    kept.mkdir()
    (kept / "y.npy").write_bytes(b"keep")
    link = f"{_held_aside.PREFIX}{host}-{dead}-link"
    os.symlink(kept, tmp_path / link)
    assert _held_aside.sweep(str(tmp_path)) == [names["gone"]]
    assert sorted(os.listdir(tmp_path)) == sorted([names["live"], names["other"], link])
    assert (kept / "y.npy").read_bytes() == b"keep"
