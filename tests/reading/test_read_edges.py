"""Edges of reading CSV: unbalanced quotes, quotes that are text, lines longer than a block,
null markers stated and counted. Real files, real gzip streams, real pyarrow."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tracemalloc
import warnings

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskfeed import DataError
from daskfeed.reading._nulls import NA_COUNTS_KEY
from daskfeed.reading._records import Quotes, record_buffers
from daskfeed.reading._source import Source
from daskfeed.reading._streams import open_file
from daskfeed.reading._tables import iter_tables

MiB = 2**20


def _tables(path, **kwargs) -> list[pa.Table]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "1 compressed file", UserWarning)
        src = Source(str(path), **kwargs)
    return [t for b in src.blocks for t in iter_tables(b, src.options)]


# ------------------------------------------------------------------ unbalanced quotes
_HEAD = b'id,text,y\n1,a,0\n2,b,1\n3,"unclosed,1\n'  # the quote opens on line 4, at byte 24


@pytest.fixture(scope="module")
def unclosed(tmp_path_factory):
    """~70 MB of CSV with an unclosed quote on line 4: plain and gzip."""
    d = tmp_path_factory.mktemp("unclosed")
    data = _HEAD + b"".join(b"%d,word %d,1\n" % (i, i % 97) for i in range(4, 4_000_000))
    assert len(data) > 50e6
    (d / "big.csv").write_bytes(data)
    (d / "big.csv.gz").write_bytes(gzip.compress(data, 1))
    return d


_READ_ALL = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from daskfeed import DataError
from daskfeed.reading._source import Source
from daskfeed.reading._splits import SplitError
from daskfeed.reading._tables import iter_tables
src = Source(sys.argv[1], **json.loads(sys.argv[2]))
before, start, msg = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter(), None
try:
    try:
        for block in src.blocks:
            for _ in iter_tables(block, src.options):
                pass
    except SplitError as err:  # as the scan does: the file's blocks decided exactly
        src.split_exactly(err.path)
except DataError as err:
    msg = str(err)
print(json.dumps({"wall_s": time.perf_counter() - start, "msg": msg,
                  "grew_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


@pytest.mark.parametrize(("name", "blocksize", "what"), [
    ("big.csv", None, "never closed before the end of the file"),  # byte ranges: decided exactly
    ("big.csv", MiB, "never closed before the end of the file"),
    ("big.csv.gz", None, "never closed before the end of the file"),  # the limit is 256 MiB
    ("big.csv.gz", MiB, "still open"),  # the limit is 64 MiB: before the end of the file
])
def test_an_unclosed_quote_in_a_large_file_is_a_prompt_error_naming_line_and_byte(
        unclosed, name, blocksize, what):
    options = {"blocksize": blocksize} if blocksize else {}
    out = subprocess.run([sys.executable, "-c", _READ_ALL, str(unclosed / name), json.dumps(options)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    msg = result["msg"]
    assert msg is not None, "an unclosed quote was read without an error"
    assert name in msg and "line 4, byte 24" in msg and what in msg
    assert "'3,\"unclosed,1'" in msg and 'unbalanced "' in msg and "Hint:" in msg
    assert result["wall_s"] < 30
    assert result["grew_mb"] < 400  # the file is 70 MB; at most a few copies of the open field


def test_an_open_quote_stops_the_stream_at_the_limit_with_bounded_memory(unclosed):
    path = str(unclosed / "big.csv.gz")
    limit = MiB
    tracemalloc.start()
    try:
        with open_file(path, {}, "gzip") as f:
            header = f.readline()
            chunks = record_buffers(f, len(header), 64 * 1024, path=path, limit=limit)
            with pytest.raises(DataError, match="still open") as err:
                for _ in chunks:
                    pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    later = int(str(err.value).split("still open ")[1].split(" bytes later")[0].replace(",", ""))
    assert limit < later <= limit + 64 * 1024  # stopped one read past the limit, not at the end
    assert peak < 8 * MiB  # the stream is 70 MB: only the open field (and one read) were held


def test_an_open_quote_at_the_end_of_a_whole_file_is_an_error_not_a_merged_row(write_csv):
    path = write_csv("tail.csv", 'x,y\n1,"ok"\n2,"open\n3,z\n')  # pyarrow alone reads 2 rows
    with pytest.raises(DataError) as err:
        _tables(path)
    assert "line 3, byte 13" in str(err.value) and "tail.csv" in str(err.value)


@pytest.mark.parametrize("text, where", [
    ('x,y\n1,a\n2,"open\n', "line 3, byte 10"),  # in the last field: pyarrow keeps it
    ('x,y\n1,a\n2,"open', "line 3, byte 10"),  # ... with no line break at the end
    ('x,y\n1,"open,a\n2,b\n', "line 2, byte 6"),
])
def test_an_open_quote_in_a_small_file_is_found_wherever_it_is(write_csv, text, where):
    with pytest.raises(DataError, match=where):
        _tables(write_csv("small.csv", text))
    (table,) = _tables(write_csv("fine.csv", 'x,y\n1,"a\nb"\n2,"c,d"\n'))  # closed: fine
    assert table.column("y").to_pylist() == ["a\nb", "c,d"]


def test_quotes_that_are_text_are_read_as_pyarrow_reads_them(tmp_path):
    """A quote inside an unquoted field is text (5'11"), in a stream cut into many chunks."""
    rows = []
    for i in range(60_000):
        if i % 7 == 0:
            rows.append(f'{i},"{i} in\nquotes, ""said""",5\'{i % 12}"\n')
        else:
            rows.append(f'{i},plain {i},5\'{i % 12}"\n')
    text = ("id,note,height\n" + "".join(rows)).encode()
    (tmp_path / "h.csv.gz").write_bytes(gzip.compress(text, 1))
    whole = pacsv.read_csv(io.BytesIO(text), parse_options=pacsv.ParseOptions(newlines_in_values=True),
                           convert_options=pacsv.ConvertOptions(
                               column_types={"note": pa.string(), "height": pa.string()}))

    tables = _tables(tmp_path / "h.csv.gz", blocksize=16 * 1024)

    assert len(tables) > 30
    read = pa.concat_tables([t.select(["id", "note", "height"]) for t in tables]).replace_schema_metadata()
    assert read.equals(whole)


# ------------------------------------------------ the quote scanner, by pyarrow's rules
_Q, _SEP, _LF, _CR = ord('"'), ord(","), ord("\n"), ord("\r")


def _reference(text: bytes) -> tuple[int, bool, int]:
    """pyarrow's quoting, one byte at a time: (cut, inside, opened) at the end of ``text``."""
    inside, field_start, cut, opened, i = False, True, 0, -1, 0
    while i < len(text):
        c = text[i]
        if inside:
            if c == _Q and i + 1 < len(text) and text[i + 1] == _Q:
                i += 2
                continue
            inside = c != _Q
        elif c == _Q and field_start:
            inside, opened, field_start = True, i, False
        else:
            field_start = c in (_SEP, _LF, _CR)
            cut = i + 1 if c == _LF else cut
        i += 1
    return cut, inside, opened


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.binary(max_size=300).map(lambda b: bytes(b'a,"\n\r'[x % 5] for x in b)),
       stride=st.integers(1, 40), steps=st.lists(st.integers(1, 50), max_size=20))
