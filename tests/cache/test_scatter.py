"""The stored order: each block's rows kept in file order, their seeded order applied on read."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.cache._blocks import BlockCache, block_tables, stored_rows
from daskfeed.cache._scatter import block_order, scatter_order
from daskfeed.reading import Block, ReadOptions


@settings(max_examples=50, deadline=None)
@given(index=st.integers(0, 10**6), pieces=st.lists(st.integers(0, 300), min_size=1, max_size=4))
def test_the_stored_order_permutes_each_piece_within_itself(index, pieces):
    order = scatter_order([(index, n, k) for k, n in enumerate(pieces)])
    starts = np.cumsum([0, *pieces])
    for k, n in enumerate(pieces):  # piece k's stored rows are a permutation of its own rows
        mine = order[starts[k]:starts[k + 1]]
        assert sorted(mine.tolist()) == list(range(starts[k], starts[k + 1]))
        assert (mine - starts[k]).tolist() == block_order(index, n, k).tolist()


def test_a_block_in_pieces_is_stored_piece_by_piece_and_read_back_in_file_order(tmp_path):
    (tmp_path / "c").mkdir()
    cache = BlockCache(str(tmp_path / "c"))
    w = cache.writer(7)
    w.add(7, pa.table({"i": np.arange(50)}))
    w.add(7, pa.table({"i": np.arange(50, 80)}))  # a second piece (a gzip file's next buffer)
    w.add(8, pa.table({"i": np.arange(20)}))
    w.commit()
    assert [r[2] for r in cache.lookup(7)] == [50, 30] and len(cache.lookup(8)) == 1  # its pieces
    stored = cache.stored_view(7, None, {}).column("i").to_pylist()
    assert stored == [*block_order(7, 50, 0).tolist(), *(50 + block_order(7, 30, 1)).tolist()]
    assert stored != sorted(stored)  # really permuted
    kept, order = cache.file_view(7, None, {})  # as the file keeps them, and the order to take
    assert kept.column("i").to_pylist() == list(range(80))
    assert kept.take(order).column("i").to_pylist() == stored
    dummy = Block(str(tmp_path / "absent.csv"), 0, -1, 0)  # never parsed: the cache has it
    rows = [v for t in block_tables(7, dummy, ReadOptions(), cache) for v in t.column("i").to_pylist()]
    assert rows == list(range(80))


def test_a_block_parsed_where_it_is_not_cached_has_the_stored_order_it_gets_cached_in(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("i,j\n" + "".join(f"{k},{k % 3}\n" for k in range(500)))
    block = Block(str(path), 0, -1, 0)
    (tmp_path / "c").mkdir()
    cache = BlockCache(str(tmp_path / "c"))
    table, order = stored_rows(3, block, ReadOptions(), cache)  # parsed here
    parsed = table.take(order).column("i").to_pylist()
    assert sorted(parsed) == list(range(500)) and parsed == block_order(3, 500).tolist()
    assert cache.has(3)  # cached on the way
    assert cache.stored_view(3, None, {}).column("i").to_pylist() == parsed
    table, order = stored_rows(3, block, ReadOptions(), cache, columns=["j"])  # from the cache now
    assert table.column_names == ["j"] and table.column("j").to_pylist() == [k % 3 for k in range(500)]
    assert order.tolist() == parsed


def test_an_entry_of_the_older_format_is_removed_and_rebuilt_with_one_line(tmp_path):
    import json

    from daskfeed.cache._open import open_cache
    from daskfeed.cache._writer import CACHE_VERSION
    from daskfeed.reading import Source

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text("x,cleared\n1,0\n2,1\n")
    src = Source(str(tmp_path / "d" / "*.csv"))
    cache, line = open_cache(src, tmp_path / "c")
    meta = json.loads((tmp_path / "c" / cache.entries[0] / "meta.json").read_text())
    meta["version"] = 3  # as daskfeed wrote it before the stored order
    (tmp_path / "c" / cache.entries[0] / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "c" / cache.entries[0] / "g000000-old.json").write_text(
        json.dumps({"version": 3, "parts": {"0": [["g000000-old-000.arrow", 0, 1]]}}))
    again, line = open_cache(src, tmp_path / "c")
    assert line.endswith(f"; an entry in cache format 3 was removed and is rebuilt in format "
                         f"{CACHE_VERSION})"), line
    assert again.cached_blocks() == 0
    meta = json.loads((tmp_path / "c" / cache.entries[0] / "meta.json").read_text())
    assert meta["version"] == CACHE_VERSION
    _, line = open_cache(src, tmp_path / "c")
    assert "format 3" not in line
