"""The parse cache: the scan parses each block once, later epochs read Arrow, never CSV."""

from __future__ import annotations

import glob
import gzip
import os
import shutil
import stat
import warnings

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed.cache._blocks import BlockCache
from daskfeed.cache._open import open_cache
from daskfeed.cache._scatter import block_order
from daskfeed.core._exceptions import CacheError
from daskfeed.reading._source import Source
from daskfeed.reading._tables import iter_tables


def _copy_ids(id_data, dest) -> list[str]:
    """A private copy of the id-tagged files (tests below delete or touch them)."""
    files = sorted(glob.glob(id_data.train_glob, recursive=True))
    os.makedirs(dest, exist_ok=True)
    out = []
    for f in files:
        target = os.path.join(dest, os.path.basename(f))
        with open(f, "rb") as src, open(target, "wb") as dst:
            dst.write(src.read())
        out.append(target)
    return out


def _epoch_ids(seq) -> np.ndarray:
    ids = np.concatenate([seq[i][0]["row_id"] for i in range(len(seq))])
    seq.on_epoch_end()
    return ids


def test_epochs_after_the_scan_read_no_csv(id_data, tmp_path, client):
    files = _copy_ids(id_data, tmp_path / "data")
    with daskfeed.DaskSequence(str(tmp_path / "data" / "*.csv"), label="cleared", client=client,
                               batch_size=500, cache=tmp_path / "cache") as seq:
        assert seq.cache is not None
        assert seq.cache.cached_blocks() == len(seq.source.blocks)  # written by the scan
        assert all(stat.S_IMODE(os.stat(d).st_mode) == 0o700 for d in seq.cache.directories())
        for f in files:  # from here on, the CSV cannot be read at all
            os.remove(f)
        for _ in range(2):
            ids = _epoch_ids(seq)
            assert len(ids) == id_data.train_rows
            assert np.array_equal(np.sort(ids), np.arange(id_data.train_rows))


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_cached_batches_equal_parsed_batches(demo_data, tmp_path, client, compression):
    import dask

    kw = {"label": "cleared", "client": client, "batch_size": 1000, "seed": 3}

    def epochs(seq):
        out = []
        for _ in range(2):
            out.append([seq[i] for i in range(len(seq))])
            seq.on_epoch_end()
        return out

    def same(a, b):
        for epoch, (ea, eb) in enumerate(zip(a, b, strict=True)):
            for i, ((xa, ya), (xb, yb)) in enumerate(zip(ea, eb, strict=True)):
                assert np.array_equal(ya, yb)
                for k in xa:
                    assert np.array_equal(xa[k], xb[k]), (epoch, i, k)

    with daskfeed.DaskSequence(demo_data.train_glob, cache=False, shuffle=False, **kw) as plain:
        manifest = plain.manifest
        expected = epochs(plain)
    with dask.config.set({"daskfeed.cache-compression": compression}):
        # in file order (windows of blocks): epoch 0 parses CSV and writes the cache, 1 reads it
        with daskfeed.DaskSequence(demo_data.train_glob, cache=tmp_path / "c", manifest=manifest,
                                   shuffle=False, **kw) as cached:
            assert cached.cache.compression == (None if compression == "none" else compression)
            assert cached.manifest is manifest  # no scan ran: the first epoch's windows fill the cache
            assert cached.cache.cached_blocks() < len(cached.source.blocks)
            same(expected, epochs(cached))
            assert cached.cache.cached_blocks() == len(cached.source.blocks)
        # in the global order: the same batches whether its blocks were parsed or cached
        with daskfeed.DaskSequence(demo_data.train_glob, cache=tmp_path / "d", manifest=manifest,
                                   **kw) as first:
            assert first.global_order  # a fresh cache: its windows parse the blocks and cache them
            parsed = epochs(first)
            assert first.cache.cached_blocks() == len(first.source.blocks)
        with daskfeed.DaskSequence(demo_data.train_glob, cache=tmp_path / "d", manifest=manifest,
                                   **kw) as again:
            same(parsed, epochs(again))


