"""Text that is really numbers or dates: the scan refuses it rather than make it categories.

A text column whose values are numbers written with a decimal comma, or numbers (or ISO 8601
dates) but for a few stray tokens, would silently become a category of thousands of values;
:func:`refuse_numbers_as_text` says so with the flag that reads them (``--decimal ,``,
``--na-values``, ``--dtype NAME=string``). Stray tokens that made only some blocks text (the
column then changes type from block to block) are refused alike (:func:`refuse_strays_among`).
A stray token is named with the line, file and column where it first is: its block is read
again on the way to the error. :func:`where` names a block in every message of the scan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from daskfeed.core import DaskfeedError, SchemaError
from daskfeed.reading import ISO_DATE, NA_MARKERS, SPACES, Source, Spot, iter_tables, locate_values

_MARKERS = frozenset(NA_MARKERS)
_ISO_DATE = re.compile(ISO_DATE)
_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"  # numbers (float() takes them), told in C


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a number (``float()`` takes it).

    Parameters
    ----------
    text
        A value as read.

    Returns
    -------
    bool
        True when ``float(text)`` takes it.
    """
    try:
        float(text)
    except ValueError:
        return False
    return True


# a number written with a decimal comma: 1,5  -3,25  1.234,5 (dots grouping thousands)
_DECIMAL_COMMA = re.compile(r"[+-]?(\d{1,3}(\.\d{3})+|\d+),\d+")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+")  # 12,345 or 1,234,567: US thousands, ambiguous
STRAY_TOKENS = 5  # at most this many distinct non-numbers in a column of numbers: stray tokens
STRAY_SHARE = 0.01  # ... on at most this share of its rows
STRAY_READS = 3  # blocks read again, at most, to name the lines of stray tokens (on the way to an error)


def refuse_numbers_as_text(src: Source, name: str, values: dict[str, int], block: int,
                           approximate: bool = False, count: int = 0) -> None:
    """Refuse a text column that is really numbers or dates: a decimal comma, or a few stray tokens.

    Either would silently become a category of thousands of values (a numeric label: a
    classifier of as many classes). The scan's exact value counts tell: numbers written
    ``1,5`` while the decimal point is ``.`` (hint: ``--decimal ,``), or numbers but for at
    most :data:`STRAY_TOKENS` distinct values on at most :data:`STRAY_SHARE` of the rows (such
    as ``?`` or ``-``; hint: list them with ``--na-values``); ISO 8601 dates but for such
    stray tokens the same. A column of text that merely holds some numbers is left as it is;
    ``--dtype NAME=string`` keeps any column as text.

    Parameters
    ----------
    src
        The data (its read options and blocks).
    name
        The column.
    values
        Its value counts (the most frequent when there are very many).
    block
        The first block that read it as text (named in the message; stray tokens are looked
        for in it and the blocks after it, :data:`STRAY_READS` at most, to name their lines).
    approximate
        ``values`` holds only the most frequent values: a rare stray token may be missing from
        it. When those values are numbers (dates) but for a few stray tokens, the first text
        block is read again for the others (:data:`STRAY_TOKENS` distinct ones at most: stray
        tokens too).
    count
        The column's values in all (its numbers are told from it when ``values`` is
        approximate).

    Raises
    ------
    SchemaError
        Naming the column, the values and where, with the flag that reads them.
    """
    rows = sum(values.values())
    if not rows:
        return
    numbers = {v: n for v, n in values.items() if is_number(v)}
    comma = ({v: n for v, n in values.items() if _DECIMAL_COMMA.fullmatch(v.strip())}
             if src.options.decimal == "." else {})
    other = {v: n for v, n in values.items()  # null markers are missing once it reads as numbers
             if v not in numbers and v not in comma and v.strip() not in _MARKERS}
    keep = _keep(name)
    if comma and all(_THOUSANDS.fullmatch(v.strip()) for v in comma) and (
            sum(comma.values()) + sum(numbers.values()) >= (1 - STRAY_SHARE) * rows):
        shown = ", ".join(repr(v) for v in sorted(comma, key=lambda v: -comma[v])[:3])
        raise SchemaError(
            f"Expected numbers without thousands separators in column {name!r}. Received: "
            f"{shown} ... ({sum(comma.values()):,} of {rows:,} values) in {where(src, block)}, "
            "which would be read as text categories.\nHint: write the numbers without the "
            "',' between thousands (pyarrow reads no thousands separator); with a decimal "
            f"comma (1.234,5) pass --decimal , instead. To keep the column as text: {keep}.")
    if comma and sum(comma.values()) + sum(numbers.values()) >= (1 - STRAY_SHARE) * rows:
        shown = ", ".join(repr(v) for v in sorted(comma, key=lambda v: -comma[v])[:3])
        raise SchemaError(
            f"Expected numbers with the decimal point '.' in column {name!r}. Received: "
            f"numbers written with a decimal comma ({shown} ...; {sum(comma.values()):,} of "
            f"{rows:,} values) in {where(src, block)}, which would be read as text categories."
            f"\nHint: pass --decimal , (decimal=','); such files often separate fields with "
            f"';' (--sep ';'). To keep the column as text: {keep}.")
    if numbers:
        what, found = "numbers", numbers
    else:
        what = "ISO 8601 dates"
        found = {v: n for v, n in values.items() if _ISO_DATE.match(v.strip(SPACES))}
        other = {v: n for v, n in values.items() if v not in found and v.strip() not in _MARKERS}
    if len(found) < 3 or len(other) > STRAY_TOKENS or sum(other.values()) > max(1, STRAY_SHARE * rows):
        return
    counted: dict[str, int | None] = dict(other)
    if approximate:  # a rare token may not be counted: the first text block holds one, if any
        counted.update({v: None for v in _strays_in(src, block, name, what, STRAY_TOKENS + 1)
                        if v not in counted})
    if not counted or len(counted) > STRAY_TOKENS:
        return
    spots = _places(src, name, range(block, min(block + STRAY_READS, src.npartitions)), counted)
    markers = sum(n for v, n in values.items() if v.strip() in _MARKERS)
    n = count - sum(other.values()) - markers if approximate else sum(found.values())
    raise _strays(src, name, what, n, counted, spots, block)


