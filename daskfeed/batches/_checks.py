"""What a sequence checks at construction: a reference manifest fits it, its sample-weight column.

Each check raises a :class:`~daskfeed.core._exceptions.SchemaError`,
:class:`~daskfeed.core._exceptions.SettingError` or :class:`~daskfeed.core._exceptions.DataError`
that names the column or setting (and the file and line of a bad weight) before anything is
trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed.core import DataError, SchemaError, SettingError, warn_user
from daskfeed.manifest import (
    EXACT_FLOAT32,
    Manifest,
    frame_weight_faults,
    record_line,
    unknown_classes,
    unknown_column,
    weight_faults,
)
from daskfeed.reading import Source

if TYPE_CHECKING:
    from distributed import Client

    from daskfeed.cache import BlockCache


def check_compatible(manifest: Manifest, reference: Manifest, columns: list[str]) -> None:
    """Refuse data whose ``columns`` are missing or of another kind than in ``reference``.

    Parameters
    ----------
    manifest
        This data's manifest.
    reference
        The manifest whose statistics encode the features (e.g. the training set's).
    columns
        The features and the label.

    Raises
    ------
    SchemaError
        A column is missing here, or numeric in one and text in the other.
    """
    for name in columns:
        mine = manifest.columns.get(name)
        theirs = reference.columns[name]
        if mine is None:
            raise SchemaError(
                f"Expected column {name!r} (of the reference data) in this data. Received: "
                f"columns {list(manifest.columns)[:20]}.\nHint: give both data sets the same columns."
            )
        if mine.kind not in (theirs.kind, "empty"):
            raise SchemaError(
                f"Column {name!r} is {theirs.kind} in the reference data but {mine.kind} "
                "here.\nHint: give both data sets the same column types."
            )


def check_classes(manifest: Manifest, reference: Manifest, source: Source, client: Client,
                  label: str, cache: BlockCache | None) -> None:
    """Refuse label text that is no class of the reference data, naming its file and line.

    Parameters
    ----------
    manifest, source
        This data's manifest and source.
    reference
        The manifest whose classes the model learns (the training data's).
    client
        The cluster that looks for the first such row.
    label
        The label column.
    cache
        The block cache (see :mod:`daskfeed.cache._blocks`), or None.

    Raises
    ------
    DataError
        A label value here is no class of ``reference``.
    """
    known = reference.classes
    unknown = sorted(set(manifest.classes or ()) - set(known or ()))
    if known is None or not unknown:
        return
    rows = sum(manifest.label_counts.get(v, 0) for v in unknown)
    first = "in the DataFrame's partitions"
    if source.frame is None:
        blocks = [b for b, n in enumerate(manifest.counts) if n > 0]
        found = client.gather([client.submit(
            unknown_classes, b, source.blocks[b], source.options, label, tuple(known), cache,
            pure=False) for b in blocks])
        b, hit = next((b, f) for b, f in zip(blocks, found, strict=True) if f["row"] is not None)
        first = f"the first ({hit['value']!r}) at {_row_place(source, client, b, hit['row'])}"
    raise DataError(
        f"Expected label values that are classes of the training data ({', '.join(known[:10])}"
        f"{' ...' if len(known) > 10 else ''}). Received: {', '.join(map(repr, unknown[:5]))}"
        f"{' ...' if len(unknown) > 5 else ''} in {rows:,} row(s) of label {label!r}; "
        f"{first}.\nHint: the model cannot learn a class it never saw: add rows of it to the "
        "training data, or leave these rows out of this data."
    )


def check_disjoint(manifest: Manifest, reference: Manifest, validation_split: float,
                   subset: str | None, seed: int) -> None:
    """Refuse a sequence over rows of the split part that ``reference`` describes.

    Parameters
    ----------
    manifest
        This data's manifest.
    reference
        The reference manifest, maybe one part of a split of the same data.
    validation_split, subset, seed
        This sequence's split settings (for the message).

    Raises
    ------
    SettingError
        Both are the same part of one split, or parts of different splits of the same data.
    """
    theirs = reference.split
    if not theirs or reference.fingerprint != manifest.fingerprint:
        return
    mine = manifest.split or {}
    same = all(mine.get(k) == theirs[k] for k in ("validation_split", "seed"))
    if not same or mine.get("subset") == theirs["subset"]:
        want = "validation" if theirs["subset"] == "training" else "training"
        raise SettingError(
            f"The reference manifest is the {theirs['subset']} part of a split of this data "
            f"(validation_split={theirs['validation_split']:g}, seed={theirs['seed']}), so "
            "this sequence would serve some of its rows too. Expected the other part. "
            f"Received: validation_split={validation_split or None}, "
            f"subset={subset!r}, seed={seed}.\nHint: pass validation_split="
            f"{theirs['validation_split']:g}, subset={want!r}, seed={theirs['seed']}."
        )


def check_weight_column(manifest: Manifest, weight: str, label: str,
                        features: list[str] | None) -> None:
    """The weight column exists, is numeric, and is neither the label nor a feature.

    Parameters
    ----------
    manifest
        This data's manifest.
    weight, label
        The weight and label column names.
    features
        The features asked for (None: every other column).

    Raises
    ------
    SchemaError
        The column is unknown, the label, a feature, or not numeric.
    """
    col = manifest.columns.get(weight)
    if col is None:
        raise SchemaError(unknown_column(weight, list(manifest.columns), "weight"))
    if weight == label or weight in (features or ()):
        what = "the label" if weight == label else "a feature"
        hint = "pick another weight column" if weight == label else "drop it from features (--features)"
        raise SchemaError(
            f"The weight column cannot also be {what}. Received: weight={weight!r}.\nHint: {hint}."
        )
    if col.kind != "numeric":
        raise SchemaError(
            f"Expected a numeric weight column. Received: weight={weight!r}, a {col.kind} "
            f"column{f' with values such as {col.vocabulary[:3]}' if col.vocabulary else ''}.\n"
            "Hint: weights are numbers >= 0; pick a numeric column or fix this one."
        )
    wide = max((abs(v) for v in (col.min, col.max) if v is not None), default=0)
    if wide >= EXACT_FLOAT32:
        warn_user(
            f"Weight column {weight!r} holds values up to {wide:,}: Keras takes sample weights "
            "as float32, which rounds values beyond 2**24 (relative error < 6e-8). Hint: "
            "scale the weights down if that matters.")


def check_weights(manifest: Manifest, source: Source, client: Client, label: str, weight: str,
                  cache: BlockCache | None) -> None:
    """Refuse missing or negative weights in rows with a label, naming file and line.

    The scan's statistics of the column say whether there can be any; only then are the
    rows looked for on the cluster (one task per block).

    Parameters
    ----------
    manifest, source
        This data's manifest and source.
    client
        The cluster that looks for the rows.
    label, weight
        The label and weight column names.
    cache
        The block cache (see :mod:`daskfeed.cache._blocks`), or None.

    Raises
    ------
    DataError
        A row with a label has a missing or negative weight.
    """
    col = manifest.columns[weight]
    if not col.missing and (col.min is None or col.min >= 0):
        return
    found = _weight_faults(manifest, source, client, label, weight, cache)
    missing = sum(f["missing"] for _, f in found)
    negative = sum(f["negative"] for _, f in found)
    if not (missing or negative):
        return  # the missing weights are all in rows without a label (skipped)
    b, first = next((b, f) for b, f in found if f["row"] is not None)
    value = "missing" if np.isnan(first["value"]) else f"{first['value']:g}"
    raise DataError(
        f"Expected a weight >= 0 in every row with a label (weight column {weight!r}). "
        f"Received: {missing:,} row(s) with a missing weight and {negative:,} with a negative "
        f"one; the first ({value}) at {_row_place(source, client, b, first['row'])}.\nHint: fill "
        "in or fix those weights, or drop those rows (a weight of 0 keeps a row out of the loss)."
    )


def _weight_faults(manifest: Manifest, source: Source, client: Client, label: str, weight: str,
                   cache: BlockCache | None) -> list[tuple[int, dict[str, Any]]]:
    """``(block, faults)`` of every non-empty block (see :func:`~daskfeed.manifest.weight_faults`)."""
    blocks = [b for b, n in enumerate(manifest.counts) if n > 0]
    if source.frame is not None:
        from dask.delayed import delayed

        frames = source.partitions()
        tasks = [delayed(frame_weight_faults)(frames[b], label, weight) for b in blocks]
        futures = client.compute(tasks)
    else:
        futures = [client.submit(weight_faults, b, source.blocks[b], source.options, label, weight,
                                 cache, pure=False)
                   for b in blocks]
    return list(zip(blocks, client.gather(futures), strict=True))


def _row_place(source: Source, client: Client, b: int, row: int) -> str:
    """``<file> line N (its byte range)``: where row ``row`` of block ``b`` is."""
    block = source.blocks[b]
    if source.frame is not None:
        return f"block {b}, row {row}"
    line = client.submit(record_line, block, source.options, row, pure=False).result()
    where = f"line {line}" if line is not None else f"row {row + 1} of the block"
    return f"{block.path} {where} (block {b}: {block.describe()})"
