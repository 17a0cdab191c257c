"""Data that grows: a scan of changed files scans only their parts, and its manifest is a full scan's."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskfeed.cache import open_cache
from daskfeed.core import DataError
from daskfeed.reading import FileInfo, Source
from daskfeed.reading._parts import _cut_after
from daskfeed.scanning import scan_source

_CLOCK = itertools.count(1_700_000_000)  # every write gets an mtime of its own


def _write(path: str, rows: int, seed: int, decimal_in_n: bool = False) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=rows)
    n = rng.integers(0, 1000, size=rows)
    c = rng.choice(["red", "green", "blue", f"rare{seed}"], size=rows, p=[0.4, 0.3, 0.2, 0.1])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("x,n,c,y\n")
        for k in range(rows):
            shown = "2.5" if decimal_in_n and k == 0 else str(n[k])
            f.write(f"{x[k]!r},{shown},{c[k]},{int(x[k] > 0)}\n")
    t = next(_CLOCK)
    os.utime(path, (t, t))


def _scan(root, cache_root, client, blocksize=4096):
    src = Source(os.path.join(root, "**", "*.csv"), blocksize=blocksize)
    cache, _ = open_cache(src, cache_root, client=client)
    manifest = scan_source(src, label="y", client=client, vocabulary_size=3, timeout=120,
                           parse_cache=cache)
    if cache is not None:
        cache.release(client)  # (as a closed sequence gives its lease back: cache clear may go on)
    return manifest, src


def _lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def _same(a, b) -> None:
    left, right = a.plain(), b.plain()
    for key in ("created", "scan_seconds", "scan_line"):
        left.pop(key), right.pop(key)
    assert left == right


_OPS = st.lists(st.tuples(st.sampled_from(["add", "add-dir", "remove", "rewrite", "decimal"]),
                          st.integers(0, 10_000), st.integers(1, 120)), min_size=1, max_size=4)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(_OPS, min_size=2, max_size=4))
def test_the_merged_manifest_is_a_full_scans_after_every_change(rounds, tmp_path_factory, client):
    """Rounds of added, removed and rewritten files (new directories, an int column gaining
    decimals, files of several blocks): each round's scan reuses what it can and gives exactly the
    manifest a scan of every file into an empty store gives."""
    base = tmp_path_factory.mktemp("grow")
    root, kept = str(base / "data"), str(base / "kept")
    files = [os.path.join(root, "day0", f"f{i:03d}.csv") for i in range(12)]
    for i, path in enumerate(files):
        _write(path, 20 + 7 * i, i)
    _scan(root, kept, client)
    for r, ops in enumerate(rounds, start=1):
        for op, pick, rows in ops:
            if op in ("add", "add-dir", "decimal") or not files:
                day = f"day{r}" if op == "add-dir" else "day0"
                path = os.path.join(root, day, f"g{r}-{pick}.csv")
                _write(path, rows, pick + 100 * r, decimal_in_n=op == "decimal")
                files.append(path) if path not in files else None
            elif op == "remove" and len(files) > 1:
                os.remove(files.pop(pick % len(files)))
            else:
                _write(files[pick % len(files)], rows, pick + 7 * r)
        grown, src = _scan(root, kept, client)
        full, _ = _scan(root, str(base / f"fresh{r}"), client)
        _same(grown, full)
        assert grown.rows == sum(_lines(f.path) - 1 for f in src.files)
        assert grown.scan_line.startswith("scan: ") and full.scan_line.endswith("scanned")


def test_the_line_says_what_changed_and_only_changed_parts_are_scanned(tmp_path, client):
    root, kept = str(tmp_path / "data"), str(tmp_path / "kept")
    for i in range(40):
        _write(os.path.join(root, "2026-11-24", f"f{i:02d}.csv"), 50, i)
    first, _ = _scan(root, kept, client)
    assert first.scan_line == "scan: 40 files (" + first.scan_line.split("(")[1]
    again, _ = _scan(root, kept, client)
    assert "unchanged since the last scan" in again.scan_line and again.rows == first.rows
    for i in range(3):
        _write(os.path.join(root, "2026-11-25", f"n{i}.csv"), 30, 100 + i)
    grown, _ = _scan(root, kept, client)
    assert grown.scan_line.startswith("scan: 3 new files (") and grown.scan_line.endswith(
        ", 0 changed, 0 gone; 40 unchanged reused"), grown.scan_line
    assert grown.rows == first.rows + 90
    os.remove(os.path.join(root, "2026-11-24", "f05.csv"))
    _write(os.path.join(root, "2026-11-25", "n1.csv"), 31, 7)
    later, _ = _scan(root, kept, client)
    assert ", 1 changed, 1 gone; " in later.scan_line and later.rows == grown.rows - 50 + 1


def test_a_new_file_that_changes_a_columns_type_is_named(tmp_path, client):
    root, kept = str(tmp_path / "data"), str(tmp_path / "kept")
    for i in range(5):
        _write(os.path.join(root, "a", f"f{i}.csv"), 40, i)
    before, _ = _scan(root, kept, client)
    _write(os.path.join(root, "b", "odd.csv"), 40, 9, decimal_in_n=True)
    after, _ = _scan(root, kept, client)
    assert (before.columns["n"].dtype, after.columns["n"].dtype) == ("int64", "float64")
    assert ("column 'n' is numeric float64 now (numeric int64 before), first in "
            f"{os.path.join(root, 'b', 'odd.csv')}") in after.scan_line, after.scan_line


def test_a_file_rewritten_during_the_scan_is_refused_and_not_kept(tmp_path, client):
    root, kept = str(tmp_path / "data"), str(tmp_path / "kept")
    for i in range(4):
        _write(os.path.join(root, "a", f"f{i}.csv"), 40, i)
    victim = os.path.join(root, "a", "f2.csv")
    src = Source(os.path.join(root, "**", "*.csv"))
    cache, _ = open_cache(src, kept, client=client)

    def rewrite(rows, done, total, seconds, finished):  # the scan's end, on the trainer
        if finished:
            with open(victim, "a", encoding="utf-8") as f:
                f.write("0.5,1,red,1\n")

    with pytest.raises(DataError, match="changed during the scan") as err:
        scan_source(src, label="y", client=client, vocabulary_size=3, timeout=120,
                    parse_cache=cache, progress=rewrite)
    assert victim in str(err.value) and "Hint:" in str(err.value)
    again, _ = _scan(root, kept, client)  # nothing of the refused scan was kept
    assert again.scan_line.startswith("scan: 4 files (") and again.rows == 161


def test_cache_clear_gone_removes_the_parts_of_changed_or_removed_files(tmp_path, client):
    from click.testing import CliRunner

    from daskfeed.cli._commands import cli

    root, kept = str(tmp_path / "data"), str(tmp_path / "kept")
    for day in ("a", "b", "c"):
        for i in range(3):
            _write(os.path.join(root, day, f"f{i}.csv"), 40, i)
    _, src = _scan(root, kept, client)
    parts = src.parts()  # one per directory at least (a path's hash may cut one more)
    files = [f.path for f in src.files]

    def part_of(path: str) -> int:
        return next(n for n, p in enumerate(parts) if p.files[0] <= files.index(path) < p.files[1])

    removed, rewritten = os.path.join(root, "a", "f1.csv"), os.path.join(root, "b", "f0.csv")
    touched = {part_of(removed), part_of(rewritten)}
    again = sum(p.files[1] - p.files[0] for n, p in enumerate(parts) if n in touched) - 2
    os.remove(removed)
    _write(rewritten, 41, 5)
    runner = CliRunner()
    listed = runner.invoke(cli, ["cache", "list", "--cache", kept])
    assert f"{len(parts)} entries (one per part" in listed.output, listed.output
    assert "2 of them hold files that changed or went since" in listed.output, listed.output
    glob = os.path.join(root, "**", "*.csv")
    assert listed.output.count(f"    serves: {glob} (label y)") == len(parts), listed.output
    cleared = runner.invoke(cli, ["cache", "clear", "--gone", "--cache", kept])
    assert cleared.exit_code == 0 and "removed 2 cache entries of files changed or gone" in (
        cleared.output), cleared.output
    assert "and 0 scan record(s) no data set's last scan uses" in cleared.output  # none rescanned
    ignored = ("scans", "daskfeed-cache.json", "daskfeed-cache.lock")
    assert sorted(n for n in os.listdir(kept) if n not in ignored) == sorted(
        p.key for n, p in enumerate(parts) if n not in touched)
    grown, _ = _scan(root, kept, client)  # the parts kept are reused
    assert grown.scan_line.endswith(
        f"1 changed, 1 gone; {8 - again - 1:,} unchanged reused, {again:,} unchanged scanned again "
        "with them (their part changed)"), grown.scan_line
    again = runner.invoke(cli, ["cache", "clear", "--gone", "--cache", kept])
    assert "removed 0 cache entries" in again.output and "and 2 scan record(s)" in again.output, (
        again.output)  # the records of days a and b as they were


def test_a_split_scanned_again_after_growth_is_the_full_scans_split(tmp_path, client):
    """With a validation split, the blocks held out move as files come; each part's record is
    kept per set of its blocks scanned, so the grown scan of either subset is a full scan's."""
    from daskfeed.manifest import split_settings

    root = str(tmp_path / "data")
    for i in range(30):
        _write(os.path.join(root, f"d{i % 3}", f"f{i:02d}.csv"), 30 + i, i)

    def scan(kept: str, subset: str):
        src = Source(os.path.join(root, "**", "*.csv"), blocksize=4096)
        cache, _ = open_cache(src, kept, client=client)
        return scan_source(src, label="y", client=client, vocabulary_size=3, timeout=120,
                           parse_cache=cache, split=split_settings(0.3, subset, 7))

    for subset in ("training", "validation"):
        scan(str(tmp_path / "kept"), subset)
    for i in range(6):
        _write(os.path.join(root, "d9", f"n{i}.csv"), 40 + i, 100 + i)
    for subset in ("training", "validation"):
        grown = scan(str(tmp_path / "kept"), subset)
        _same(grown, scan(str(tmp_path / f"fresh-{subset}"), subset))
        assert grown.scan_line.startswith("scan: 6 new files ("), grown.scan_line
        assert ", 0 changed, 0 gone; " in grown.scan_line, grown.scan_line


