"""Nulls: the null-marker rule applied to a parsed table, and the types every table keeps.

Empty fields are missing in every column; the usual markers (:data:`NA_MARKERS`) only in a
column whose other values are all numbers; the user's markers in every column. What each marker
made missing is counted in the table's schema metadata under :data:`NA_COUNTS_KEY`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daskfeed.core import DataError
from daskfeed.reading._dates import DATE_START, SPACES, iso_dates
from daskfeed.reading._files import Block

# values that are missing in numeric columns (text stays text unless the user lists them)
NA_MARKERS = ("NA", "N/A", "n/a", "#N/A", "#N/A N/A", "#NA", "<NA>", "NULL", "null", "None",
              "NaN", "nan", "-NaN", "-nan", "1.#IND", "-1.#IND", "1.#QNAN", "-1.#QNAN")
NULL_VALUES = ("", *NA_MARKERS)  # "" (an empty field) is missing in every column
# values of a float column made missing, and the marker each is counted under: a number that
# is no number, or one no model can take (inf, -inf, Infinity: no mean, no scale)
NOT_FINITE = (("NaN", pc.is_nan), ("inf", pc.is_inf))
# schema metadata of each parsed table: JSON {column: {marker: count of values it made missing}}
NA_COUNTS_KEY = b"daskfeed.na_counts"
# ... and JSON {column: times without a zone among zoned ones, taken as UTC}, where there were any
NAIVE_TIMES_KEY = b"daskfeed.naive_times"
_NUMBER_TYPES = (pa.int64(), pa.float64(), pa.bool_())  # pyarrow's order of inference


def column_markers(name: str, column: pa.ChunkedArray, forced: pa.DataType | None,
                    na_values: tuple[str, ...], block: Block, decimal: str = ".",
                    naive_times: dict[str, int] | None = None) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Apply the null-marker rule to one parsed column.

    A text column of ISO 8601 dates that pyarrow left as text (zoned and naive times mixed,
    or markers among them) becomes timestamps, its markers missing as in a column of numbers.

    Parameters
    ----------
    name
        The column's name (for errors).
    column
        The column as pyarrow parsed it (a forced column: as text).
    forced
        The column's dtype override, if any.
    na_values
        The user's null markers.
    block
        Where the column was read (for errors).
    decimal
        The decimal point of the numbers in the text (``--decimal``).
    naive_times
        Filled with ``{name: count}`` when the column mixed zoned times and times without a
        zone (those are taken as UTC).

    Returns
    -------
    tuple
        The column with its markers missing, and how many values each marker made missing.

    Raises
    ------
    DataError
        When a value of a forced column does not convert to its dtype.
    """
    counts = {"": column.null_count} if column.null_count else {}
    markers = tuple(dict.fromkeys(NA_MARKERS + na_values))
    if _is_text(column.type):
        if forced is None:
            numbers = _as_numbers(column, markers, decimal)
            dates = _as_dates(column, markers) if numbers is None else None
            if numbers is not None:
                column, made = numbers[0], _value_counts(column, numbers[1])
            elif dates is not None:
                column, made, naive = dates
                if naive and naive_times is not None:
                    naive_times[name] = naive
            else:  # text: only the user's markers are missing
                column, made = _null_where_in(column, na_values)
        elif _is_text(forced):
            column, made = _null_where_in(column, na_values)
        else:
            column, made = _as_forced(name, column, forced, markers, block, decimal)
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        column, made = _null_numbers(column, na_values)
    else:
        made = {}
    if pa.types.is_floating(column.type):
        column, nans = _not_finite_to_null(column)
        made = _added(made, nans)
    return column, _added(counts, made)


