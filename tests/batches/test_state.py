"""The one resume state (daskfeed.batches._state.StreamState): stored as plain values, read back
in every format it was written in, checked on resume."""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.batches import ORDER_VERSION, STATE_VERSION, StreamState
from daskfeed.core import CheckpointError

BASE = StreamState(epoch=3, batch=17, seed=5, batch_size=64, fingerprint="ab" * 16, num_batches=40,
              rows=2_500, window_rows=4_096, blocksize=2**20, shuffle=True, drop_remainder=False,
              label="cleared", features=("gold", "level", "class"), shard=(1, 3),
              validation_split=0.2, order=ORDER_VERSION)
WHERE = "The checkpoint out/checkpoints/ckpt-000003-000000017"

STATES = st.builds(
    StreamState, epoch=st.integers(0, 10**6), batch=st.integers(0, 10**9), seed=st.integers(0, 2**32),
    batch_size=st.integers(1, 10**5), fingerprint=st.text("0123456789abcdef", min_size=32, max_size=32),
    num_batches=st.integers(0, 10**9), rows=st.integers(0, 10**12), window_rows=st.integers(1, 10**8),
    blocksize=st.integers(1, 2**31), shuffle=st.booleans(), drop_remainder=st.booleans(),
    label=st.text(min_size=1, max_size=12), features=st.lists(st.text(max_size=8), max_size=6).map(tuple),
    shard=st.integers(1, 8).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))),
    validation_split=st.sampled_from([0.0, 0.1, 0.25]), units=st.sampled_from([0, 1, 640]),
    position=st.none() | st.integers(0, 10**9))


@settings(max_examples=100, deadline=None)
@given(STATES)
def test_a_state_round_trips_through_json_with_its_version(state):
    """What is persisted (state.json, torch.save) is ``to_dict()``: plain values, versioned."""
    stored = json.loads(json.dumps(state.to_dict()))
    assert stored["version"] == STATE_VERSION
    assert isinstance(stored["features"], list) and isinstance(stored["shard"], list)
    back = StreamState.from_dict(stored)
    assert back == state and hash(back) == hash(state)
    back.check(state, WHERE)  # the same batches: resuming is allowed


def test_a_checkpoint_cursor_stored_before_the_version_still_reads():
    """state.json's cursor of format 1 (``asdict`` of the cursor, no version) is the same state."""
    old = json.loads(json.dumps(asdict(BASE)))
    assert "version" not in old and StreamState.from_dict(old) == BASE


def test_a_cursor_stored_before_shards_and_splits_reads_as_the_whole_data():
    old = {k: v for k, v in asdict(BASE).items() if k not in ("shard", "validation_split")}
    state = StreamState.from_dict(json.loads(json.dumps(old)))
    assert state.shard == (0, 1) and state.validation_split == 0.0
    assert state == replace(BASE, shard=(0, 1), validation_split=0.0)


def test_a_torch_dataset_state_of_version_1_reads_what_it_recorded_and_the_rest_from_the_stream():
    """It kept the position and batch size, seed, shard, fingerprint only: those are checked."""
    mine = replace(BASE, units=64, position=0, epoch=0, batch=0, shard=(0, 2))
    old = {"version": 1, "epoch": 3, "start": 17, "position": 35, "batch_size": 64, "seed": 5,
           "shard": [1, 2], "fingerprint": "ab" * 16}
    state = StreamState.from_dict(old, like=mine)
    assert state == replace(mine, epoch=3, batch=17, position=35, shard=(1, 2))
    state.check(mine, WHERE)  # the shard is a layout in the global order
    with pytest.raises(CheckpointError, match=r"made with seed=9; .* Received: seed=5"):
        StreamState.from_dict({**old, "seed": 9}, like=mine).check(mine, WHERE)
    with pytest.raises(CheckpointError, match=r"Expected a resume state \(BatchStream.get_state\)"):
        StreamState.from_dict(old)  # (nothing to take the rest from)


def test_a_state_of_a_later_format_or_of_another_shape_is_refused_by_name():
    with pytest.raises(CheckpointError, match=rf"Expected a resume state of format {STATE_VERSION} "
                                              rf"or older. Received: format {STATE_VERSION + 1}"):
        StreamState.from_dict({**BASE.to_dict(), "version": STATE_VERSION + 1})
    with pytest.raises(CheckpointError, match=r"Expected a resume state with batch_size, "):
        StreamState.from_dict({k: v for k, v in BASE.to_dict().items()
                               if k not in ("batch_size", "seed")})


def test_from_dict_leaves_its_argument_alone():
    stored = BASE.to_dict()
    StreamState.from_dict(stored)
    assert stored["features"] == ["gold", "level", "class"] and stored["shard"] == [1, 3]