def test_the_quote_scanner_agrees_with_pyarrows_rules_however_it_is_fed(text, stride, steps):
    quotes = Quotes(",", stride=stride)
    end = 0
    for step in steps:  # the buffer grows as reads arrive
        end = min(end + step, len(text))
        quotes.scan(text[:end], final=False)
    quotes.scan(text, final=True)
    cut, inside, opened = _reference(text)
    assert (quotes.cut, quotes.inside) == (cut, inside)
    if inside:
        assert quotes.opened == opened


_FIELD = st.one_of(
    st.text("ab1 '\"", max_size=6).filter(lambda s: not s.startswith('"')),  # unquoted: quotes are text
    st.text('ab,\n"', max_size=8).map(lambda s: '"' + s.replace('"', '""') + '"'),  # quoted
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(_FIELD, _FIELD), min_size=1, max_size=40),
       size=st.integers(1, 64))
def test_buffers_parse_to_what_the_whole_text_parses_to(rows, size):
    text = "".join(f"{i},{a},{b}\n" for i, (a, b) in enumerate(rows)).encode()
    read = pacsv.ReadOptions(column_names=["i", "a", "b"])
    convert = pacsv.ConvertOptions(column_types={"a": pa.string(), "b": pa.string()},
                                   strings_can_be_null=False)
    whole = pacsv.read_csv(io.BytesIO(text), read_options=read, convert_options=convert)

    chunks = [body for _, body in record_buffers(io.BytesIO(text), 0, size)]

    assert b"".join(chunks) == text
    parsed = pa.concat_tables(pacsv.read_csv(io.BytesIO(c), read_options=read, convert_options=convert)
                              for c in chunks if c)
    assert parsed.equals(whole)


