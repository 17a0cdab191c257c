"""One scan and one cache per data set; every setting that shapes a manifest is checked on reuse
(issue 11 item 2, issue 18 item 2)."""

from __future__ import annotations

import os
import warnings

import pytest
from helpers import wait_for

import daskfeed
from daskfeed.core._exceptions import ManifestMismatchError


def _entries(root) -> list[str]:
    """The cache entries (one per part of the files), not the scans nor the buckets beside them."""
    return sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))
                  and n not in ("scans", "buckets"))


def _size(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_three_budgets_scan_once_and_keep_one_cache_entry(demo_data, tmp_path):
    from daskfeed.training._train import train

    cache, out = tmp_path / "cache", tmp_path / "out"
    sizes, entries, scans = [], [], 0
    for limit in ("4GB", "2GB", "6GB"):  # each gives another window (and block) size
        lines: list[str] = []
        train(demo_data.train_glob, label="cleared", epochs=1, memory_limit=limit, nworkers=2,
              dashboard_address="127.0.0.1:0", output=out, verbose=0, echo=lines.append,
              cache=cache)
        scans += sum("scanned in" in line for line in lines)
        entries.append(_entries(cache))  # one per part of the files (where parts are cut
        sizes.append(_size(cache))       # depends on the paths: tmp_path's here)
    assert scans == 1
    assert entries == [entries[0]] * 3 and sizes == [sizes[0]] * 3  # no second copy written


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_a_changed_setting_rebuilds_the_manifest_in_train(demo_data, tmp_path):
    from daskfeed.training._train import train

    out = tmp_path / "out"
    common = {"label": "cleared", "epochs": 1, "memory_limit": "3GB", "nworkers": 1,
              "dashboard_address": "127.0.0.1:0", "output": out, "verbose": 0, "cache": False}
    train(demo_data.train_glob, vocabulary_size=5, echo=lambda _: None, **common)
    assert daskfeed.Manifest.from_json(out / "manifest.json").vocabulary_size == 5
    lines: list[str] = []
    result = train(demo_data.train_glob, vocabulary_size=2, echo=lines.append, **common)
    assert "rescanning: vocabulary_size is now 2 (the manifest was made with 5)" in lines, lines
    assert not any("manifest reused" in line for line in lines)
    assert max(len(c.vocabulary) for c in result.manifest.columns.values()) == 2


@pytest.fixture(scope="module")
def scanned(demo_data, client):
    return daskfeed.scan(demo_data.train_glob, label="cleared", client=client, vocabulary_size=5)


@pytest.mark.parametrize(("setting", "value", "shown"), [
    ("vocabulary_size", 2, "vocabulary_size=5. Received: vocabulary_size=2"),
    ("encoding", "latin-1", "encoding='utf-8'. Received: encoding='latin-1'"),
    ("sep", ";", "sep=','. Received: sep=';'"),
    ("bad_lines", "skip", "bad_lines='error'. Received: bad_lines='skip'"),
    ("dtype", {"region": "string"}, "dtype={}. Received: dtype={'region': 'string'}"),
    ("na_values", ["NA"], "na_values=[]. Received: na_values=['NA']"),
    ("blocksize", "1MiB", "blocksize="),
    ("label", "level", "label='cleared'. Received: label='level'"),
])
def test_a_reused_manifest_made_with_another_setting_is_refused(demo_data, client, scanned, setting,
                                                                 value, shown):
    kw = {"label": "cleared", "vocabulary_size": 5, setting: value}
    with pytest.raises(ManifestMismatchError) as info:
        daskfeed.DaskSequence(demo_data.train_glob, client=client, manifest=scanned, cache=False, **kw)
    msg = str(info.value)
    assert f"The manifest was made with {shown}" in msg, msg
    assert "Hint:" in msg


def test_the_same_settings_reuse_and_features_do_not_shape_the_manifest(demo_data, client, scanned):
    with daskfeed.DaskSequence(demo_data.train_glob, label="cleared", client=client, cache=False,
                               manifest=scanned, vocabulary_size=5, features=["level", "region"]) as a:
        assert a.manifest is scanned and a.features == ["level", "region"]
        assert a.source.options.blocksize == scanned.read_options["blocksize"]
        assert a.encoding.columns[1].input_dim == 5 + 2


def test_scan_with_a_json_cache_rescans_on_another_setting(demo_data, client, tmp_path):
    path = tmp_path / "m.json"
    first = daskfeed.scan(demo_data.train_glob, label="cleared", client=client, vocabulary_size=5,
                          cache=path)
    again = daskfeed.scan(demo_data.train_glob, label="cleared", client=client, vocabulary_size=5,
                          cache=path)
    assert again.created == first.created  # reused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = daskfeed.scan(demo_data.train_glob, label="cleared", client=client,
                              vocabulary_size=2, cache=path)
    assert other.vocabulary_size == 2 and other.created != first.created


