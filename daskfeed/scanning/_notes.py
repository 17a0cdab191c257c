"""The scan's notes: what it decided for the user that the user should know (kept in the manifest)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from daskfeed.manifest import EXACT_FLOAT32, Column, numeric_dtype


def naive_notes(facts: list[dict[str, Any]]) -> list[str]:
    """A note per date column that mixed zoned times with times without a zone.

    The reader takes a time without a zone as UTC (as pyarrow counts the seconds of such times,
    and as ``serving/`` reads them); where zoned times stand beside them, they may have been
    local times.

    Parameters
    ----------
    facts
        What the scan found in each block (their ``naive_times``).

    Returns
    -------
    list of str
        One note per such column.
    """
    naive: Counter[str] = Counter()
    for f in facts:
        naive.update(f.get("naive_times", {}))
    return [
        f"Column {name!r} mixes times with a zone (such as 2013-09-23T21:00:00Z) and {n:,} "
        "time(s) without one (2013-09-23 21:00:00); those are read as UTC, as pyarrow and "
        "serving/ read a time without a zone. Hint: if they are local times, write them with "
        "their offset (+02:00)."
        for name, n in sorted(naive.items()) if n]


def vocabulary_notes(columns: dict[str, Column]) -> list[str]:
    """A note per text column whose vocabulary the counts kept do not decide.

    (See :func:`daskfeed.scanning._schema.decided`.)

    Parameters
    ----------
    columns
        Every column, by name.

    Returns
    -------
    list of str
        One note per such column.
    """
    return [
        f"Column {c.name!r} has more distinct values than the scan counts exactly (over 50,000 "
        f"in a part of the data: ~{c.distinct:,} in all), and the counts kept do not decide its "
        f"{len(c.vocabulary):,} most frequent: a value left out may have up to {c.count_bound:,} "
        "rows more than counted. Its vocabulary is the most frequent of the counts kept (values "
        "past it share the out-of-vocabulary code). Hint: exclude the column if it is an id, or "
        "lower --vocabulary-size to the values that clearly stand out."
        for c in columns.values() if c.kind == "categorical" and not c.vocabulary_decided]


def wide_notes(columns: dict[str, Column], label: str) -> list[str]:
    """A note per numeric column whose values reach 2**24, where float32 stops being exact.

    Parameters
    ----------
    columns
        Every column, by name.
    label
        The label's name.

    Returns
    -------
    list of str
        One note per such column.
    """
    notes = []
    for c in columns.values():
        if c.kind != "numeric" or numeric_dtype(c) == "float32":
            continue
        big = max((v for v in (c.min, c.max) if v is not None), key=abs)
        what = "label" if c.name == label else "column"
        notes.append(
            f"{what.capitalize()} {c.name!r} holds values up to {big:,} (beyond 2**24 = "
            f"{EXACT_FLOAT32:,}, where float32 stops holding every whole number): batches carry "
            f"it as {numeric_dtype(c)}, exactly; "
            + ("a float32 model input rounds it (the default model standardizes it in float64 "
               f"first). Hint: if it is an id, leave it out (exclude={[c.name]})."
               if what == "column" else
               "Keras computes the loss in float32, which rounds it. Hint: predict a scaled "
               "label (e.g. thousands, or a log).")
        )
    return notes
