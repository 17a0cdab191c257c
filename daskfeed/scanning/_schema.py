"""Column kinds: what each block says a column is, and what the whole data set makes of it.

A block's kind comes from its Arrow table; kinds merge across blocks (an
integer column with blanks in late files becomes a float column with missing values), null
markers give way to the other blocks' kind, and real drift (numbers in one block, text in
another) is an error naming both blocks; numbers that a few stray tokens (``?``) made text in
some blocks are refused naming the tokens and their lines.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from daskfeed.core import SchemaError
from daskfeed.manifest import Column
from daskfeed.reading import NA_MARKERS, Source, Spot, first_values
from daskfeed.scanning._refusals import refuse_numbers_as_text, refuse_strays_among, text_of, where

NUMERIC_KINDS = {"int", "float"}
_MARKERS = frozenset(NA_MARKERS)

# what the scan learns of one block, and the merged statistics of one column (see daskfeed.scanning._stats)
BlockFacts = dict[str, Any]
ColumnStats = dict[str, Any]
Stats = dict[str, ColumnStats]  # {column: its statistics}


def arrow_kind(col: pa.ChunkedArray) -> str:
    """Kind of one Arrow column: int, float, string, datetime or null (all missing).

    Parameters
    ----------
    col
        One column of a parsed table.

    Returns
    -------
    str
        ``"int"``, ``"float"``, ``"string"``, ``"datetime"`` or ``"null"``.
    """
    if len(col) and col.null_count == len(col):
        return "null"
    return type_kind(col.type)


def type_kind(t: pa.DataType) -> str:
    """Kind of a column of Arrow type ``t`` that holds values (see :func:`arrow_kind`).

    Parameters
    ----------
    t
        The column's type.

    Returns
    -------
    str
        ``"int"``, ``"float"``, ``"string"``, ``"datetime"``, or ``"null"`` for the null type.
    """
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t):
        return "datetime"
    return "string"


def markers_only(col: pa.ChunkedArray) -> dict[str, int] | None:
    """``{marker: count}`` when every value of a text column is a null marker (``NA``, ...).

    Such a column of one block may be a numeric column's missing values or text that happens
    to read ``NA``; which, the other blocks decide (see :func:`resolve_column`).

    Parameters
    ----------
    col
        One column of a parsed table.

    Returns
    -------
    dict of str to int or None
        The count of each marker; None when the column is not text or holds other values.
    """
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None
    head = next((s.as_py() for c in col.slice(0, 256).chunks for s in c if s.is_valid), None)
    if head is not None and head not in _MARKERS:  # text, told without compute calls
        return None
    values = pc.drop_null(col)
    if not len(values) or not pc.all(pc.is_in(values, value_set=pa.array(NA_MARKERS))).as_py():
        return None
    vc = pc.value_counts(values)
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def markers_by_part(col: pa.ChunkedArray, bounds: Any) -> list[dict[str, int] | None]:
    """:func:`markers_only` of each part of a column (rows ``bounds[k]:bounds[k + 1]``).

    Told for all parts at once by each one's first value (usually text: None); a part whose
    first value is a marker, or has none, is looked at whole.
    """
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return [None] * (len(bounds) - 1)
    out: list[dict[str, int] | None] = []
    for k, head in enumerate(first_values(col, bounds)):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        out.append(None if head is not None and head not in _MARKERS
                   else markers_only(col.slice(lo, hi - lo)))
    return out


def merge_kind(a: str | None, b: str) -> str:
    """The kind of a column over two tables; null markers give way to any other kind.

    Parameters
    ----------
    a
        The kind so far (None: no table yet).
    b
        The kind in the next table.

    Returns
    -------
    str
        The merged kind.
    """
    if a is None or a == b or b in ("null", "markers"):
        return b if a in (None, "null") else a
    if a in ("null", "markers"):
        return b
    if {a, b} <= NUMERIC_KINDS:
        return "float"
    return "mixed"


def add_counts(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """``{column: {marker: count}}`` summed.

    Parameters
    ----------
    a, b
        ``{column: {marker: count}}`` of two parts.

    Returns
    -------
    dict
        Their sum (a new dict).
    """
    out = {c: dict(m) for c, m in a.items()}
    for c, m in b.items():
        for k, n in m.items():
            out.setdefault(c, {})[k] = out.get(c, {}).get(k, 0) + n
    return out


def check_headers(src: Source, facts: list[BlockFacts], notes: list[str]) -> tuple[list[str], set[str]]:
    """The columns every block lists, and the files listing them in another order.

    Another order is aligned by name (the feed takes columns by name); other names, or no
    rows at all, are refused. Empty files are skipped with a note.

    Parameters
    ----------
    src
        The data's source.
    facts
        What the scan found in each block (:data:`BlockFacts`), in block order.
    notes
        Notes for the user; empty files are noted here.

    Returns
    -------
    tuple
        The column names, and the files that list them in another order.

    Raises
    ------
    SchemaError
        When a file's header names other columns than the first file's, or every file is empty.
    """
    ref_cols: list[str] | None = None
    ref_i = 0
    aligned: set[str] = set()
    for i, f in enumerate(facts):
        if not f["columns"]:
            continue  # empty file
        if ref_cols is None:
            ref_cols, ref_i = f["columns"], i
        elif f["columns"] != ref_cols and sorted(f["columns"]) == sorted(ref_cols):
            aligned.add(src.blocks[i].path)
        elif f["columns"] != ref_cols:
            missing = [c for c in ref_cols if c not in f["columns"]]
            extra = [c for c in f["columns"] if c not in ref_cols]
            what = (f"missing {missing}" if missing else "") + (
                f"{'; ' if missing else ''}extra {extra}" if extra else "")
            raise SchemaError(
                f"Header of {where(src, i)} differs from {where(src, ref_i)}: "
                f"{what or 'same names in another order'}.\nExpected: {ref_cols}.\n"
                f"Received: {f['columns']}.\nHint: give all files the same header."
            )
    if ref_cols is None:
        raise SchemaError(
            "Expected rows in the data. Received: every file is empty.\n"
            "Hint: check the glob matches the files you mean."
        )
    empty = [src.blocks[i].path for i, f in enumerate(facts)
             if not f["columns"] and not f.get("unscanned")]
    if empty:
        notes.append(f"{len(empty)} empty file(s) skipped (no header, no rows), e.g. {empty[0]}.")
    return ref_cols, aligned


def markers_of(name: str, kind: str, facts: list[BlockFacts]) -> dict[str, int]:
    """Values each null marker made missing in column ``name`` (``""``: empty fields).

    The parser's counts, plus, when the column is not text, the blocks where it held nothing
    but markers (text there, missing here).

    Parameters
    ----------
    name
        The column.
    kind
        Its resolved kind.
    facts
        What the scan found in each block, in block order.

    Returns
    -------
    dict of str to int
        ``{marker: values made missing}``.
    """
    return tally_columns([name], facts)[name].markers(kind)


@dataclass
class Tally:
    """One column over every block's facts (:func:`tally_columns`)."""

    first: dict[str, int] = field(default_factory=dict)  # kind -> first block with rows showing it
    missing: int = 0  # missing values the blocks counted
    parsed: Counter[str] = field(default_factory=Counter)  # what the parser's markers made missing
    # ... and, block after block, the blocks holding nothing but markers (text there)
    with_markers: Counter[str] = field(default_factory=Counter)
    marker_rows: int = 0  # values of those blocks

    def markers(self, kind: str) -> dict[str, int]:
        """:func:`markers_of` the column, were it of ``kind``: most first (ties in block order)."""
        counts = self.parsed if kind == "categorical" else self.with_markers
        return {k: n for k, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n}


