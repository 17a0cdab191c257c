"""scan() on a real LocalCluster: statistics, dtype reconciliation, vocabularies, JSON, errors."""

from __future__ import annotations

import glob
import json
import os
import time

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed import ManifestMismatchError, SchemaError
from daskfeed.manifest._manifest import Manifest


def _all_rows(pattern: str) -> pd.DataFrame:
    return pd.concat([pd.read_csv(p) for p in sorted(glob.glob(pattern, recursive=True))],
                     ignore_index=True)


def test_scan_statistics_match_pandas(demo_data, client):
    m = daskfeed.scan(demo_data.train_glob, label="cleared", client=client)
    df = _all_rows(demo_data.train_glob)
    assert m.rows == len(df) == demo_data.train_rows
    assert len(m.blocks) == 40 and sum(m.counts) == m.rows
    assert m.task == "binary" and m.num_classes == 2
    for name in ["level", "gear_score", "duration_s", "gold_spent", "deaths"]:
        col, ref = m.columns[name], df[name]
        assert col.kind == "numeric"
        assert col.missing == int(ref.isna().sum())
        assert col.mean == pytest.approx(ref.mean(), rel=1e-9)
        assert col.var == pytest.approx(ref.var(ddof=0), rel=1e-9)
        assert (col.min, col.max) == (ref.min(), ref.max())
    assert m.columns["level"].dtype == "int64"
    assert m.columns["region"].kind == "categorical"
    assert set(m.columns["region"].vocabulary) == set(df["region"].unique())
    assert "東京" in m.columns["region"].vocabulary and "São Paulo, BR" in m.columns["region"].vocabulary
    assert m.columns["class"].missing == int(df["class"].isna().sum()) > 0


def test_int_column_with_blanks_only_in_late_files_becomes_float(demo_data, client):
    import dask.dataframe as dd

    files = sorted(glob.glob(demo_data.train_glob, recursive=True))
    assert pd.read_csv(files[0])["gold_spent"].dtype == np.int64  # early files: clean ints
    assert pd.read_csv(files[-1])["gold_spent"].isna().any()  # late files: blanks
    # the trap is real: dask infers int64 from the first file and fails late
    with pytest.raises(ValueError, match="gold_spent"):
        dd.read_csv(demo_data.train_glob).compute(scheduler="sync")
    m = daskfeed.scan(demo_data.train_glob, label="cleared", client=client)
    col = m.columns["gold_spent"]
    assert (col.kind, col.dtype) == ("numeric", "float64")
    assert col.missing == int(_all_rows(demo_data.train_glob)["gold_spent"].isna().sum()) > 0


def test_vocabulary_keeps_top_k_and_counts_oov(demo_data, client):
    m = daskfeed.scan(demo_data.train_glob, label="cleared", client=client, vocabulary_size=5)
    q = _all_rows(demo_data.train_glob)["quest_id"]
    vc = q.value_counts()
    col = m.columns["quest_id"]
    assert len(col.vocabulary) == 5
    assert set(col.vocabulary) == set(vc.index[:5])  # the most frequent
    assert col.distinct == q.nunique()
    assert col.oov_rows == int(vc.iloc[5:].sum())


def test_manifest_json_roundtrip_and_reuse_without_rescan(demo_data, client, tmp_path):
    path = tmp_path / "m.json"
    m = daskfeed.scan(demo_data.train_glob, label="cleared", client=client, manifest_path=path)
    assert path.exists()
    back = Manifest.from_json(path)
    assert back.to_dict() == Manifest.from_dict(m.to_dict()).to_dict()
    assert back.columns["region"].vocabulary == m.columns["region"].vocabulary
    again = daskfeed.scan(demo_data.train_glob, label="cleared", client=client, manifest_path=path)
    assert again.created == m.created  # read from disk, not rescanned (a scan stamps its time)
    from distributed import get_task_stream

    with get_task_stream(client) as ts:
        seq = daskfeed.DaskSequence(demo_data.train_glob, label="cleared", client=client,
                                    manifest=str(path))
        seq.close()
    from dask.utils import key_split

    assert not [t for t in ts.data if key_split(t["key"]).startswith("daskfeed-scan")]
    assert seq.manifest.created == m.created