def refuse_strays_among(src: Source, name: str, what: str, present: int, values: dict[str, int],
                        blocks: Sequence[int]) -> list[Spot]:
    """Refuse a column of numbers (or dates) in some blocks that a few stray tokens made text in others.

    pyarrow types each block on its own rows: one ``?`` makes a block of numbers a block of
    text, and the column then changes type from block to block. When the values that are not
    ``what`` (nor null markers) are at most :data:`STRAY_TOKENS` distinct ones on at most
    :data:`STRAY_SHARE` of the values, they are refused as stray tokens, as
    :func:`refuse_numbers_as_text` refuses them in a column that is text in every block: the
    message names each one and the line, file and column where it first is, with the
    ``--na-values`` that reads them. The first text block is read again to find them (the
    value counts may not hold a rare one, and hold no places); a later one only for a token
    not found in it, :data:`STRAY_READS` blocks at most. Only on the way to an error: the
    caller refuses the column otherwise (it changes type).

    Parameters
    ----------
    src
        The data (its read options and blocks).
    name
        The column.
    what
        ``"numbers"`` or ``"ISO 8601 dates"``: what the other blocks read it as.
    present
        Values of the column in every block that holds any (not missing, not a null marker of
        a block of nothing else).
    values
        Its value counts in the blocks that read it as text (the most frequent when there are
        very many).
    blocks
        The blocks that read it as text (or as text and ``what``), in order.

    Returns
    -------
    list of Spot
        Otherwise: the first values of the first text block that are not ``what``, and where
        they are (for the message that the column changes type).

    Raises
    ------
    SchemaError
        Naming the stray tokens, where they are, and the flag that reads them.
    """
    stray = _not_of(what)
    known = {v: n for v, n in values.items() if stray(v)}
    tokens = dict.fromkeys([*_strays_in(src, blocks[0], name, what, STRAY_TOKENS + 1), *known]) \
        if blocks else dict.fromkeys(known)
    if not tokens or len(tokens) > STRAY_TOKENS or sum(known.values()) > max(1, STRAY_SHARE * present):
        return _places(src, name, blocks[:1], list(tokens)[:3])
    markers = sum(n for v, n in values.items() if v.strip() in _MARKERS)
    raise _strays(src, name, what, present - sum(known.values()) - markers,
                  {v: known.get(v) for v in tokens}, _places(src, name, blocks[:STRAY_READS], tokens),
                  blocks[0] if blocks else 0)


def text_of(values: dict[str, int]) -> str | None:
    """What text values are when they are some of a kind: ``"numbers"``, ``"ISO 8601 dates"`` or None.

    Parameters
    ----------
    values
        Value counts of a column.

    Returns
    -------
    str or None
        ``"numbers"`` when some value is a number; else ``"ISO 8601 dates"`` when some is an
        ISO 8601 date; else None.
    """
    if any(is_number(v) for v in values):
        return "numbers"
    return "ISO 8601 dates" if any(_ISO_DATE.match(v.strip(SPACES)) for v in values) else None


