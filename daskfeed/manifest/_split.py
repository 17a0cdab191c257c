"""The validation split: which whole blocks a manifest made for a split describes.

``validation_split=F, subset=..., seed=S`` holds out about F of the input bytes by whole blocks
(:func:`split_blocks`); the manifest records the settings and the blocks held
out (``split["validation_partitions"]``), so both parts are scanned once and never overlap.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from daskfeed.core import SettingError

if TYPE_CHECKING:
    from daskfeed.reading import Source

SUBSETS = ("training", "validation")


def split_settings(validation_split: float | None, subset: str | None,
                   seed: int) -> dict[str, Any] | None:
    """The split a manifest is made for, checked (None: the whole data).

    Parameters
    ----------
    validation_split
        The fraction of the data held out (None or 0: no split).
    subset
        Which part: ``"training"`` or ``"validation"`` (None without a split).
    seed
        The seed that draws the blocks held out.

    Returns
    -------
    dict or None
        ``validation_split``, ``subset`` and ``seed``; None without a split.

    Raises
    ------
    SettingError
        When the fraction is outside (0, 1) or ``subset`` is not "training" / "validation".
    """
    if validation_split is None or validation_split == 0:
        if subset is not None:
            raise SettingError(f"Expected subset=None without validation_split. Received: "
                             f"subset={subset!r}.\nHint: pass validation_split=0.1 (for example) "
                             "to split the data.")
        return None
    if not 0.0 < float(validation_split) < 1.0:
        raise SettingError(f"Expected 0 < validation_split < 1. Received: "
                         f"validation_split={validation_split!r}.")
    if subset not in SUBSETS:
        raise SettingError(
            f"Expected subset='training' or subset='validation' with validation_split="
            f"{validation_split}. Received: subset={subset!r}.\nHint: make the training sequence "
            "with subset='training' and the validation one with subset='validation' and the "
            "same seed (as Keras' image_dataset_from_directory does)."
        )
    return {"validation_split": float(validation_split), "subset": subset, "seed": int(seed)}


def scanned_blocks(npartitions: int, split: dict[str, Any] | None) -> list[int]:
    """The blocks a manifest made for ``split`` describes (all of them without one).

    Parameters
    ----------
    npartitions
        The source's number of blocks.
    split
        The manifest's split, with its ``validation_partitions`` (None: no split).

    Returns
    -------
    list of int
        The indices of the blocks of ``split``'s subset, in order.
    """
    if split is None:
        return list(range(npartitions))
    validation = set(split["validation_partitions"])
    keep = split["subset"] == "validation"
    return [i for i in range(npartitions) if (i in validation) == keep]


def held_out(src: Source, split: dict[str, Any]) -> tuple[int, ...]:
    """The blocks of ``src`` held out for validation by ``split`` (whole blocks).

    Parameters
    ----------
    src
        The data's source.
    split
        The split's settings (:func:`split_settings`).

    Returns
    -------
    tuple of int
        The indices of the blocks held out.
    """
    keys = [f"{b.path}\0{b.offset}" for b in src.blocks]
    return split_blocks(keys, block_sizes(src), validation_split=split["validation_split"],
                        seed=split["seed"])


def block_sizes(src: Source) -> list[int]:
    """Bytes of every block of ``src`` (a whole file: its size; a block of a dask DataFrame: 1).

    Parameters
    ----------
    src
        The data's source.

    Returns
    -------
    list of int
        One size per block, in block order.
    """
    return src.block_sizes()  # computed once per source: scan tasks ask for it per part


def _split_rank(seed: int, key: str) -> int:
    """A block's place in the split order: a hash of ``(seed, key)``, the same everywhere."""
    digest = hashlib.blake2b(f"{int(seed)}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def split_blocks(keys: Sequence[str], sizes: Sequence[int], *, validation_split: float,
                 seed: int = 0) -> tuple[int, ...]:
    """The blocks held out for validation: whole blocks, chosen by a seeded hash.

    Blocks are ranked by a hash of ``(seed, key)`` (a key names a block: its file and
    byte offset) and taken in that order while the bytes held out stay nearest to
    ``validation_split`` of the total; at least one block is held out and at least one is
    left for training. The same keys, sizes, fraction and seed give the same blocks in
    every process and every run; nothing is read.

    Parameters
    ----------
    keys
        One name per block, in block order (stable across runs: path and offset).
    sizes
        Bytes (or any size measure) per block.
    validation_split
        Fraction of the data to hold out, ``0 < validation_split < 1``.
    seed
        Another seed draws other blocks.

    Returns
    -------
    tuple of int
        Indices of the held-out blocks, ascending.

    Raises
    ------
    SettingError
        When the fraction is outside (0, 1) or there are fewer than two blocks.
    """
    if not 0.0 < float(validation_split) < 1.0:
        raise SettingError(f"Expected 0 < validation_split < 1. Received: "
                         f"validation_split={validation_split!r}.")
    if len(keys) != len(sizes):
        raise ValueError(f"Expected one size per block. Received: {len(keys)} keys and "
                         f"{len(sizes)} sizes.")
    if len(keys) < 2:
        raise SettingError(
            f"Expected at least 2 blocks to hold whole blocks out for validation. "
            f"Received: {len(keys)} block(s).\nHint: lower the blocksize (--blocksize) so the "
            "data has several blocks, or pass separate validation data (--validation)."
        )
    order = sorted(range(len(keys)), key=lambda p: (_split_rank(seed, keys[p]), p))
    target = float(validation_split) * sum(max(int(n), 0) for n in sizes)
    held: list[int] = []
    taken = 0
    for p in order:
        size = max(int(sizes[p]), 0)
        if taken + size / 2 <= target:  # nearer the target with it than without it
            held.append(p)
            taken += size
    if not held:
        held = [order[0]]
    if len(held) == len(keys):
        held.pop()
    return tuple(sorted(held))
