"""Moments that merge exactly: the same mean and variance however the rows are grouped.

A column's moments are computed per *segment* (a block, or a piece of a block parsed as several
tables): its count, mean and sum of squared deviations in float64, from its own values alone
(the same numbers whatever else the table held). Each segment then adds its exact sums
``S1 = n * mean`` and ``S2 = m2 + n * mean**2`` — dyadic rationals, kept as Python integers
with a power of two — so merging is integer addition: associative and commutative. Statistics
of a data set are the same whether its blocks are scanned at once, part by part, or a part's
new files alone and merged into what was kept of the part (:mod:`daskfeed.scanning._scan`).

The mean and ``m2`` shown are rounded once from the exact sums (:func:`settle`).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

Dyadic = list[int]  # [numerator, exponent]: numerator * 2**exponent (JSON-able)
_ZERO: Dyadic = [0, 0]


def segment_moments(values: np.ndarray, present: np.ndarray | None,
                    bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, mean and sum of squared deviations of each segment's present values.

    Parameters
    ----------
    values
        The present values of the whole table, in row order (float64, no NaN).
    present
        Per row of the table, whether its value is present (``len(values)`` are); None:
        every row's is.
    bounds
        Where each segment starts in the table's rows, and where the last one ends.

    Returns
    -------
    tuple of numpy.ndarray
        Counts (int64), means and m2 (float64) of the segments holding values, in order.
        Each is computed from that segment's values alone (``numpy.add.reduceat`` sums a
        segment the same way wherever it lies), so it does not depend on its neighbours.
        One segment (a block parsed as one table: the usual case) gives the same numbers
        without the arrays that place many.
    """
    rows = len(present) if present is not None else len(values)
    if len(bounds) == 2 and bounds[0] == 0 and bounds[1] == rows:  # one segment
        if not len(values):
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
        counts = np.array([len(values)], dtype=np.int64)
        means = np.add.reduceat(values, [0]) / counts
        d = np.subtract(values, means[0])
        return counts, means, np.add.reduceat(np.multiply(d, d, out=d), [0])
    at = np.zeros(len(present) + 1 if present is not None else bounds[-1] + 1, dtype=np.int64)
    if present is None:
        at[1:] = np.arange(1, len(at), dtype=np.int64)
    else:
        np.cumsum(present, dtype=np.int64, out=at[1:])
    lo, hi = at[bounds[:-1]], at[bounds[1:]]
    counts = hi - lo
    some = counts > 0
    lo, counts = lo[some], counts[some]
    if not len(counts):
        return counts, np.zeros(0), np.zeros(0)
    means = np.add.reduceat(values, lo) / counts
    d = values - np.repeat(means, counts)
    return counts, means, np.add.reduceat(np.multiply(d, d, out=d), lo)


def exact_sums(counts: np.ndarray, means: np.ndarray, m2: np.ndarray) -> tuple[Dyadic, Dyadic]:
    """``S1`` and ``S2`` of segments (see the module's docstring), exactly.

    Returns
    -------
    tuple
        ``(S1, S2)`` as :data:`Dyadic` values.

    Raises
    ------
    OverflowError
        When a mean or ``m2`` is not finite (values whose squares pass float64's range).
    """
    if not (np.isfinite(means).all() and np.isfinite(m2).all()):
        raise OverflowError("a segment's mean or sum of squared deviations is beyond float64")
    # each float as numerator * 2**exponent, exactly (frexp's mantissa times 2**53 is whole)
    mantissas, exponents = np.frexp(np.concatenate([means, m2]))
    nums = (mantissas * float(1 << 53)).astype(np.int64).tolist()
    exps = (exponents.astype(np.int64) - 53).tolist()
    k = len(means)
    ns = counts.tolist()
    terms1 = [(n * a, e) for n, a, e in zip(ns, nums[:k], exps[:k], strict=True)]
    terms2 = [(n * a * a, 2 * e) for n, a, e in zip(ns, nums[:k], exps[:k], strict=True)]
    terms2 += zip(nums[k:], exps[k:], strict=True)
    return _sum(terms1), _sum(terms2)


def add(a: Dyadic | None, b: Dyadic | None) -> Dyadic:
    """``a + b`` exactly (None: 0)."""
    return _sum([tuple(x) for x in (a, b) if x])  # type: ignore[misc]


def settle(count: int, s1: Dyadic, s2: Dyadic) -> tuple[float, float]:
    """The mean and the sum of squared deviations of ``count`` values with sums ``s1``, ``s2``.

    Computed exactly, rounded once to float64 (``m2`` is never below 0).
    """
    if count <= 0:
        return 0.0, 0.0
    f1, f2 = _fraction(s1), _fraction(s2)
    return float(f1 / count), float(max(f2 - f1 * f1 / count, Fraction(0)))


def _sum(terms: list[tuple[int, int]]) -> Dyadic:
    """The exact sum of dyadic terms, in lowest terms (so equal sums are equal lists)."""
    terms = [(n, e) for n, e in terms if n]
    if not terms:
        return list(_ZERO)
    low = min(e for _, e in terms)
    total = sum(n << (e - low) for n, e in terms)
    if not total:
        return list(_ZERO)
    shift = (total & -total).bit_length() - 1
    return [total >> shift, low + shift]


def _fraction(d: Dyadic) -> Fraction:
    num, exp = int(d[0]), int(d[1])
    return Fraction(num << exp) if exp >= 0 else Fraction(num, 1 << -exp)