def test_a_manifest_that_kept_no_lines_is_scanned_again(demo_data, client, tmp_path):
    """A manifest written before daskfeed kept its blocks' lines (its packed blocks without a
    ``line`` array, the format version unchanged) is not reused: daskfeed rows would have no
    line to name."""
    import json

    path = tmp_path / "m.json"
    first = daskfeed.scan(demo_data.train_glob, label="cleared", client=client, manifest_path=path)
    assert all(b.get("line") for b in first.blocks)
    old = json.loads(path.read_text())
    for key in ("line", "row_lines"):
        old["blocks"].pop(key, None)
    path.write_text(json.dumps(old))
    with pytest.warns(UserWarning, match=r"kept no line of its rows .* scanned again"):
        again = daskfeed.scan(demo_data.train_glob, label="cleared", client=client, manifest_path=path)
    assert again.created != first.created and all(b.get("line") for b in again.blocks)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rescanned one is reused, without a word
        assert daskfeed.scan(demo_data.train_glob, label="cleared", client=client,
                             manifest_path=path).created == again.created


def test_cache_list_and_clear_show_and_remove_entries(demo_data, tmp_path, client):
    from click.testing import CliRunner

    from daskfeed.cli._commands import cli

    root = tmp_path / "cache"
    with daskfeed.DaskSequence(demo_data.train_glob, label="cleared", client=client,
                               cache=root) as seq:
        parts = len(seq.cache.entries)
    # closing cancels the sequence's prefetched windows; one already running on a worker still
    # finishes (a cancelled task's thread runs to its end) and may fill the cache again: clear
    # once no worker is executing anything
    def idle() -> bool:
        return not any(client.run(lambda dask_worker: dask_worker.state.executing_count).values())

    wait_for(idle, 60, "the workers to finish the cancelled windows")
    runner = CliRunner()
    listed = runner.invoke(cli, ["cache", "list", "--cache", str(root)])
    assert listed.exit_code == 0, listed.output
    entries = _entries(root)
    assert len(entries) == parts and all(e in listed.output for e in entries)
    assert f"{parts} entr{'y' if parts == 1 else 'ies'} (one per part" in listed.output
    assert "more files" in listed.output  # the data each holds: a run of the 40 demo files
    # no ENTRIES (an empty $(...)) is never "all", not even with --yes
    for flags in ([], ["--yes"]):
        empty = runner.invoke(cli, ["cache", "clear", "--cache", str(root), *flags])
        assert empty.exit_code == 2 and "Expected the cache ENTRIES to remove" in empty.output
        assert "Received: no ENTRIES" in empty.output and "pass --all --yes" in empty.output
        assert "Traceback" not in empty.output and _entries(root) == entries, empty.output
    both = runner.invoke(cli, ["cache", "clear", "--cache", str(root), "--all", entries[0]])
    assert both.exit_code == 2 and "Expected ENTRIES or --all" in both.output, both.output
    asked = runner.invoke(cli, ["cache", "clear", "--cache", str(root), "--all"])  # not a terminal
    assert asked.exit_code == 2 and f"removing all {parts} cache entries" in asked.output, asked.output
    assert "needs --all --yes" in asked.output and _entries(root) == entries
    cleared = runner.invoke(cli, ["cache", "clear", "--cache", str(root), "--all", "--yes"])
    assert cleared.exit_code == 0 and f"removed {parts} cache entr" in cleared.output, cleared.output
    assert _entries(root) == [] and not os.path.exists(root / "scans")
    assert "no cache entries" in runner.invoke(cli, ["cache", "list", "--cache", str(root)]).output


def test_a_reused_manifest_repeats_what_the_scan_warned(tmp_path, client):
    rows = "".join(f"{i},{'' if i % 10 == 0 else i % 2}\n" for i in range(200))  # 20 unlabeled
    (tmp_path / "d.csv").write_text("x,y\n" + rows)
    with pytest.warns(UserWarning, match="20 of 200 rows have no value in label 'y'"):
        m = daskfeed.scan(str(tmp_path / "d.csv"), label="y", client=client)
    with pytest.warns(UserWarning, match="20 of 200 rows have no value in label 'y'"):
        daskfeed.DaskSequence(str(tmp_path / "d.csv"), label="y", client=client, manifest=m,
                              cache=False).close()
