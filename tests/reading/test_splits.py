"""Splitting one CSV file into blocks when quoted fields hold line breaks: speculated starts
checked by every block, exact starts chained from the file's start. Real files, real pyarrow."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskfeed import DataError
from daskfeed.reading._source import Source
from daskfeed.reading._splits import SplitError, record_start
from daskfeed.reading._tables import iter_tables

_NAMES = ["i", "a", "b"]
_TEXT = {name: "string" for name in _NAMES}


def _whole(text: bytes) -> pa.Table:
    """What pyarrow reads from the whole file (every column as text)."""
    return pacsv.read_csv(
        io.BytesIO(text), parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(_NAMES, pa.string()),
                                             strings_can_be_null=True, null_values=[""]))


def _blocks(src: Source) -> pa.Table:
    tables = [t.select(_NAMES).cast(pa.schema([(n, pa.string()) for n in _NAMES]))
              for b in src.blocks for t in iter_tables(b, src.options)]
    return pa.concat_tables(tables).replace_schema_metadata() if tables else _whole(b"i,a,b\n")


def _read(path: str, blocksize: int) -> tuple[pa.Table, bool]:
    """The file read block by block as the scan reads it: speculated, then exact if that fails."""
    src = Source(path, blocksize=blocksize, dtype=_TEXT)
    try:
        return _blocks(src), False
    except SplitError as err:
        src.split_exactly(err.path)
        return _blocks(src), True


_FIELD = st.one_of(
    st.just(""),
    st.text("ab1 '\"", min_size=1, max_size=6).filter(lambda s: not s.startswith('"')),  # quotes are text
    st.text('ab,\n"', max_size=10).map(lambda s: '"' + s.replace('"', '""') + '"'),  # quoted
    st.text('a\r\n,"', max_size=10).map(lambda s: '"' + s.replace('"', '""') + '"'),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_FIELD, _FIELD, st.sampled_from(["\n", "\r\n"])), min_size=1,
                     max_size=40),
       blocksize=st.integers(1, 400), exact=st.booleans())
def test_any_valid_csv_split_anywhere_reads_as_pyarrow_reads_it_whole(tmp_path, rows, blocksize, exact):
    text = ("i,a,b\n" + "".join(f"{i},{a},{b}{end}" for i, (a, b, end) in enumerate(rows))).encode()
    path = tmp_path / "q.csv"
    path.write_bytes(text)
    whole = _whole(text)

    src = Source(str(path), blocksize=blocksize, dtype=_TEXT)
    if exact:  # the exact starts alone
        src.split_exactly(src.files[0].path)
        assert _blocks(src).equals(whole)
    else:  # speculated: the same rows, or a SplitError, never other rows
        try:
            read = _blocks(src)
        except SplitError:
            return
        assert read.equals(whole)


def test_quoted_line_breaks_in_a_split_file_are_read_at_every_blocksize(tmp_path):
    """A quoted field with line breaks is one value wherever the blocks are cut: no broken rows,
    no row twice; the speculated starts hold on such text."""
    rows = [f'{i},"note {i}\nsecond, line ""q""",{i % 2}' if i % 7 == 0 else f"{i},plain {i},{i % 2}"
            for i in range(300)]
    path = tmp_path / "notes.csv"
    path.write_text("i,a,b\n" + "\n".join(rows) + "\n")
    for blocksize in range(7, 3000, 97):
        read, exact = _read(str(path), blocksize)
        assert not exact, blocksize  # speculation sufficed
        assert read.column("i").to_pylist() == [str(i) for i in range(300)]
        assert read.column("a").to_pylist()[7] == 'note 7\nsecond, line "q"'


def test_a_field_longer_than_a_block_leaves_the_blocks_it_spans_empty(tmp_path):
    long = "x" * 5000
    text = f'i,a,b\n0,"{long}\n{long}",1\n1,b,2\n'.encode()
    path = tmp_path / "long.csv"
    path.write_bytes(text)
    src = Source(str(path), blocksize=1000, dtype=_TEXT)
    try:
        read = _blocks(src)
    except SplitError as err:
        src.split_exactly(err.path)
        read = _blocks(src)
    assert read.equals(_whole(text))
    assert sum(1 for b in src.blocks if b.start == b.stop) >= 8 or not src.splits


def test_a_misleading_start_is_refused_by_the_block_then_read_exactly(tmp_path):
    """Text that misleads the speculation (a quoted field holding more lines that look like
    records than it looks at) is never read wrong: a block refuses it, the exact starts read it."""
    inner = "\n".join(f"{k},plain,x" for k in range(20_000))  # 250 kB, no quote: looks like records
    text = f'i,a,b\n0,"{inner}",1\n1,b,2\n'.encode()
    path = tmp_path / "mislead.csv"
    path.write_bytes(text)
    read, exact = _read(str(path), 20_000)
    assert exact
    assert read.equals(_whole(text))
    assert read.num_rows == 2


def test_an_unbalanced_quote_in_a_split_file_names_its_line_and_byte(tmp_path):
    text = b"i,a,b\n" + b"".join(b"%d,w,1\n" % i for i in range(3)) + b'3,"open,1\n' + \
        b"".join(b"%d,w,1\n" % i for i in range(4, 3000))
    path = tmp_path / "open.csv"
    path.write_bytes(text)
    src = Source(str(path), blocksize=1000, dtype=_TEXT)
    with pytest.raises(SplitError):
        _blocks(src)
    with pytest.raises(DataError) as err:
        src.split_exactly(src.files[0].path)
    msg = str(err.value)
    assert "open.csv" in msg and "line 5, byte 26" in msg and "never closed" in msg and "Hint:" in msg


def test_a_start_is_decided_from_the_bytes_after_the_boundary(tmp_path):
    text = b'i,a,b\n1,"one\ntwo, three",x\n2,b,c\n'
    path = tmp_path / "s.csv"
    path.write_bytes(text)
    with open(path, "rb") as f:
        # the first line break after byte 6 is inside the quoted field: its record ends at ',x\n'
        assert record_start(f, 6, len(text), ",") == text.index(b"2,b,c")
        assert record_start(f, text.index(b"two"), len(text), ",") == text.index(b"2,b,c")
        assert record_start(f, text.index(b"2,b,c") + 1, len(text), ",") == len(text)
