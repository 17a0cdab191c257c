"""The data cursor of a checkpoint (daskfeed.checkpoint._cursor): made, stored, checked on resume."""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.batches import ORDER_VERSION
from daskfeed.checkpoint._cursor import Cursor
from daskfeed.core import CheckpointError

BASE = Cursor(epoch=3, batch=17, seed=5, batch_size=64, fingerprint="ab" * 16, num_batches=40,
              rows=2_500, window_rows=4_096, blocksize=2**20, shuffle=True, drop_remainder=False,
              label="cleared", features=("gold", "level", "class"), shard=(1, 3),
              validation_split=0.2, order=ORDER_VERSION)
WHERE = "out/checkpoints/ckpt-000003-000000017"

CURSORS = st.builds(
    Cursor, epoch=st.integers(0, 10**6), batch=st.integers(0, 10**9), seed=st.integers(0, 2**32),
    batch_size=st.integers(1, 10**5), fingerprint=st.text("0123456789abcdef", min_size=32, max_size=32),
    num_batches=st.integers(0, 10**9), rows=st.integers(0, 10**12), window_rows=st.integers(1, 10**8),
    blocksize=st.integers(1, 2**31), shuffle=st.booleans(), drop_remainder=st.booleans(),
    label=st.text(min_size=1, max_size=12), features=st.lists(st.text(max_size=8), max_size=6).map(tuple),
    shard=st.integers(1, 8).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))),
    validation_split=st.sampled_from([0.0, 0.1, 0.25]), units=st.sampled_from([0, 1, 640]),
    position=st.none() | st.integers(0, 10**9))


@settings(max_examples=100, deadline=None)
@given(CURSORS)
def test_a_cursor_round_trips_through_state_json(cursor):
    """state.json keeps ``asdict(cursor)`` as JSON (tuples become lists)."""
    stored = json.loads(json.dumps(asdict(cursor)))
    assert isinstance(stored["features"], list) and isinstance(stored["shard"], list)
    back = Cursor.from_dict(stored)
    assert back == cursor and hash(back) == hash(cursor)
    back.check(cursor, WHERE)  # the same batches: resuming is allowed


def test_a_cursor_stored_before_shards_and_splits_reads_as_the_whole_data():
    old = {k: v for k, v in asdict(BASE).items() if k not in ("shard", "validation_split")}
    cursor = Cursor.from_dict(json.loads(json.dumps(old)))
    assert cursor.shard == (0, 1) and cursor.validation_split == 0.0
    assert cursor == replace(BASE, shard=(0, 1), validation_split=0.0)


def test_from_dict_leaves_its_argument_alone():
    stored = json.loads(json.dumps(asdict(BASE)))
    Cursor.from_dict(stored)
    assert stored["features"] == ["gold", "level", "class"] and stored["shard"] == [1, 3]


def test_of_reads_a_sequence_s_plan_manifest_and_settings():
    seq = SimpleNamespace(
        seed=5, batch_size=64, manifest=SimpleNamespace(fingerprint="ab" * 16),
        plan=SimpleNamespace(num_batches=40, rows=2_500), window_rows=4_096,
        source=SimpleNamespace(options=SimpleNamespace(blocksize=2**20)), shuffle=True,
        drop_remainder=False, label="cleared", features=["gold", "level", "class"], shard=[1, 3],
        validation_split=0.2, global_order=False)
    assert Cursor.of(seq, 3, 17) == BASE
    del seq.validation_split  # a sequence without a split
    assert Cursor.of(seq, 3, 17) == replace(BASE, validation_split=0.0)


def test_epoch_and_batch_are_where_training_stands_not_what_must_match():
    BASE.check(replace(BASE, epoch=0, batch=0), WHERE)
    BASE.check(replace(BASE, blocksize=2**26), WHERE)  # in the fingerprint, not compared alone


def test_other_data_is_refused_naming_both_fingerprints_and_sizes():
    other = replace(BASE, fingerprint="cd" * 16, rows=3_000_000)
    with pytest.raises(CheckpointError) as err:
        BASE.check(other, WHERE)
    msg = str(err.value)
    assert msg.startswith(f"The checkpoint {WHERE} was made on other data: expected data with "
                          f"fingerprint {'ab' * 16} (2,500 rows, 40 batches per epoch). "
                          f"Received: fingerprint {'cd' * 16} (3,000,000 rows;")
    assert "Hint: resume on exactly the files the run started with" in msg


