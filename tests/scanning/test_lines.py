"""Every row traced to its line: the scan's line facts, the manifest's lines, ``row_line``.

Files are written with a known line per row id (the header is line 1; a quoted field's line
breaks, blank lines and skipped malformed lines count); after a real scan, each block's rows
are parsed again in file order and ``row_line`` of each must be the line its id was written on.
"""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskfeed
from daskfeed.cache import open_cache
from daskfeed.manifest import Manifest, pack_row_lines, row_line, row_lines
from daskfeed.manifest._packing import pack_blocks, unpack_blocks
from daskfeed.reading import Source, SplitError, iter_tables
from daskfeed.scanning import scan_source
from daskfeed.scanning._build import block_lines
from daskfeed.scanning._store import RECORD_VERSION
from daskfeed.scanning._task import scan_blocks

pytestmark = pytest.mark.filterwarnings("ignore:.*(no value in label|malformed line).*:UserWarning")

#: what a record of the files written here may be
ROW, QUOTED, BLANK, BAD = "row", "quoted", "blank", "bad"


def _text(kinds: list[str], *, eol: str = "\n", last_eol: bool = True,
          seed: int = 0) -> tuple[str, dict[int, int]]:
    """A CSV (id, note, y) of these records, and the line each row's id is written on."""
    r = random.Random(seed)
    out, lines, line = ["id,note,y"], {}, 2
    for i, kind in enumerate(kinds):
        y = "" if r.random() < 0.1 else str(r.randint(0, 1))  # some rows without a label
        if kind == BLANK:
            out.append("")
            line += 1
            continue
        if kind == BAD:
            out.append(f"{i},too,many,fields")
            line += 1
            continue
        note = f"plain {i}"
        if kind == QUOTED:
            breaks = r.randint(1, 3)
            note = '"' + eol.join(f'said ""{k}"", then' for k in range(breaks + 1)) + '"'
        lines[i] = line
        out.append(f"{i},{note},{y}")
        line += 1 + note.count("\n")
    return eol.join(out) + (eol if last_eol else ""), lines


def _kinds(n: int, seed: int, *, quoted: float = 0.0, blank: float = 0.0,
           bad: float = 0.0) -> list[str]:
    r = random.Random(seed)
    out = []
    for _ in range(n):
        x = r.random()
        out.append(QUOTED if x < quoted else BLANK if x < quoted + blank else
                   BAD if x < quoted + blank + bad else ROW)
    return out


def _check(m: Manifest, src: Source, truth: dict[str, dict[int, int]]) -> int:
    """Every row of every block on the line its id was written on; the rows checked."""
    checked = 0
    for i, (block, meta) in enumerate(zip(src.blocks, m.blocks, strict=True)):
        ids = [v for t in iter_tables(block, src.options, []) for v in t.column("id").to_pylist()]
        assert len(ids) == meta["raw_rows"], (i, meta)
        got = row_lines(meta, range(len(ids)))
        assert got is not None, (i, meta)
        want = [truth[block.path][v] for v in ids]
        assert got.tolist() == want, (i, block.describe())
        assert [row_line(meta, k) for k in range(len(ids))] == want
        checked += len(ids)
    return checked


def _scan(paths, client, **kw) -> tuple[Manifest, Source]:
    src = Source(paths, **kw)
    m = daskfeed.scan(src, label="y", client=client)
    return m, src


@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("last_eol", [True, False], ids=["last-eol", "no-last-eol"])
def test_a_file_in_many_blocks_with_fields_over_lines_and_blank_lines(tmp_path, client, eol,
                                                                      last_eol):
    path = tmp_path / "notes.csv"
    text, truth = _text(_kinds(4000, 1, quoted=0.05, blank=0.02), eol=eol, last_eol=last_eol)
    path.write_bytes(text.encode())
    m, src = _scan(str(path), client, blocksize=8 * 1024)
    assert len(m.blocks) >= 8
    assert _check(m, src, {str(path): truth}) == m.rows + m.label_missing == len(truth)
    assert any("row_lines" in b for b in m.blocks)


