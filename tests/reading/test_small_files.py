"""Small files parsed up to SHARED_FILES per pyarrow call give each block the table it gets alone:
same types, values, null-marker counts; anything unusual falls back to one file at a time."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from daskfeed import DataError
from daskfeed.reading._nulls import na_counts
from daskfeed.reading._small_files import SmallFiles
from daskfeed.reading._source import Source
from daskfeed.reading._tables import iter_tables
from daskfeed.scanning._task import scan_blocks

_FILES = {  # name: text, in the order they are listed
    "a00.csv": "id,name,score,when\n1,anna,0.5,2024-01-02\n2,NA,1.5,2024-01-03\n",
    "a01.csv": 'id,name,score,when\n3,"b, with comma",NA,2024-01-04\n4,,2.5,\n',
    "a02.csv": "id,name,score,when\n5,carl,3.5,2024-01-05",  # no final line break
    "a03.csv": "id,name,score,when\n",  # no rows: ends the run a00-a02
    "a04.csv": "id,name,score,when\n7,dora,x,2024-01-07\n",  # text where the first has numbers
    "a05.csv": 'id,name,score,when\n6,"two\nlines",4.5,2024-01-06\n',  # a field over lines
    "a06.csv": "id,name,score,when\n\n8,emil,5.5,2024-01-08\n",  # a blank line
    "a07.csv": "id,name,score,when\n9,fay,6.5,2024-01-09\n10,gus,7.5,2024-01-10\n",
    "a08.csv": "id,score,name,when\n11,8.5,hal,2024-01-11\n",  # another header
    "a09.csv": "id,name,score,when\n12,ida,9.5,2024-01-12\n",
    "a10.csv": "id,name,score,when\n13,jo,10.5,2024-01-13\n",
}


def _both(pattern, **kwargs):
    """Each block's tables parsed alone, and as a scan task reads them (runs, else alone)."""
    src = Source(pattern, **kwargs)
    items = list(enumerate(src.blocks))
    files = SmallFiles(items, src.options)
    alone = [list(iter_tables(b, src.options)) for _, b in items]
    together: list[list] = []
    while len(together) < len(items):
        runs = files.runs(len(together))
        together += [[t] for run in runs for t in _tables(run)] or [alone[len(together)]]
    return alone, together


def _tables(run):
    """Each block of ``run`` as a table of its own, its null-marker counts in its metadata."""
    from daskfeed.reading._nulls import with_na_counts

    return [with_na_counts(run.table.slice(a, b - a), c)
            for a, b, c in zip(run.bounds[:-1], run.bounds[1:], run.counts, strict=True)]


def test_each_block_gets_the_table_it_gets_alone(write_csv, tmp_path, monkeypatch):
    import daskfeed.reading._small_files as small

    shared = []
    real = small.SmallFiles._parse_together
    monkeypatch.setattr(small.SmallFiles, "_parse_together",
                        lambda self, texts, *a: shared.append(len(texts)) or real(self, texts, *a))
    for name, text in _FILES.items():
        write_csv(f"d/{name}", text)
    alone, together = _both(str(tmp_path / "d" / "*.csv"), na_values=["x"])
    assert len(alone) == len(together) == len(_FILES)
    for name, a, b in zip(_FILES, alone, together, strict=True):
        assert len(a) == len(b), name
        for x, y in zip(a, b, strict=True):
            assert x.equals(y, check_metadata=True), (name, x.schema, y.schema)
    assert shared[0] == 3  # a00-a02 were parsed together (then others tried, some fell back)


def test_many_plain_files_are_parsed_together(write_csv, tmp_path, monkeypatch):
    calls = []
    import daskfeed.reading._small_files as small

    real = small.read_csv
    monkeypatch.setattr(small, "read_csv", lambda *a, **k: calls.append(1) or real(*a, **k))
    for i in range(small.SHARED_FILES + 8):
        write_csv(f"m/f{i:03d}.csv", "x,y,t\n" + "".join(f"{i * 10 + r},{r % 2},w{r}\n" for r in range(10)))
    alone, together = _both(str(tmp_path / "m" / "*.csv"))
    assert all(a[0].equals(b[0], check_metadata=True) for a, b in zip(alone, together, strict=True))
    assert len(calls) == 2 * 2  # two runs (SHARED_FILES, then 8 files), each its first file + the rest


def test_an_open_quote_in_a_run_of_small_files_names_its_file(write_csv, tmp_path):
    for i in range(5):
        text = "x,y\n1,a\n2,b\n" if i != 3 else 'x,y\n1,a\n2,"open\n'
        write_csv(f"q/f{i}.csv", text)
    src = Source(str(tmp_path / "q" / "*.csv"))
    files = SmallFiles(list(enumerate(src.blocks)), src.options)
    assert files.runs(0) == []  # the quote spoils the run: its files are read one by one
    with pytest.raises(DataError, match=r"f3\.csv") as err:
        scan_blocks(list(enumerate(src.blocks)), src.options, "x")
    assert "line 3, byte 10" in str(err.value)