# (field, the running value, the hint's flag and value)
DIFFERENCES = [
    ("batch_size", 128, "--batch-size 64"),
    ("seed", 6, "--seed 5"),
    ("label", "won", "--label cleared"),
    ("features", ("gold",), "--features/--exclude gold,level,class"),
    ("validation_split", 0.0, "--validation-split 0.2"),
    ("shuffle", False, "shuffle True"),
    ("drop_remainder", True, "drop_remainder False"),
    ("shard", (0, 3), "--rank 1 --world-size 3 (a run in the global order, with the parse cache "
                      "on, resumes under any number of trainers)"),
    ("num_batches", 41, "num_batches 40"),
    ("rows", 2_501, "rows 2500"),
    ("window_rows", 8_192, "the same --memory-limit (it sets the window size) and 4096"),
]


@pytest.mark.parametrize(("name", "received", "hint"), DIFFERENCES, ids=[d[0] for d in DIFFERENCES])
def test_a_setting_that_changes_the_batches_is_refused_with_both_values(name, received, hint):
    with pytest.raises(CheckpointError) as err:
        BASE.check(replace(BASE, **{name: received}), WHERE)
    expected = getattr(BASE, name)
    assert str(err.value) == (
        f"The checkpoint {WHERE} was made with {name}={expected!r}; resuming needs the same "
        f"batches. Received: {name}={received!r}.\nHint: resume with {hint}, or train from "
        "scratch without --resume (the old checkpoints are then removed).")
    assert isinstance(err.value, ValueError)  # also a builtin


def test_every_field_but_where_training_stands_and_the_blocksize_is_checked():
    checked = {name for name, _, _ in DIFFERENCES} | {"fingerprint", "units", "order"}
    assert {f.name for f in fields(Cursor)} - checked == {"epoch", "batch", "blocksize", "position"}


ORDERED = replace(BASE, units=64, position=51)  # a cursor in the global order


def test_a_position_in_the_global_order_resumes_under_any_layout():
    """Window size, number of trainers (and with it the batches and rows of each) may change."""
    ORDERED.check(replace(ORDERED, shard=(0, 2), window_rows=100, num_batches=61, rows=3_900), WHERE)
    assert ORDERED.at == 51 and ORDERED.global_order and BASE.at == 17


def test_a_global_order_of_other_units_or_another_order_is_refused():
    with pytest.raises(CheckpointError, match=r"made with units=64; .* Received: units=65"):
        ORDERED.check(replace(ORDERED, units=65), WHERE)
    with pytest.raises(CheckpointError) as err:
        ORDERED.check(BASE, WHERE)
    assert str(err.value).startswith(
        f"The checkpoint {WHERE} was made in the global order (parse cache on); resuming needs the "
        "same order of rows. Received: a run with windows of blocks (the parse cache off, or a "
        "dask DataFrame).\nHint: resume with the cache setting the run started with")
    with pytest.raises(CheckpointError, match="made with windows of blocks"):
        BASE.check(ORDERED, WHERE)


def test_a_checkpoint_of_the_order_before_buckets_is_refused_by_its_format():
    """A cursor stored before the order had a format field is format 1 (a run of every block)."""
    old = {k: v for k, v in asdict(ORDERED).items() if k != "order"}
    stored = Cursor.from_dict(json.loads(json.dumps(old)))
    assert stored.order == 1
    with pytest.raises(CheckpointError) as err:
        stored.check(ORDERED, WHERE)
    assert str(err.value).startswith(
        f"The checkpoint {WHERE} was made in the global order of another daskfeed (order "
        "format 1: units of a run of every block); this one reads format 3 (whole buckets, a "
        "power of two of them, rows in block-id order)")
    two = replace(stored, order=2)  # the buckets before growth kept them: another K, order
    with pytest.raises(CheckpointError, match=r"order format 2: whole buckets, rows in block "
                                              r"order\); this one reads format 3"):
        two.check(ORDERED, WHERE)
    assert "Hint: train from scratch without --resume" in str(err.value)


def test_the_fingerprint_is_told_before_the_settings():
    with pytest.raises(CheckpointError, match="made on other data"):
        BASE.check(replace(BASE, fingerprint="0" * 32, batch_size=1, seed=0), WHERE)


def test_settings_are_told_in_a_fixed_order():
    with pytest.raises(CheckpointError, match=r"made with batch_size=64;"):
        BASE.check(replace(BASE, rows=1, seed=0, batch_size=1), WHERE)
    with pytest.raises(CheckpointError, match=r"made with seed=5;"):
        BASE.check(replace(BASE, rows=1, seed=0), WHERE)
