"""A date encodes the same whatever type pyarrow gave its block (issue 32, silently wrong dates).

pyarrow reads a block of dates as timestamps, but as text when one value is no date or zoned and
naive times are mixed. The feed's encoder (what training and ``daskfeed predict`` use) read such a
block with pandas: microseconds taken for nanoseconds (every date 1000 times too small), the
format guessed from the first value (other forms became the mean), mixed offsets refused with a
raw "Mixed timezones detected", and a number in a date column taken as nanoseconds. Now every
value reads as pyarrow reads it alone (seconds since 1970, UTC), and a value that is no date gets
the training mean and is counted. (Since then the reader itself reads a block of only dates,
zoned and naive mixed, as timestamps; a block holding a value that is no date stays text.)

The files are real CSV files read by the reader (:func:`daskfeed.reading.iter_tables`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

FILL = -7.0  # the training mean: told apart from any date read

# each alone in a file is a timestamp to pyarrow; together (zoned and naive mixed) they are text
FORMS = [
    "2013-09-23", "2013-09-23T21", "2013-09-23 21:05", "2013-09-23T21:05:07", " 2013-09-23", "2013-09-23 ",
    "2013-09-23T21:05:07Z", "2013-09-23T21Z", "2013-09-23T21:05:07+02", "2013-09-23T21:05:07+0230",
    "2013-09-23T21:05:07+02:30", "2013-09-23 21:05:07-05:30", "2013-09-23T21:05:07-00:00",
    "2013-09-23T21:05:07.5", "2013-09-23 21:05:07.25Z", "2013-09-23T21:05:07.123456789",
    "2013-09-23T21:05:07.123456789-05:30", "1969-12-31T23:59:59.5", "2012-02-29", "0001-01-01",
    "9999-12-31T23:59:59", "1677-09-22T00:00:00.25", "2262-04-10T23:59:59.999999999",
]
# text that is no date (missing: no, they are written); what serving counts as unparsed too
NOT_DATES = ["not a date", "NA", "2013-02-29", "2013-13-01", "2013-09-23T24:00:00",
             "2013-09-23T21:00:00z", "2013-09-23T21:00:00+24", "2013-9-23", "20130923", "٢٠١٣-09-23"]


def _read(path, values: list[str]):
    from daskfeed.reading import Block, ReadOptions, iter_tables

    with open(path, "w", encoding="utf-8") as f:
        f.write("when,y\n" + "".join(f"{v},1\n" for v in values))
    (table,) = iter_tables(Block(str(path), 0, -1, 0), ReadOptions())
    return table


def _encode(path, values: list[str]) -> tuple[str, np.ndarray, np.ndarray]:
    """The block's type to pyarrow, the encoded dates and where a value was no date."""
    from daskfeed.manifest import ColumnCode, Encoding, encode_features

    table = _read(path, values)
    unparsed: dict[str, np.ndarray] = {}
    enc = Encoding("y", "float32", (ColumnCode("when", "datetime", FILL, (), "float64"),))
    x = encode_features(table, enc, unparsed)["when"]
    return str(table.schema.field("when").type), x, unparsed.get("when", np.zeros(len(x), bool))


def _alone(tmp_path, values: list[str]) -> list[float]:
    found = []
    for i, v in enumerate(values):
        kind, x, unparsed = _encode(tmp_path / f"alone{i}.csv", [v])
        assert kind.startswith("timestamp"), (v, kind)  # pyarrow reads it as a date
        assert not unparsed.any()
        found.append(float(x[0]))
    return found


@pytest.mark.parametrize("spoiler", [None, "not a date", ""], ids=["zones-mixed", "a-bad-date",
                                                                    "a-blank"])
