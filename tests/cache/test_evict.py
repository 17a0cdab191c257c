"""daskfeed.cache-max-size: least recently used parts of other data are evicted, never one in use."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import time

import dask.config
import pytest

import daskfeed
from daskfeed.cache import CacheChoice, clear, open_cache
from daskfeed.cache._evict import LEASE_SECONDS, LOCK
from daskfeed.core import CacheError
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


def _lease(cache, who: str, ago: float) -> None:
    """A lease ``who`` on ``cache``'s parts, last renewed ``ago`` seconds ago."""
    t = time.time() - ago
    for d in cache.directories():
        path = os.path.join(d, f"lease-{who}-deadbeef")
        open(path, "w").close()
        os.utime(path, (t, t))


def test_a_lease_not_renewed_for_minutes_is_a_dead_trainers_on_any_host(tmp_path, client):
    """No pid is believed: a pid reused, another host, another container all read the same."""
    root = tmp_path / "c"
    a, _ = _cached(_data(tmp_path, "a", 400), root, client)
    a.release(client)
    _lease(a, f"{socket.gethostname()}-{os.getpid()}", LEASE_SECONDS + 60)  # a live pid, not renewed
    _lease(a, "another-host-77", LEASE_SECONDS + 60)
    _last_used(a, 1000)
    b, line = _cached(_data(tmp_path, "b", 10), root, client, max_size=1)
    assert not _there(a) and _there(b), line
    b.release(client)


def test_a_lease_renewed_keeps_its_parts_whatever_its_host_or_pid(tmp_path, client):
    root = tmp_path / "c"
    a, _ = _cached(_data(tmp_path, "a", 400), root, client)
    a.release(client)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that is free now: on another host (or in a container) that says nothing
    _lease(a, f"elsewhere-{gone.pid}", 30)
    _last_used(a, 1000)
    b, line = _cached(_data(tmp_path, "b", 10), root, client, max_size=1)
    assert _there(a), line  # renewed 30 s ago: a live trainer's
    assert "the rest is in use" in line
    b.release(client)


def test_a_trainer_renews_its_leases_while_it_lives(tmp_path, client, monkeypatch):
    from daskfeed.cache import _evict
    from daskfeed.cache._blocks import heartbeat

    monkeypatch.setattr(_evict, "RENEW_SECONDS", 0.05)  # (read by the trainer's heartbeat)
    root = tmp_path / "c"
    a, _ = _cached(_data(tmp_path, "a", 100), root, client)
    leases = glob.glob(str(root / "*" / f"lease-{a.lease}"))
    assert leases
    old = time.time() - 2 * LEASE_SECONDS
    for path in leases:
        os.utime(path, (old, old))
    beat = heartbeat(a)
    assert beat is not None
    for _ in range(2):  # (a renewal in flight as the leases were aged may end first: the next)
        beat.clear()
        assert beat.wait(60)  # a renewal, on the workers
    assert all(time.time() - os.stat(p).st_mtime < LEASE_SECONDS for p in leases)
    a.release(client)
    assert heartbeat(a) is None and not glob.glob(str(root / "*" / "lease-*"))


def test_opening_and_clearing_wait_for_the_roots_lock_and_say_who_holds_it(tmp_path, client):
    root = tmp_path / "c"
    a, _ = _cached(_data(tmp_path, "a", 100), root, client)
    a.release(client)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys\n"
         f"fd = os.open({str(root / LOCK)!r}, os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CacheError, match=r"Expected to lock the cache root .* within 0\.2 s\. "
                                             r"Received: another process holds .*daskfeed-cache\.lock"):
            clear(root, lock_timeout=0.2)
        with pytest.raises(CacheError, match=r"raise daskfeed\.cache-lock-timeout"):
            open_cache(Source(str(tmp_path / "a" / "*.csv")), root, lock_timeout=0.2)
        assert _there(a)  # nothing removed while another process held the lock
    finally:
        holder.communicate("go\n")
    assert clear(root, lock_timeout=0.2) and not _there(a)  # the lock given back: cleared


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