def tally_columns(names: list[str], facts: list[BlockFacts]) -> dict[str, Tally]:
    """Each column's kinds, missing values and null markers over all blocks, in one pass.

    Blocks of one run share their ``kinds`` dict (:func:`daskfeed.scanning._task.shared_facts`):
    it is looked at once.
    """
    out = {name: Tally() for name in names}
    looked: set[int] = set()
    for i, f in enumerate(facts):
        kinds = f.get("kinds") or {}
        if f.get("rows") and kinds and id(kinds) not in looked:
            looked.add(id(kinds))
            for name, k in kinds.items():
                t = out.get(name)
                if t is not None and k is not None and k not in t.first:
                    t.first[k] = i
        for name, n in (f.get("missing") or {}).items():
            if name in out:
                out[name].missing += n
        for name, made in (f.get("na_counts") or {}).items():
            if made and name in out:
                out[name].parsed.update(made)
                out[name].with_markers.update(made)
        for name, made in (f.get("marker_values") or {}).items():
            if made and name in out:
                out[name].with_markers.update(made)
                out[name].marker_rows += sum(made.values())
    return out


def _finite(x: float | int | None) -> float | None:
    if isinstance(x, int):  # exact bounds of a whole-number column
        return x
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _drift(src: Source, name: str, real: dict[str, int], facts: list[BlockFacts],
           st: ColumnStats) -> SchemaError:
    """The error for column ``name`` holding numbers in one block and text (or dates) in another.

    Numbers (or dates) that a few stray tokens made text in some blocks are refused as such
    (:func:`~daskfeed.scanning._refusals.refuse_strays_among`, which names each token's line);
    otherwise the text named is values that are not numbers (dates), where it found them.
    """
    text = [i for i, f in enumerate(facts)  # the blocks that read it as text
            if f["rows"] and f.get("kinds", {}).get(name) in ("string", "mixed")] or \
        sorted(real[kd] for kd in ("string", "mixed") if kd in real)
    values: dict[str, int] = st.get("values") or {}
    base = real.keys() - {"string", "mixed"}  # what the other blocks read it as (none: only mixed)
    what = ("numbers" if base and base <= NUMERIC_KINDS else "ISO 8601 dates" if base == {"datetime"}
            else None if base else text_of(values))
    spots: list[Spot] = []
    if what is not None and text and name not in dict(src.options.dtype):
        present = sum(f["rows"] - f.get("missing", {}).get(name, 0) for f in facts
                      if f["rows"] and f.get("kinds", {}).get(name) in base | {"string", "mixed"})
        spots = refuse_strays_among(src, name, what, present, values, text)
    if "mixed" in real:
        i = real["mixed"]
        detail = f"numbers mixed with text such as {_text(spots, facts[i], name)} in {where(src, i)}"
    else:
        nums = [v for kd, v in real.items() if kd in NUMERIC_KINDS]
        txt_kind = "string" if "string" in real else "datetime"
        txt_i = real[txt_kind]
        shown = _text(spots, facts[txt_i], name) if txt_kind == "string" else \
            facts[txt_i].get("samples", {}).get(name, [])
        detail = (f"numbers in {where(src, min(nums))} but {txt_kind} values "
                  f"{shown} in {where(src, txt_i)}") if nums else (
            f"dates in {where(src, real['datetime'])} but text in {where(src, real['string'])}")
    return SchemaError(
        f"Column {name!r} changes type within the data set: {detail}.\n"
        f"Expected one type in every block. Hint: pass --dtype {name}=string "
        f"(dtype={{{name!r}: 'string'}}) to treat it as a category, or exclude it."
    )


