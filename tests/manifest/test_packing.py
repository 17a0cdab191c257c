"""The manifest's packed blocks (daskfeed.manifest._packing): round trips, compactness, damage."""

from __future__ import annotations

import base64
import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.manifest._packing import ENCODING, FIELDS, pack_blocks, unpack_blocks

PATHS = st.sampled_from(["/data/a.csv", "/data/b.csv.gz", "s3://bucket/part 7.csv",
                         "/données/été.csv", "relative/x.tsv"])
INTS = st.integers(-1, 2**50)  # -1: a whole file's length; byte offsets of files of any size
BLOCK = st.fixed_dictionaries({"path": PATHS, "offset": INTS, "length": INTS, "rows": INTS,
                               "raw_rows": INTS})


@settings(max_examples=200, deadline=None)
@given(st.lists(BLOCK, max_size=60))
def test_blocks_round_trip_through_json(blocks):
    packed = pack_blocks(blocks)
    assert set(packed) == {"count", "encoding", "paths", "file", *FIELDS}
    assert packed["count"] == len(blocks) and packed["encoding"] == ENCODING
    assert unpack_blocks(json.loads(json.dumps(packed))) == blocks


def _decoded(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


def test_each_path_is_kept_once_in_first_seen_order():
    blocks = [{"path": p, "offset": i * 10, "length": 10, "rows": 3, "raw_rows": 3}
              for i, p in enumerate(["b.csv", "a.csv", "b.csv", "c.csv", "a.csv"])]
    packed = pack_blocks(blocks)
    assert _decoded(packed["paths"]) == b"b.csv\0a.csv\0c.csv"
    assert unpack_blocks(packed) == blocks


def test_integers_are_little_endian_int64_differences():
    blocks = [{"path": "f.csv", "offset": o, "length": 100, "rows": r, "raw_rows": r + 1}
              for o, r in [(0, 5), (100, 7), (200, 4)]]
    packed = pack_blocks(blocks)

    def ints(name: str) -> list[int]:
        raw = _decoded(packed[name])
        return [int.from_bytes(raw[i:i + 8], "little", signed=True) for i in range(0, len(raw), 8)]

    assert ints("offset") == [0, 100, 100]
    assert ints("length") == [100, 0, 0]
    assert ints("rows") == [5, 2, -3]
    assert ints("raw_rows") == [6, 2, -3]
    assert ints("file") == [0, 0, 0]


def test_raw_rows_default_to_rows():
    packed = pack_blocks([{"path": "f.csv", "offset": 0, "length": 9, "rows": 4},
                          {"path": "f.csv", "offset": 9, "length": 9, "rows": 6, "raw_rows": 8}])
    assert [b["raw_rows"] for b in unpack_blocks(packed)] == [4, 8]


def test_no_blocks_round_trip():
    packed = pack_blocks([])
    assert packed["count"] == 0 and unpack_blocks(packed) == []


def test_many_small_files_pack_to_a_few_bytes_a_block():
    n = 20_000
    blocks = [{"path": f"/data/day={i // 100:04d}/part-{i:06d}.csv", "offset": 0, "length": 4096 + i % 7,
               "rows": 50 + i % 3, "raw_rows": 50 + i % 3} for i in range(n)]
    packed = pack_blocks(blocks)
    size = len(json.dumps(packed))
    plain = len(json.dumps(blocks))
    assert size < 8 * n, f"{size / n:.1f} bytes per block packed"  # the paths dominate
    assert size * 10 < plain
    assert unpack_blocks(packed) == blocks


@pytest.mark.parametrize("name", ["file", *FIELDS])
def test_an_array_of_another_length_is_a_clear_error(name):
    blocks = [{"path": "f.csv", "offset": i, "length": 1, "rows": 1, "raw_rows": 1} for i in range(3)]
    damaged = pack_blocks(blocks)
    damaged[name] = pack_blocks(blocks[:2])[name]
    expected = r"^Expected 3 blocks in every array of the packed manifest blocks\.$"
    with pytest.raises(ValueError, match=expected):
        unpack_blocks(damaged)
    damaged = pack_blocks(blocks)
    damaged["count"] = 4
    with pytest.raises(ValueError, match="Expected 4 blocks"):
        unpack_blocks(damaged)