def numbers_by_part(column: pa.ChunkedArray, na_values: tuple[str, ...],
                    bounds: np.ndarray) -> tuple[pa.ChunkedArray, list[dict[str, int]]]:
    """:func:`column_markers` of a column that is not text, for all its parts at once.

    What the rule does to such a column is value by value (empty fields, the user's markers
    that are numbers, NaN, infinities), so one pass over the whole column gives each part (the rows from
    ``bounds[i]`` to ``bounds[i + 1]``) the values and counts it gets on its own; the counts
    come from the masks of the whole column, summed per part.

    Parameters
    ----------
    column
        A column that is not text (see :func:`column_markers` for text).
    na_values
        The user's null markers.
    bounds
        Where each part starts, and where the last one ends: ascending, from 0 to the
        column's length.

    Returns
    -------
    tuple
        The column with its markers missing (normalized, see :func:`normalize_column`), and
        for each part how many values each marker made missing.
    """
    masks = [("", _mask(column.is_null()))] if column.null_count else []
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        for marker in na_values:
            try:
                value = float(marker)
            except ValueError:
                continue
            column = _null_masked(column, pc.fill_null(pc.equal(column, value), False), marker, masks)
    if pa.types.is_floating(column.type):
        for marker, test in NOT_FINITE:
            column = _null_masked(column, pc.fill_null(test(column), False), marker, masks)
    return normalize_column(column), _by_part(masks, bounds)


def text_by_part(column: pa.ChunkedArray, na_values: tuple[str, ...], bounds: np.ndarray,
                 decimal: str = ".") -> tuple[pa.ChunkedArray, list[dict[str, int]]] | None:
    """:func:`column_markers` of a text column (no dtype override), for all its parts at once.

    A part whose first value (neither missing nor a marker) is text, not blank, stays text on
    its own, and only the user's markers become missing in it, value by value: when every part
    reads so, one pass over the whole column does. None when some part may be numbers or dates (its
    first value looks like one, is blank, or it has none): :func:`column_markers` decides part
    by part.

    Parameters
    ----------
    column
        A text column, as parsed.
    na_values
        The user's null markers.
    bounds
        Where each part starts, and where the last one ends (see :func:`numbers_by_part`).
    decimal
        The decimal point of the numbers in the text (``--decimal``).

    Returns
    -------
    tuple or None
        The column with the user's markers missing, and for each part how many values each
        marker made missing.
    """
    markers = tuple(dict.fromkeys(NA_MARKERS + na_values))
    for first in set(first_values(column, bounds, markers)):
        # (blank: the date rule looks past it, at the first value that is not)
        if first is None or not first.strip(SPACES) or _looks_like_a_number(first, decimal) \
                or DATE_START.match(first):
            return None
    masks = [("", _mask(column.is_null()))] if column.null_count else []
    hit = _is_in(column, na_values) if na_values else None
    made = _value_counts(column, hit) if hit is not None else {}
    for marker in made:  # each of the user's markers found, where it is
        masks.append((marker, _mask(pc.fill_null(pc.equal(column, marker), False))))
    if made:
        column = _null(column, hit)
    return normalize_column(column), _by_part(masks, bounds)


def _by_part(masks: list[tuple[str, np.ndarray]], bounds: np.ndarray) -> list[dict[str, int]]:
    """For each part (see :func:`numbers_by_part`), how many values each marker's mask hit.

    Two masks of one marker (the user's ``inf`` and the rule's) add up.
    """
    counts: list[dict[str, int]] = [{} for _ in range(len(bounds) - 1)]
    for marker, mask in masks:
        for part, n in enumerate(_part_sums(mask, bounds)):
            if n:
                counts[part][marker] = counts[part].get(marker, 0) + int(n)
    return counts