def _text(spots: list[Spot], facts: BlockFacts, name: str) -> str:
    """The text of a column that changes type, as named: found again (with places), else sampled."""
    if spots:
        return f"{', '.join(repr(s.value) for s in spots[:3])} (the first on {spots[0].describe()})"
    return str(facts.get("samples", {}).get(name, []))


def resolve_column(src: Source, name: str, kinds: dict[str, int], missing: int,
                   st: ColumnStats, facts: list[BlockFacts], k: int) -> Column:
    """The :class:`Column` ``name`` is over all blocks, from its kinds and merged statistics.

    Parameters
    ----------
    src
        The data (its blocks are named in errors).
    name
        The column.
    kinds
        ``{kind: first block showing it}`` over the blocks with rows.
    missing
        Missing values over all blocks.
    st
        The column's merged statistics (:func:`daskfeed.scanning._stats.merge_stats`, finished by
        :func:`daskfeed.scanning._stats.finish_stats`).
    facts
        Every block's facts (samples of text for the error).
    k
        Values kept in a text column's vocabulary.

    Returns
    -------
    Column

    Raises
    ------
    SchemaError
        When the column holds numbers in one block and text or dates in another.
    """
    real = {kd: i for kd, i in kinds.items() if kd != "null"}
    if len(real) > 1:  # markers only in some blocks: the other blocks say what it is
        real.pop("markers", None)
    if "markers" in real:  # nothing but markers anywhere: text, as written
        real["string"] = real.pop("markers")
    count = int(st.get("count", 0))
    if not real:
        return Column(name, "empty", "null", missing=missing)
    if "mixed" in real or (real.keys() & NUMERIC_KINDS and real.keys() & {"string", "datetime"}) or (
            "string" in real and "datetime" in real):
        raise _drift(src, name, real, facts, st)
    if real.keys() <= NUMERIC_KINDS or real.keys() == {"datetime"}:
        numeric = real.keys() <= NUMERIC_KINDS
        dtype = ("int64" if real.keys() == {"int"} and missing == 0 else "float64") if numeric \
            else "datetime64"
        return Column(name, "numeric" if numeric else "datetime", dtype, missing=missing,
                      count=count, mean=float(st.get("mean", 0.0)),
                      var=float(st.get("m2", 0.0)) / max(count, 1),
                      min=_finite(st.get("min")), max=_finite(st.get("max")),
                      integer=real.keys() == {"int"})
    values: dict[str, int] = st.get("values", {})
    if name not in dict(src.options.dtype):  # a column forced to text is text
        refuse_numbers_as_text(src, name, values, real.get("string", 0),
                               approximate=bool(st.get("approximate")), count=count)
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    count += int(st.get("markers", 0))  # text that reads "NA" is a value here
    bound = int(st.get("bound", 0))
    return Column(name, "categorical", "string", missing=missing, count=count,
                  vocabulary=[v for v, _ in ranked[:k]], distinct=int(st.get("distinct", len(values))),
                  oov_rows=sum(c for _, c in ranked[k:]), approximate=bool(st.get("approximate")),
                  count_bound=bound,
                  vocabulary_decided=bool(st.get("decided")) or decided(ranked, k, bound))


