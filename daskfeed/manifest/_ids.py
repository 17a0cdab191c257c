"""Ids: feature columns that look like row ids rather than features, and the warning about them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol


class Column(Protocol):
    """What is read of a manifest's column (:class:`~daskfeed.manifest._manifest.Column`)."""

    kind: str
    count: int
    distinct: int
    approximate: bool
    integer: bool
    missing: int
    min: float | None
    max: float | None
    mean: float
    var: float


def id_like(columns: Mapping[str, Column], names: list[str]) -> dict[str, str]:
    """The columns of ``names`` that look like row ids rather than features, and why.

    An unnamed column (an empty header, or pandas' ``Unnamed: 0``: the row numbers R and
    pandas write), a numeric column named like an id (``id``, ``user_id``, ``userId``),
    whole numbers that are a permutation of consecutive values (one per row, judged from
    count, range and variance), or text with about as many distinct values as rows.

    Parameters
    ----------
    columns
        A manifest's columns by name.
    names
        Columns of ``columns`` (the features chosen).

    Returns
    -------
    dict of str to str
        ``{column: why it looks like a row id}``; empty when none does.
    """
    found = {}
    for name in names:
        col = columns[name]
        if name.strip() == "" or re.fullmatch(r"Unnamed: \d+", name):
            found[name] = "an unnamed column, as R and pandas write row numbers"
        elif col.kind == "numeric" and re.fullmatch(r"(?i)id|.*[_\-. ]id|.*[a-z]I[dD]", name):
            found[name] = "named like an id, used as a number"
        elif col.kind == "numeric" and _consecutive(col):
            found[name] = "whole numbers, one per row"
        elif col.kind == "categorical" and col.count >= 100 and col.distinct >= 0.95 * col.count:
            about = "~" if col.approximate else ""
            found[name] = f"{about}{col.distinct:,} distinct values in {col.count:,} rows"
    return found


def joined(a: Column, b: Column) -> Column:
    """One column as two disjoint parts of the data hold it (a split's training and validation).

    What :func:`id_like` reads, exact for counts, range and variance: a row number is a
    permutation of consecutive values over the whole data, not over either part.

    Parameters
    ----------
    a, b
        The same column in the two parts' manifests.

    Returns
    -------
    Column
        The whole data's view of it (enough for :func:`id_like`).
    """
    from types import SimpleNamespace

    n = a.count + b.count
    mean = (a.mean * a.count + b.mean * b.count) / n if n else 0.0
    var = ((a.var * a.count + b.var * b.count
            + a.count * b.count / n * (a.mean - b.mean) ** 2) / n) if n else 0.0
    bounds = [v for v in (a.min, b.min) if v is not None], [v for v in (a.max, b.max) if v is not None]
    whole = SimpleNamespace(
        kind=a.kind if a.kind == b.kind else "mixed", count=n, distinct=a.distinct + b.distinct,
        approximate=True, integer=a.integer and b.integer, missing=a.missing + b.missing,
        min=min(bounds[0]) if bounds[0] else None, max=max(bounds[1]) if bounds[1] else None,
        mean=mean, var=var)
    return whole


def id_warning(found: dict[str, str]) -> str:
    """The warning about feature columns that look like row ids, with the fix.

    Parameters
    ----------
    found
        What :func:`id_like` returned (not empty).

    Returns
    -------
    str
        The columns and why, and the ``--exclude`` / ``exclude=`` that leaves them out.
    """
    names = sorted(found)  # an unnamed column first: a leading comma names it in --exclude
    flag = ",".join(names) or "''"
    return (
        "Feature column(s) that look like row ids: "
        + ", ".join(f"{n!r} ({found[n]})" for n in names)
        + ". A model learns nothing from them that carries over to new rows.\nHint: leave them "
        f"out: --exclude {flag} (exclude={names!r}), or choose the features (--features, features=)."
    )


def _consecutive(col: Column) -> bool:
    """Whole numbers min..max, each once: count, range and variance (n²-1)/12 all agree."""
    n = col.count
    if not (col.integer and n >= 100 and not col.missing and col.min is not None
            and col.max is not None and col.max - col.min + 1 == n):
        return False
    return abs(col.var - (n * n - 1) / 12) <= 0.02 * (n * n - 1) / 12