def test_epoch_and_batch_are_where_training_stands_not_what_must_match():
    BASE.check(replace(BASE, epoch=0, batch=0), WHERE)
    BASE.check(replace(BASE, blocksize=2**26), WHERE)  # in the fingerprint, not compared alone


def test_other_data_is_refused_naming_both_fingerprints_and_sizes():
    other = replace(BASE, fingerprint="cd" * 16, rows=3_000_000)
    with pytest.raises(CheckpointError) as err:
        BASE.check(other, WHERE)
    msg = str(err.value)
    assert msg.startswith(f"{WHERE} was made on other data: expected data with "
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
        f"{WHERE} was made with {name}={expected!r}; resuming needs the same "
        f"batches. Received: {name}={received!r}.\nHint: resume with {hint}, or train from "
        "scratch without --resume (the old checkpoints are then removed).")


def test_a_state_handed_over_in_python_hints_at_keywords_not_flags():
    with pytest.raises(CheckpointError) as err:
        BASE.check(replace(BASE, seed=6), "The TorchDataset state", cli=False)
    assert str(err.value) == (
        "The TorchDataset state was made with seed=5; resuming needs the same batches. Received: "
        "seed=6.\nHint: build it with seed=5, or start from the beginning (without this state).")
    assert isinstance(err.value, ValueError)  # also a builtin


def test_every_field_but_where_training_stands_the_blocksize_and_the_skips_is_checked():
    """The batches skipped are not checked: a resume adds its own to them (BatchStream.set_state)."""
    checked = {name for name, _, _ in DIFFERENCES} | {"fingerprint", "units", "order"}
    assert {f.name for f in fields(StreamState)} - checked == {"epoch", "batch", "blocksize", "position",
                                                               "skips"}


def test_the_batches_skipped_go_through_json_and_a_state_before_them_has_none():
    state = replace(BASE, units=64, position=51, skips=((0, 2, 4), (3, 16, 16)))
    back = StreamState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and back.skips == ((0, 2, 4), (3, 16, 16))
    older = {k: v for k, v in state.to_dict().items() if k != "skips"}
    assert StreamState.from_dict(older).skips == ()
    state.check(replace(state, skips=()), WHERE)  # not refused: the resume adds its own


ORDERED = replace(BASE, units=64, position=51)  # a state in the global order


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
        f"{WHERE} was made in the global order (parse cache on); resuming needs the "
        "same order of rows. Received: a run with windows of blocks (the parse cache off, or a "
        "dask DataFrame).\nHint: resume with the cache setting the run started with")
    with pytest.raises(CheckpointError, match="made with windows of blocks"):
        BASE.check(ORDERED, WHERE)


def test_a_checkpoint_of_the_order_before_buckets_is_refused_by_its_format():
    """A cursor stored before the order had a format field is format 1 (a run of every block)."""
    old = {k: v for k, v in asdict(ORDERED).items() if k != "order"}
    stored = StreamState.from_dict(json.loads(json.dumps(old)))
    assert stored.order == 1
    with pytest.raises(CheckpointError) as err:
        stored.check(ORDERED, WHERE)
    assert str(err.value).startswith(
        f"{WHERE} was made in the global order of another daskfeed (order "
        "format 1: units of a run of every block); this one reads format 4 (whole buckets, a "
        "power of two of them, block ids anchored at a part's first file)")
    two = replace(stored, order=2)  # the buckets before growth kept them: another K, order
    with pytest.raises(CheckpointError, match=r"order format 2: whole buckets, rows in block "
                                              r"order\); this one reads format 4"):
        two.check(ORDERED, WHERE)
    three = replace(stored, order=3)  # block ids by the part's key: a part that grew moved them
    with pytest.raises(CheckpointError, match=r"order format 3: whole buckets, a power of two of "
                                              r"them, rows in block-id order\); this one reads"):
        three.check(ORDERED, WHERE)
    assert "Hint: train from scratch without --resume" in str(err.value)


def test_the_fingerprint_is_told_before_the_settings():
    with pytest.raises(CheckpointError, match="made on other data"):
        BASE.check(replace(BASE, fingerprint="0" * 32, batch_size=1, seed=0), WHERE)


def test_settings_are_told_in_a_fixed_order():
    with pytest.raises(CheckpointError, match=r"made with batch_size=64;"):
        BASE.check(replace(BASE, rows=1, seed=0, batch_size=1), WHERE)
    with pytest.raises(CheckpointError, match=r"made with seed=5;"):
        BASE.check(replace(BASE, rows=1, seed=0), WHERE)