# --------------------------------------------------------- lines longer than a block
def _long_line_file(tmp_path, where: str) -> tuple[str, int]:
    rows = [f"{i},short {i},{i % 2}" for i in range(3000)]
    at = {"start": 0, "middle": 1500, "end": 2999}[where]
    rows[at] = f"{at},{'x' * 5_000_000},{at % 2}"  # 5 MB: more than a block, and than pyarrow's 1 MiB
    path = tmp_path / f"long-{where}.csv"
    path.write_text("id,text,y\n" + "\n".join(rows) + "\n")
    return str(path), at


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("blocksize", [MiB, 2_500_000, 4 * MiB])
def test_a_line_longer_than_a_block_is_read_once(tmp_path, where, blocksize):
    path, at = _long_line_file(tmp_path, where)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        src = Source(path, blocksize=blocksize)
    assert src.options.bad_lines == "error"
    tables = [t for b in src.blocks for t in iter_tables(b, src.options)]

    assert len(src.blocks) > 1
    assert sum(t.num_rows for t in tables) == 3000
    ids = sorted(i for t in tables for i in t.column("id").to_pylist())
    assert ids == list(range(3000))
    long = next(t for t in tables if at in t.column("id").to_pylist())
    assert len(long.column("text")[long.column("id").to_pylist().index(at)].as_py()) == 5_000_000


def test_a_line_longer_than_a_block_is_read_in_a_compressed_stream(tmp_path):
    path, _ = _long_line_file(tmp_path, "middle")
    (tmp_path / "long.csv.gz").write_bytes(gzip.compress(open(path, "rb").read(), 1))
    tables = _tables(tmp_path / "long.csv.gz", blocksize=MiB)
    assert sum(t.num_rows for t in tables) == 3000
    assert max(max(map(len, t.column("text").to_pylist())) for t in tables) == 5_000_000


# ------------------------------------------------------------------------ null markers
def _na_counts(table: pa.Table) -> dict:
    return json.loads(table.schema.metadata[NA_COUNTS_KEY])


def test_markers_in_a_text_column_stay_text(write_csv):
    path = write_csv("r.csv", "region,memo,y\nNA,N/A,1\nEU,none yet,0\nJP,,1\nNA,null,0\n")
    (table,) = _tables(path)
    assert table.column("region").to_pylist() == ["NA", "EU", "JP", "NA"]
    assert len(set(table.column("region").to_pylist())) == 3
    assert table.column("memo").to_pylist() == ["N/A", "none yet", None, "null"]
    assert _na_counts(table) == {"memo": {"": 1}}  # the empty field only


def test_markers_in_a_numeric_column_are_missing_and_counted(write_csv):
    path = write_csv("n.csv", "gold,score,y\n10,1.5,1\nNA,N/A,0\nnull,NaN,1\nN/A,,0\n12,2.5,1\n,nan,0\n")
    (table,) = _tables(path)
    assert table.schema.field("gold").type == pa.int64()
    assert table.column("gold").to_pylist() == [10, None, None, None, 12, None]
    assert table.schema.field("score").type == pa.float64()
    assert table.column("score").to_pylist() == [1.5, None, None, None, 2.5, None]
    assert _na_counts(table) == {"gold": {"NA": 1, "null": 1, "N/A": 1, "": 1},
                                 "score": {"N/A": 1, "NaN": 1, "nan": 1, "": 1}}


def test_nan_that_pyarrow_reads_as_a_float_is_missing_and_counted_as_nan(write_csv):
    path = write_csv("f.csv", "score,y\n1.5,1\nNaN,0\nnan,1\n2.5,0\n")
    (table,) = _tables(path)
    assert table.column("score").to_pylist() == [1.5, None, None, 2.5]
    assert _na_counts(table) == {"score": {"NaN": 2}}  # however spelled: one key