def _added(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Counts by marker, ``b``'s added to ``a``'s (one marker counted twice adds up)."""
    out = dict(a)
    for marker, n in b.items():
        out[marker] = out.get(marker, 0) + n
    return out


def count_by_part(where: pa.ChunkedArray, bounds: np.ndarray) -> np.ndarray:
    """How many values of each part (rows ``bounds[i]:bounds[i + 1]``) ``where`` is true at (missing: not).

    Parameters
    ----------
    where
        A boolean column.
    bounds
        Where each part starts, and where the last one ends.

    Returns
    -------
    numpy.ndarray
        One count per part.
    """
    if len(bounds) == 2:  # one part: no mask needed
        return np.array([pc.sum(where).as_py() or 0])
    return _part_sums(_mask(where), bounds)


def _part_sums(mask: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    running = np.concatenate(([0], np.cumsum(mask)))
    return running[bounds[1:]] - running[bounds[:-1]]


def _mask(where: pa.ChunkedArray) -> np.ndarray:
    """A boolean column as numpy (missing: False)."""
    return where.to_numpy(zero_copy_only=False).astype(bool)


def _null_masked(column: pa.ChunkedArray, hit: pa.ChunkedArray, marker: str,
                 masks: list[tuple[str, np.ndarray]]) -> pa.ChunkedArray:
    """``column`` missing where ``hit``; the mask noted under ``marker`` when it hit anything."""
    mask = _mask(hit)
    if not mask.any():
        return column
    masks.append((marker, mask))
    return _null(column, hit)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_in(column: pa.ChunkedArray, values: Sequence[str]) -> pa.ChunkedArray:
    return pc.is_in(column, value_set=_value_set(tuple(values)))


@functools.lru_cache(maxsize=64)
def _value_set(values: tuple[str, ...]) -> pa.Array:
    """The markers as an Arrow array, made once per set (many small files: many columns)."""
    return pa.array(list(values), pa.string())


def _null(column: pa.ChunkedArray, where: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(where, pa.scalar(None, column.type), column)


def _value_counts(column: pa.ChunkedArray, where: pa.ChunkedArray) -> dict[str, int]:
    """How many times each value of ``column`` occurs where ``where`` is true."""
    return {r["values"]: r["counts"] for r in pc.value_counts(pc.filter(column, where)).to_pylist()}


def _as_numbers(column: pa.ChunkedArray, markers: Sequence[str],
                decimal: str = ".") -> tuple[pa.ChunkedArray, pa.ChunkedArray] | None:
    """Convert a text column whose values other than markers are all numbers.

    Returns ``column`` as int64, float64 or bool with its markers missing, and where the
    markers were; None for text (told by its first values, before the whole column is
    looked at), and for a column of only markers and empties. ``decimal``: the numbers'
    decimal point.
    """
    first = _first_value(column, markers)
    if first is not None and not _looks_like_a_number(first, decimal):
        return None  # text, told by its first value without a failing cast (they are slow)
    original, column = column, _with_point(column, decimal)
    head = column.slice(0, 256)
    values = pc.drop_null(pc.filter(head, pc.invert(_is_in(head, markers))))
    targets = [t for t in _NUMBER_TYPES if _casts(values, t)]
    if len(values) and not targets:
        return None
    is_marker = _is_in(original, markers)
    if not len(values):  # the first values are markers: look further
        values = pc.drop_null(pc.filter(column, pc.invert(is_marker))).slice(0, 256)
        targets = [t for t in _NUMBER_TYPES if len(values) and _casts(values, t)]
    for target in targets:
        try:
            return pc.cast(_null(column, is_marker), target), is_marker
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


def first_values(column: pa.ChunkedArray, bounds: np.ndarray, skip: Sequence[str] = (),
                 most: int = 256) -> list[str | None]:
    """Each part's first value among its first ``most`` that is neither missing nor in ``skip``.

    The value a look at each part's slice alone finds (blanks count as values), for all parts
    of a text column at once: one ``take`` of every part's first value, which is usually it; a
    part whose first value is missing or skipped is looked at on its own.

    Parameters
    ----------
    column
        A text column.
    bounds
        Where each part starts, and where the last one ends: ascending, from 0 to the
        column's length.
    skip
        Values passed over (null markers).
    most
        How many of a part's first values are looked at.

    Returns
    -------
    list
        One value (or None: none there) per part.
    """
    cuts = np.asarray(bounds, dtype=np.int64)
    full = np.flatnonzero(np.diff(cuts) > 0)
    out: list[str | None] = [None] * (len(cuts) - 1)
    skipped = set(skip)
    heads = column.take(cuts[full]).to_pylist() if len(full) else []
    for k, head in zip(full.tolist(), heads, strict=True):
        if head is not None and head not in skipped:
            out[k] = str(head)
        else:
            lo = int(cuts[k])
            out[k] = _first_value(column.slice(lo, int(cuts[k + 1]) - lo), skip, most)
    return out


def _first_value(column: pa.ChunkedArray, markers: Sequence[str], most: int = 256,
                 blank: bool = True) -> str | None:
    """The first of the first ``most`` values that is neither missing nor a marker, if any.

    ``blank`` False: nor only spaces.
    """
    skip = set(markers)
    for chunk in column.slice(0, most).chunks:  # scalars one at a time: usually one is read
        for scalar in chunk:
            value = scalar.as_py()
            if value is not None and value not in skip and (blank or value.strip(SPACES)):
                return str(value)
    return None


def _as_dates(column: pa.ChunkedArray,
              markers: Sequence[str]) -> tuple[pa.ChunkedArray, dict[str, int], int] | None:
    """A text column whose values other than markers and blanks are all ISO 8601 dates, as timestamps.

    pyarrow leaves such a column as text when zoned and naive times are mixed in it, or null
    markers stand among the dates; read alone, each value would be a date. The timestamps
    are those of :meth:`daskfeed.reading._dates.IsoDates.as_timestamps` (a time without a zone
    taken as UTC); the markers and blank values are missing, counted by value; and how many
    times had no zone where others had one (0 unless mixed). None for any other column (told
    by its first value, usually).
    """
    first = _first_value(column, markers, blank=False)
    if first is None or not DATE_START.match(first):
        return None
    text = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    is_marker = pc.fill_null(_is_in(text, markers), False)
    dates = iso_dates(_null(text, is_marker))
    if (~dates.ok & ~dates.blank).any():
        return None  # some value is no date: text (the scan names stray tokens)
    missing = np.asarray(is_marker, dtype=bool) | (dates.blank & np.asarray(text.is_valid(), dtype=bool))
    made = _value_counts(pa.chunked_array([text]), pa.chunked_array([pa.array(missing)]))
    stamps = dates.as_timestamps()
    naive = int((dates.ok & ~dates.blank & ~dates.zoned).sum()) if dates.zoned.any() else 0
    return pa.chunked_array([stamps]), made, naive


def _with_point(column: pa.ChunkedArray, decimal: str) -> pa.ChunkedArray:
    """Text whose numbers are written with ``decimal`` as their point, with ``.`` instead.

    With a decimal comma, dots group thousands (``1.234,5`` is 1234.5, ``1.234`` is 1234), as
    the locales that write a decimal comma have it.
    """
    if decimal == ".":
        return column
    if decimal == ",":
        column = pc.replace_substring(column, ".", "")
    return pc.replace_substring(column, decimal, ".")


def _looks_like_a_number(text: str, decimal: str = ".") -> bool:
    """Whether ``text`` could be a value of a number or bool column (pyarrow decides for sure)."""
    try:
        float(text if decimal == "." else
              text.replace(".", "").replace(decimal, ".") if decimal == "," else
              text.replace(decimal, "."))
    except ValueError:
        return text.strip().lower() in ("true", "false")
    return True


def _casts(values: pa.ChunkedArray, target: pa.DataType) -> bool:
    try:
        pc.cast(values, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _null_where_in(column: pa.ChunkedArray, markers: Sequence[str]) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Text column: ``markers`` become missing; counted per marker."""
    if not markers:
        return column, {}
    hit = _is_in(column, markers)
    made = _value_counts(column, hit)
    return (_null(column, hit), made) if made else (column, {})


def _as_forced(name: str, column: pa.ChunkedArray, target: pa.DataType, markers: Sequence[str],
               block: Block, decimal: str = ".") -> tuple[pa.ChunkedArray, dict[str, int]]:
    """A column with a dtype override (read as text): markers missing, the rest cast."""
    hit = _is_in(column, markers)
    numeric = pa.types.is_integer(target) or pa.types.is_floating(target)
    try:
        converted = pc.cast(_null(_with_point(column, decimal) if numeric else column, hit), target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(
            f"Expected {target} values in column {name!r} of {block.describe()} (its dtype "
            f"override). Received: {err}.\nHint: fix the value, list it as a null marker "
            "(na_values / --na-values), or change the column's dtype override."
        ) from err
    return converted, _value_counts(column, hit)


def _null_numbers(column: pa.ChunkedArray,
                  na_values: Sequence[str]) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Numeric column: the user's markers that are numbers (``-999``) become missing."""
    made = {}
    for marker in na_values:
        try:
            value = float(marker)
        except ValueError:
            continue
        hit = pc.fill_null(pc.equal(column, value), False)
        n = pc.sum(hit).as_py() or 0
        if n:
            made[marker] = n
            column = _null(column, hit)
    return column, made


def _not_finite_to_null(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray, dict[str, int]]:
    """Float column: NaN and infinities (however spelled) become missing, as "NaN" and "inf"."""
    made = {}
    for marker, test in NOT_FINITE:
        hit = pc.fill_null(test(column), False)  # (a missing value is neither)
        n = pc.sum(hit).as_py() or 0
        if n:
            made[marker] = n
            column = _null(column, hit)
    return column, made


def na_counts(table: pa.Table) -> dict[str, dict[str, int]]:
    """What the parser's null markers made missing, per column (the table's schema metadata).

    Parameters
    ----------
    table
        A parsed table.

    Returns
    -------
    dict
        ``{column: {marker: count}}``.
    """
    raw = (table.schema.metadata or {}).get(NA_COUNTS_KEY)
    return json.loads(raw) if raw else {}


def naive_times(table: pa.Table) -> dict[str, int]:
    """Times without a zone among zoned ones in a parsed table, per column (taken as UTC).

    Parameters
    ----------
    table
        A parsed table.

    Returns
    -------
    dict
        ``{column: count}``; empty when no column mixed them.
    """
    raw = (table.schema.metadata or {}).get(NAIVE_TIMES_KEY)
    return json.loads(raw) if raw else {}


def finite_floats(table: pa.Table) -> pa.Table:
    """A typed table's (Parquet's) float columns with NaN and infinities missing, counted as CSV's are.

    Parameters
    ----------
    table
        A table read with its types (no null-marker rule).

    Returns
    -------
    pyarrow.Table
        The same columns; what became missing in its schema metadata (see :func:`na_counts`).
    """
    counts: dict[str, dict[str, int]] = {}
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_floating(column.type):
            column, made = _not_finite_to_null(column)
            if made:
                counts[name] = made
        columns.append(column)
    if not counts:
        return table
    return with_na_counts(pa.Table.from_arrays(columns, names=table.column_names), counts)


def with_na_counts(table: pa.Table, counts: dict[str, dict[str, int]],
                   naive: dict[str, int] | None = None) -> pa.Table:
    """A table with what its null markers made missing in its schema metadata.

    Parameters
    ----------
    table
        A parsed table.
    counts
        ``{column: {marker: count}}``.
    naive
        ``{column: times without a zone among zoned ones}``, if any.

    Returns
    -------
    pyarrow.Table
        ``table`` with ``counts`` as JSON under :data:`NA_COUNTS_KEY` (and ``naive`` under
        :data:`NAIVE_TIMES_KEY`).
    """
    meta = dict(table.schema.metadata or {})
    meta[NA_COUNTS_KEY] = json.dumps(counts, sort_keys=True).encode()
    if naive:
        meta[NAIVE_TIMES_KEY] = json.dumps(naive, sort_keys=True).encode()
    return table.replace_schema_metadata(meta)


def normalize(table: pa.Table) -> pa.Table:
    """Types that survive nulls and chunking: bool → float64, dates → timestamps.

    Parameters
    ----------
    table
        A parsed table (e.g. a Parquet row group).

    Returns
    -------
    pyarrow.Table
        The same columns, those types converted.
    """
    return pa.Table.from_arrays([normalize_column(c) for c in table.columns],
                                names=table.column_names)


def normalize_column(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """One column as :func:`normalize` makes it.

    Parameters
    ----------
    column
        A parsed column.

    Returns
    -------
    pyarrow.ChunkedArray
        Booleans as float64, dates as timestamps, others as they are.
    """
    if pa.types.is_boolean(column.type):
        return column.cast(pa.float64())
    if pa.types.is_date(column.type):
        return column.cast(pa.timestamp("s"))
    return column

