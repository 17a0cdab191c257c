"""Text columns with more values than the scan counts exactly: the bound, and when it decides the top K."""

from __future__ import annotations

from collections import Counter
from unittest import mock

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.scanning import _notes, _schema, _stats


@settings(max_examples=60, deadline=None)
@given(tables=st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=60), min_size=1,
                       max_size=6),
       tracked=st.integers(2, 8), k=st.integers(1, 6))
def test_counts_kept_bound_every_values_rows_and_a_decided_top_k_is_the_true_one(tables, tracked, k):
    """Whatever is dropped in which table or merge: kept count <= rows <= kept count + bound for
    every value (a value not kept: rows <= bound); where the bound decides the top K, the K
    values kept most often are K values of the most rows."""
    with mock.patch.object(_stats, "MAX_TRACKED", tracked):  # a few values, not 50,000
        parts = [_stats.table_stats(pa.table({"c": [f"v{x}" for x in t], "y": [0] * len(t)}), "y")
                 for t in tables]
        merged = _stats.merge_stats(*parts)["c"]
    truth = Counter(f"v{x}" for t in tables for x in t)
    kept, bound = merged["values"], merged.get("bound", 0)
    for value, rows in truth.items():
        assert kept.get(value, 0) <= rows <= kept.get(value, 0) + bound, (value, rows, bound)
    if not merged.get("approximate"):
        assert bound == 0 and kept == dict(truth)
    ranked = sorted(kept.items(), key=lambda kv: (-kv[1], kv[0]))
    if _schema.decided(ranked, k, bound):
        chosen = {v for v, _ in ranked[:k]}
        least = min(truth[v] for v in chosen)
        assert all(truth[v] <= least for v in truth if v not in chosen), (chosen, truth)
        assert len(chosen) == min(k, len(truth))


def test_a_vocabulary_the_counts_do_not_decide_is_said_with_its_bound():
    from daskfeed.manifest import Column

    cols = {"user": Column("user", "categorical", "string", vocabulary=["a", "b"], distinct=80_000,
                           approximate=True, count_bound=7, vocabulary_decided=False),
            "city": Column("city", "categorical", "string", vocabulary=["x"], distinct=60_000,
                           approximate=True, count_bound=3)}
    [note] = _notes.vocabulary_notes(cols)
    assert note.startswith("Column 'user' has more distinct values than the scan counts exactly")
    assert "~80,000 in all" in note and "up to 7 rows more than counted" in note and "Hint:" in note


def _files(root, tables: list[list[str]]) -> str:
    for n, values in enumerate(tables):
        (root / f"f{n:02d}.csv").write_text("c,y\n" + "".join(f"{v},{i % 2}\n" for i, v in
                                                              enumerate(values)))
    return str(root / "*.csv")


def test_an_undecided_top_k_is_counted_again_and_is_the_true_one(tmp_path):
    """With 6 values counted exactly per table (50,000 in daskfeed), files of many rare values
    and a few frequent ones: every part drops values, so the merged counts carry a bound (23)
    larger than the gap between the 3rd and 4th most frequent (12): the candidates are counted
    again and the vocabulary is the true top 3."""
    from distributed import Client, LocalCluster

    from daskfeed.cache import open_cache
    from daskfeed.reading import Source
    from daskfeed.scanning import scan_source

    rng = np.random.default_rng(3)
    tables = []
    for n in range(12):  # per file: hot values 40, 39, 38, 37 and 5 times, 10 rare ones once
        rows = [f"hot{i}" for i, times in enumerate((40, 39, 38, 37, 5)) for _ in range(times)]
        rows += [f"rare{n}-{r}" for r in range(10)]  # more values than a table keeps
        rng.shuffle(rows)
        tables.append(rows)
    (tmp_path / "d").mkdir()
    pattern = _files(tmp_path / "d", tables)
    truth = Counter(v for t in tables for v in t)
    top = sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    with mock.patch.object(_stats, "MAX_TRACKED", 6), \
            LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        src = Source(pattern, blocksize=256)  # a part per file: every part drops values
        cache, _ = open_cache(src, tmp_path / "c", client=client)
        m = scan_source(src, label="y", client=client, vocabulary_size=3, timeout=60,
                        parse_cache=cache)
    column = m.columns["c"]
    assert column.vocabulary == [v for v, _ in top], (column.vocabulary, top)
    assert column.count_bound > 12 and column.vocabulary_decided
    assert "column 'c': its top 3 decided by counting 4 values again in 12 part(s)" in m.scan_line
    assert not [n for n in m.notes if "'c'" in n]