def test_infinities_are_missing_and_counted_as_inf_alone_and_among_small_files(write_csv, tmp_path):
    """inf, -inf and Infinity in a float column: no model takes them and no mean holds them; they are
    missing, counted under "inf" (beside NaN), read alone and read with other small files, and the
    scan's statistics are those of the finite values."""
    from daskfeed.scanning._task import scan_blocks

    path = write_csv("i/a.csv", "score,y\n1.5,1\ninf,0\n-Infinity,1\nnan,0\n2.5,1\n")
    (table,) = _tables(path)
    assert table.column("score").to_pylist() == [1.5, None, None, None, 2.5]
    assert _na_counts(table) == {"score": {"inf": 2, "NaN": 1}}
    write_csv("i/b.csv", "score,y\n4.0,1\n-inf,0\n")
    src = Source(str(tmp_path / "i" / "*.csv"))
    out = scan_blocks(list(enumerate(src.blocks)), src.options, "y")
    assert [f["na_counts"] for f in out["facts"]] == [{"score": {"inf": 2, "NaN": 1}},
                                                      {"score": {"inf": 1}}]
    assert out["stats"]["score"]["count"] == 3
    assert out["stats"]["score"]["mean"] == pytest.approx(8.0 / 3)
    assert (out["stats"]["score"]["min"], out["stats"]["score"]["max"]) == (1.5, 4.0)


def test_one_marker_counted_twice_adds_up_alone_and_among_small_files(write_csv, tmp_path):
    """The user's marker "inf" and the rule's infinities are one count, not the last of two; NaN
    spelt two ways too (a file alone, and a run of small files)."""
    from daskfeed.scanning._task import scan_blocks

    path = write_csv("u/a.csv", "score,y\n1,0\ninf,1\ninf,0\n-inf,1\n,0\n")
    (table,) = _tables(path, na_values=["inf"])
    assert table.column("score").null_count == 4
    assert _na_counts(table) == {"score": {"": 1, "inf": 3}}
    write_csv("u/b.csv", "score,y\n-inf,1\ninf,0\n2.5,1\n")
    src = Source(str(tmp_path / "u" / "*.csv"), na_values=["inf"])
    out = scan_blocks(list(enumerate(src.blocks)), src.options, "y")
    assert [f["na_counts"] for f in out["facts"]] == [{"score": {"": 1, "inf": 3}},
                                                      {"score": {"inf": 2}}]


def test_parquet_floats_lose_nan_and_infinities_counted_as_csv_does(tmp_path):
    """A Parquet float column's NaN and infinities are missing and counted (its types are its
    own: no other rule applies), so the scan's statistics hold only finite values."""
    import pyarrow.parquet as pq

    from daskfeed.scanning._task import scan_blocks

    pq.write_table(pa.table({"score": [1.5, float("inf"), float("nan"), 2.5, -float("inf")],
                             "y": [1, 0, 1, 0, 1]}), tmp_path / "p.parquet")
    src = Source(str(tmp_path / "p.parquet"))
    (table,) = list(iter_tables(src.blocks[0], src.options))
    assert table.column("score").to_pylist() == [1.5, None, None, 2.5, None]
    assert _na_counts(table) == {"score": {"NaN": 1, "inf": 2}}
    out = scan_blocks(list(enumerate(src.blocks)), src.options, "y")
    assert out["stats"]["score"]["count"] == 2 and out["stats"]["score"]["mean"] == 2.0


def test_numbers_whose_squares_pass_float64_are_refused_with_the_column_named(write_csv, tmp_path):
    """1e200 and -1e200 have a variance float64 cannot hold: the scan says so, naming the column,
    instead of statistics of an overflowed sum."""
    from daskfeed.scanning._task import scan_blocks

    write_csv("o/a.csv", "big,y\n1e200,1\n-1e200,0\n3,1\n")
    src = Source(str(tmp_path / "o" / "*.csv"))
    with pytest.raises(DataError, match=r"(?s)column 'big'.*float64.*Hint"):
        scan_blocks(list(enumerate(src.blocks)), src.options, "y")