def test_regular_blocks_keep_no_row_lines(tmp_path, client):
    path = tmp_path / "plain.csv"
    text, truth = _text(_kinds(5000, 2))
    path.write_bytes(text.encode())
    m, src = _scan(str(path), client, blocksize=8 * 1024)
    assert len(m.blocks) >= 8 and not any("row_lines" in b for b in m.blocks)
    assert m.blocks[0]["line"] == 2
    _check(m, src, {str(path): truth})


def test_a_file_whose_blocks_are_decided_exactly(tmp_path, client):
    # a quoted field of 150 kB of lines that read like rows: the speculated starts fail
    mislead = '"' + "\n".join(f"{k},plain,1" for k in range(12_000)) + '"'
    kinds = _kinds(3000, 3, quoted=0.05)
    text, truth = _text(kinds)
    head, rest = text.split("\n", 1)
    first, rest = rest.split("\n", 1)
    rid = int(first.split(",")[0])
    text = f"{head}\n{rid},{mislead},1\n{rest}"
    truth = {k: v + (12_000 - 1 if k != rid else 0) for k, v in truth.items()}
    path = tmp_path / "mislead.csv"
    path.write_bytes(text.encode())
    m, src = _scan(str(path), client, blocksize=16 * 1024)
    assert m.splits  # decided exactly
    _check(m, src, {str(path): truth})


def test_small_files_parsed_together_and_alone(tmp_path, client):
    truth, paths = {}, []
    for k in range(40):
        kinds = _kinds(30, k, blank=0.1 if k % 7 == 3 else 0.0, quoted=0.1 if k % 11 == 5 else 0)
        text, lines = _text(kinds, seed=k, last_eol=k % 5 != 0)
        path = tmp_path / "many" / f"part-{k:03d}.csv"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(text.encode())
        truth[str(path)] = lines
        paths.append(str(path))
    m, src = _scan(str(tmp_path / "many" / "*.csv"), client)
    assert all(b["line"] == 2 for b in m.blocks)
    _check(m, src, truth)


@pytest.mark.parametrize("bad_lines", ["skip", "quarantine"])
def test_skipped_lines_count(tmp_path, client, bad_lines):
    path = tmp_path / "bad.csv"
    text, truth = _text(_kinds(3000, 4, bad=0.03, blank=0.01, quoted=0.02))
    path.write_bytes(text.encode())
    m, src = _scan(str(path), client, blocksize=8 * 1024, bad_lines=bad_lines)
    assert m.bad_lines > 0
    _check(m, src, {str(path): truth})


def test_a_gzip_file_streamed_in_buffers(tmp_path, client):
    path = tmp_path / "notes.csv.gz"
    text, truth = _text(_kinds(6000, 5, quoted=0.03, blank=0.01), eol="\r\n")
    path.write_bytes(gzip.compress(text.encode()))
    with pytest.warns(UserWarning):  # (a compressed file is one block)
        m, src = _scan(str(path), client, blocksize=16 * 1024)
    assert len(m.blocks) == 1 and m.blocks[0]["line"] == 2
    _check(m, src, {str(path): truth})


def _scan_kept(pattern: str, root, client, **kw) -> tuple[Manifest, Source]:
    """A scan with a parse cache under ``root`` (the scan's part records kept there)."""
    src = Source(pattern, **kw)
    cache, line = open_cache(src, str(root), client=client, required=True)
    assert cache is not None, line
    m = scan_source(src, label="y", client=client, vocabulary_size=5, timeout=120,
                    parse_cache=cache)
    cache.release(client)
    return m, src


def test_lines_survive_the_json_kept_records_and_grown_data(tmp_path, client):
    data, root, truth = tmp_path / "data" / "day0", tmp_path / "kept", {}
    data.mkdir(parents=True)

    def write(k: int) -> None:
        text, truth[str(data / f"f{k}.csv")] = _text(_kinds(1500, 10 + k, quoted=0.04, blank=0.01),
                                                     seed=k)
        (data / f"f{k}.csv").write_bytes(text.encode())

    for k in range(2):
        write(k)
    pattern, kw = str(data / "*.csv"), {"blocksize": 8 * 1024}
    m, src = _scan_kept(pattern, root, client, **kw)
    _check(Manifest.from_dict(json.loads(json.dumps(m.plain()))), src, truth)
    again, src = _scan_kept(pattern, root, client, **kw)  # every file unchanged: the last manifest
    assert again.scanned_parts == 0
    _check(again, src, truth)
    write(2)  # the part grew at its end: only the new file is scanned
    grown, src = _scan_kept(pattern, root, client, **kw)
    assert "1 new file" in grown.scan_line, grown.scan_line
    assert _check(grown, src, truth) == sum(len(t) for t in truth.values())
    fresh, _ = _scan_kept(pattern, tmp_path / "fresh", client, **kw)
    assert fresh.blocks == grown.blocks