def test_touching_a_file_invalidates_its_cache(id_data, tmp_path, client):
    files = _copy_ids(id_data, tmp_path / "data")
    pattern = str(tmp_path / "data" / "*.csv")
    with daskfeed.DaskSequence(pattern, label="cleared", client=client, cache=tmp_path / "c") as a:
        old = set(a.cache.directories())
    os.utime(files[3], (1_700_000_000, 1_700_000_000))
    with daskfeed.DaskSequence(pattern, label="cleared", client=client, cache=tmp_path / "c") as b:
        new = set(b.cache.directories())
        touched = b.cache.place(next(i for i, blk in enumerate(b.source.blocks)
                                     if blk.path == str(files[3])))[0]
        assert new - old == {touched}  # the part of the touched file only
        assert [d for d in old - new if os.path.exists(d)] == []  # its stale copy is gone
        assert b.cache.cached_blocks() == len(b.source.blocks)


def test_a_stale_entry_loses_its_name_before_its_files(tmp_path, write_csv, monkeypatch):
    """A window task of a closed sequence may still be re-caching a block in the stale entry:
    renamed away before ``rmtree`` runs, the entry cannot be kept alive under its name by a file
    that task writes meanwhile (a race that made the test above flaky)."""
    import daskfeed.cache._open as cache_mod
    from daskfeed.cache._entries import list_entries

    write_csv("d/a.csv", "x,y\n1,0\n2,1\n")
    src = Source(str(tmp_path / "d" / "*.csv"))
    old, _ = open_cache(src, tmp_path / "c")
    late = old.writer(0)  # the task began before the files changed
    late.add(0, next(iter_tables(src.blocks[0], src.options)))
    os.utime(tmp_path / "d" / "a.csv", (1_700_000_000, 1_700_000_000))
    real, seen = shutil.rmtree, []

    def rmtree(path, *a, **k):
        seen.append((path, os.path.exists(old.directories()[0])))
        late.commit()  # the late writer, while the entry is being removed
        return real(path, *a, **k)

    monkeypatch.setattr(cache_mod.shutil, "rmtree", rmtree)
    new, _ = open_cache(Source(str(tmp_path / "d" / "*.csv")), tmp_path / "c")
    [old_dir], [new_dir] = old.directories(), new.directories()
    assert new_dir != old_dir and seen and all(not exists for _, exists in seen), seen
    assert not os.path.exists(old_dir) and late.failed  # its write found no entry to keep alive
    assert sorted(os.listdir(tmp_path / "c")) == sorted([os.path.basename(new_dir), "daskfeed-cache.json",
                                                          "daskfeed-cache.lock", "scans"])
    assert [e.path for e in list_entries(tmp_path / "c")] == [new_dir]


def test_a_disk_without_room_is_refused_up_front(tmp_path, write_csv):
    write_csv("d/a.csv", "x,y\n1,0\n")
    huge = tmp_path / "d" / "b.csv"
    with open(huge, "wb") as f:  # a sparse file 4x the free space: listed with its size, never read
        f.truncate(min(4 * shutil.disk_usage(tmp_path).free, 15 * 10**12))
    src = Source(str(tmp_path / "d" / "*.csv"))
    with pytest.raises(CacheError) as err:
        open_cache(src, tmp_path / "cache", required=True)
    msg = str(err.value)
    assert "GB free" in msg and str(tmp_path / "cache") in msg and "--no-cache" in msg
    cache, why = open_cache(src, tmp_path / "cache", required=False)
    assert cache is None and "cache: off" in why and "GB free" in why


def test_auto_compression_writes_plain_files_where_there_is_room_else_zstd(tmp_path, write_csv):
    from daskfeed.cache._open import estimate_bytes

    write_csv("d/a.csv", "x,y\n1,0\n")
    cache, why = open_cache(Source(str(tmp_path / "d" / "*.csv")), tmp_path / "c0")
    assert cache is not None and cache.compression is None and "uncompressed" in why
    free = shutil.disk_usage(tmp_path).free
    with open(tmp_path / "d" / "b.csv", "wb") as f:  # room for zstd (0.6x), not for plain (1x)
        f.truncate(int((free - 2**30) / 0.8))
    src = Source(str(tmp_path / "d" / "*.csv"))
    assert estimate_bytes(src, "zstd") + 2**30 < free < estimate_bytes(src, None) + 2**30
    cache, why = open_cache(src, tmp_path / "c1")
    assert cache is not None and cache.compression == "zstd" and "zstd" in why
    with pytest.raises(CacheError, match="GB free"):
        open_cache(src, tmp_path / "c2", required=True, compression="none")


