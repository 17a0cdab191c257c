"""Class weights from a scan's label counts (daskfeed.manifest._class_weights)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daskfeed.core import ManifestMismatchError, SchemaError, SettingError
from daskfeed.manifest._class_weights import class_weights

MEDALS = ["bronze", "gold", "silver"]


def test_balanced_is_rows_over_classes_times_class_rows():
    w = class_weights("binary", "y", {"0": 30, "1": 10}, None)
    assert w == pytest.approx({0: 40 / (2 * 30), 1: 40 / (2 * 10)})
    assert list(w) == [0, 1]


@given(st.dictionaries(st.integers(0, 50).map(str), st.integers(1, 10**6), min_size=1, max_size=20))
def test_balanced_classes_weigh_the_same_in_total(counts):
    w = class_weights("multiclass", "y", counts, None)
    assert sorted(w) == sorted(int(k) for k in counts)
    total = sum(counts.values())
    for k, n in counts.items():
        assert w[int(k)] * n == pytest.approx(total / len(counts))


def test_classes_without_rows_get_no_weight():
    assert class_weights("multiclass", "y", {"0": 10, "1": 0, "2": 30}, None) == pytest.approx(
        {0: 2.0, 2: 40 / 60})


def test_a_text_label_is_weighed_by_class_code():
    w = class_weights("multiclass", "medal", {"bronze": 10, "gold": 30, "silver": 20}, MEDALS)
    assert w == pytest.approx({0: 2.0, 1: 60 / 90, 2: 1.0})
    assert class_weights("multiclass", "medal", {"bronze": 1, "gold": 1, "silver": 1}, MEDALS,
                         {"gold": 5}) == {0: 1.0, 1: 5.0, 2: 1.0}


def test_a_mapping_gives_its_weights_and_one_to_classes_it_leaves_out():
    counts = {"0": 5, "1": 5, "2": 5}
    assert class_weights("multiclass", "y", counts, None, {"0": 1, "2": 9.5}) == {0: 1.0, 1: 1.0, 2: 9.5}
    assert class_weights("multiclass", "y", counts, None, {1: "3", " 2 ": 0}) == {0: 1.0, 1: 3.0, 2: 0.0}


def test_a_regression_label_has_no_classes():
    with pytest.raises(SchemaError) as err:
        class_weights("regression", "price", {}, None)
    assert str(err.value) == ("Expected a class label (0/1 or class ids) for class weights. "
                              "Received: label 'price', a regression label.\nHint: weigh rows with "
                              "a weight column instead (weight='COL', --weight COL).")


def test_a_manifest_without_label_counts_asks_for_a_rescan():
    with pytest.raises(ManifestMismatchError, match=r"^Expected the label counts of 'y' in the manifest\. "
                                          r"Received: a manifest without them"):
        class_weights("binary", "y", {}, None)


def test_only_balanced_is_a_word():
    with pytest.raises(SettingError) as err:
        class_weights("binary", "y", {"0": 1, "1": 1}, None, "auto")
    assert str(err.value) == ("Expected class weights 'balanced' or a mapping {class: weight}. "
                              "Received: 'auto'.\nHint: e.g. '{\"0\": 1, \"1\": 9}'.")


@pytest.mark.parametrize("key", ["7", "one", 1.5, "-1"])
def test_a_class_not_in_the_data_is_refused_naming_the_classes(key):
    with pytest.raises(SchemaError) as err:
        class_weights("multiclass", "y", {"0": 3, "1": 3, "2": 3}, None, {key: 2})
    assert str(err.value) == (
        f"Expected class weights for the classes of label 'y' (0, 1, 2). Received: class {key!r}."
        "\nHint: name classes by their id, e.g. '{\"0\": 1, \"1\": 9}'.")


def test_a_text_label_s_classes_are_named_by_name():
    with pytest.raises(SchemaError) as err:
        class_weights("multiclass", "medal", {"bronze": 1, "gold": 1, "silver": 1}, MEDALS, {"1": 4})
    assert str(err.value) == (
        "Expected class weights for the classes of label 'medal' (bronze, gold, silver). Received: "
        "class '1'.\nHint: name classes by their name, e.g. '{\"bronze\": 2}'.")


def test_many_classes_are_listed_up_to_twenty():
    counts = {str(i): 1 for i in range(30)}
    with pytest.raises(SchemaError, match=r"\(0, 1, 2, .*, 19 \.\.\.\)\. Received: class '99'"):
        class_weights("multiclass", "y", counts, None, {"99": 1})


@pytest.mark.parametrize("weight", [-1, float("nan"), float("inf"), "heavy", None])
def test_a_weight_must_be_a_finite_number_at_least_zero(weight):
    with pytest.raises(SettingError) as err:
        class_weights("binary", "y", {"0": 1, "1": 1}, None, {"1": weight})
    assert str(err.value) == (f"Expected a class weight that is a number >= 0. Received: {weight!r} "
                              "for class '1'.\nHint: e.g. '{\"0\": 1, \"1\": 9}'.")
