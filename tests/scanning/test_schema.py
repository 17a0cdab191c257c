"""Column kinds (daskfeed.scanning._schema): per block, merged, resolved, and the scan's refusals.

Pure functions over Arrow columns and the facts / statistics the scan gathers; the blocks are
real files (a :class:`~daskfeed.reading.Source`), named in the messages.
"""

from __future__ import annotations

from functools import reduce

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.core import SchemaError
from daskfeed.manifest import EXACT_FLOAT32, Column
from daskfeed.reading import NA_MARKERS, Source
from daskfeed.scanning._notes import wide_notes
from daskfeed.scanning._refusals import is_number, where
from daskfeed.scanning._schema import (
    add_counts,
    arrow_kind,
    check_headers,
    check_label,
    markers_of,
    markers_only,
    merge_kind,
    resolve_column,
    resolve_columns,
    type_kind,
)

KINDS = ["null", "markers", "int", "float", "string", "datetime", "mixed"]


@pytest.fixture
def src(write_csv) -> Source:
    for i in range(4):
        write_csv(f"d/f{i}.csv", "a,b\n1,2\n")
    return Source(write_csv("d/f0.csv", "a,b\n1,2\n").rsplit("/", 1)[0] + "/*.csv")


def blk(src: Source, i: int) -> str:
    return f"block {i} ({src.blocks[i].path} (whole file))"


# -- one column of one block -------------------------------------------------------------------
@pytest.mark.parametrize(("t", "kind"), [
    (pa.int8(), "int"), (pa.int64(), "int"), (pa.uint32(), "int"), (pa.float32(), "float"),
    (pa.float64(), "float"), (pa.timestamp("s"), "datetime"), (pa.timestamp("ns", "UTC"), "datetime"),
    (pa.string(), "string"), (pa.large_string(), "string"), (pa.null(), "null")])
def test_type_kind(t, kind):
    assert type_kind(t) == kind


def test_arrow_kind_says_null_for_a_column_with_no_value_whatever_its_type():
    assert arrow_kind(pa.chunked_array([pa.array([None, None], pa.float64())])) == "null"
    assert arrow_kind(pa.chunked_array([pa.array([None], pa.string()), pa.array([None], pa.string())])) \
        == "null"
    assert arrow_kind(pa.chunked_array([pa.array([None, 1.5])])) == "float"
    assert arrow_kind(pa.chunked_array([pa.array([], pa.int64())])) == "int"  # no rows: its type
    assert arrow_kind(pa.chunked_array([pa.array(["x", None])])) == "string"


def text(*values, t=None) -> pa.ChunkedArray:
    return pa.chunked_array([pa.array(list(values), t or pa.string())])


def test_markers_only_counts_each_marker_of_a_column_of_nothing_else():
    col = pa.chunked_array([pa.array(["NA", None, "N/A"]), pa.array(["NA", "NULL", None])])
    assert markers_only(col) == {"NA": 2, "N/A": 1, "NULL": 1}
    assert markers_only(text(*NA_MARKERS, t=pa.large_string())) == dict.fromkeys(NA_MARKERS, 1)


@pytest.mark.parametrize("col", [
    text("NA", "gold"),  # a value besides the markers
    text("gold", "NA"),  # told by its first value
    text(None, None),  # no value at all
    text(),
    text("na"),  # markers are case-sensitive: "na" is text
    text(" NA"),
    pa.chunked_array([pa.array([1, None])]),  # not text
], ids=["value-after", "value-first", "all-missing", "empty", "lower-case", "space", "numbers"])
def test_markers_only_is_none_for_anything_else(col):
    assert markers_only(col) is None


def test_a_marker_past_the_first_256_rows_is_still_seen():
    assert markers_only(text(*["NA"] * 300, "gold")) is None
    assert markers_only(text(*[None] * 300, "NA")) == {"NA": 1}


# -- kinds over blocks ---------------------------------------------------------------------------
@pytest.mark.parametrize(("a", "b", "merged"), [
    (None, "int", "int"), (None, "null", "null"), ("null", "null", "null"),
    ("null", "markers", "markers"), ("markers", "null", "markers"),
    ("int", "null", "int"), ("null", "float", "float"),
    ("int", "markers", "int"), ("markers", "string", "string"),  # markers give way to any kind
    ("int", "int", "int"), ("int", "float", "float"), ("float", "int", "float"),
    ("int", "string", "mixed"), ("float", "datetime", "mixed"), ("string", "datetime", "mixed"),
    ("mixed", "int", "mixed"), ("string", "mixed", "mixed")])
