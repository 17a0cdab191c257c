"""The validation split: which whole blocks a manifest made for a split describes.

``validation_split=F, subset=..., seed=S`` holds out about F of the input bytes by whole blocks
(:func:`~daskfeed.plan.split_blocks`); the manifest records the settings and the blocks held
out (``split["validation_partitions"]``), so both parts are scanned once and never overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daskfeed.plan import split_blocks

if TYPE_CHECKING:
    from daskfeed.source import Source

__all__ = ["SUBSETS", "block_sizes", "held_out", "scanned_blocks", "split_settings"]

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
    ValueError
        When the fraction is outside (0, 1) or ``subset`` is not "training" / "validation".
    """
    if validation_split is None or validation_split == 0:
        if subset is not None:
            raise ValueError(f"Expected subset=None without validation_split. Received: "
                             f"subset={subset!r}.\nHint: pass validation_split=0.1 (for example) "
                             "to split the data.")
        return None
    if not 0.0 < float(validation_split) < 1.0:
        raise ValueError(f"Expected 0 < validation_split < 1. Received: "
                         f"validation_split={validation_split!r}.")
    if subset not in SUBSETS:
        raise ValueError(
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
    if src.frame is not None:
        return [1] * src.npartitions
    return [b.length if b.length >= 0 else src.files[b.file_index].size for b in src.blocks]
