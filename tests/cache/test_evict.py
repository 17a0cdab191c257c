"""daskfeed.cache-max-size: least recently used parts of other data are evicted, never one in use."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import time

import dask.config

import daskfeed
from daskfeed.cache import CacheChoice, open_cache
from daskfeed.reading import Source
from daskfeed.scanning import scan_source


def _data(root, name: str, rows: int) -> str:
    for i in range(3):
        path = root / name / f"f{i}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x,y\n" + "".join(f"{i * rows + r},{r % 2}\n" for r in range(rows)))
    return str(root / name / "*.csv")


def _cached(pattern: str, root, client, max_size=None):
    """Open the cache of ``pattern`` under ``root`` and fill it with a scan (its lease kept)."""
    src = Source(pattern)
    cache, line = open_cache(src, root, client=client, max_size=max_size)
    scan_source(src, label="y", client=client, vocabulary_size=3, timeout=120, parse_cache=cache)
    return cache, line


def _size(cache) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for top in cache.directories()
               for d, _, fs in os.walk(top) for n in fs)


def _last_used(cache, ago: float) -> None:
    t = time.time() - ago
    for d in cache.directories():
        os.utime(os.path.join(d, "meta.json"), (t, t))


def _there(cache) -> bool:
    return all(os.path.isdir(d) for d in cache.directories())


def test_the_least_recently_used_data_goes_first_and_never_one_in_use(tmp_path, client):
    root = tmp_path / "c"
    a, _ = _cached(_data(tmp_path, "a", 400), root, client)
    a.release(client)
    b, _ = _cached(_data(tmp_path, "b", 400), root, client)
    b.release(client)
    _last_used(a, 2000)
    _last_used(b, 1000)
    c, line = _cached(_data(tmp_path, "c", 50), root, client, max_size=_size(b) + 4096)  # (c's own meta.json)
    assert not _there(a) and _there(b) and _there(c)  # a: used longest ago
    assert "; 1 least recently used entry of other data (" in line, line
    assert "evicted to stay under daskfeed.cache-max-size" in line
    c.release(client)

    held, _ = _cached(str(tmp_path / "b" / "*.csv"), root, client)  # b in use from here on
    _last_used(b, 3000)
    _last_used(c, 10)
    d, line = _cached(_data(tmp_path, "d", 10), root, client, max_size=1)
    assert _there(b) and not _there(c), line  # b is older, but leased by a live trainer
    assert "over daskfeed.cache-max-size (1 B): the rest is in use" in line, line
    d.release(client)
    held.release(client)
    e, line = _cached(_data(tmp_path, "e", 10), root, client, max_size=1)
    assert not _there(b) and not _there(d) and _there(e), line
    e.release(client)


def test_a_lease_of_a_trainer_that_died_does_not_keep_its_parts(tmp_path, client):
    root = tmp_path / "c"
    a, _ = _cached(_data(tmp_path, "a", 400), root, client)
    a.release(client)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is free now: a trainer killed without giving its lease back
    for d in a.directories():
        open(os.path.join(d, f"lease-{socket.gethostname()}-{gone.pid}-deadbeef"), "w").close()
    _last_used(a, 1000)
    b, line = _cached(_data(tmp_path, "b", 10), root, client, max_size=1)
    assert not _there(a) and _there(b), line
    b.release(client)


def test_a_closed_sequence_gives_its_lease_back_and_the_bound_comes_from_config(tmp_path, client):
    root = tmp_path / "c"
    pattern = _data(tmp_path, "a", 100)
    with dask.config.set({"daskfeed.cache-max-size": "10GB"}):
        assert CacheChoice.resolve(True).max_size == 10**10
        with daskfeed.DaskSequence(pattern, label="y", client=client, batch_size=50, cache=root) as seq:
            assert len(seq) == 6
            assert glob.glob(str(root / "*" / "lease-*"))  # held while the data are open
    assert glob.glob(str(root / "*" / "lease-*")) == []
    assert CacheChoice.resolve(True).max_size is None  # no bound by default


def test_a_run_with_other_read_options_keeps_the_entries_of_the_same_files(tmp_path, client):
    """A run with another setting (a wrong one) writes entries of its own beside the good ones;
    only changed files make an entry of theirs unreadable, and so removed."""
    pattern = _data(tmp_path, "data", 200)
    root = tmp_path / "cache"
    good, _ = _cached(pattern, root, client)
    other = Source(pattern, dtype={"x": "string"})  # the same files read otherwise
    wrong, _ = open_cache(other, root, client=client)
    scan_source(other, label="y", client=client, vocabulary_size=3, timeout=120, parse_cache=wrong)
    assert _there(good) and _there(wrong) and set(good.directories()).isdisjoint(wrong.directories())
    again, _ = _cached(pattern, root, client)  # the good entries serve the next run
    assert again.directories() == good.directories() and again.cached_blocks() == good.cached_blocks() > 0
    with open(tmp_path / "data" / "f0.csv", "a") as f:  # a file changed: its entries are stale
        f.write("9999,1\n")
    _cached(pattern, root, client)
    assert not _there(good) and not _there(wrong)
