"""The validation split by whole blocks (daskfeed.manifest._split): settings, blocks held out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.manifest._split import (
    block_sizes,
    held_out,
    scanned_blocks,
    split_blocks,
    split_settings,
)
from daskfeed.reading import Source

KEYS_SIZES = st.integers(2, 40).flatmap(lambda n: st.tuples(
    st.lists(st.text(min_size=1, max_size=12), min_size=n, max_size=n, unique=True),
    st.lists(st.integers(1, 10**6), min_size=n, max_size=n)))
FRACTIONS = st.floats(0.01, 0.99)


# -- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction", [None, 0, 0.0])
def test_no_fraction_is_no_split(fraction):
    assert split_settings(fraction, None, seed=3) is None


def test_the_split_settings_are_plain_values():
    assert split_settings(0.25, "validation", seed=7.0) == {"validation_split": 0.25,
                                                              "subset": "validation", "seed": 7}


def test_a_subset_without_a_fraction_is_refused():
    with pytest.raises(ValueError) as err:
        split_settings(None, "training", seed=0)
    assert str(err.value) == ("Expected subset=None without validation_split. Received: "
                              "subset='training'.\nHint: pass validation_split=0.1 (for example) "
                              "to split the data.")


@pytest.mark.parametrize("fraction", [1, 1.5, -0.1])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match=rf"^Expected 0 < validation_split < 1\. Received: "
                                         rf"validation_split={fraction!r}\.$"):
        split_settings(fraction, "training", seed=0)
    with pytest.raises(ValueError, match=r"^Expected 0 < validation_split < 1\."):
        split_blocks(["a", "b"], [1, 1], validation_split=fraction)


@pytest.mark.parametrize("subset", [None, "train", "Validation"])
def test_a_subset_other_than_training_or_validation_is_refused(subset):
    with pytest.raises(ValueError) as err:
        split_settings(0.2, subset, seed=0)
    assert str(err.value).startswith(
        f"Expected subset='training' or subset='validation' with validation_split=0.2. "
        f"Received: subset={subset!r}.\nHint: make the training sequence with subset='training'")


# -- the blocks held out ---------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(KEYS_SIZES, FRACTIONS, st.integers(0, 2**32))
def test_whole_blocks_near_the_fraction_at_least_one_on_each_side(keys_sizes, fraction, seed):
    keys, sizes = keys_sizes
    held = split_blocks(keys, sizes, validation_split=fraction, seed=seed)
    assert list(held) == sorted(set(held)) and all(0 <= p < len(keys) for p in held)
    assert 1 <= len(held) <= len(keys) - 1
    taken, target = sum(sizes[p] for p in held), fraction * sum(sizes)
    # each block taken was nearer the target with it; each left out, nearer without it
    assert len(held) in (1, len(keys) - 1) or abs(taken - target) <= max(sizes) / 2


@settings(max_examples=100, deadline=None)
@given(KEYS_SIZES, FRACTIONS, st.integers(0, 2**32), st.randoms(use_true_random=False))
def test_the_blocks_held_out_follow_their_keys_not_the_listing_order(keys_sizes, fraction, seed, rnd):
    keys, sizes = keys_sizes
    held = {keys[p] for p in split_blocks(keys, sizes, validation_split=fraction, seed=seed)}
    order = list(range(len(keys)))
    rnd.shuffle(order)
    shuffled = split_blocks([keys[p] for p in order], [sizes[p] for p in order],
                            validation_split=fraction, seed=seed)
    assert {keys[order[p]] for p in shuffled} == held


def test_the_same_inputs_give_the_same_blocks_and_another_seed_others():
    keys = [f"/data/part{i:03d}.csv\0{0}" for i in range(200)]
    sizes = [1000] * 200
    a = split_blocks(keys, sizes, validation_split=0.2, seed=1)
    assert a == split_blocks(list(keys), list(sizes), validation_split=0.2, seed=1)
    assert len(a) == 40  # equal blocks: exactly the fraction
    b = split_blocks(keys, sizes, validation_split=0.2, seed=2)
    assert len(b) == 40 and a != b


def test_a_tiny_fraction_still_holds_one_block_out_and_a_big_one_leaves_one():
    assert len(split_blocks(["a", "b", "c"], [100, 100, 100], validation_split=0.01)) == 1
    assert len(split_blocks(["a", "b", "c"], [100, 100, 100], validation_split=0.99)) == 2


def test_split_blocks_refuses_fewer_than_two_blocks_or_sizes_not_one_per_block():
    with pytest.raises(ValueError) as err:
        split_blocks(["a"], [10], validation_split=0.5)
    assert str(err.value).startswith("Expected at least 2 blocks to hold whole blocks out for "
                                     "validation. Received: 1 block(s).\nHint: lower the blocksize")
    with pytest.raises(ValueError, match=r"^Expected one size per block\. Received: 3 keys and 2 sizes\.$"):
        split_blocks(["a", "b", "c"], [1, 2], validation_split=0.5)


# -- the blocks of a subset, of a Source ----------------------------------------------------------
def test_scanned_blocks_are_the_subset_s_blocks_and_the_parts_cover_the_data():
    assert scanned_blocks(4, None) == [0, 1, 2, 3]
    val = {"validation_split": 0.5, "subset": "validation", "seed": 0, "validation_partitions": [3, 1]}
    assert scanned_blocks(5, val) == [1, 3]
    assert scanned_blocks(5, {**val, "subset": "training"}) == [0, 2, 4]


def test_held_out_splits_a_source_s_blocks_by_path_offset_and_file_size(write_csv):
    for i in range(6):
        write_csv(f"d/f{i}.csv", "a,b\n" + "1,2\n" * (i + 1) * 50)
    src = Source(write_csv("d/f0.csv", "a,b\n" + "1,2\n" * 50).rsplit("/", 1)[0] + "/*.csv")
    sizes = block_sizes(src)
    assert sizes == [4 + 4 * 50 * (i + 1) for i in range(6)]  # whole files: their sizes
    split = split_settings(0.3, "validation", seed=5)
    assert split is not None
    held = held_out(src, split)
    keys = [f"{b.path}\0{b.offset}" for b in src.blocks]
    assert held == split_blocks(keys, sizes, validation_split=0.3, seed=5)
    assert 1 <= len(held) < 6