@pytest.mark.parametrize("na_values", [None, ["-999", "none"]])
def test_numbers_marked_once_for_all_files_match_each_file_alone(write_csv, tmp_path, na_values,
                                                               monkeypatch):
    """Columns that are not text get the null-marker rule once per run of files: each file's
    values and marker counts (empties, NaN however spelled, the user's numeric markers) are
    still its own."""
    import daskfeed.reading._small_files as small

    shared = []
    real = small.numbers_by_part
    monkeypatch.setattr(small, "numbers_by_part", lambda col, *a: shared.append(col.type) or real(col, *a))
    nans = ["nan", "NaN", "-nan", "", "1.5"]
    for i in range(12):
        rows = [f"{'' if (i + r) % 5 == 0 else i * 10 + r},{nans[(i * 3 + r) % 5]},"
                f"{'-999' if (i + r) % 4 == 0 else r / 4},{'true' if r % 2 else 'false'},"
                f"2024-01-{r + 1:02d},w{r}" for r in range(6)]
        write_csv(f"n/f{i:02d}.csv", "a,b,c,d,e,t\n" + "\n".join(rows) + "\n")
    alone, together = _both(str(tmp_path / "n" / "*.csv"), na_values=na_values)
    for a, b in zip(alone, together, strict=True):
        assert a[0].equals(b[0], check_metadata=True), (a[0].schema, b[0].schema)
    counts = [na_counts(t[0]) for t in together]
    assert any(c.get("b", {}).get("NaN") for c in counts) and any(c.get("a", {}).get("") for c in counts)
    assert any(c.get("c", {}).get("-999") for c in counts) == bool(na_values)
    assert len(shared) == 5  # a-e: the 11 files after the first, once (t is text: file by file)


def _task_files(write_csv, numbers_in_text: bool) -> None:
    """Twelve small files of one header: blanks, NaN, markers in numbers and text, dates, bools.

    ``numbers_in_text``: one file's ``code`` holds only numbers and another's ``note`` only
    ``NA``: those files' text columns are numbers / markers alone, so the rule goes file by file.
    """
    for i in range(12):
        rows = []
        for r in range(5 + i % 3):
            code = str(100 + r) if numbers_in_text and i == 7 else f"c{(i + r) % 4}"
            note = "NA" if numbers_in_text and i == 9 else ["x", "NA", "", "none", "y"][(i + r) % 5]
            rows.append(",".join([
                "" if (i + r) % 6 == 0 else str(i * 10 + r),                    # id: int, blanks
                ["ann", "NA", '"bo, b"', "none", "cy"][(i * 2 + r) % 5],        # name: text
                "" if i == 4 else ["nan", "-999", "", "1.5", "2.25"][(i + r) % 5],  # score
                "true" if r % 2 else "false",                                 # flag
                f"2024-02-{r + 1:02d}",                                       # when
                code, note, str((i + r) % 2)]))                               # code, note, y
        write_csv(f"t/f{i:02d}.csv", "id,name,score,flag,when,code,note,y\n" + "\n".join(rows) + "\n")


@pytest.mark.parametrize("numbers_in_text", [False, True])
@pytest.mark.parametrize("na_values", [None, ["none", "-999"]])
def test_a_scan_task_of_small_files_gets_what_each_file_gets_alone(write_csv, tmp_path, monkeypatch,
                                                                   na_values, numbers_in_text):
    """A run of small files scanned at once (facts of all its files in one pass, one table to
    the statistics and the cache) gives each file the facts, statistics and cached rows it gets
    scanned on its own; text columns are sampled in the first file that shows text in them."""
    import daskfeed.scanning._task as task
    from daskfeed.cache._open import open_cache
    from daskfeed.scanning._stats import merge_stats

    _task_files(write_csv, numbers_in_text)
    src = Source(str(tmp_path / "t" / "*.csv"), na_values=na_values)
    items = list(enumerate(src.blocks))
    parts = []
    real = task.parts_facts
    monkeypatch.setattr(task, "parts_facts", lambda t, b, *a: parts.append(len(b) - 1) or real(t, b, *a))
    runs_cache, _ = open_cache(src, str(tmp_path / "c1"), compression="none")
    alone_cache, _ = open_cache(src, str(tmp_path / "c2"), compression="none")
    together = task.scan_blocks(items, src.options, "y", runs_cache)
    alone = [task.scan_blocks([item], src.options, "y", alone_cache) for item in items]
    assert max(parts) == (1 if numbers_in_text else 11)  # the eleven after the first: one pass
    sampled = set()
    for i, (t, (a,)) in enumerate(zip(together["facts"], [x["facts"] for x in alone], strict=True)):
        assert {k: v for k, v in t.items() if k != "samples"} == {
            k: v for k, v in a.items() if k != "samples"}, src.blocks[i].describe()
        for name, kind in a["kinds"].items():
            if kind == "string" and name not in sampled:
                sampled.add(name)
                assert t["samples"][name] == a["samples"][name] != []
    assert sampled == {"name", "code", "note"}
    if numbers_in_text:
        assert together["facts"][7]["kinds"]["code"] == "int"
        assert together["facts"][9]["kinds"]["note"] == "markers"
    merged = merge_stats(*[x["stats"] for x in alone])
    assert together["stats"].keys() == merged.keys()
    for name, st in merged.items():
        for key, value in st.items():  # (merging adds "values": None, "markers": 0 where none)
            if not (value is None or (key == "markers" and value == 0)):
                assert together["stats"][name][key] == (
                    pytest.approx(value) if isinstance(value, float) else value), (name, key)
    for i, _ in items:
        (t,), (a,) = runs_cache.tables(i), alone_cache.tables(i)
        assert t.to_pylist() == a.to_pylist(), src.blocks[i].describe()