def test_a_kept_scan_of_an_older_record_version_is_scanned_again(tmp_path, client):
    data, root = tmp_path / "data", tmp_path / "kept"
    data.mkdir()
    text, truth = _text(_kinds(1000, 7, quoted=0.05))
    (data / "a.csv").write_bytes(text.encode())
    m, _ = _scan_kept(str(data / "*.csv"), root, client, blocksize=8 * 1024)
    (kept,) = (root / "scans" / "sets").glob("*.json")
    body = json.loads(kept.read_text())
    assert body["version"] == RECORD_VERSION
    old = Manifest.from_dict(body["manifest"])  # as a daskfeed before lines kept it
    old.blocks = [{k: v for k, v in b.items() if k not in ("line", "row_lines")} for b in old.blocks]
    del body["version"]
    body["manifest"] = old.plain()
    kept.write_text(json.dumps(body))
    for record in (root / "scans" / "parts").glob("*.json"):  # records of the older version
        rec = json.loads(record.read_text())
        rec["version"] = RECORD_VERSION - 1
        record.write_text(json.dumps(rec))
    again, src = _scan_kept(str(data / "*.csv"), root, client, blocksize=8 * 1024)
    assert again.scanned_parts == 1  # neither the kept manifest nor the records were believed
    assert again.blocks == m.blocks
    _check(again, src, {str(data / "a.csv"): truth})


# ------------------------------------------------------------------ without a cluster: properties
def _scan_here(path: str, **kw) -> tuple[list[dict], Source]:
    """The scan's facts of every block, parsed here (no cluster), and the blocks' lines."""
    src = Source(path, **kw)
    while True:
        try:
            out = scan_blocks(list(enumerate(src.blocks)), src.options, "y")
            break
        except SplitError:
            src.split_exactly(path)
    return [{"raw_rows": f["rows"], "rows": f["label_rows"], **lines}
            for f, lines in zip(out["facts"], block_lines(src, out["facts"]), strict=True)], src


RECORD = st.sampled_from([ROW, ROW, ROW, QUOTED, BLANK, BAD])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(RECORD, min_size=1, max_size=80), eol=st.sampled_from(["\n", "\r\n"]),
       last_eol=st.booleans(), blocksize=st.sampled_from([64, 200, 1 << 20]),
       seed=st.integers(0, 1000))
def test_any_small_csv_text_gives_each_row_its_line(tmp_path, kinds, eol, last_eol, blocksize,
                                                   seed):
    if all(k in (BLANK, BAD) for k in kinds):
        kinds = [*kinds, ROW]
    text, truth = _text(kinds, eol=eol, last_eol=last_eol, seed=seed)
    path = tmp_path / "p.csv"
    path.write_bytes(text.encode())
    bad = "skip" if BAD in kinds else "error"
    if bad == "skip" and kinds.count(BAD) > max(100, len(truth)):
        return
    blocks, src = _scan_here(str(path), blocksize=blocksize, bad_lines=bad)
    for block, meta in zip(src.blocks, blocks, strict=True):
        ids = [v for t in iter_tables(block, src.options, []) for v in t.column("id").to_pylist()]
        got = row_lines(meta, range(len(ids)))
        assert got is not None and got.tolist() == [truth[v] for v in ids], (text, block)


def test_row_line_refuses_a_row_the_block_has_not():
    block = {"path": "a.csv", "offset": 0, "length": -1, "rows": 2, "raw_rows": 3, "line": 2}
    assert row_line(block, 2) == 4
    with pytest.raises(IndexError, match=r"Expected row numbers 0 to 2 .*Received: row 3\."):
        row_line(block, 3)
    assert row_line({**block, "line": None}, 0) is None
    assert row_line({k: v for k, v in block.items() if k != "line"}, 0) is None