def decided(ranked: list[tuple[str, int]], k: int, bound: int) -> bool:
    """Whether the counts kept decide the top ``k``: its last count beats any other's upper bound.

    A kept count is a lower bound of the value's rows; any value may have ``bound`` more.

    Parameters
    ----------
    ranked
        The kept counts, most first.
    k
        How many values the top holds.
    bound
        Rows a value may have beyond its kept count.

    Returns
    -------
    bool
        True when the top ``k`` of ``ranked`` is the top ``k`` of the rows.
    """
    if bound == 0:
        return True
    if len(ranked) < k:  # values were dropped: one of them has a place in the top k
        return False
    outside = ranked[k][1] if len(ranked) > k else 0
    return ranked[k - 1][1] > outside + bound


def resolve_columns(src: Source, names: list[str], facts: list[BlockFacts], stats: Stats,
             vocabulary_size: int) -> dict[str, Column]:
    """Every column over all blocks: its kind reconciled, statistics, null markers counted.

    Parameters
    ----------
    src
        The data's source.
    names
        The columns, in order.
    facts
        What the scan found in each block, in block order.
    stats
        The merged statistics of every column.
    vocabulary_size
        Most frequent values kept per text column.

    Returns
    -------
    dict of str to Column
        Every column, by name, in order.
    """
    columns: dict[str, Column] = {}
    for name, t in tally_columns(names, facts).items():
        col = resolve_column(src, name, t.first, t.missing, stats.get(name, {}), facts, vocabulary_size)
        col.missing_markers = t.markers(col.kind)
        if col.kind != "categorical":  # blocks of nothing but markers: missing values too
            col.missing += t.marker_rows
        columns[name] = col
    return columns


def check_label(src: Source, label: str, column: Column, facts: list[BlockFacts]) -> None:
    """Refuse a label column that is neither numbers nor text (class names): no values, dates.

    Parameters
    ----------
    src
        The data's source (for the message).
    label
        The label's name.
    column
        The label's resolved column.
    facts
        What the scan found in each block (the first block showing the label is named).

    Raises
    ------
    SchemaError
        When the label holds no values or dates.
    """
    if column.kind in ("numeric", "categorical"):
        return
    first = next((i for i, f in enumerate(facts) if f["kinds"].get(label) not in (None, "null")), 0)
    received = "no values at all" if column.kind == "empty" else f"a {column.kind} column"
    raise SchemaError(
        f"Expected a label column {label!r} of numbers (0/1, class ids, a target) or of class "
        f"names. Received: {received} in {where(src, first)}.\nHint: check the label name "
        "(--label), or write the label as numbers or class names."
    )
