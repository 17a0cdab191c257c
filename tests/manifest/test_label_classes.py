"""Text class labels (daskfeed.manifest._labels): classes, class codes, unknown classes of a block.

(tests/manifest/test_labels.py trains on labels as users have them; this file tests the module.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from daskfeed.core import SchemaError
from daskfeed.manifest import Column
from daskfeed.manifest._labels import MAX_CLASSES, class_codes, text_classes, unknown_classes
from daskfeed.reading import ReadOptions, Source

MEDALS = ("bronze", "gold", "silver")


def label(distinct: int = 0, approximate: bool = False) -> Column:
    return Column("medal", "categorical", "string", distinct=distinct, approximate=approximate)


def test_classes_are_sorted_by_name_with_their_rows():
    got = text_classes(label(3), {"silver": 4, "gold": 7, "bronze": 1})
    assert got == {"bronze": 1, "gold": 7, "silver": 4} and list(got) == list(MEDALS)


def test_the_most_classes_are_taken():
    values = {f"c{i:04d}": 1 for i in range(MAX_CLASSES)}
    assert len(text_classes(label(MAX_CLASSES), values)) == MAX_CLASSES


@pytest.mark.parametrize(("column", "shown"), [
    (label(MAX_CLASSES + 1), f"{MAX_CLASSES + 1:,}"),  # more distinct values than counted
    (label(5, approximate=True), "~5"),  # counts that are not exact
])
def test_too_many_or_inexact_classes_are_refused(column, shown):
    values = {"b": 1, "a": 2, "d": 1, "c": 1, "e": 1}
    with pytest.raises(SchemaError) as err:
        text_classes(column, values)
    assert str(err.value) == (
        f"Expected a text label with at most {MAX_CLASSES:,} classes. Received: label 'medal' with "
        f"{shown} distinct values, such as ['a', 'b', 'c'].\nHint: it looks like a regression "
        "target written as text, or an id: pick another label column, or write the target as numbers.")


@pytest.mark.parametrize("col", [
    pa.array(["gold", None, "tin", "bronze", "silver", ""]),
    pa.array(["gold", None, "tin", "bronze", "silver", ""], pa.large_string()),
    pa.array(["gold", None, "tin", "bronze", "silver", ""]).dictionary_encode(),
    pa.chunked_array([pa.array(["gold", None, "tin"]), pa.array(["bronze", "silver", ""])]),
], ids=["string", "large_string", "dictionary", "chunked"])
def test_codes_are_positions_among_the_classes_and_minus_one_for_unknown_or_missing(col):
    codes, labelled = class_codes(col, MEDALS)
    assert codes.dtype == np.int64 and labelled.dtype == bool
    assert codes.tolist() == [1, -1, -1, 0, 2, -1]
    assert labelled.tolist() == [True, False, True, True, True, True]


def test_numbers_are_matched_as_their_text():
    codes, labelled = class_codes(pa.array([1, 2, None, 3]), ("1", "3"))
    assert codes.tolist() == [0, -1, -1, 1] and labelled.tolist() == [True, True, False, True]


@pytest.mark.parametrize("col", [pa.nulls(3), pa.chunked_array([pa.nulls(1), pa.nulls(2)])])
def test_a_column_of_nothing_has_no_label(col):
    codes, labelled = class_codes(col, MEDALS)
    assert codes.tolist() == [-1, -1, -1] and labelled.tolist() == [False] * 3


def test_a_column_of_no_chunks_is_empty():
    codes, labelled = class_codes(pa.chunked_array([], pa.string()), MEDALS)
    assert codes.shape == labelled.shape == (0,)


def test_unknown_classes_of_a_block_count_them_and_name_the_first(write_csv):
    path = write_csv("d/medals.csv", "x,medal\n1,gold\n2,\n3,tin\n4,silver\n5,tin\n6,lead\n")
    src = Source(path)
    got = unknown_classes(0, src.blocks[0], ReadOptions(), "medal", MEDALS)
    assert got == {"rows": 3, "row": 2, "value": "tin"}
    assert unknown_classes(0, src.blocks[0], ReadOptions(), "medal", (*MEDALS, "lead", "tin")) == {
        "rows": 0, "row": None, "value": None}