# ------------------------------------------------------------------------- the manifest's JSON
def test_twenty_thousand_regular_blocks_grow_the_manifest_by_little():
    n = 20_000
    blocks = [{"path": f"/data/day={i // 100:04d}/part-{i:06d}.csv", "offset": 0, "length": 4096 + i % 7,
               "rows": 50 + i % 3, "raw_rows": 50 + i % 3} for i in range(n)]
    before = len(json.dumps(pack_blocks(blocks)))
    with_lines = [{**b, "line": 2} for b in blocks]
    after = len(json.dumps(pack_blocks(with_lines)))
    assert after - before < 2_000, after - before
    assert unpack_blocks(json.loads(json.dumps(pack_blocks(with_lines)))) == with_lines
    big = [{"path": "/data/big.csv", "offset": i * 2**20, "length": 2**20, "rows": 9000 + i % 50,
            "raw_rows": 9000 + i % 50, "line": 2 + i * 9000 + sum(range(i % 50))} for i in range(n)]
    grown = len(json.dumps(pack_blocks(big))) - len(json.dumps(pack_blocks(
        [{k: v for k, v in b.items() if k != "line"} for b in big])))
    assert grown < 8 * n, grown  # a few bytes a block where the lines vary


def test_irregular_blocks_keep_their_rows_lines_through_the_json():
    blocks = [{"path": "a.csv", "offset": 0, "length": 100, "rows": 3, "raw_rows": 3, "line": 2,
               "row_lines": pack_row_lines([0, 2, 5])},
              {"path": "a.csv", "offset": 100, "length": 100, "rows": 2, "raw_rows": 2, "line": 9},
              {"path": "a.csv", "offset": 200, "length": 100, "rows": 2, "raw_rows": 2, "line": None},
              {"path": "b.csv", "offset": 0, "length": -1, "rows": 1, "raw_rows": 2, "line": 2,
               "row_lines": [1, 3]}]  # (a list, as a hand-made block may have: packed too)
    back = unpack_blocks(json.loads(json.dumps(pack_blocks(blocks))))
    assert back[:3] == blocks[:3] and back[3]["row_lines"] == pack_row_lines([1, 3])
    assert [row_line(back[0], k) for k in range(3)] == [2, 4, 7]
    assert row_line(back[1], 1) == 10 and row_line(back[2], 0) is None
    assert row_lines(back[3], [0, 1]).tolist() == row_lines(blocks[3], [0, 1]).tolist() == [3, 5]
    assert row_line({**back[0], "raw_rows": 4, "rows": 4}, 0) is None  # not a line per row
    assert row_line({**back[0], "row_lines": "not packed"}, 0) is None  # damaged: not known
    damaged = pack_blocks(blocks)
    damaged["row_lines"]["lines"] = damaged["row_lines"]["lines"][:1]
    with pytest.raises(ValueError, match="Expected the packed lines of each of the 2 blocks"):
        unpack_blocks(damaged)


def test_a_million_rows_some_over_two_lines_pack_to_a_few_kilobytes():
    rng = np.random.default_rng(0)
    offsets = np.cumsum(1 + (rng.random(1_000_000) < 0.01)) - 1
    packed = pack_row_lines(offsets)
    assert len(packed) < 64_000, len(packed)
    block = {"path": "a.csv", "offset": 0, "length": 9, "rows": offsets.size,
             "raw_rows": offsets.size, "line": 5, "row_lines": packed}
    rows = rng.integers(0, offsets.size, 1000)
    assert row_lines(block, rows).tolist() == (offsets[rows] + 5).tolist()


def test_an_old_manifest_without_lines_loads_with_lines_unknown(tmp_path):
    blocks = [{"path": "a.csv", "offset": 0, "length": -1, "rows": 3, "raw_rows": 3}]
    packed = pack_blocks(blocks)
    assert "line" not in packed
    back = unpack_blocks(packed)
    assert back == blocks and row_line(back[0], 0) is None


def test_a_parquet_file_has_no_lines(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "y": [0, 1, 0]}), path)
    blocks, _ = _scan_here(str(path))
    assert blocks[0]["line"] is None and row_line(blocks[0], 0) is None