def test_markers_the_user_lists_are_missing_in_every_column(write_csv):
    path = write_csv("u.csv", "region,gold,y\nNA,-999,1\nEU,5,0\nJP,NA,1\n")
    (plain,) = _tables(path)
    (table,) = _tables(path, na_values=["NA", "-999"])
    assert plain.column("region").to_pylist() == ["NA", "EU", "JP"]
    assert table.column("region").to_pylist() == [None, "EU", "JP"]
    assert table.column("gold").to_pylist() == [None, 5, None]
    assert _na_counts(table) == {"region": {"NA": 1}, "gold": {"-999": 1, "NA": 1}}
    assert Source(path, na_values=["NA"]).fingerprint() != Source(path).fingerprint()
    same = Source(path, na_values=["NA", "x"]), Source(path, na_values=["x", "NA"])
    assert same[0].fingerprint() == same[1].fingerprint()


def test_a_block_of_only_markers_stays_text_for_the_scan_to_decide(write_csv):
    lines = [f"{i},{i * 2}" for i in range(2000)] + ["NA,NA", "null,", "N/A,NA"] * 700
    path = write_csv("m.csv", "x,z\n" + "\n".join(lines) + "\n")
    tables = _tables(path, blocksize=8000)
    last = tables[-1]
    assert last.num_rows > 0 and set(last.column("x").to_pylist()) == {"NA", "null", "N/A"}
    assert last.schema.field("x").type == pa.string()  # not turned missing: the scan decides
    assert _na_counts(last) == {"z": {"": last.column("z").null_count}}
    assert tables[0].schema.field("x").type == pa.int64()


def test_a_dtype_override_takes_markers_as_missing_and_names_a_bad_value(write_csv):
    path = write_csv("d.csv", "zip,n,y\n01234,NA,1\nNA,7,0\n")
    (table,) = _tables(path, dtype={"zip": "string", "n": "float64"})
    assert table.column("zip").to_pylist() == ["01234", "NA"]  # text: NA stays text
    assert table.column("n").to_pylist() == [None, 7.0]
    assert _na_counts(table) == {"n": {"NA": 1}}
    bad = write_csv("e.csv", "n,y\n1,0\nabc,1\n")
    with pytest.raises(DataError) as err:
        _tables(bad, dtype={"n": "int64"})
    assert "'n'" in str(err.value) and "abc" in str(err.value) and "Hint:" in str(err.value)


def test_a_dask_dataframe_is_read_the_way_its_csv_is(write_csv):
    """One read pipeline: a dask DataFrame's partitions become Arrow tables with the same null
    markers, types and counts as the same rows parsed from CSV."""
    import dask
    import dask.dataframe as dd
    import pandas as pd

    text = "n,t,e,c,b\n1,x,1,u,true\n,NA,NA,v,false\n3,,3,u,true\n"
    (parsed,) = _tables(write_csv("f.csv", text), na_values=["x"])
    frame = pd.DataFrame({"n": pd.array([1, None, 3], dtype="Int64"), "t": ["x", "NA", None],
                          "e": ["1", "NA", "3"], "c": pd.Categorical(["u", "v", "u"]),
                          "b": [True, False, True]})
    src = Source(dd.from_pandas(frame, npartitions=1), na_values=["x"])
    (table,) = dask.compute(*src.partitions(), scheduler="sync")
    assert table.schema.types == parsed.schema.types
    assert table.to_pydict() == parsed.to_pydict()
    assert _na_counts(table) == _na_counts(parsed) == {
        "n": {"": 1}, "t": {"": 1, "x": 1}, "e": {"NA": 1}}


# ------------------------------------------------------------------ lines without an end
_READ_BOUNDED = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from daskfeed import DataError
from daskfeed.reading._source import Source
from daskfeed.reading._tables import iter_tables
before, start, msg = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter(), None
try:
    src = Source(sys.argv[1], **json.loads(sys.argv[2]))
    src.header()
    for block in src.blocks:
        for _ in iter_tables(block, src.options):
            pass
except DataError as err:
    msg = str(err)
