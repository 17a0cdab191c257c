"""What the scan says of columns: null markers stated and counted (issue 18.3), distinct counts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import daskfeed


@pytest.fixture(scope="module")
def marked(tmp_path_factory):
    d = tmp_path_factory.mktemp("markers")
    rows = ["region,gold,memo,y"]
    for i in range(300):
        region = ["NA", "EU", "JP"][i % 3]  # NA: North America
        gold = {0: "NA", 1: "null", 2: ""}.get(i % 10, str(i))
        memo = "N/A" if i % 4 == 0 else f"note {i % 5}"
        rows.append(f"{region},{gold},{memo},{i % 2}")
    (d / "a.csv").write_text("\n".join(rows) + "\n")
    # a file where the numeric column and the text columns hold nothing but markers
    (d / "b.csv").write_text("region,gold,memo,y\n" + "".join(f"NA,NA,N/A,{i % 2}\n" for i in range(50)))
    return d


def test_markers_are_missing_in_numbers_and_text_in_text(marked, client):
    m = daskfeed.scan(str(marked / "*.csv"), label="y", client=client)
    region, gold, memo = m.columns["region"], m.columns["gold"], m.columns["memo"]
    assert region.kind == "categorical" and set(region.vocabulary) == {"NA", "EU", "JP"}
    assert region.missing == 0 and region.missing_markers == {}
    assert memo.kind == "categorical" and "N/A" in memo.vocabulary and memo.missing == 0
    assert gold.kind == "numeric"
    assert gold.missing_markers == {"NA": 30 + 50, "null": 30, "": 30}  # b.csv: markers only
    assert gold.missing == 140 and gold.count == 210


def test_batches_keep_NA_as_a_category(marked, client):
    with daskfeed.DaskSequence(str(marked / "a.csv"), label="y", client=client, batch_size=300,
                               shuffle=False, cache=False) as seq:
        x, _ = seq[0]
        vocab = seq.encoding.columns[0].vocabulary
        na_code = vocab.index("NA") + 2
    assert np.all(x["region"][::3] == na_code)  # every third row: North America, not missing
    assert not np.any(x["region"] == 0)


def test_listed_na_values_are_missing_in_text_too(marked, client):
    m = daskfeed.scan(str(marked / "*.csv"), label="y", client=client, na_values=["NA"])
    region = m.columns["region"]
    assert set(region.vocabulary) == {"EU", "JP"}
    assert region.missing == 100 + 50 and region.missing_markers == {"NA": 150}


def test_distinct_counts_beyond_what_is_tracked_are_estimated(tmp_path, client):
    from daskfeed.scanning import _stats as stats

    n = stats.MAX_TRACKED * 4  # 200,000 distinct user ids: more than the exact counts kept
    (tmp_path / "u.csv").write_text("user_id,y\n" + "".join(f"u{i},{i % 2}\n" for i in range(n)))
    m = daskfeed.scan(str(tmp_path / "u.csv"), label="y", client=client)
    col = m.columns["user_id"]
    assert col.approximate
    assert abs(col.distinct - n) / n < 0.06, col.distinct


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", ""])), max_size=1100))
def test_a_text_columns_samples_are_its_first_distinct_values(values):
    """The samples a type-drift message quotes: the first 3 distinct values of the first 1000."""
    from daskfeed.scanning._stats import _samples

    col = pa.chunked_array([pa.array(values, pa.string())])
    first = list(dict.fromkeys(v for v in values[:1000] if v is not None))[:3]
    assert _samples(col) == first
