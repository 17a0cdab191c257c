"""Where a value is (daskfeed.reading._locate): its line as an editor counts it, in any block.

Real files read again block by block, byte ranges and whole compressed files; quoted fields over
several lines, ``\\r\\n`` line ends, other separators. The lines are checked against Python's
``csv`` module reading the whole file at once.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import shutil
import tempfile
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskfeed.reading import Source, locate_values

_VALUES = st.sampled_from(["1", "-2.5", "?", "-", "x y", "", "?x"])
_QUOTED = st.sampled_from(['"a\nb"', '"c,d"', '"e""f"', '"?"', "plain"])


def _first_lines(text: str, sep: str, field: int) -> dict[str, int]:
    """Each value's first line in field ``field`` (reference: the whole text at once)."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=sep)
    next(reader)
    first: dict[str, int] = {}
    before = 1
    for row in reader:
        if field < len(row) and row[field]:
            first.setdefault(row[field], before + 1)
        before = reader.line_num
    return first


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(st.tuples(_VALUES, _QUOTED, _VALUES), min_size=1, max_size=120),
       sep=st.sampled_from([",", ";", "\t"]), eol=st.sampled_from(["\n", "\r\n"]),
       blocksize=st.sampled_from([40, 100, 333, None]), gz=st.booleans(), field=st.sampled_from([0, 2]))
def test_each_value_is_found_on_its_first_line_whatever_the_blocks(rows, sep, eol, blocksize, gz, field):
    text = eol.join(sep.join(r) for r in [("v", "q", "w"), *rows]) + eol
    d = tempfile.mkdtemp(prefix="daskfeed-locate-")
    try:
        path = os.path.join(d, "f.csv.gz" if gz else "f.csv")
        with open(path, "wb") as f:
            f.write(gzip.compress(text.encode()) if gz else text.encode())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a compressed file is one block)
            src = Source(path, sep=sep, blocksize=blocksize)
        if not gz:  # where each block's records start, decided from the whole file (as a scan may)
            src.split_exactly(path)
        want = _first_lines(text, sep, field)
        found: dict[str, int] = {}
        for block in src.blocks:
            for spot in locate_values(block, src.options, ["v", "q", "w"][field], set(want)):
                assert (spot.path, spot.column, spot.field, spot.from_byte) == (path, ["v", "q", "w"][field],
                                                                               field + 1, 0)
                found[spot.value] = min(found.get(spot.value, spot.line), spot.line)
        assert found == want
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_missing_column_or_no_values_find_nothing(tmp_path):
    (tmp_path / "f.csv").write_text("a,b\n1,?\n", encoding="utf-8")
    src = Source(str(tmp_path / "f.csv"))
    assert locate_values(src.blocks[0], src.options, "c", ["?"]) == []
    assert locate_values(src.blocks[0], src.options, "b", []) == []
    [spot] = locate_values(src.blocks[0], src.options, "b", ["?", "absent"])
    assert spot.describe() == f"line 2 of {tmp_path / 'f.csv'} (column 'b', field 2)"