def _not_of(what: str) -> Callable[[str], bool]:
    """Whether a value is a stray token in a column of ``what``: neither that nor a null marker."""
    if what == "numbers":
        return lambda v: v.strip() not in _MARKERS and not is_number(v)
    return lambda v: v.strip() not in _MARKERS and not _ISO_DATE.match(v.strip(SPACES))


def _strays_in(src: Source, i: int, name: str, what: str, most: int) -> list[str]:
    """The values of column ``name`` in block ``i`` that are neither ``what`` nor null markers.

    The block is parsed again as the scan parsed it; only its distinct text values that do not
    look like ``what`` at a glance (a pattern, in C) are tried one by one. ``most`` at most;
    none for a dask DataFrame or a block that cannot be read again.
    """
    if src.frame is not None:
        return []
    stray, found = _not_of(what), []
    looks = _NUMBER if what == "numbers" else ISO_DATE
    try:
        for table in iter_tables(src.blocks[i], src.options):
            column = table.column(name) if name in table.column_names else None
            if column is None or not (pa.types.is_string(column.type)
                                      or pa.types.is_large_string(column.type)):
                continue
            distinct = pc.unique(pc.drop_null(column))
            others = pc.filter(distinct, pc.invert(pc.match_substring_regex(distinct, looks)))
            found += [v for v in others.to_pylist() if v not in found and stray(v)]
            if len(found) >= most:
                break
    except (OSError, ValueError, DaskfeedError):  # (gone since the scan, say: nothing more is told)
        pass
    return found[:most]


def _places(src: Source, name: str, blocks: Sequence[int], values: Collection[str]) -> list[Spot]:
    """Where each of ``values`` first is in ``blocks`` (read again, in order, until all are found).

    Nothing for a dask DataFrame (no lines); a block that cannot be read again (gone since the
    scan, say) tells nothing more: the refusal is made without it.
    """
    spots: list[Spot] = []
    if src.frame is None:
        for i in blocks:
            left = [v for v in values if v not in {s.value for s in spots}]
            if not left:
                break
            try:
                spots += locate_values(src.blocks[i], src.options, name, left)
            except (OSError, ValueError, DaskfeedError):
                break
    return spots


def _strays(src: Source, name: str, what: str, found: int, other: Mapping[str, int | None],
            spots: list[Spot], block: int) -> SchemaError:
    """The error for a column of ``what`` (``found`` of them) but for a few stray ``other`` values.

    Each value with its count (None: not counted) and where it first is (``spots``); a value
    not found again is in a later block; with none found, the first text block is named.
    """
    tokens = sorted(other, key=lambda v: (-(other[v] or 0), v))
    exact = all(other[v] is not None for v in tokens)
    if exact:
        counted = (f"{sum(n or 0 for n in other.values()):,} other value(s) "
                   + ", ".join(f"{v!r} ({other[v]:,})" for v in tokens))
    else:  # (a token not counted is counted among the numbers: 'about')
        counted = "other values, among them " + ", ".join(repr(v) for v in tokens)
    at = {s.value for s in spots}
    places = "; ".join([f"{s.value!r} {'first ' if other[s.value] != 1 else ''}on {s.describe()}"
                        for s in spots] + [f"{v!r} in a later block" for v in tokens if v not in at])
    if not spots:
        places = f"first in {where(src, block)}"
    return SchemaError(
        f"Expected {what.rpartition(' ')[2]} in column {name!r}. Received: "
        f"{'' if exact else 'about '}{found:,} {what} "
        f"and {counted}, which would make the whole column text categories: {places}.\n"
        f"Hint: if they mean 'missing', list them: --na-values {','.join(tokens)} "
        f"(na_values={tokens!r}); to keep the column as text: {_keep(name)}.")


def _keep(name: str) -> str:
    """The flag (and argument) that keeps column ``name`` as text."""
    return f"--dtype {name}=string (dtype={{{name!r}: 'string'}})"


def where(src: Source, i: int) -> str:
    """Block ``i`` of ``src`` and the file bytes it covers, for messages.

    Parameters
    ----------
    src
        The data's source.
    i
        The block's index.

    Returns
    -------
    str
        ``block i (file, bytes a-b)``.
    """
    return f"block {i} ({src.blocks[i].describe()})"
