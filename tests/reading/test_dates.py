"""A text column of ISO 8601 dates that pyarrow leaves as text reads as dates: zoned and naive
times mixed in one block (a time without a zone taken as UTC, counted), null markers among dates
(missing, counted); a column holding one value that is no date stays text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.manifest._encoding import date_seconds
from daskfeed.reading import iso_seconds
from daskfeed.reading._nulls import na_counts, naive_times
from daskfeed.reading._small_files import SmallFiles
from daskfeed.reading._source import Source
from daskfeed.reading._tables import iter_tables


def _read(write_csv, text: str, **options) -> pa.Table:
    src = Source(write_csv("d.csv", text), **options)
    (table,) = iter_tables(src.blocks[0], src.options)
    return table


_TICKS = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _alone(value: str, unit: str) -> int:
    """Ticks (in ``unit``) since 1970 UTC of one value as pyarrow reads it, its column's only value."""
    import pyarrow.csv as pacsv

    col = pacsv.read_csv(pa.BufferReader(f"when\n{value}\n".encode()),
                         convert_options=pacsv.ConvertOptions(timestamp_parsers=[])).column(0)
    if pa.types.is_date(col.type):
        col = col.cast(pa.timestamp("s"))
    assert pa.types.is_timestamp(col.type), (value, col.type)
    return col.cast(pa.int64())[0].as_py() * (_TICKS[unit] // _TICKS[col.type.unit])


def test_zoned_and_naive_times_in_one_block_read_as_utc_dates(write_csv):
    table = _read(write_csv, "when,y\n2013-09-23T21:00:00Z,1\n2013-09-23 21:00:00,0\n"
                             "2013-09-24T01:00:00+02:00,1\n2013-09-23,0\n")
    col = table.column("when")
    assert col.type == pa.timestamp("s", "UTC")
    assert col.cast(pa.int64()).to_pylist() == [1379970000, 1379970000, 1379977200, 1379894400]
    assert naive_times(table) == {"when": 2}  # the naive time and the date alone
    assert na_counts(table) == {}


def test_markers_among_dates_are_missing_and_counted(write_csv):
    table = _read(write_csv, "when,y\nNA,1\n2013-09-23 21:00:00.25,0\n  ,1\nnull,0\n,1\n"
                             "2013-09-23,0\n")
    col = table.column("when")
    assert col.type == pa.timestamp("ns")  # no zone: naive, as pyarrow types such a column
    assert col.null_count == 4
    assert col.cast(pa.int64()).to_pylist()[1] == 1379970000_250_000_000
    assert na_counts(table) == {"when": {"": 1, "NA": 1, "null": 1, "  ": 1}}
    assert naive_times(table) == {}  # nothing zoned: nothing to say


def test_one_value_that_is_no_date_keeps_the_column_text(write_csv):
    for odd in ("yesterday", "2013-02-30", "20130923"):
        table = _read(write_csv, f"when,y\n2013-09-23T21:00:00Z,1\n2013-09-23 21:00:00,0\n{odd},1\n")
        assert pa.types.is_string(table.column("when").type), odd
        assert naive_times(table) == {}


def test_a_user_marker_among_dates_is_missing(write_csv):
    table = _read(write_csv, "when,y\n2013-09-23T21:00:00Z,1\nunknown,0\n2013-09-23 22:00:00,1\n",
                  na_values=["unknown"])
    assert table.column("when").type == pa.timestamp("s", "UTC")
    assert na_counts(table) == {"when": {"unknown": 1}}


def test_small_files_parsed_together_read_mixed_dates_as_each_file_alone(write_csv, tmp_path):
    texts = ["t,y\n2013-09-23 21:00:00,1\n2013-09-23T21:00:00Z,0\n",  # mixed: the run reads text
             "t,y\n2013-09-23T21:00:00Z,1\n2013-09-23T22:00:00+01:00,0\n",
             "t,y\n2013-09-23 21:00:00,1\nNA,0\n",  # naive, a marker
             "t,y\n2013-09-24T21:00:00Z,1\n2013-09-24 21:00:00,1\n2013-09-24 22:00:00,1\n"]
    for i, text in enumerate(texts):
        write_csv(f"s/f{i}.csv", text)
    src = Source(str(tmp_path / "s" / "*.csv"))
    alone = [next(iter(iter_tables(b, src.options))) for b in src.blocks]
    runs = SmallFiles(list(enumerate(src.blocks)), src.options).runs(0)
    got = [run.table.slice(a, b - a) for run in runs
           for a, b in zip(run.bounds[:-1], run.bounds[1:], strict=True)]
    assert len(runs) > 1 and len(got) == len(alone)  # parsed together, then typed file by file
    for x, y in zip(alone, got, strict=True):
        assert x.equals(y, check_metadata=True), (x.schema, y.schema)
    assert [naive_times(t) for t in alone] == [{"t": 1}, {}, {}, {"t": 2}]
    assert [str(t.column("t").type) for t in alone] == [
        "timestamp[s, tz=UTC]", "timestamp[s, tz=UTC]", "timestamp[s]", "timestamp[s, tz=UTC]"]


_FORMS = st.sampled_from(["{d}", "{d}T{h}", "{d} {h}:{m}", "{d}T{h}:{m}:{s}", "{d}T{h}:{m}:{s}Z",
                          "{d} {h}:{m}:{s}.{f}", "{d}T{h}:{m}:{s}+{zh}:30", "{d}T{h}:{m}:{s}-{zh}",
                          "{d}T{h}:{m}:{s}.{f}+{zh}{zh}"])


@st.composite
def _date(draw) -> str:
    y, mo, d = draw(st.integers(1700, 2200)), draw(st.integers(1, 12)), draw(st.integers(1, 28))
    return draw(_FORMS).format(
        d=f"{y:04d}-{mo:02d}-{d:02d}", h=f"{draw(st.integers(0, 23)):02d}",
        m=f"{draw(st.integers(0, 59)):02d}", s=f"{draw(st.integers(0, 59)):02d}",
        f=str(draw(st.integers(0, 10**9 - 1))).rjust(draw(st.integers(1, 9)), "0")[:9],
        zh=f"{draw(st.integers(0, 14)):02d}")


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.one_of(_date(), st.sampled_from(["", "NA", "null", " "])), min_size=1,
                       max_size=30))
def test_each_value_reads_as_it_reads_alone(tmp_path_factory, values):
    """Whatever the mix, a value of a column of dates reads as pyarrow reads it alone (zones in
    UTC, a time without one as UTC), or is missing when it is a marker or blank."""
    path = tmp_path_factory.mktemp("mix") / "d.csv"
    path.write_text("when,y\n" + "".join(f"{v},1\n" for v in values), encoding="utf-8")
    src = Source(str(path))
    (table,) = iter_tables(src.blocks[0], src.options)
    col = table.column("when")
    blank = [v.strip() in ("", "NA", "null") for v in values]
    if all(blank):
        return  # nothing but markers: the scan decides what the column is
    assert pa.types.is_timestamp(col.type), (values, col.type)
    want = [None if b else _alone(v, col.type.unit) for v, b in zip(values, blank, strict=True)]
    assert col.cast(pa.int64()).to_pylist() == want  # exactly, in the column's unit
    # value by value, the encoding's and serving's reading of dates left as text agrees (up to
    # float64's rounding of nanosecond ticks in a column with a fraction somewhere)
    secs, unread = iso_seconds(pa.array(values))
    assert not unread[~np.array(blank)].any()
    np.testing.assert_allclose(secs, date_seconds(col)[0], rtol=0, atol=2e-6)