def test_files_appended_to_one_folder_are_the_only_files_parsed(tmp_path, client):
    """A day's files added to one flat folder extend its last part: each round parses exactly the
    new files (counted by the scan's own progress: bytes and rows read), keeps the part's earlier
    cache entries, and gives the manifest a scan of every file gives."""
    root, kept = str(tmp_path / "data"), str(tmp_path / "kept")
    days = iter(range(1000))
    written = itertools.count()

    def add(n: int) -> list[str]:
        paths = []
        for _ in range(n):
            d = next(days)
            # one small file in 256 ends a part by its path's hash (the temporary folder's too):
            # such a name is left out, so that the folder stays one part whatever the folder
            while _cut_after(FileInfo(os.path.join(root, f"2013-{d:04d}.csv"), 0, 0.0)):
                d = next(days)
            paths.append(os.path.join(root, f"2013-{d:04d}.csv"))
            # the 14th file (the second of the first day added) has a decimal in column n
            _write(paths[-1], 40 + 13 * (d % 7), d, decimal_in_n=next(written) == 13)
        return paths

    def scan(cache_root: str):
        seen = []
        src = Source(os.path.join(root, "*.csv"), blocksize=1 << 20)
        cache, _ = open_cache(src, cache_root, client=client)
        manifest = scan_source(src, label="y", client=client, vocabulary_size=3, timeout=120,
                               parse_cache=cache, progress=lambda *a: seen.append(a))
        cache.release(client)
        return manifest, src, cache, seen[-1] if seen else (0, 0, 0, 0.0, True)

    add(12)
    _, src, cache, _ = scan(kept)
    assert len(src.parts()) == 1 and len(cache.entries) == 1  # one folder, under a block: one part
    entries = list(cache.entries)
    for r, n in enumerate([3, 1, 5, 2]):
        new = add(n)
        grown, src, cache, (rows, done, total, _, finished) = scan(kept)
        assert len(src.parts()) == 1, "the new files extended the folder's part"
        assert list(cache.entries[:-1]) == entries and len(cache.entries) == len(entries) + 1
        entries = list(cache.entries)
        assert finished and done == total == sum(os.path.getsize(p) for p in new), (done, total)
        assert rows == sum(_lines(p) - 1 for p in new)
        assert grown.scan_line.startswith(f"scan: {n} new file{'s' if n > 1 else ''} (")
        reused = f", 0 changed, 0 gone; {12 + sum([3, 1, 5, 2][:r])} unchanged reused"
        assert reused in grown.scan_line and "scanned again" not in grown.scan_line
        if r == 0:  # a decimal in an appended file: named as in a new part
            assert ("column 'n' is numeric float64 now (numeric int64 before), first in "
                    f"{new[1]}") in grown.scan_line, grown.scan_line
        full, _, fresh, _ = scan(str(tmp_path / f"fresh{r}"))
        assert len(fresh.entries) == 1
        _same(grown, full)