def test_a_run_keeps_each_files_own_line_breaks(write_csv, tmp_path):
    """A file without a final line break is parsed with one added, not counted among its own."""
    for name, text in (("b0.csv", "x,y\n1,2\n3,4\n"), ("b1.csv", "x,y\n5,6\n7,8\n"),
                       ("b2.csv", "x,y\n9,10")):  # (no final line break)
        write_csv(f"b/{name}", text)
    src = Source(str(tmp_path / "b" / "*.csv"))
    runs = SmallFiles(list(enumerate(src.blocks)), src.options).runs(0)
    assert [i for run in runs for i in run.indices] == [0, 1, 2]
    assert [n for run in runs for n in run.breaks] == [2, 2, 0]


_VALUES = hs.one_of(hs.none(), hs.sampled_from(["", " ", "NA", "null", "x", "EU", "12", "2024-01-01"]))


@settings(max_examples=300, deadline=None)
@given(values=hs.lists(_VALUES, max_size=40), cuts=hs.lists(hs.integers(0, 40), max_size=6),
       skip=hs.sampled_from([(), ("NA", "null"), ("NA", "x", "")]), most=hs.integers(1, 6),
       chunk=hs.integers(1, 40))
def test_each_parts_first_value_is_the_one_it_has_alone(values, cuts, skip, most, chunk):
    """``first_values`` of a column cut in parts (the runs of small files): each part's first value
    among its first ``most`` neither missing nor skipped, as ``_first_value`` of its slice alone."""
    import numpy as np
    import pyarrow as pa

    from daskfeed.reading._nulls import _first_value, first_values

    column = pa.chunked_array([pa.array(values[i:i + chunk], pa.string())
                               for i in range(0, len(values), chunk)] or [pa.array([], pa.string())])
    bounds = np.array(sorted({0, len(values), *(c for c in cuts if c <= len(values))}))
    if len(bounds) < 2:
        bounds = np.array([0, 0])
    got = first_values(column, bounds, skip, most)
    assert got == [_first_value(column.slice(a, b - a), skip, most)
                   for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("first", [" ", "   ", "\t"])
def test_a_blank_first_value_gets_a_file_the_same_kind_alone_and_in_a_run(write_csv, tmp_path, first):
    """The date rule passes over blank values: a file whose column reads ``[blank, a date]`` is
    a date column (the blank missing) scanned alone, and so among small files whose column is
    text (a run's look at each file's first value used to take the blank for text)."""
    from daskfeed.cache._open import open_cache

    write_csv("d/a0.csv", "y,when\n1,north\n0,south\n")
    write_csv("d/a1.csv", f'y,when\n1,"{first}"\n0,2024-01-01\n1,2024-02-03\n')
    write_csv("d/a2.csv", "y,when\n0,east\n1,west\n")
    src = Source(str(tmp_path / "d" / "*.csv"))
    items = list(enumerate(src.blocks))
    together = scan_blocks(items, src.options, "y",
                           open_cache(src, str(tmp_path / "c1"), compression="none")[0])
    alone_cache = open_cache(src, str(tmp_path / "c2"), compression="none")[0]
    alone = [scan_blocks([item], src.options, "y", alone_cache)["facts"][0] for item in items]
    assert [f["kinds"]["when"] for f in together["facts"]] == [a["kinds"]["when"] for a in alone]
    assert alone[1]["kinds"]["when"] != alone[0]["kinds"]["when"]  # (a date, beside text)
    for i, fact in enumerate(together["facts"]):
        assert {k: v for k, v in fact.items() if k != "samples"} == \
            {k: v for k, v in alone[i].items() if k != "samples"}