def test_touching_a_file_invalidates_the_manifest(tmp_path, client, write_csv):
    a = write_csv("d/a.csv", "x,y\n1,0\n2,1\n")
    write_csv("d/b.csv", "x,y\n3,0\n")
    cache = tmp_path / "m.json"
    m1 = daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client, cache=cache)
    with open(a, "a", encoding="utf-8") as f:
        f.write("4,1\n")
    os.utime(a, (time.time() + 5, time.time() + 5))
    with pytest.raises(ManifestMismatchError, match="fingerprint"):
        daskfeed.DaskSequence(str(tmp_path / "d" / "*.csv"), label="y", client=client, manifest=m1)
    m2 = daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client, cache=cache)
    assert m2.rows == 4 and m2.fingerprint != m1.fingerprint


def test_column_turning_to_text_late_is_a_clear_error(tmp_path, client, write_csv):
    write_csv("d/a.csv", "x,y\n1,0\n2,1\n")
    write_csv("d/b.csv", "x,y\nn/a-ish,0\noops,1\n")
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client)
    msg = str(err.value)
    assert "'x'" in msg and "b.csv" in msg and "a.csv" in msg and "Hint:" in msg


def test_dtype_override_reads_the_column_as_category(tmp_path, client, write_csv):
    write_csv("d/a.csv", "x,y\n1,0\n2,1\n")
    write_csv("d/b.csv", "x,y\nzz,0\n")
    m = daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client, dtype={"x": "string"})
    assert m.columns["x"].kind == "categorical" and set(m.columns["x"].vocabulary) == {"1", "2", "zz"}


def test_columns_without_values_are_named_when_no_feature_is_left(tmp_path, client, write_csv):
    """(found by the CSV fuzz test: the message listed a, b and y and said no feature was left)"""
    write_csv("a.csv", "a,b,y\n,,1\n,,0\n")
    m = daskfeed.scan(str(tmp_path / "a.csv"), label="y", client=client)
    with pytest.raises(SchemaError) as err:
        m.feature_names()
    msg = str(err.value)
    assert "columns are ['a', 'b', 'y'], of which ['a', 'b'] have no values in any row" in msg, msg
    assert "Hint: keep at least one column with values besides the label 'y'" in msg


def test_missing_label_names_the_columns_and_a_close_match(demo_data, client):
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(demo_data.train_glob, label="clear", client=client)
    msg = str(err.value)
    assert "'clear'" in msg and "cleared" in msg and "Hint:" in msg


def test_text_label_is_a_class_label(tmp_path, client, write_csv):
    write_csv("a.csv", "x,y\n1,yes\n2,no\n3,yes\n4,\n")
    with pytest.warns(UserWarning, match="1 of 4 rows"):
        m = daskfeed.scan(str(tmp_path / "a.csv"), label="y", client=client)
    assert (m.task, m.num_classes, m.classes) == ("multiclass", 2, ["no", "yes"])
    assert m.label_counts == {"no": 1, "yes": 2}


def test_text_label_with_too_many_values_is_refused(tmp_path, client, write_csv):
    write_csv("a.csv", "x,y\n" + "".join(f"{i},user{i}\n" for i in range(1001)))
    with pytest.raises(SchemaError, match=r"(?s)'y' with 1,001 distinct values.*regression target"):
        daskfeed.scan(str(tmp_path / "a.csv"), label="y", client=client)


def test_rows_without_label_are_counted_and_skipped(tmp_path, client, write_csv):
    write_csv("a.csv", "x,y\n1,0\n2,\n3,1\n")
    with pytest.warns(UserWarning, match="1 of 3 rows"):
        m = daskfeed.scan(str(tmp_path / "a.csv"), label="y", client=client)
    assert (m.rows, m.label_missing) == (2, 1)


def test_multiclass_and_regression_labels(tmp_path, client, write_csv):
    write_csv("m.csv", "x,y\n" + "".join(f"{i},{i % 4}\n" for i in range(40)))
    write_csv("r.csv", "x,y\n" + "".join(f"{i},{i * 0.37}\n" for i in range(40)))
    m = daskfeed.scan(str(tmp_path / "m.csv"), label="y", client=client)
    assert (m.task, m.num_classes) == ("multiclass", 4)
    r = daskfeed.scan(str(tmp_path / "r.csv"), label="y", client=client)
    assert r.task == "regression"