def test_gzip_is_parsed_in_bounded_buffers_with_types_per_table(tmp_path, client):
    from daskfeed.cli._demo import generate_rows

    df = pd.DataFrame(generate_rows(20_000, seed=2, stream=0, row_id_start=0))
    df["drift"] = np.where(np.arange(len(df)) < 15_000, "1", "2.5")  # int early, float late
    text = df.to_csv(index=False).encode()
    (tmp_path / "big.csv.gz").write_bytes(gzip.compress(text))
    src = Source(str(tmp_path / "big.csv.gz"), blocksize="200kB")
    assert len(src.blocks) == 1  # not splittable: one partition ...
    tables = list(iter_tables(src.blocks[0], src.options))
    assert len(tables) >= len(text) // 200_000  # ... parsed in buffers of ~blocksize of text
    assert max(t.num_rows for t in tables) < 200_000 / 40
    assert sum(t.num_rows for t in tables) == 20_000
    with pytest.warns(UserWarning, match="cannot be split"):
        seq = daskfeed.DaskSequence(str(tmp_path / "big.csv.gz"), label="cleared", client=client,
                                    blocksize="200kB", batch_size=3000, cache=tmp_path / "c")
    with seq:
        assert seq.manifest.columns["drift"].kind == "numeric"
        assert seq.manifest.columns["drift"].mean == pytest.approx((15_000 + 2.5 * 5_000) / 20_000)
        ids = _epoch_ids(seq)
    assert np.array_equal(np.sort(ids), np.arange(20_000))
    ranges = seq.cache.lookup(0)  # every buffer of the stream was cached, each a piece
    assert len(ranges) == len(tables) and sum(r[2] for r in ranges) == 20_000  # a range a piece


def test_an_incomplete_block_is_never_read(tmp_path):
    cache = BlockCache(str(tmp_path))
    import pyarrow as pa

    w = cache.writer(0)
    w.add(0, pa.table({"x": [1, 2, 3]}))
    w.add(1, pa.table({"x": ["a", "b"]}))  # text after numbers: another Arrow file
    w.begin(2)  # an empty partition is cached too
    assert cache.tables(0) is None and not cache.has(0)  # no marker yet: not visible
    w.commit()
    (table,) = cache.tables(0)  # in the file's order; the stored order is applied on read
    assert table.column("x").to_pylist() == [1, 2, 3]
    assert cache.stored_view(0, None, {}).column("x").to_pylist() == [
        [1, 2, 3][k] for k in block_order(0, 3)]
    assert cache.tables(1)[0].column("x").to_pylist() == ["a", "b"]
    assert cache.has(2) and sum(t.num_rows for t in cache.tables(2)) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty block is no damaged one
        assert cache.stored_view(2, None, {}).num_rows == 0
    assert cache.cached_blocks() == 3
    assert not glob.glob(str(tmp_path / "*.tmp-*"))
    assert len(glob.glob(str(tmp_path / "g000000-*.arrow"))) == 2

    # a column empty in one file, numeric in the next, text in the third: never a lost group
    w = cache.writer(10)
    w.add(10, pa.table({"x": pa.nulls(2)}))
    w.add(11, pa.table({"x": [1.5, 2.5]}))
    w.add(12, pa.table({"x": ["a", None]}))
    w.commit()
    assert [cache.tables(i)[0].column("x").to_pylist() for i in (10, 11, 12)] == [
        [None, None], [1.5, 2.5], ["a", None]]


def test_a_damaged_cache_file_falls_back_to_the_csv(tmp_path, client, write_csv):
    """A cache file damaged after its marker was written (a crash, a bad disk) is not fatal:
    the partition is parsed from the CSV again, with a warning, and the epoch is complete."""
    for i in range(4):
        write_csv(f"d/f{i}.csv", "x,y\n" + "".join(f"{i * 100 + r},{r % 2}\n" for r in range(100)))
    kw = {"label": "y", "client": client, "batch_size": 50, "cache": tmp_path / "c"}
    with daskfeed.DaskSequence(str(tmp_path / "d" / "*.csv"), **kw) as seq:
        path = seq.cache.path
    files = glob.glob(os.path.join(path, "*", "g*.arrow"))
    assert files
    for f in files:  # truncate every Arrow file: the markers still point at them
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)
    with daskfeed.DaskSequence(str(tmp_path / "d" / "*.csv"), **kw) as seq:
        assert seq.cache.path == path
        ids = np.concatenate([seq[i][0]["x"] for i in range(len(seq))])
    assert np.array_equal(np.sort(ids), np.arange(400, dtype=np.float32))