print(json.dumps({"wall_s": time.perf_counter() - start, "msg": msg,
                  "grew_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


@pytest.mark.parametrize(("head", "what"), [
    (b"a,b\n1,", "Expected CSV lines of at most 67,108,864 bytes"),  # a row without an end
    (b"", "Expected a header line of at most 67,108,864 bytes"),  # a header without an end
])
def test_a_line_without_a_break_is_an_error_within_the_limit_not_a_read_of_the_whole(
        tmp_path, head, what):
    """The issue's case: a small .gz of one endless line (here 1 GB of text in ~1 MB) took
    1.5 GB before failing; now the read stops at the limit (four blocksizes, >= 64 MiB)."""
    path = tmp_path / "endless.csv.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(head)
        for _ in range(1024):
            f.write(b"x" * MiB)
    assert path.stat().st_size < 4 * MiB
    out = subprocess.run([sys.executable, "-c", _READ_BOUNDED, str(path), json.dumps({"blocksize": MiB})],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    msg = result["msg"]
    assert msg is not None and what in msg and str(path) in msg and "Hint:" in msg, msg
    assert "xxxx" in msg  # it shows how the line starts
    assert result["grew_mb"] < 400 and result["wall_s"] < 60, result


def test_a_header_field_past_the_csv_modules_limit_is_a_data_error(tmp_path):
    path = tmp_path / "wide.csv"
    path.write_bytes(b'"' + b"n" * (200 * 1024) + b'",y\n1,0\n')
    with pytest.raises(DataError, match=r"Expected a CSV header line in .*wide.csv \(line 1\)"):
        Source(str(path)).header()


# ------------------------------------------------------------------ a header of too many columns
def _wide(path, columns: int) -> None:
    names = [f"c{i}" for i in range(columns)]
    path.write_text(",".join(names) + "\n" + ",".join("1" for _ in names) + "\n", encoding="utf-8")


def test_a_header_of_more_columns_than_the_limit_is_an_error_naming_file_count_and_setting(tmp_path):
    import dask.config

    path = tmp_path / "wide.csv"
    _wide(path, 20_001)
    src = Source(str(path))
    with pytest.raises(DataError) as err:
        src.header()
    text = str(err.value)
    assert f"Expected at most 10,000 columns in the header of {path} (line 1)." in text
    assert "Received: 20,001 columns split on ','; it starts 'c0,c1,c2," in text
    assert "\nHint: " in text and "daskfeed.max-columns" in text and "--sep" in text
    with pytest.raises(DataError, match=r"Received: 20,001 columns"):  # as a worker reads it
        list(iter_tables(src.blocks[0], src.options))

    with dask.config.set({"daskfeed.max-columns": 20_001}):
        wider = Source(str(path))
    # resolved with the read options and handed down: the config's scope has ended
    assert len(wider.header()) == 20_001
    (table,) = iter_tables(wider.blocks[0], wider.options)
    assert table.num_columns == 20_001 and table.num_rows == 1
    assert wider.fingerprint() == src.fingerprint()  # a bound, not a way of reading


@pytest.mark.parametrize("value", ["many", 0, 2.5, True])
def test_a_max_columns_setting_that_is_not_a_count_is_refused(tmp_path, value):
    import dask.config

    from daskfeed import SettingError

    path = tmp_path / "a.csv"
    _wide(path, 3)
    with dask.config.set({"daskfeed.max-columns": value}), pytest.raises(SettingError) as err:
        Source(str(path))
    assert "Expected daskfeed.max-columns to be a whole number of at least 1" in str(err.value)
    assert f"Received: {value!r}." in str(err.value)


# ------------------------------------------------------------------ encodings and line breaks
# (found by tests/e2e/test_csv_fuzz.py)
@pytest.mark.parametrize(("encoding", "what"), [
    ("utf-16", "Expected an encoding in which line breaks, separators and quotes are single ASCII"),
    ("utf-32-le", "Expected an encoding in which line breaks"),
    ("no-such-codec", "Expected a text encoding Python knows"),
])
def test_an_encoding_that_cannot_be_cut_at_line_break_bytes_is_refused(tmp_path, encoding, what):
    from daskfeed import SettingError

    path = tmp_path / "a.csv"
    path.write_bytes("x,y\n1,0\n".encode("utf-16") if encoding == "utf-16" else b"x,y\n1,0\n")
    with pytest.raises(SettingError) as err:
        Source(str(path), encoding=encoding)
    assert what in str(err.value) and f"Received: encoding={encoding!r}" in str(err.value)
    assert "\nHint: " in str(err.value)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "cp1252", "latin-1"])
def test_encodings_whose_line_breaks_are_bytes_are_read(tmp_path, encoding):
    path = tmp_path / "a.csv"
    path.write_bytes("name,y\ncafé,1\nthé,0\n".encode(encoding))
    (table,) = _tables(path, encoding=encoding)
    assert table.column("name").to_pylist() == ["café", "thé"]


def test_a_utf16_file_read_as_utf8_is_named_as_utf16(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes("x,y\n1,0\n".encode("utf-16"))
    with pytest.raises(DataError) as err:
        Source(str(path)).header()
    assert "looks like UTF-16" in str(err.value) and "iconv -f UTF-16 -t UTF-8" in str(err.value)


@pytest.mark.parametrize("size", [3, 200_000])  # within the header's limit, and past it
def test_lines_that_end_with_cr_alone_are_refused_naming_them(tmp_path, size):
    path = tmp_path / "mac.csv"
    path.write_bytes(b"x,y\r" + b"".join(b"%d,1\r" % i for i in range(size)))
    with pytest.raises(DataError) as err:
        Source(str(path), blocksize=2**16).header()
    assert "\\r alone (classic Mac OS)" in str(err.value), str(err.value)
    assert "tr '\\r' '\\n'" in str(err.value)


def test_bytes_of_another_encoding_under_skip_are_an_encoding_error_not_a_bad_line(tmp_path):
    """pyarrow decodes a malformed line as UTF-8 for the bad-line handler: latin-1 bytes there
    raised inside pyarrow ("Exception ignored" on stderr) and the line was called malformed."""
    path = tmp_path / "a.csv"
    path.write_bytes(b"x,y\n" + b"1,0\n2\n" * 3 + b"caf\xe9 au lait\n4,1\n")
    raised: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, raised.append
    try:
        with pytest.raises(DataError) as err:
            _tables(path, bad_lines="skip")
    finally:
        sys.unraisablehook = hook
    assert not raised, raised
    text = str(err.value)
    assert "Expected utf-8 text in" in text and "bytes b'\\xe9'" in text, text
    assert "in the line that starts b'caf\\xe9 au lait'" in text, text
    assert "encoding='latin-1'" in text
    (table,) = _tables(path, bad_lines="skip", encoding="latin-1")  # the right encoding: skipped
    assert table.num_rows == 4


def test_a_long_last_line_of_a_byte_range_is_an_error_within_the_limit_not_a_read_of_it(tmp_path):
    """An uncompressed file: a block reads on past its end to its last record's end, so a line of
    gigabytes was read whole. Now a record running more than the limit past the block's end is a
    DataError naming the line, and the block reads only its own bytes to say so."""
    path = tmp_path / "one-long-line.csv"
    with open(path, "wb") as f:
        f.write(b"a,b\n" + b"".join(b"%d,%d\n" % (i, i % 2) for i in range(2000)))
        f.write(b"7,")  # line 2002: 600 MiB without a break, then more rows
        for _ in range(600):
            f.write(b"y" * MiB)
        f.write(b"\n" + b"".join(b"%d,1\n" % i for i in range(2000)))
    out = subprocess.run([sys.executable, "-c", _READ_BOUNDED, str(path), json.dumps({"blocksize": MiB})],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    msg = result["msg"]
    assert msg is not None and "Expected CSV lines of at most 67,108,864 bytes" in msg, msg
    assert str(path) in msg and "line 2,002" in msg and "'7,yyyy" in msg and "Hint:" in msg, msg
    assert "runs past 629,145," in msg  # the whole line's length, as far as its end
    assert result["grew_mb"] < 400 and result["wall_s"] < 60, result


def test_a_last_line_just_within_the_limit_is_read(tmp_path):
    path = tmp_path / "long-but-fine.csv"
    text = "x" * (3 * MiB)
    path.write_text("id,text,y\n1,a,0\n2," + text + ",1\n3,b,0\n")
    tables = _tables(path, blocksize=64 * 1024)  # a 64 MiB limit: the 3 MiB line is a record
    assert sum(t.num_rows for t in tables) == 3
    assert max(map(len, (v for t in tables for v in t.column("text").to_pylist()))) == 3 * MiB