def test_merge_kind(a, b, merged):
    assert merge_kind(a, b) == merged


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(KINDS), min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_the_merged_kind_of_blocks_does_not_depend_on_their_order_or_grouping(kinds, rnd):
    """Scan results merge in a tree whose shape depends on timing: any order, any grouping."""
    merged = reduce(merge_kind, kinds, None)
    shuffled = list(kinds)
    rnd.shuffle(shuffled)
    assert reduce(merge_kind, shuffled, None) == merged
    cut = rnd.randrange(1, len(kinds) + 1)
    left, right = reduce(merge_kind, kinds[:cut], None), reduce(merge_kind, kinds[cut:], None)
    assert (merge_kind(left, right) if right is not None else left) == merged
    real = set(kinds) - {"null", "markers"}
    if not real:
        assert merged == ("markers" if "markers" in kinds else "null")
    elif real <= {"int", "float"}:
        assert merged == ("int" if real == {"int"} else "float")
    elif len(real) == 1:
        assert merged == real.pop()
    else:
        assert merged == "mixed"


COUNTS = st.dictionaries(st.sampled_from("abc"), st.dictionaries(st.sampled_from(["", "NA", "null"]),
                                                                 st.integers(0, 100)))


@given(COUNTS, COUNTS)
def test_add_counts_sums_per_column_and_marker_and_leaves_its_inputs_alone(a, b):
    a_before, b_before = repr(a), repr(b)
    out = add_counts(a, b)
    assert (repr(a), repr(b)) == (a_before, b_before)
    # (a column with no marker at all is kept from ``a`` only: no count either way)
    assert {c: m for c, m in out.items() if m} == {c: m for c, m in add_counts(b, a).items() if m}
    assert set(a) <= set(out) <= set(a) | set(b)
    for c in set(a) | {c for c, m in b.items() if m}:
        ma, mb = a.get(c, {}), b.get(c, {})
        assert out[c] == {k: ma.get(k, 0) + mb.get(k, 0) for k in set(ma) | set(mb)}


@pytest.mark.parametrize(("value", "number"), [
    ("1", True), ("-2.5e3", True), (" 7 ", True), ("0x10", False), ("", False), ("gold", False),
    ("1,5", False), ("NA", False), ("1.2.3", False)])
def test_is_number(value, number):
    assert is_number(value) is number


# -- headers -------------------------------------------------------------------------------------
def facts(columns, *, rows=1, unscanned=False, **more):
    f = {"columns": list(columns), "rows": rows if columns else 0, **more}
    if unscanned:
        f["unscanned"] = True
    return f


def test_where_names_the_block_and_its_bytes(src):
    assert where(src, 2) == blk(src, 2) and src.blocks[2].path.endswith("f2.csv")


def test_the_same_header_everywhere_is_the_columns(src):
    notes: list[str] = []
    assert check_headers(src, [facts("ab")] * 4, notes) == (["a", "b"], set())
    assert notes == []


def test_a_header_in_another_order_is_aligned_by_name(src):
    cols, aligned = check_headers(src, [facts("ab"), facts("ba"), facts("ab"), facts("ba")], [])
    assert cols == ["a", "b"] and aligned == {src.blocks[1].path, src.blocks[3].path}


def test_empty_files_are_skipped_with_a_note_and_the_first_with_rows_is_the_reference(src):
    notes: list[str] = []
    got = check_headers(src, [facts(""), facts("ba"), facts(""), facts("ab")], notes)
    assert got == (["b", "a"], {src.blocks[3].path})
    assert notes == [f"2 empty file(s) skipped (no header, no rows), e.g. {src.blocks[0].path}."]
    notes.clear()
    check_headers(src, [facts("ab"), facts("", unscanned=True), facts("ab"), facts("ab")], notes)
    assert notes == []  # a block not scanned is not an empty file


def test_another_header_is_refused_naming_both_blocks_and_what_differs(src):
    with pytest.raises(SchemaError) as err:
        check_headers(src, [facts(""), facts("ab"), facts("ab"), facts("ac")], [])
    assert str(err.value) == (
        f"Header of {blk(src, 3)} differs from {blk(src, 1)}: missing ['b']; extra ['c'].\n"
        "Expected: ['a', 'b'].\nReceived: ['a', 'c'].\nHint: give all files the same header.")
    with pytest.raises(SchemaError, match=r"differs from block 0 .*: missing \['b'\]\.\n"):
        check_headers(src, [facts("ab"), facts("a")], [])
    with pytest.raises(SchemaError, match=r"differs from block 0 .*: extra \['c'\]\.\n"):
        check_headers(src, [facts("ab"), facts("abc")], [])


def test_no_rows_anywhere_is_refused(src):
    with pytest.raises(SchemaError) as err:
        check_headers(src, [facts("")] * 4, [])
    assert str(err.value) == ("Expected rows in the data. Received: every file is empty.\n"
                              "Hint: check the glob matches the files you mean.")


