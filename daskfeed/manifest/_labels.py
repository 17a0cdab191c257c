"""Text class labels: their classes from the scan's exact value counts, and their class codes.

A label column of text (``gold``, ``silver``, ``bronze``) is a classification label: its
classes, sorted by name, get the codes 0..K-1 in that order. The scan counts every value of a
text column exactly up to :data:`~daskfeed.scanning._stats.MAX_TRACKED` distinct values, so the classes
and their row counts are exact; more than :data:`MAX_CLASSES` of them is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daskfeed.cache import BlockCache, block_tables
from daskfeed.core import SchemaError
from daskfeed.manifest._manifest import Column, Manifest
from daskfeed.reading import Block, ReadOptions

#: The most distinct values a text label may have.
MAX_CLASSES = 1000


def refuse_single_class(manifest: Manifest) -> None:
    """Refuse to train a classifier on a label with fewer than two classes present.

    A model fit on one class learns nothing (binary: a constant; softmax over one unit: a loss
    of 0 and no gradient), yet ``fit`` runs and reports figures: refused before any fit.

    Parameters
    ----------
    manifest
        The training data's manifest.

    Raises
    ------
    SchemaError
        Naming the label, its one value and its rows.
    """
    if manifest.task == "regression":
        return
    present = {k: n for k, n in manifest.label_counts.items() if n}
    if len(present) >= 2 or not manifest.label_counts:  # (no counts: a manifest before they were kept)
        return
    value, rows = next(iter(present.items()), ("(none)", 0))
    if manifest.label_classes is None and manifest.task == "binary":
        value = f"{value} (a 0/1 label)"
    raise SchemaError(
        f"Expected at least two classes in label {manifest.label!r} to train a classifier. "
        f"Received: all {rows:,} labelled rows have the value {value}.\nHint: check the label "
        "column (--label) and the files chosen (does the glob take the data of one outcome "
        "only?); with a validation split, the training part alone has to hold two classes.")


def text_classes(column: Column, values: dict[str, int]) -> dict[str, int]:
    """The classes of a text label and their rows, sorted by class name.

    Parameters
    ----------
    column
        The label's column as the scan resolved it (``distinct``, ``approximate``).
    values
        The scan's value counts of the column (exact when not ``approximate``).

    Returns
    -------
    dict of str to int
        ``{class name: rows}`` in the order of the class codes 0..K-1.

    Raises
    ------
    SchemaError
        When the column has more than 1,000 distinct values.
    """
    distinct = max(len(values), int(column.distinct))
    if column.approximate or distinct > MAX_CLASSES:
        raise SchemaError(
            f"Expected a text label with at most {MAX_CLASSES:,} classes. Received: label "
            f"{column.name!r} with {'~' if column.approximate else ''}{distinct:,} distinct "
            f"values, such as {sorted(values)[:3]}.\nHint: it looks like a regression target "
            "written as text, or an id: pick another label column, or write the target as numbers."
        )
    return {name: int(values[name]) for name in sorted(values)}


def class_codes(col: pa.ChunkedArray | pa.Array, classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The class code (int64, -1 where not a class) of each row, and the mask of rows with a label.

    Parameters
    ----------
    col
        The label column of a table (text, dictionary-encoded text, or all missing).
    classes
        The class names in code order.

    Returns
    -------
    codes, labelled
        ``codes[i]`` is the position of row i's value in ``classes`` (-1: missing or unknown);
        ``labelled[i]`` is True where row i has a value.
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], pa.string())
    labelled = np.asarray(col.is_valid(), dtype=bool)
    if pa.types.is_null(col.type):
        return np.full(len(col), -1, dtype=np.int64), labelled
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    text = col if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) else pc.cast(
        col, pa.string())
    codes = pc.fill_null(pc.index_in(text, value_set=pa.array(list(classes), pa.string())), -1)
    return np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64), labelled


def unknown_classes(index: int, block: Block, options: ReadOptions, label: str,
                    classes: tuple[str, ...], cache: BlockCache | None = None) -> dict[str, Any]:
    """Rows of block ``index`` whose label is not one of ``classes`` (runs on a worker).

    Parameters
    ----------
    index, block, options, cache
        The block and how to read it (the parse cache first, as the epochs do).
    label
        The label column.
    classes
        The training data's class names.

    Returns
    -------
    dict
        ``{"rows": n, "row": k, "value": v}``: how many rows, and the first (``k``: its place
        among the block's parsed rows, None when there is none) with its label text.
    """
    out: dict[str, Any] = {"rows": 0, "row": None, "value": None}
    offset = 0
    for table in block_tables(index, block, options, cache, columns=[label]):
        col = table.column(label)
        codes, labelled = class_codes(col, classes)
        bad = np.flatnonzero(labelled & (codes < 0))
        out["rows"] += len(bad)
        if len(bad) and out["row"] is None:
            out["row"] = offset + int(bad[0])
            out["value"] = str(col[int(bad[0])].as_py())
        offset += table.num_rows
    return out