def test_each_form_reads_in_a_text_block_exactly_as_alone(tmp_path, spoiler) -> None:
    alone = _alone(tmp_path, FORMS)
    values = FORMS + ([spoiler] if spoiler is not None else [])
    kind, x, unparsed = _encode(tmp_path / "block.csv", values)
    if spoiler == "not a date":
        assert kind == "string"  # pyarrow gave up on the block: the encoder reads it value by value
        assert x[:len(FORMS)].tolist() == alone  # exactly: fractions, zones, every form
    else:  # only dates (and a blank): the reader read them as pyarrow reads each alone
        assert kind == "timestamp[us, tz=UTC]"  # (years 0001 and 9999: beyond nanoseconds)
        # exact but for a fraction: ticks of another unit round otherwise in float64 (and
        # digits past the microsecond are not held), by under a microsecond
        fraction = [i for i, v in enumerate(FORMS) if "." in v]
        exact = [i for i in range(len(FORMS)) if i not in fraction]
        assert x[exact].tolist() == [alone[i] for i in exact]
        assert np.abs(x[fraction] - np.array(alone)[fraction]).max() < 1e-6
    assert unparsed.tolist() == [False] * len(FORMS) + ([spoiler == "not a date"] if spoiler
                                                         is not None else [])
    if spoiler is not None:
        assert x[-1] == FILL
    # and the seconds are the UTC ones (not 1000 times too small, not the mean)
    assert x[0] == datetime(2013, 9, 23, tzinfo=timezone.utc).timestamp() == 1379894400.0
    zoned = datetime(2013, 9, 23, 21, 5, 7, tzinfo=timezone(timedelta(hours=2, minutes=30)))
    assert x[FORMS.index("2013-09-23T21:05:07+02:30")] == zoned.timestamp() == 1379961307.0
    assert x[FORMS.index("2013-09-23T21:05:07.5")] == 1379970307.5


def test_values_that_are_no_dates_get_the_mean_and_are_counted(tmp_path) -> None:
    values = ["2013-09-23", " 2013-09-23T00:00 ", *NOT_DATES, "", "   "]
    kind, x, unparsed = _encode(tmp_path / "bad.csv", values)
    assert kind == "string"
    # spaces around a date are ignored, as serving ignores them (pyarrow: around a date only)
    assert x.tolist() == [1379894400.0] * 2 + [FILL] * (len(NOT_DATES) + 2)
    # blanks are missing (the mean, not counted); every other value that is no date is counted
    assert unparsed.tolist() == [False] * 2 + [True] * len(NOT_DATES) + [False, False]


def test_a_number_in_a_date_column_is_no_date(tmp_path) -> None:
    # a block of numbers is int64 to pyarrow: 20130923 was 20130923 ns, 0.02 s after 1970
    kind, x, unparsed = _encode(tmp_path / "numbers.csv", ["20130923", "", "1379894400"])
    assert kind == "int64"
    assert x.tolist() == [FILL] * 3
    assert unparsed.tolist() == [True, False, True]


def test_date_seconds_reads_parquet_and_pandas_types_alike(tmp_path) -> None:
    import pandas as pd
    import pyarrow as pa

    from daskfeed.manifest import ColumnCode, Encoding
    from daskfeed.manifest._encoding import date_seconds, encode_frame

    text = ["2013-09-23T21:05:07+02:00", "2013-09-23", None, "later"]
    secs, unparsed = date_seconds(pa.chunked_array([pa.array(text[:2]), pa.array(text[2:])]))
    want = [1379963107.0, 1379894400.0]
    assert secs[:2].tolist() == want and np.isnan(secs[2:]).all()
    assert unparsed.tolist() == [False, False, False, True]
    typed = pa.array([datetime(2013, 9, 23, 19, 5, 7), None], pa.timestamp("us"))
    assert date_seconds(typed)[0][0] == want[0]
    assert date_seconds(pa.array([15971], pa.date32()))[0].tolist() == [want[1]]
    assert date_seconds(pa.array(["2013-09-23"]).dictionary_encode())[0].tolist() == [want[1]]
    # a pandas frame (encode_frame) reads its dates through the same function
    enc = Encoding("y", "float32", (ColumnCode("when", "datetime", FILL, (), "float64"),))
    frame = pd.DataFrame({"when": text, "y": [1.0] * 4})
    assert encode_frame(frame, enc).x["when"].tolist() == [*want, FILL, FILL]
    frame["when"] = pd.to_datetime(frame["when"], utc=True, format="ISO8601", errors="coerce")
    assert encode_frame(frame, enc).x["when"].tolist() == [*want, FILL, FILL]


def test_the_feed_counts_over_the_rows_it_keeps(tmp_path) -> None:
    from daskfeed.manifest import ColumnCode, Encoding, encode_table

    path = tmp_path / "labelled.csv"
    path.write_text("when,y\n2013-09-23,1\nyesterday,\n2013-09-23T21:00+02,0\nsoon,1\n",
                    encoding="utf-8")
    from daskfeed.reading import Block, ReadOptions, iter_tables

    (table,) = iter_tables(Block(str(path), 0, -1, 0), ReadOptions())
    enc = Encoding("y", "float32", (ColumnCode("when", "datetime", FILL, (), "float64"),))
    unparsed: dict[str, np.ndarray] = {}
    data = encode_table(table, enc, unparsed)  # the row without a label is dropped
    assert data.x["when"].tolist() == [1379894400.0, 1379962800.0, FILL]
    assert unparsed["when"].tolist() == [False, False, True]