# -- one column over all blocks ------------------------------------------------------------------
def resolve(src, kinds, missing=0, st_=None, fs=None, k=3) -> Column:
    return resolve_column(src, "x", kinds, missing, st_ or {}, fs or [facts("x")] * 4, k)


NUM_STATS = {"count": 4, "mean": 2.5, "m2": 5.0, "min": 1, "max": 4}


def test_an_int_column_is_int64_with_its_moments_and_exact_bounds(src):
    c = resolve(src, {"int": 0}, st_={**NUM_STATS, "max": 2**60})
    assert (c.kind, c.dtype, c.integer, c.missing) == ("numeric", "int64", True, 0)
    assert (c.count, c.mean, c.var, c.min, c.max) == (4, 2.5, 1.25, 1, 2**60)
    assert isinstance(c.max, int)


@pytest.mark.parametrize(("kinds", "missing"), [({"int": 0}, 3), ({"int": 0, "float": 2}, 0),
                                                ({"float": 1, "null": 0}, 0)])
def test_blanks_or_a_float_block_make_an_int_column_float64(src, kinds, missing):
    c = resolve(src, kinds, missing, NUM_STATS)
    assert (c.kind, c.dtype, c.missing) == ("numeric", "float64", missing)
    assert c.integer is (kinds.keys() == {"int"})


def test_bounds_that_are_not_finite_are_none(src):
    c = resolve(src, {"float": 0}, st_={**NUM_STATS, "min": float("-inf"), "max": float("nan")})
    assert (c.min, c.max) == (None, None)
    c = resolve(src, {"float": 0}, st_={"count": 0})
    assert (c.count, c.mean, c.var, c.min, c.max) == (0, 0.0, 0.0, None, None)


def test_markers_in_some_blocks_give_way_to_the_others(src):
    c = resolve(src, {"markers": 0, "int": 2}, st_=NUM_STATS)
    assert (c.kind, c.dtype) == ("numeric", "int64")


def test_nothing_but_markers_is_text_counting_them_as_values(src):
    c = resolve(src, {"markers": 0, "null": 1}, st_={"count": 0, "markers": 5, "values": {"NA": 5}})
    assert (c.kind, c.dtype, c.count, c.vocabulary) == ("categorical", "string", 5, ["NA"])


def test_a_column_with_no_value_is_empty(src):
    c = resolve(src, {"null": 0}, missing=4)
    assert (c.kind, c.dtype, c.missing, c.count) == ("empty", "null", 4, 0)
    assert resolve(src, {}).kind == "empty"


def test_dates_are_a_datetime_column(src):
    c = resolve(src, {"datetime": 1, "null": 0}, missing=1, st_={**NUM_STATS, "min": 1.7e9, "max": 1.8e9})
    assert (c.kind, c.dtype, c.missing, c.min, c.max, c.integer) == (
        "datetime", "datetime64", 1, 1.7e9, 1.8e9, False)


def test_text_keeps_the_k_most_frequent_values_and_counts_the_rest(src):
    values = {"gold": 5, "bronze": 5, "silver": 9, "tin": 1, "lead": 2}
    c = resolve(src, {"string": 0}, missing=2, k=3, st_={"count": 22, "values": values})
    assert c.vocabulary == ["silver", "bronze", "gold"]  # by count, then by name
    assert (c.oov_rows, c.distinct, c.count, c.missing, c.approximate) == (3, 5, 22, 2, False)
    c = resolve(src, {"string": 0}, st_={"count": 22, "values": values, "distinct": 900,
                                         "approximate": True})
    assert (c.distinct, c.approximate) == (900, True)


def test_numbers_in_one_block_and_text_in_another_is_refused_naming_both(src):
    fs = [facts("x"), facts("x"), facts("x", samples={"x": ["gold", "silver"]}), facts("x")]
    with pytest.raises(SchemaError) as err:
        resolve(src, {"null": 0, "int": 1, "float": 3, "string": 2}, fs=fs)
    assert str(err.value) == (
        f"Column 'x' changes type within the data set: numbers in {blk(src, 1)} but string values "
        f"['gold', 'silver'] in {blk(src, 2)}.\nExpected one type in every block. Hint: pass "
        "--dtype x=string (dtype={'x': 'string'}) to treat it as a category, or exclude it.")


@pytest.mark.parametrize(("kinds", "detail"), [
    ({"float": 3, "mixed": 1}, "numbers mixed with text such as ['1', 'one'] in {1}"),
    ({"datetime": 0, "string": 2}, "dates in {0} but text in {2}"),
    ({"int": 3, "datetime": 1}, "numbers in {3} but datetime values ['1', 'one'] in {1}"),
])
def test_each_drift_names_its_blocks(src, kinds, detail):
    fs = [facts("x", samples={"x": ["1", "one"]})] * 4
    with pytest.raises(SchemaError) as err:
        resolve(src, kinds, fs=fs)
    expected = detail.format(*(blk(src, i) for i in range(4)))
    assert str(err.value).startswith(f"Column 'x' changes type within the data set: {expected}.\n")


