"""Text that is really numbers or dates: the scan refuses it rather than make it categories.

A text column whose values are numbers written with a decimal comma, or numbers (or ISO 8601
dates) but for a few stray tokens, would silently become a category of thousands of values;
:func:`refuse_numbers_as_text` says so with the flag that reads them (``--decimal ,``,
``--na-values``, ``--dtype NAME=string``). :func:`where` names a block in every message of the
scan.
"""

from __future__ import annotations

import re

from daskfeed.core import SchemaError
from daskfeed.reading import ISO_DATE, NA_MARKERS, SPACES, Source

_MARKERS = frozenset(NA_MARKERS)
_ISO_DATE = re.compile(ISO_DATE)


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


def refuse_numbers_as_text(src: Source, name: str, values: dict[str, int], block: int,
                           approximate: bool = False) -> None:
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
        The first block that read it as text (named in the message).
    approximate
        ``values`` holds only the most frequent values: rare stray tokens may be missing from
        it, so only the decimal comma is judged.

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
    keep = f"--dtype {name}=string (dtype={{{name!r}: 'string'}})"
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
    if approximate:
        return
    if numbers:
        _refuse_strays(src, name, "numbers", numbers, other, rows, block, keep)
    else:
        dates = {v: n for v, n in values.items() if _ISO_DATE.match(v.strip(SPACES))}
        _refuse_strays(src, name, "ISO 8601 dates", dates,
                       {v: n for v, n in values.items() if v not in dates and v.strip() not in _MARKERS},
                       rows, block, keep)


def _refuse_strays(src: Source, name: str, what: str, found: dict[str, int], other: dict[str, int],
                   rows: int, block: int, keep: str) -> None:
    """Refuse a column of ``what`` (``found``: their value counts) but for a few stray ``other`` values.

    At least three distinct values of the kind, at most :data:`STRAY_TOKENS` distinct others on
    at most :data:`STRAY_SHARE` of the ``rows`` (see :func:`refuse_numbers_as_text`).
    """
    if len(found) < 3 or not other or len(other) > STRAY_TOKENS or \
            sum(other.values()) > max(1, STRAY_SHARE * rows):
        return
    tokens = sorted(other, key=lambda v: (-other[v], v))
    counted = ", ".join(f"{v!r} ({other[v]:,})" for v in tokens)
    raise SchemaError(
        f"Expected {what.rpartition(' ')[2]} in column {name!r}. Received: {sum(found.values()):,} "
        f"{what} and {sum(other.values()):,} other value(s) {counted} in {where(src, block)}, "
        f"which would make the whole column text categories.\nHint: if they mean 'missing', "
        f"list them: --na-values {','.join(tokens)} (na_values={tokens!r}); to keep the column "
        f"as text: {keep}.")


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