def test_stale_temporary_files_of_killed_writers_are_swept(tmp_path):
    from daskfeed.cache._open import STALE_TMP_SECONDS, _sweep

    old = tmp_path / "g000000-abcd-000.arrow.tmp-123"
    new = tmp_path / "g000004-abcd-000.arrow.tmp-456"
    for f in (old, new):
        f.write_bytes(b"x")
    past = os.path.getmtime(old) - STALE_TMP_SECONDS - 10
    os.utime(old, (past, past))
    assert _sweep(str(tmp_path)) == 1  # a live writer's file (young) stays
    assert not old.exists() and new.exists()


def test_big_integers_and_far_dates_read_the_same_from_cache_and_csv(tmp_path, client, write_csv):
    rows = "".join(f"{1_700_000_000_123 + i * 977},{'9999-12-31' if i % 3 else '2020-01-0' + str(i % 9 + 1)},"
                   f"{i % 2}\n" for i in range(300))
    write_csv("d/big.csv", "ms,day,y\n" + rows)
    kw = {"label": "y", "client": client, "batch_size": 100, "shuffle": False}
    with daskfeed.DaskSequence(str(tmp_path / "d" / "big.csv"), cache=False, **kw) as plain:
        parsed = [plain[i] for i in range(len(plain))]
    with daskfeed.DaskSequence(str(tmp_path / "d" / "big.csv"), cache=tmp_path / "c", **kw) as cached:
        assert cached.manifest.columns["day"].kind == "datetime"
        assert cached.manifest.columns["day"].max == pytest.approx(253402214400.0)  # 9999-12-31
        for i, (x, y) in enumerate(parsed):
            xc, yc = cached[i]  # from the cache written by the scan
            assert np.array_equal(y, yc)
            assert np.array_equal(x["ms"], xc["ms"]) and np.array_equal(x["day"], xc["day"])
    ms = np.array([1_700_000_000_123 + i * 977 for i in range(100)], dtype=np.int64)
    assert np.array_equal(parsed[0][0]["ms"], ms)  # exact: wide whole numbers travel as int64


def test_gzip_buffers_keep_quoted_line_breaks_whole(tmp_path, client):
    rows = "".join(f'{i},"note {i}\nsecond line, with comma",{i % 2}\n' for i in range(10_000))
    (tmp_path / "q.csv.gz").write_bytes(gzip.compress(("x,note,y\n" + rows).encode()))
    src = Source(str(tmp_path / "q.csv.gz"), blocksize="20kB")
    tables = list(iter_tables(src.blocks[0], src.options))
    assert len(tables) > 3 and sum(t.num_rows for t in tables) == 10_000  # buffers of >= 64 KiB
    notes = [n for t in tables for n in t.column("note").to_pylist()]
    assert notes[1234] == "note 1234\nsecond line, with comma"
    (tmp_path / "small.csv").write_text('a,b\n1,2\n3,"x\ny"', encoding="utf-8")  # no final newline
    small = Source(str(tmp_path / "small.csv"))
    (table,) = list(iter_tables(small.blocks[0], small.options))  # a small file: one table
    assert table.column("b").to_pylist() == ["2", "x\ny"]


def test_the_default_cache_directory_is_the_workers_not_the_trainers(tmp_path, write_csv):
    """Workers elsewhere (here: another XDG_CACHE_HOME) cache under their own default root."""
    from distributed import Client, LocalCluster

    from daskfeed.cache._blocks import default_root

    for i in range(3):
        write_csv(f"d/f{i}.csv", "x,y\n" + "".join(f"{i * 10 + r},{r % 2}\n" for r in range(10)))
    workers_home = tmp_path / "worker-home"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      host="127.0.0.1", env={"XDG_CACHE_HOME": str(workers_home)}) as cluster, \
            Client(cluster) as client:
        with daskfeed.DaskSequence(str(tmp_path / "d" / "*.csv"), label="y", client=client,
                                   batch_size=10) as seq:
            assert len(np.concatenate([seq[i][1] for i in range(len(seq))])) == 30
            status = seq.cache_status
    entry = workers_home / "daskfeed" / seq.cache.entries[0]
    assert str(workers_home / "daskfeed") in status
    assert glob.glob(str(entry / "g*.arrow")) and oct(os.stat(entry).st_mode & 0o777) == "0o700"
    assert not os.path.exists(os.path.join(default_root(), seq.cache.entries[0]))  # not the trainer's
