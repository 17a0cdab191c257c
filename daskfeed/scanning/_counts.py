"""Counting values: label and text value counts, and the distinct-count sketch (mergeable).

What :mod:`daskfeed.scanning._stats` keeps per column of text and for the label: counts made by a
hash of the values (or from a dictionary encoding's codes), and the ``KMV_SIZE`` smallest value
hashes, from which the number of distinct values is estimated.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# distinct label values tracked; above this an integer label is treated as regression
MAX_LABEL_VALUES = 1000
KMV_SIZE = 2048  # smallest value hashes kept per text column: distinct counts within ~2 %


def kmv(values: Sequence[object]) -> list[int]:
    """The ``KMV_SIZE`` smallest 64-bit hashes of distinct ``values`` (a mergeable sketch).

    pandas' vectorized hash (4x faster than a Python-level hash per value on 100k distinct
    values), imported here: a worker loads pandas only when a block has a text column.
    """
    if not len(values):
        return []
    import pandas as pd

    hashes = pd.util.hash_array(np.asarray([str(v) for v in values], dtype=object), categorize=False)
    if len(hashes) > KMV_SIZE:
        hashes = np.partition(hashes, KMV_SIZE)[:KMV_SIZE]
    return sorted(int(h) for h in hashes)


def merge_kmv(a: list[int], b: list[int]) -> list[int]:
    """Two sketches of :func:`kmv` as one (the union's smallest hashes)."""
    return sorted(set(a) | set(b))[:KMV_SIZE]


def distinct_estimate(kmv: list[int]) -> int:
    """Distinct values from a k-minimum-values sketch (exact below ``KMV_SIZE`` values).

    Parameters
    ----------
    kmv
        The sketch: the smallest distinct 64-bit hashes, sorted.

    Returns
    -------
    int
        The number of distinct values (estimated at ``KMV_SIZE`` hashes and more).
    """
    if len(kmv) < KMV_SIZE:
        return len(kmv)
    return round((KMV_SIZE - 1) / (kmv[-1] / 2.0**64))


def label_counts(col: pa.ChunkedArray) -> dict[str, int]:
    """The label's values (as floats) and their counts: the ``MAX_LABEL_VALUES + 1`` most frequent.

    Counted by a hash of the column's own values (not a sort of them all); values equal as
    floats are one value, ties in count go to the smaller value.
    """
    vc = pc.value_counts(pc.drop_null(col))
    values = vc.field("values").cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    counts = vc.field("counts").to_numpy(zero_copy_only=False)
    keep = ~np.isnan(values)
    uniq, where_ = np.unique(values[keep], return_inverse=True)
    summed = np.bincount(where_, weights=counts[keep], minlength=len(uniq)).astype(np.int64)
    top = np.argsort(-summed, kind="stable")[: MAX_LABEL_VALUES + 1]
    return {repr(float(uniq[i])): int(summed[i]) for i in top}


def coded_counts(coded: pa.ChunkedArray) -> tuple[list[object], np.ndarray]:
    """The values of a dictionary-encoded column and their counts, in order of first appearance.

    (As ``pyarrow.compute.value_counts`` of the text gives them: a chunk's dictionary lists its
    values in that order; values no row of a chunk uses are left out.)
    """
    found: dict[object, int] = {}
    for chunk in coded.chunks:
        codes = chunk.indices
        if chunk.null_count:
            codes = pc.drop_null(codes)
        counts = np.bincount(codes.to_numpy(zero_copy_only=False), minlength=len(chunk.dictionary))
        used = np.flatnonzero(counts)
        for value, n in zip(chunk.dictionary.take(pa.array(used)).to_pylist(), counts[used].tolist(),
                            strict=True):
            found[value] = found.get(value, 0) + n
    return list(found), np.fromiter(found.values(), dtype=np.int64, count=len(found))
