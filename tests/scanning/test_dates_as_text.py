"""Dates pyarrow would leave as text: zoned and naive times mixed in a file, markers among dates,
a stray token. The first two are read as dates (the times without a zone as UTC, said in a note
with their count); the third is refused naming the values and the flag that reads them."""

from __future__ import annotations

import pytest

import daskfeed
from daskfeed import SchemaError


def _times(n: int, zoned_every: int = 0) -> list[str]:
    """Times in 2013-09-20 … 24: every ``zoned_every``-th with a zone (0: none)."""
    out = []
    for i in range(n):
        day, hour = 20 + i % 5, i % 24
        out.append(f"2013-09-{day}T{hour:02d}:00:00Z" if zoned_every and i % zoned_every == 0 else
                   f"2013-09-{day} {hour:02d}:00:00")
    return out


def test_a_column_mixing_zoned_and_naive_times_is_dates_with_a_counted_note(tmp_path, client,
                                                                           write_csv):
    times = _times(400, 3)
    write_csv("d/mixed.csv", "when,x,y\n" + "".join(f"{t},{i},{i % 2}\n" for i, t in enumerate(times)))
    write_csv("d/naive.csv", "when,x,y\n2013-09-25 01:00:00,1,0\nNA,2,1\n")  # no zone: no note
    with pytest.warns(UserWarning, match="mixes times with a zone") as said:
        m = daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client)
    col = m.columns["when"]
    assert col.kind == "datetime" and col.missing == 1 and col.missing_markers == {"NA": 1}
    naive = sum(1 for t in times if not t.endswith("Z"))
    [note] = [n for n in m.notes if "mixes times" in n]
    assert f"and {naive:,} time(s) without one" in note and "read as UTC" in note
    assert note in [str(w.message) for w in said]
    assert col.min == 1379635200.0  # 2013-09-20T00:00:00Z, the first (zoned) time
    assert col.max == 1380070800.0  # 2013-09-25 01:00:00 taken as UTC


def test_a_stray_token_in_a_column_of_dates_is_refused_then_read_as_missing(tmp_path, client,
                                                                           write_csv):
    times = _times(600)
    times[300] = "unknown"
    write_csv("s.csv", "when,y\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(times)))
    data = str(tmp_path / "s.csv")
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(data, label="y", client=client)
    assert str(err.value).startswith(
        "Expected dates in column 'when'. Received: 599 ISO 8601 dates and 1 other value(s) "
        "'unknown' (1), which would make the whole column text categories: 'unknown' on line 302 "
        f"of {data} (column 'when', field 1).\n")
    assert "--na-values unknown (na_values=['unknown'])" in str(err.value)
    m = daskfeed.scan(data, label="y", na_values=["unknown"], client=client)
    assert m.columns["when"].kind == "datetime" and m.columns["when"].missing_markers == {"unknown": 1}
    assert not m.notes
    kept = daskfeed.scan(data, label="y", dtype={"when": "string"}, client=client)
    assert kept.columns["when"].kind == "categorical"