def test_headers_in_another_order_are_aligned_by_name(tmp_path, client, write_csv):
    write_csv("d/a.csv", "x,y,c\n1,0,u\n2,1,v\n")
    write_csv("d/b.csv", "c,y,x\nv,0,10\nu,1,20\n")
    with pytest.warns(UserWarning, match="aligned by name"):
        seq = daskfeed.DaskSequence(str(tmp_path / "d" / "*.csv"), label="y", client=client,
                                    shuffle=False, batch_size=4)
    with seq:
        assert seq.manifest.aligned_files == 1
        assert seq.manifest.columns["x"].mean == pytest.approx(33 / 4)
        x, y = seq[0]
    assert x["x"].tolist() == [1, 2, 10, 20] and y.tolist() == [0, 1, 0, 1]
    vocab = seq.manifest.columns["c"].vocabulary
    assert [vocab[c - 2] for c in x["c"]] == ["u", "v", "v", "u"]


def test_headers_with_other_names_are_refused_naming_the_file(tmp_path, client, write_csv):
    write_csv("d/a.csv", "x,y\n1,0\n")
    write_csv("d/b.csv", "y,z\n0,1\n")
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client)
    msg = str(err.value)
    assert "b.csv" in msg and "missing ['x']" in msg and "extra ['z']" in msg and "Hint:" in msg


def test_large_file_is_split_into_byte_ranges(tmp_path, client):
    from daskfeed.cli._demo import generate_rows

    df = pd.DataFrame(generate_rows(20_000, seed=1, stream=1, row_id_start=0))
    path = tmp_path / "big.csv"
    df.to_csv(path, index=False)
    m = daskfeed.scan(str(path), label="cleared", client=client, blocksize="100kB")
    assert len(m.blocks) > 5
    assert m.rows == 20_000
    assert m.columns["row_id"].min == 0 and m.columns["row_id"].max == 19_999
    assert m.columns["row_id"].mean == pytest.approx(9999.5)


def test_a_manifest_of_many_small_files_is_compact_and_round_trips(tmp_path, client):
    """5,000 one-block files: manifest.json under 60 bytes per block, read back equal, and a
    changed file still detected by the fingerprint."""
    n = 5000
    for d in range(5):
        (tmp_path / "d" / f"part{d}").mkdir(parents=True)
    paths = [tmp_path / "d" / f"part{i % 5}" / f"quest_log_{i:05d}.csv" for i in range(n)]
    for i, p in enumerate(paths):
        p.write_text(f"level,region,cleared\n{i % 70},EU,{i % 2}\n{i % 13},JP,1\n", encoding="utf-8")
    pattern = str(tmp_path / "d" / "**" / "*.csv")
    path = tmp_path / "manifest.json"
    m = daskfeed.scan(pattern, label="cleared", client=client, manifest_path=path)
    assert len(m.blocks) == n and m.rows == 2 * n
    size = path.stat().st_size
    assert size / n <= 60, f"{size / n:.1f} bytes per block"
    back = Manifest.from_json(path)
    assert back.blocks == m.blocks and back.counts == m.counts
    assert back.to_dict() == m.to_dict() and back.summary() == m.summary()
    back.check_fingerprint(daskfeed.Source(pattern).fingerprint())  # the same files: accepted
    paths[1234].write_text("level,region,cleared\n1,EU,0\n", encoding="utf-8")
    os.utime(paths[1234], (time.time() + 5, time.time() + 5))
    with pytest.raises(ManifestMismatchError, match="fingerprint"):
        back.check_fingerprint(daskfeed.Source(pattern).fingerprint())


def test_a_manifest_of_an_older_format_is_rescanned_with_a_note(tmp_path, client, write_csv):
    write_csv("d/a.csv", "x,y\n1,0\n2,1\n")
    path = tmp_path / "manifest.json"
    m = daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client, manifest_path=path)
    old = m.to_dict() | {"version": 2, "partitions": m.blocks}
    del old["blocks"]
    path.write_text(json.dumps(old), encoding="utf-8")
    with pytest.warns(UserWarning, match=r"manifest of format version 2 .*scanned again"):
        again = daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client,
                              manifest_path=path)
    assert again.created != m.created and again.rows == 2
    assert Manifest.from_json(path).version == again.version > 2  # rewritten in the new format


def test_the_old_cache_argument_of_scan_still_names_the_manifest_path(tmp_path, client, write_csv):
    write_csv("d/a.csv", "x,y\n1,0\n2,1\n")
    path = tmp_path / "m.json"
    with pytest.warns(DeprecationWarning, match=r"scan\(cache=\) is now scan\(manifest_path=\)"):
        m = daskfeed.scan(str(tmp_path / "d" / "a.csv"), label="y", client=client, cache=path)
    assert path.exists() and daskfeed.Manifest.from_json(path).fingerprint == m.fingerprint
