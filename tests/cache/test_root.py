"""A cache root others can write, or one holding what daskfeed did not make, is refused; nothing
that isn't daskfeed's is removed; links are never followed (issue "Safe to share", items 1-2).

Each finding of the issue reproduced as an attack on a real root, with real files and a real
cluster where the cache is opened on workers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from daskfeed.cache import BlockCache, clear, list_entries, open_cache, own_dir, own_root
from daskfeed.core import CacheError, write_file
from daskfeed.reading import Source
from daskfeed.scanning import scan_source


def _data(root, rows: int = 200) -> str:
    path = root / "data" / "a.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x,y\n" + "".join(f"{r},{r % 2}\n" for r in range(rows)))
    return str(path)


def _cached(pattern: str, root, client=None, **kw) -> BlockCache:
    src = Source(pattern)
    cache, line = open_cache(src, str(root), client=client, required=True, **kw)
    assert cache is not None, line
    scan_source(src, label="y", client=client, vocabulary_size=3, timeout=120, parse_cache=cache)
    return cache


def test_a_root_writable_by_others_is_refused_naming_path_finding_and_fix(tmp_path, client):
    data = _data(tmp_path)
    root = tmp_path / "team"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(CacheError) as err:  # (opened on the workers, as a run does)
        open_cache(Source(data), str(root), client=client)  # not even asked for: refused
    text = str(err.value)
    assert str(root) in text and "writable by others (mode 0777)" in text, text
    assert f"chmod go-w {root}" in text, text
    assert os.listdir(root) == []  # nothing written there
    os.chmod(root, 0o755)  # the fix the message names
    cache = _cached(data, root, client)
    assert os.path.isfile(root / "daskfeed-cache.json") and cache.cached_blocks() > 0


def test_a_symlinked_root_or_entry_is_refused_and_its_target_left_alone(tmp_path):
    data = _data(tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    os.chmod(target, 0o775)
    link = tmp_path / "cache-link"
    link.symlink_to(target)  # the user's own link: what it points to is checked
    with pytest.raises(CacheError, match=r"it \(a link to .*elsewhere\) is writable by others"):
        open_cache(Source(data), str(link), required=True)
    os.chmod(target, 0o755)
    with pytest.raises(CacheError, match="holds files daskfeed did not make"):
        open_cache(Source(data), str(link), required=True)
    (target / "keep.txt").unlink()  # (~/.cache/daskfeed moved to a bigger disk: accepted)
    assert _cached(data, link).cached_blocks() > 0 and (target / "daskfeed-cache.json").is_file()
    # an entry's name planted as a link to a folder with files an hour old: not chmod-ed, not swept
    root = tmp_path / "root"
    cache = _cached(data, root)
    entry = cache.directories()[0]
    victim = tmp_path / "victim"
    victim.mkdir()
    os.chmod(victim, 0o755)
    old = victim / "x.tmp-1"
    old.write_text("precious")
    os.utime(old, (1, 1))
    subprocess.run(["rm", "-rf", entry], check=True)
    os.symlink(victim, entry)
    with pytest.raises(CacheError, match="is a symbolic link"):
        open_cache(Source(data), str(root), required=True)
    assert old.read_text() == "precious" and (os.stat(victim).st_mode & 0o777) == 0o755


def test_a_folder_of_the_users_is_never_removed(tmp_path):
    """The issue's reproduction: --cache pointed at a folder holding results/meta.json."""
    data = _data(tmp_path)
    home = tmp_path / "work"
    (home / "results").mkdir(parents=True)
    (home / "results" / "meta.json").write_text(json.dumps({"run": 3}))
    (home / "notes.removing-draft").mkdir()
    with pytest.raises(CacheError) as err:
        open_cache(Source(data), str(home), required=True)
    text = str(err.value)
    assert "holds files daskfeed did not make ('notes.removing-draft', 'results')" in text, text
    assert f"--cache {home / 'daskfeed-cache'}" in text, text
    assert (home / "results" / "meta.json").exists() and (home / "notes.removing-draft").exists()
    with pytest.raises(CacheError):
        clear(str(home))
    assert (home / "results" / "meta.json").exists()
    # the folder the hint names works, and a foreign folder placed in a marked root is not touched
    root = home / "daskfeed-cache"
    _cached(data, root).release()
    planted = root / "0123456789abcdef0123456789abcdef"  # an entry's name, not daskfeed's meta
    planted.mkdir()
    (planted / "meta.json").write_text(json.dumps({"version": 1}))
    cache = _cached(data, root)  # (an entry of another version is removed: this is not one)
    assert len(list_entries(str(root))) == 1 and planted.exists()
    cache.release()
    assert len(clear(str(root))) == 1 and planted.exists()


def test_an_older_daskfeeds_root_is_adopted_and_its_old_entries_go(tmp_path):
    data = _data(tmp_path)
    root = tmp_path / "old"
    old = root / ("f" * 32)
    old.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    (old / "meta.json").write_text(json.dumps({"identity": "x", "version": 1}))
    (root / "scans" / "parts").mkdir(parents=True, mode=0o700)
    os.chmod(root / "scans", 0o700)
    (root / "scans" / "parts" / ("a" * 32 + ".pkl")).write_bytes(b"old pickle")
    _cached(data, root)
    assert (root / "daskfeed-cache.json").is_file() and not old.exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="making a folder of another user needs root (CI runs as root)")
def test_another_users_root_is_refused(tmp_path):
    data = _data(tmp_path)
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(CacheError, match=r"belongs to uid 12345, not to "):
        open_cache(Source(data), str(root), required=True)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    os.symlink(root, mine / "link")
    os.lchown(mine / "link", 12345, 12345)  # a link planted by another user
    with pytest.raises(CacheError, match=r"is a symbolic link \(to .*theirs\) of uid 12345"):
        own_root(str(mine / "link"))


def test_clear_finding_no_entries_removes_nothing_and_keeps_an_entry_in_use(tmp_path):
    data = _data(tmp_path)
    root = tmp_path / "root"
    cache = _cached(data, root)  # leased by this (live) process: in use
    scans = root / "scans"
    assert scans.is_dir()
    assert clear(str(root)) == [] and scans.is_dir() and cache.cached_blocks() > 0
    cache.release()  # the lease given back (as a closed sequence does)
    assert len(clear(str(root))) == 1 and not scans.exists()
    assert clear(str(root)) == [] and (root / "daskfeed-cache.json").is_file()


def test_a_level_of_ours_that_others_may_write_is_made_ours_alone(tmp_path):
    """An older daskfeed made buckets/ with the umask's mode (0775 under umask 002)."""
    data = _data(tmp_path)
    root = tmp_path / "root"
    cache = _cached(data, root)
    entry, buckets = cache.directories()[0], root / "buckets"
    buckets.mkdir(mode=0o700)
    os.chmod(buckets, 0o775)
    os.chmod(entry, 0o775)
    _cached(data, root)
    assert (os.stat(entry).st_mode & 0o777) == 0o700
    own_dir(str(buckets))
    assert (os.stat(buckets).st_mode & 0o777) == 0o700


def test_cli_refuses_an_open_root_without_a_traceback(tmp_path):
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    cli = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    proc = subprocess.run([cli, "cache", "clear", "--cache", str(root), "--all", "--yes"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "writable by others" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_link_planted_at_a_files_name_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "meta.json"
    path.symlink_to(victim)
    write_file(str(path), "{}")
    assert victim.read_text() == "precious" and not path.is_symlink() and path.read_text() == "{}"
