"""Mergeable statistics of blocks: facts (rows, kinds, missing), moments, value counts, sketches.

Computed on the workers per table (:func:`table_facts`, :func:`table_stats`; the blocks
of a dask DataFrame arrive as tables too), merged in a tree on the cluster
(:func:`merge_stats`, :func:`merge_facts`); only small facts per block travel to the client.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daskfeed.core import DataError
from daskfeed.manifest import ENCODE_BYTES, epoch_seconds
from daskfeed.reading import count_by_part, na_counts, naive_times
from daskfeed.scanning._counts import (
    coded_counts,
    distinct_estimate,
    kmv,
    label_counts,
    merge_kmv,
)
from daskfeed.scanning._moments import add, exact_sums, segment_moments, settle
from daskfeed.scanning._schema import (
    NUMERIC_KINDS,
    BlockFacts,
    ColumnStats,
    Stats,
    add_counts,
    arrow_kind,
    markers_by_part,
    markers_only,
    merge_kind,
    type_kind,
)

# distinct string values tracked exactly per column before counts become approximate
MAX_TRACKED = 50_000

_NO_VALUES = {"mean": 0.0, "m2": 0.0, "min": math.inf, "max": -math.inf}


def _moments(v: np.ndarray, present: np.ndarray | None, bounds: np.ndarray,
             minmax: bool = True) -> ColumnStats:
    """Exact sums and the moments of the present values ``v`` by segment (see :mod:`._moments`).

    ``present``: per row, whether its value is in ``v`` (None: every row's is); ``bounds``:
    where the segments start (and the last ends). With ``minmax``, the least and greatest
    value too. Empty: none.
    """
    if not len(v):
        return {}
    with np.errstate(over="ignore", invalid="ignore"):  # (beyond float64: exact_sums refuses it)
        s1, s2 = exact_sums(*segment_moments(v, present, bounds))
    mean, m2 = settle(len(v), s1, s2)
    out: ColumnStats = {"mean": mean, "m2": m2, "s1": s1, "s2": s2}
    if minmax:
        out.update(min=float(v.min()), max=float(v.max()))
    return out


def table_facts(table: pa.Table, label: str) -> BlockFacts:
    """What the manifest needs per block, of one Arrow table (cheap: no statistics).

    The table is as the read pipeline gives it (:func:`daskfeed.reading._tables.iter_tables`,
    :func:`daskfeed.reading._tables.frame_table`): the null-marker rule applied, so NaN is missing.
    Rows, columns, kinds, missing values (and what each null marker made missing), rows with
    a label, a few values of text columns. A text column holding only null markers is of kind
    ``"markers"`` with their counts in ``marker_values``: missing if the column is numeric.

    Parameters
    ----------
    table
        One parsed table.
    label
        The label's name.

    Returns
    -------
    BlockFacts
        Its rows, columns, kinds, missing values and null markers.
    """
    return parts_facts(table, np.array([0, table.num_rows]), label, [na_counts(table)])[0]


def parts_facts(table: pa.Table, bounds: np.ndarray, label: str,
                counts: list[dict[str, dict[str, int]]], sampled: set[str] | None = None,
                ) -> list[BlockFacts]:
    """:func:`table_facts` of each part of ``table`` (several small files parsed together) at once.

    Part ``k`` is the rows ``bounds[k]:bounds[k + 1]``; each gets the facts it gets as a table
    of its own, but for the few values of text columns (only read in the message naming the
    first block of a column that shows text): a column in ``sampled`` gets none, and the first
    part showing text in a column not in it does (the column is then added).

    Parameters
    ----------
    table
        The parts' rows, as the read pipeline gives them.
    bounds
        Where each part starts, and where the last one ends.
    label
        The label's name.
    counts
        What the null markers made missing in each part.
    sampled
        Text columns a block before these was sampled in (changed here); None: sample every part.

    Returns
    -------
    list of BlockFacts
        The facts of each part.
    """
    rows = np.diff(bounds)
    names = list(table.column_names)
    out: list[BlockFacts] = [{"rows": int(n), "columns": names, "kinds": {}, "missing": {}, "label_rows": 0,
                              "samples": {}, "na_counts": c, "marker_values": {}}
                             for n, c in zip(rows, counts, strict=True)]
    if len(rows) == 1 and (naive := naive_times(table)):  # (only a table of one part converts dates)
        out[0]["naive_times"] = naive
    for name, col in zip(names, table.columns, strict=True):
        missing = count_by_part(col.is_null(), bounds) if col.null_count else np.zeros(len(rows), int)
        base = type_kind(col.type)
        markers = markers_by_part(col, bounds) if base == "string" else None
        moments = label_moments(col, bounds) if name == label and base in NUMERIC_KINDS else None
        for k, (facts, n, gone) in enumerate(zip(out, rows.tolist(), missing.tolist(), strict=True)):
            kind = "null" if n and gone == n else base
            if kind == "string":
                if markers is not None and markers[k] is not None:
                    kind = "markers"
                    facts["marker_values"][name] = markers[k]
                if sampled is None or name not in sampled:
                    facts["samples"][name] = _samples(col.slice(int(bounds[k]), n))
                    if sampled is not None and kind == "string":
                        sampled.add(name)
            if name == label and kind in (*NUMERIC_KINDS, "string"):
                facts["label_rows"] = n - gone
            if moments is not None and kind in NUMERIC_KINDS and n:
                facts["label_moments"] = moments[k]
            facts["kinds"][name] = kind
            facts["missing"][name] = gone
    return out


def label_moments(col: pa.ChunkedArray, bounds: np.ndarray) -> list[list[float]]:
    """Each part's sum of the label's values and of their squares (missing values count 0).

    One cast and one ``numpy.add.reduceat`` for all parts; a part's sums are those of its own
    rows alone (:func:`daskfeed.scanning._moments.segment_moments` says why), so a file's facts
    are the same read alone or in a run. An empty part: ``[0.0, 0.0]``.
    """
    v = np.asarray(pc.fill_null(col.cast(pa.float64(), safe=False), 0.0).to_numpy(zero_copy_only=False),
                   dtype=np.float64)
    cuts = np.asarray(bounds, dtype=np.int64)
    v = v[:cuts[-1]]  # (reduceat's last part runs to the array's end)
    full = np.flatnonzero(np.diff(cuts) > 0)
    out = [[0.0, 0.0] for _ in range(len(cuts) - 1)]
    if len(full):
        s1 = np.add.reduceat(v, cuts[full]).tolist()
        s2 = np.add.reduceat(v * v, cuts[full]).tolist()
        for k, a, b in zip(full.tolist(), s1, s2, strict=True):
            out[k] = [a, b]
    return out


def order_ratio(facts: list[BlockFacts]) -> float | None:
    """How far the label's block means spread, over what rows in random order would give.

    The one-way analysis of variance of the label by block: the between-block mean square
    over the within-data variance. About 1 when rows are in random order; far above it when the
    data are ordered by the label or by something it follows (time, outcome). None for a text
    label, or with fewer than 4 blocks holding labels.

    Parameters
    ----------
    facts
        The scan's facts of every block (their ``label_rows`` and ``label_moments``).

    Returns
    -------
    float or None
        The ratio.
    """
    parts = [(f["label_rows"], f["label_moments"]) for f in facts
             if f.get("label_rows") and "label_moments" in f]
    if len(parts) < 4:
        return None
    n = np.array([p[0] for p in parts], dtype=np.float64)
    sums = np.array([p[1][0] for p in parts])
    total, squares = n.sum(), sum(p[1][1] for p in parts)
    mu = sums.sum() / total
    var = squares / total - mu * mu
    if var <= 1e-12 * max(1.0, mu * mu):
        return None
    between = float((n * (sums / n - mu) ** 2).sum()) / (len(parts) - 1)
    return round(between / var, 3)


def _samples(col: pa.ChunkedArray, most: int = 3) -> list[str]:
    """The first ``most`` distinct values among a text column's first 1000 (for messages).

    Usually the first few values hold them: those are looked at one by one, and the rest of
    the 1000 only when they do not.
    """
    seen: dict[str, None] = {}
    for value in col.slice(0, 16).to_pylist():
        if value is not None:
            seen[str(value)] = None
            if len(seen) == most:
                return list(seen)
    if len(col) <= 16:
        return list(seen)
    return [str(v) for v in pc.unique(pc.drop_null(col.slice(0, 1000))).to_pylist()[:most]]


def _numeric_stats(col: pa.ChunkedArray, kind: str, is_label: bool, st: ColumnStats,
                   bounds: np.ndarray) -> int:
    """Moments (exact integer bounds) and, for the label, value counts; returns missing values.

    Over the present values only; NaN, which the read pipeline makes missing, counts as
    missing here too. Moments by segment (``bounds``, see :func:`_moments`).
    """
    full = np.asarray(col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False),
                      dtype=np.float64)  # (a missing value is NaN here)
    present: np.ndarray | None = None  # (every row's value, unless some are missing or NaN)
    if col.null_count or kind == "float":
        present = ~np.isnan(full)
        if col.null_count or not present.all():
            full = full[present]
        else:
            present = None
    v = full
    exact = kind == "int" and len(v) > 0  # the exact bounds (float64 rounds above 2**53)
    st.update(_moments(v, present, bounds, minmax=not exact) or _NO_VALUES)
    if exact:
        limits = pc.min_max(col)
        st["min"], st["max"] = limits["min"].as_py(), limits["max"].as_py()
    if is_label:
        st["values"] = label_counts(col)
    return len(col) - len(v)


def _text_stats(col: pa.ChunkedArray, st: ColumnStats, coded: pa.ChunkedArray | None = None) -> int:
    """Value counts and a distinct-count sketch; returns missing values (markers-only: all).

    ``coded``: the same column dictionary-encoded (as the parse cache keeps it): its values are
    then counted from the codes, without hashing the text a second time.
    """
    missing = col.null_count
    if coded is not None and pa.types.is_dictionary(coded.type):
        values, counts = coded_counts(coded)
    else:
        vc = pc.value_counts(pc.drop_null(col))
        values, counts = vc.field("values").to_pylist(), vc.field("counts").to_numpy()
    order = np.argsort(-counts, kind="stable")
    st["approximate"] = len(values) > MAX_TRACKED
    st["values"] = {str(values[i]): int(counts[i]) for i in order[:MAX_TRACKED]}
    # how many rows any value may have beyond its count kept (0: every count exact)
    st["bound"] = int(counts[order[MAX_TRACKED]]) if len(values) > MAX_TRACKED else 0
    st["kmv"] = kmv(values)
    if markers_only(col) is not None:  # missing if numeric, text if text
        st["markers"] = len(col) - missing
        missing = len(col)
    return missing


def table_stats(table: pa.Table, label: str, coded: pa.Table | None = None,
                bounds: np.ndarray | None = None) -> Stats:
    """Per-column statistics of one Arrow table (mergeable with :func:`merge_stats`).

    Parameters
    ----------
    table
        One parsed table.
    label
        The label's name (its value counts are kept).
    coded
        The same rows as the parse cache keeps them (:func:`daskfeed.cache.compact`: text
        dictionary-encoded), when the caller has them: text is then counted by its codes.
    bounds
        Where each segment of the table starts (a block, or the table as a piece of one
        block) and where the last one ends; None: the table is one segment. Moments are
        summed by segment (:mod:`daskfeed.scanning._moments`): the same whatever else the
        table holds.

    Returns
    -------
    Stats
        ``{column: its statistics}``.
    """
    rows = table.num_rows
    cuts = np.array([0, rows], dtype=np.int64) if bounds is None else np.asarray(bounds, np.int64)
    out: Stats = {}
    for name in table.column_names:
        col = table.column(name)
        kind = arrow_kind(col)
        st: ColumnStats = {}
        if kind in NUMERIC_KINDS:
            try:
                missing = _numeric_stats(col, kind, name == label, st, cuts)
            except OverflowError as err:
                raise DataError(
                    f"Expected numbers whose squares fit in float64 in column {name!r}. Received: "
                    f"values too large for its variance ({err}; |x| above about 1e154).\nHint: "
                    "scale the column when writing it, or read it as text (--dtype "
                    f"{name}=string) to use it as a category.") from err
        elif kind == "string":
            missing = _text_stats(col, st, None if coded is None else coded.column(name))
        else:
            missing = col.null_count
            if kind == "datetime" and missing < rows:
                present = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                st.update(_moments(epoch_seconds(pc.drop_null(col)), present, cuts))
        st["count"] = rows - missing
        out[name] = st
    return out


class StatsAccumulator:
    """Statistics of many small tables of one scan task, computed ``ENCODE_BYTES`` at a time.

    Thousands of small files cost a few passes over concatenated columns, not thousands. Each
    table keeps its segments (its blocks; a piece of a block: one), so the moments are the
    same however the tables are grouped (:mod:`daskfeed.scanning._moments`).
    """

    def __init__(self, label: str) -> None:
        self.label = label
        # (table, its coded form, its segments' bounds)
        self.tables: list[tuple[pa.Table, pa.Table | None, np.ndarray]] = []
        self.size = 0
        self.stats: Stats = {}

    def add(self, table: pa.Table, coded: pa.Table | None = None,
            bounds: np.ndarray | None = None) -> None:
        """Take one table; the tables held so far are summarized once they reach ``ENCODE_BYTES``.

        Parameters
        ----------
        table
            One parsed table.
        coded
            The same table as the parse cache keeps it, if made (see :func:`table_stats`).
        bounds
            Its segments (see :func:`table_stats`); None: one.
        """
        cuts = np.array([0, table.num_rows], dtype=np.int64) if bounds is None else np.asarray(
            bounds, dtype=np.int64)
        self.tables.append((table, coded, cuts))
        self.size += table.nbytes
        if self.size >= ENCODE_BYTES:
            self.flush()

    def flush(self) -> Stats:
        """Summarize the tables held and return the statistics of every table taken.

        Returns
        -------
        Stats
            The statistics of every table taken since the last flush.
        """
        held, self.tables, self.size = self.tables, [], 0
        if len(held) > 1:
            try:
                table = pa.concat_tables([t for t, _, _ in held], promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # text in one file, numbers in another
                pass
            else:
                codes = [c for _, c, _ in held if c is not None]
                coded = None
                if len(codes) == len(held):
                    try:
                        coded = pa.concat_tables(codes, promote_options="permissive")
                    except (pa.ArrowInvalid, pa.ArrowTypeError):
                        pass
                starts = np.cumsum([0] + [t.num_rows for t, _, _ in held])
                cuts = np.concatenate([starts[k] + b[:-1] for k, (_, _, b) in enumerate(held)]
                                      + [starts[-1:]])
                held = [(table, coded, cuts)]
        for t, c, b in held:
            self.stats = merge_stats(self.stats, table_stats(t, self.label, c, b))
        return self.stats


def merge_facts(a: BlockFacts | None, b: BlockFacts) -> BlockFacts:
    """Merge the :func:`table_facts` of two tables of one block (a compressed file's buffers).

    Parameters
    ----------
    a
        The facts so far (None: the first table).
    b
        The next table's facts.

    Returns
    -------
    BlockFacts
        The block's facts over both tables.
    """
    if a is None or not a["columns"]:
        return b
    if not b["columns"]:
        return a
    out = dict(a)
    out["rows"] = a["rows"] + b["rows"]
    out["label_rows"] = a["label_rows"] + b["label_rows"]
    if "label_moments" in a or "label_moments" in b:
        ma, mb = a.get("label_moments", [0.0, 0.0]), b.get("label_moments", [0.0, 0.0])
        out["label_moments"] = [ma[0] + mb[0], ma[1] + mb[1]]
    out["kinds"] = {c: merge_kind(a["kinds"].get(c), b["kinds"].get(c, "null")) for c in a["columns"]}
    out["missing"] = {c: a["missing"].get(c, 0) + b["missing"].get(c, 0) for c in a["columns"]}
    out["samples"] = {c: a["samples"].get(c) or b["samples"].get(c, [])
                      for c in a["columns"] if c in a["samples"] or c in b["samples"]}
    out["na_counts"] = add_counts(a.get("na_counts", {}), b.get("na_counts", {}))
    out["marker_values"] = add_counts(a.get("marker_values", {}), b.get("marker_values", {}))
    naive = {c: a.get("naive_times", {}).get(c, 0) + b.get("naive_times", {}).get(c, 0)
             for c in {**a.get("naive_times", {}), **b.get("naive_times", {})}}
    if naive:
        out["naive_times"] = naive
    return out


def _merge_numeric(a: ColumnStats, b: ColumnStats) -> ColumnStats:
    """Two numeric columns' moments: exact sums added, the mean and ``m2`` settled from them."""
    na, nb = a.get("count", 0), b.get("count", 0)
    if "mean" not in b or nb == 0:
        out = {**a, "count": na + nb}
    elif "mean" not in a or na == 0:
        out = {**b, "count": na + nb}
    else:
        s1, s2 = add(a["s1"], b["s1"]), add(a["s2"], b["s2"])
        mean, m2 = settle(na + nb, s1, s2)
        out = {"count": na + nb, "mean": mean, "m2": m2, "s1": s1, "s2": s2,
               "min": min(a["min"], b["min"]), "max": max(a["max"], b["max"])}
    values = _merge_counts(a.get("values"), b.get("values"))
    if values is not None:
        out["values"] = values
    else:
        out.pop("values", None)
    return out


def _merge_counts(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int] | None:
    if a is None or b is None:
        return a if b is None else b
    c = Counter(a)
    c.update(b)
    return dict(c)


def _merge_text(cur: ColumnStats, st: ColumnStats) -> ColumnStats:
    """Two text columns' counts: a value counted in one only may have up to the other's bound more.

    The bound of the merge is the sum of theirs, plus the largest count dropped when the merge
    keeps only MAX_TRACKED values (a dropped value may have that many and the bound more).
    """
    merged = _merge_counts(cur.get("values"), st.get("values")) or {}
    approx = bool(cur.get("approximate") or st.get("approximate"))
    bound = int(cur.get("bound", 0)) + int(st.get("bound", 0))
    if len(merged) > MAX_TRACKED:
        approx = True
        ranked = Counter(merged).most_common(MAX_TRACKED + 1)
        bound += ranked[-1][1]
        merged = dict(ranked[:MAX_TRACKED])
    return {"count": cur.get("count", 0) + st.get("count", 0), "values": merged,
            "approximate": approx, "markers": cur.get("markers", 0) + st.get("markers", 0),
            "kmv": merge_kmv(cur.get("kmv", []), st.get("kmv", [])), "bound": bound}


def merge_stats(*parts: Stats) -> Stats:
    """Merge per-column partial statistics of several blocks (runs on a worker).

    Parameters
    ----------
    *parts
        Statistics of blocks (:func:`table_stats`, or merged ones).

    Returns
    -------
    Stats
        Their merge.
    """
    out: Stats = {}
    for part in parts:
        for col, st in part.items():
            if col not in out:
                out[col] = dict(st)
                continue
            cur = out[col]
            if "m2" in st or "m2" in cur:
                out[col] = _merge_numeric(cur, st)
            elif "values" in st or "values" in cur:
                out[col] = _merge_text(cur, st)
            else:
                out[col] = {"count": cur.get("count", 0) + st.get("count", 0)}
    return out


def finish_stats(stats: Stats) -> Stats:
    """The merged statistics with each text column's ``distinct`` count (estimated when approximate).

    Parameters
    ----------
    stats
        The merged statistics.

    Returns
    -------
    Stats
        The same, each text column with its ``distinct`` count.
    """
    out: Stats = {}
    for name, st in stats.items():
        out[name] = dict(st)
        if "kmv" in st:
            exact = not (st.get("approximate") and st.get("kmv"))
            out[name]["distinct"] = len(st.get("values", {})) if exact else distinct_estimate(st["kmv"])
    return out