def test_resolve_columns_takes_kinds_of_blocks_with_rows_and_sums_missing_and_markers(src):
    fs = [
        {"columns": ["n", "t"], "rows": 3, "kinds": {"n": "int", "t": "string"},
         "missing": {"n": 0, "t": 1}, "na_counts": {"t": {"": 1}}},
        {"columns": ["n", "t"], "rows": 0, "kinds": {"n": "string", "t": "int"},  # no rows: no say
         "missing": {}},
        {"columns": ["n", "t"], "rows": 2, "kinds": {"n": "markers", "t": "markers"},
         "missing": {"n": 0, "t": 0}, "marker_values": {"n": {"NA": 2}, "t": {"NA": 2}}},
        {"columns": ["n", "t"], "rows": 4, "kinds": {"n": "int", "t": "string"},
         "missing": {"n": 1, "t": 0}, "na_counts": {"n": {"": 1, "null": 3}}},
    ]
    stats = {"n": {**NUM_STATS, "count": 6}, "t": {"count": 6, "markers": 2,
                                                    "values": {"a": 4, "NA": 2}}}
    cols = resolve_columns(src, ["n", "t"], fs, stats, vocabulary_size=10)
    assert list(cols) == ["n", "t"]
    n, t = cols["n"], cols["t"]
    assert (n.kind, n.dtype) == ("numeric", "float64")  # a blank in block 3
    assert n.missing == 1 + 2  # the blank, and block 2's two markers
    assert n.missing_markers == {"null": 3, "NA": 2, "": 1}  # most first
    assert (t.kind, t.missing, t.count) == ("categorical", 1, 8)  # "NA" is text here
    assert t.missing_markers == {"": 1}


def test_markers_of_leaves_text_markers_to_a_text_column():
    fs = [{"na_counts": {"x": {"NA": 1, "": 0}}, "marker_values": {"x": {"NA": 4}}},
          {"na_counts": {"y": {"NA": 9}}}]
    assert markers_of("x", "numeric", fs) == {"NA": 5}
    assert markers_of("x", "categorical", fs) == {"NA": 1}
    assert markers_of("z", "numeric", fs) == {}


# -- the label, wide numbers -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numeric", "categorical"])
def test_a_label_of_numbers_or_class_names_is_taken(src, kind):
    check_label(src, "y", Column("y", kind, "float64"), [])


def test_a_label_of_dates_or_no_values_is_refused_naming_its_first_block(src):
    fs = [{"kinds": {}}, {"kinds": {"y": "null"}}, {"kinds": {"y": "datetime"}}, {"kinds": {"y": "null"}}]
    with pytest.raises(SchemaError) as err:
        check_label(src, "y", Column("y", "datetime", "datetime64"), fs)
    assert str(err.value) == (
        f"Expected a label column 'y' of numbers (0/1, class ids, a target) or of class names. "
        f"Received: a datetime column in {blk(src, 2)}.\nHint: check the label name (--label), "
        "or write the label as numbers or class names.")
    with pytest.raises(SchemaError, match=r"Received: no values at all in block 0 "):
        check_label(src, "y", Column("y", "empty", "null"), [{"kinds": {"y": "null"}}] * 4)


def test_wide_numbers_get_one_note_each_saying_what_carries_them():
    cols = {
        "id": Column("id", "numeric", "int64", min=0, max=2**31, integer=True),
        "neg": Column("neg", "numeric", "float64", min=-3.0e9, max=5.0),
        "small": Column("small", "numeric", "int64", min=0, max=EXACT_FLOAT32 - 1, integer=True),
        "none": Column("none", "numeric", "float64"),
        "text": Column("text", "categorical", "string", max=2**40),
        "price": Column("price", "numeric", "int64", min=1, max=2**25, integer=True),
    }
    notes = wide_notes(cols, label="price")
    assert len(notes) == 3
    ident, neg, price = notes
    assert ident.startswith(f"Column 'id' holds values up to 2,147,483,648 (beyond 2**24 = "
                            f"{EXACT_FLOAT32:,}, where float32 stops holding every whole number): "
                            "batches carry it as int64, exactly; a float32 model input rounds it")
    assert ident.endswith("Hint: if it is an id, leave it out (exclude=['id']).")
    assert neg.startswith("Column 'neg' holds values up to -3,000,000,000.0 (") and "as float64" in neg
    assert price.startswith("Label 'price' holds values up to 33,554,432 (") and "as int64" in price
    assert price.endswith("Hint: predict a scaled label (e.g. thousands, or a log).")
