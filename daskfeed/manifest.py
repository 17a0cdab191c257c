"""Scan: ONE pass over every partition on the cluster → a :class:`Manifest`.

Per partition (on a worker): row count, the kind of every column as pyarrow/pandas inferred it
*in that partition*, missing counts, numeric moments, string value counts. Partial statistics
are merged in a tree on the cluster; only small per-partition facts travel to the client. The
kinds are then reconciled: an integer column with blanks in late files becomes a float column
with missing values; a column that is numeric in one partition and text in another is an
error naming both partitions.

The Manifest is plain JSON (``to_json`` / ``from_json``) and carries the fingerprint of the
data it describes, so it can be reused instead of rescanning.
"""

from __future__ import annotations

import json
import math
import operator
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from daskfeed import config
from daskfeed.exceptions import ManifestMismatchError, SchemaError

__all__ = ["Column", "Manifest", "scan"]

MANIFEST_VERSION = 1
# distinct string values tracked exactly per column before counts become approximate
_MAX_TRACKED = 50_000
# distinct label values tracked; above this an integer label is treated as regression
_MAX_LABEL_VALUES = 1000
_NUMERIC_KINDS = {"int", "float"}


# ----------------------------------------------------------------------------- worker side
def _kind(s: pd.Series) -> str:
    """Kind of one column in one partition: int, float, string, datetime, null or mixed."""
    n = len(s)
    if n and int(s.isna().sum()) == n:
        return "null"
    dt = s.dtype
    if pd.api.types.is_bool_dtype(dt) or pd.api.types.is_integer_dtype(dt):
        return "int"
    if pd.api.types.is_float_dtype(dt):
        return "float"  # an int column with blanks arrives as float too: both are numeric
    if pd.api.types.is_datetime64_any_dtype(dt):
        return "datetime"
    if pd.api.types.is_string_dtype(dt) or dt is np.dtype(object):
        inferred = pd.api.types.infer_dtype(s, skipna=True)
        if inferred == "string":
            return "string"
        if inferred in ("integer", "boolean"):
            return "int"
        if inferred in ("floating", "mixed-integer-float", "decimal"):
            return "float"
        if inferred == "empty":
            return "null"
        return "mixed"
    if isinstance(dt, pd.CategoricalDtype):
        return "string"
    return "mixed"


_NO_VALUES = {"mean": 0.0, "m2": 0.0, "min": math.inf, "max": -math.inf}


def _moments(v: np.ndarray) -> dict[str, float]:
    """Mean, sum of squared deviations, min and max of ``v`` (empty: none)."""
    if not len(v):
        return {}
    mean = float(v.mean())
    return {"mean": mean, "m2": float(((v - mean) ** 2).sum()), "min": float(v.min()),
            "max": float(v.max())}


def summarize_partition(df: pd.DataFrame, label: str) -> dict[str, Any]:
    """Facts and partial statistics of one partition (runs on a worker)."""
    rows = len(df)
    out: dict[str, Any] = {"rows": rows, "columns": list(map(str, df.columns)), "kinds": {},
                           "missing": {}, "stats": {}}
    if label in df.columns:
        lab = pd.to_numeric(df[label], errors="coerce") if _kind(df[label]) != "string" else None
        out["label_rows"] = int(lab.notna().sum()) if lab is not None else rows
    else:
        out["label_rows"] = 0
    for name in df.columns:
        s = df[name]
        kind = _kind(s)
        key = str(name)
        missing = int(s.isna().sum())
        out["kinds"][key] = kind
        out["missing"][key] = missing
        st: dict[str, Any] = {"count": rows - missing}
        if kind in _NUMERIC_KINDS:
            v = pd.to_numeric(s, errors="coerce").dropna().to_numpy(dtype="float64")
            st.update(_moments(v) or _NO_VALUES)
            if key == label:
                vc = pd.Series(v).value_counts()
                st["values"] = {repr(float(k)): int(c) for k, c in vc.head(_MAX_LABEL_VALUES + 1).items()}
        elif kind == "datetime":
            v = s.dropna().astype("int64").to_numpy() / 1e9
            st.update(_moments(v))
        elif kind in ("string", "mixed"):
            vc = s.dropna().astype(str).value_counts()
            st["approximate"] = len(vc) > _MAX_TRACKED
            st["values"] = {str(k): int(c) for k, c in vc.head(_MAX_TRACKED).items()}
            st["kmv"] = _kmv(list(vc.index))
        out["stats"][key] = st
    return out


KMV_SIZE = 2048  # smallest value hashes kept per text column: distinct counts within ~2 %


def _kmv(values: list[Any]) -> list[int]:
    """The ``KMV_SIZE`` smallest 64-bit hashes of distinct ``values`` (a mergeable sketch)."""
    if not len(values):
        return []
    hashes = pd.util.hash_array(np.asarray([str(v) for v in values], dtype=object), categorize=False)
    if len(hashes) > KMV_SIZE:
        hashes = np.partition(hashes, KMV_SIZE)[:KMV_SIZE]
    return sorted(int(h) for h in hashes)


def _merge_kmv(a: list[int], b: list[int]) -> list[int]:
    return sorted(set(a) | set(b))[:KMV_SIZE]


def distinct_estimate(kmv: list[int]) -> int:
    """Distinct values from a k-minimum-values sketch (exact below ``KMV_SIZE`` values)."""
    if len(kmv) < KMV_SIZE:
        return len(kmv)
    return round((KMV_SIZE - 1) / (kmv[-1] / 2.0**64))


def _arrow_kind(col: Any) -> str:
    """Kind of one Arrow column: int, float, string, datetime or null (all missing)."""
    import pyarrow as pa

    t = col.type
    if pa.types.is_null(t) or (len(col) and col.null_count == len(col)):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t):
        return "datetime"
    return "string"


def _markers_only(col: Any) -> dict[str, int] | None:
    """``{marker: count}`` when every value of a text column is a null marker (``NA``, ...).

    Such a column of one partition may be a numeric column's missing values or text that
    happens to read ``NA``; which, the other partitions decide (see :func:`_resolve_column`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from daskfeed.source import NA_MARKERS

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None
    values = pc.drop_null(col)
    if not len(values) or not pc.all(pc.is_in(values, value_set=pa.array(NA_MARKERS))).as_py():
        return None
    vc = pc.value_counts(values)
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def _na_counts(table: Any) -> dict[str, dict[str, int]]:
    """What the parser's null markers made missing, per column (the table's schema metadata)."""
    from daskfeed.source import NA_COUNTS_KEY

    raw = (table.schema.metadata or {}).get(NA_COUNTS_KEY)
    return json.loads(raw) if raw else {}


def table_facts(table: Any, label: str) -> dict[str, Any]:
    """What the manifest needs per partition, of one Arrow table (cheap: no statistics).

    Rows, columns, kinds, missing values (and what each null marker made missing), rows with
    a label, a few values of text columns. A text column holding only null markers is of kind
    ``"markers"`` with their counts in ``marker_values``: missing if the column is numeric.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = table.num_rows
    out: dict[str, Any] = {"rows": rows, "columns": list(table.column_names), "kinds": {},
                           "missing": {}, "label_rows": 0, "samples": {},
                           "na_counts": _na_counts(table), "marker_values": {}}
    for name in table.column_names:
        col = table.column(name)
        kind = _arrow_kind(col)
        missing = col.null_count
        if pa.types.is_floating(col.type) and rows:
            missing += int(pc.sum(pc.is_nan(col)).as_py() or 0)
        if kind == "string":
            markers = _markers_only(col)
            if markers is not None:
                kind = "markers"
                out["marker_values"][name] = markers
            head = pc.drop_null(col.slice(0, 1000))
            out["samples"][name] = [str(v) for v in pc.unique(head).to_pylist()[:3]]
        if name == label and kind in (*_NUMERIC_KINDS, "string"):
            out["label_rows"] = rows - missing
        out["kinds"][name] = kind
        out["missing"][name] = missing
    return out


def table_stats(table: Any, label: str) -> dict[str, dict[str, Any]]:
    """Per-column statistics of one Arrow table (mergeable with :func:`merge_stats`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = table.num_rows
    out: dict[str, dict[str, Any]] = {}
    for name in table.column_names:
        col = table.column(name)
        kind = _arrow_kind(col)
        st: dict[str, Any] = {}
        if kind in _NUMERIC_KINDS:
            v = col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            v = v[~np.isnan(v)]
            missing = rows - len(v)
            st.update(_moments(v) or _NO_VALUES)
            if kind == "int" and len(v):  # the exact bounds (float64 rounds above 2**53)
                bounds = pc.min_max(col)
                st["min"], st["max"] = bounds["min"].as_py(), bounds["max"].as_py()
            if name == label:
                uniq, counts = np.unique(v, return_counts=True)
                top = np.argsort(-counts, kind="stable")[: _MAX_LABEL_VALUES + 1]
                st["values"] = {repr(float(uniq[i])): int(counts[i]) for i in top}
        else:
            missing = col.null_count
            if kind == "datetime":
                from daskfeed.feed import epoch_seconds

                st.update(_moments(epoch_seconds(pc.drop_null(col))))
            elif kind == "string":
                vc = pc.value_counts(pc.drop_null(col))
                values = vc.field("values").to_pylist()
                counts = vc.field("counts").to_numpy()
                order = np.argsort(-counts, kind="stable")
                st["approximate"] = len(values) > _MAX_TRACKED
                st["values"] = {str(values[i]): int(counts[i]) for i in order[:_MAX_TRACKED]}
                st["kmv"] = _kmv(values)
                if _markers_only(col) is not None:  # missing if numeric, text if text
                    st["markers"] = rows - missing
                    missing = rows
        st["count"] = rows - missing
        out[name] = st
    return out


class _StatsRun:
    """Statistics of many small tables, computed a run (about ``ENCODE_BYTES``) at a time.

    Thousands of small files cost a few passes over concatenated columns, not thousands.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.tables: list[Any] = []
        self.size = 0
        self.stats: dict[str, dict[str, Any]] = {}

    def add(self, table: Any) -> None:
        from daskfeed.feed import ENCODE_BYTES

        self.tables.append(table)
        self.size += table.nbytes
        if self.size >= ENCODE_BYTES:
            self.flush()

    def flush(self) -> dict[str, dict[str, Any]]:
        import pyarrow as pa

        tables, self.tables, self.size = self.tables, [], 0
        if len(tables) > 1:
            try:
                tables = [pa.concat_tables(tables, promote_options="permissive")]
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # text in one file, numbers in another
                pass
        for t in tables:
            self.stats = merge_stats(self.stats, table_stats(t, self.label))
        return self.stats


def _merge_kind(a: str | None, b: str) -> str:
    """The kind of a column over two chunks; null markers give way to any other kind."""
    if a is None or a == b or b in ("null", "markers"):
        return b if a in (None, "null") else a
    if a in ("null", "markers"):
        return b
    if {a, b} <= _NUMERIC_KINDS:
        return "float"
    return "mixed"


def _add_counts(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """``{column: {marker: count}}`` summed."""
    out = {c: dict(m) for c, m in a.items()}
    for c, m in b.items():
        for k, n in m.items():
            out.setdefault(c, {})[k] = out.get(c, {}).get(k, 0) + n
    return out


def merge_facts(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Merge the :func:`table_facts` of two chunks of one partition (a compressed file's pieces)."""
    if a is None or not a["columns"]:
        return b
    if not b["columns"]:
        return a
    out = dict(a)
    out["rows"] = a["rows"] + b["rows"]
    out["label_rows"] = a["label_rows"] + b["label_rows"]
    out["kinds"] = {c: _merge_kind(a["kinds"].get(c), b["kinds"].get(c, "null")) for c in a["columns"]}
    out["missing"] = {c: a["missing"].get(c, 0) + b["missing"].get(c, 0) for c in a["columns"]}
    out["samples"] = {c: a["samples"].get(c) or b["samples"].get(c, [])
                      for c in a["columns"] if c in a["samples"] or c in b["samples"]}
    out["na_counts"] = _add_counts(a.get("na_counts", {}), b.get("na_counts", {}))
    out["marker_values"] = _add_counts(a.get("marker_values", {}), b.get("marker_values", {}))
    return out


MAX_REJECTS_KEPT = 1000  # quarantined lines kept per partition (all are counted)
MAX_REJECT_CHARS = 4096  # characters kept of one quarantined line


def scan_block(index: int, block: Any, options: Any, label: str, writer: Any,
               run: _StatsRun, topic: str | None = None, task: int = 0,
               nbytes: int = 0) -> dict[str, Any]:
    """Parse partition ``index`` once: its facts and bad lines (see :func:`scan_blocks`).

    Its tables go to ``run`` (the group's statistics) and to ``writer`` (the group's parse
    cache writer, or None).
    """
    from daskfeed.cache import block_tables

    rejects: list[str] = []
    summary: dict[str, Any] | None = None
    report(topic, task, index)  # a read that hangs here is named by the watchdog
    for table in block_tables(index, block, options, None, rejects, use_cache=False, writer=writer):
        summary = merge_facts(summary, table_facts(table, label))
        run.add(table)
        report(topic, task, index, table.num_rows)
    report(topic, task, index, nbytes=nbytes)  # the partition's input bytes, once read
    if summary is None:  # an empty file
        summary = {"rows": 0, "columns": [], "kinds": {}, "missing": {}, "label_rows": 0, "samples": {}}
    summary["bad_lines"] = len(rejects)
    if options.bad_lines == "quarantine" and rejects:  # bounded: a pathological file stays cheap
        summary["rejects"] = [line[:MAX_REJECT_CHARS] for line in rejects[:MAX_REJECTS_KEPT]]
    if rejects and len(rejects) > max(100, summary["rows"]):
        from daskfeed.exceptions import DataError

        raise DataError(
            f"Most lines of {block.describe()} are malformed: {len(rejects):,} lines do not have "
            f"the header's {len(summary['columns']) or 'number of'} fields, {summary['rows']:,} do. "
            f"Received lines such as {rejects[0][:120]!r}.\nHint: check the delimiter (sep=) and "
            "the header of this file."
        )
    return summary


def _merge_numeric(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    na, nb = a.get("count", 0), b.get("count", 0)
    if "mean" not in a or na == 0:
        return {**b, "values": _merge_counts(a.get("values"), b.get("values"))} if "mean" in b else {
            **a, "count": na + nb}
    if "mean" not in b or nb == 0:
        return {**a, "count": na + nb, "values": _merge_counts(a.get("values"), b.get("values"))}
    n = na + nb
    delta = b["mean"] - a["mean"]
    return {
        "count": n,
        "mean": a["mean"] + delta * nb / n,
        "m2": a["m2"] + b["m2"] + delta * delta * na * nb / n,
        "min": min(a["min"], b["min"]),
        "max": max(a["max"], b["max"]),
        "values": _merge_counts(a.get("values"), b.get("values")),
    }


def _merge_counts(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int] | None:
    if a is None or b is None:
        return a if b is None else b
    c = Counter(a)
    c.update(b)
    return dict(c)


def merge_stats(*parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Merge per-column partial statistics of several partitions (runs on a worker)."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for col, st in part.items():
            if col not in out:
                out[col] = dict(st)
                continue
            cur = out[col]
            if "m2" in st or "m2" in cur:
                out[col] = _merge_numeric(cur, st)
            elif "values" in st or "values" in cur:
                merged = _merge_counts(cur.get("values"), st.get("values")) or {}
                approx = bool(cur.get("approximate") or st.get("approximate"))
                if len(merged) > _MAX_TRACKED:
                    approx = True
                    merged = dict(Counter(merged).most_common(_MAX_TRACKED))
                out[col] = {"count": cur.get("count", 0) + st.get("count", 0),
                            "values": merged, "approximate": approx,
                            "markers": cur.get("markers", 0) + st.get("markers", 0),
                            "kmv": _merge_kmv(cur.get("kmv", []), st.get("kmv", []))}
            else:
                out[col] = {"count": cur.get("count", 0) + st.get("count", 0)}
    return out


# ----------------------------------------------------------------------------- manifest
@dataclass
class Column:
    """One column as the whole data set has it."""

    name: str
    kind: str  # numeric | categorical | datetime | empty
    dtype: str  # int64 | float64 | string | datetime64 | null
    missing: int = 0
    count: int = 0
    mean: float = 0.0
    var: float = 0.0
    min: float | None = None
    max: float | None = None
    vocabulary: list[str] = field(default_factory=list)
    distinct: int = 0  # distinct values (an estimate within ~2 % when ``approximate``)
    oov_rows: int = 0  # rows whose value is out of the vocabulary (a lower bound when approximate)
    approximate: bool = False
    integer: bool = False  # every value a whole number (missing values aside)
    # values each null marker made missing ("": empty fields; "NA", "null"...: numeric columns)
    missing_markers: dict[str, int] = field(default_factory=dict)

    @property
    def fill_value(self) -> float:
        """Value that replaces missing numeric entries (the mean)."""
        return float(self.mean) if math.isfinite(self.mean) else 0.0


@dataclass
class Manifest:
    """Everything daskfeed knows about a data set after one scan (JSON-serializable)."""

    fingerprint: str
    label: str
    task: str  # binary | multiclass | regression
    num_classes: int
    columns: dict[str, Column]
    partitions: list[dict[str, Any]]  # path, offset, length, rows (usable), raw_rows
    rows: int
    label_missing: int
    nbytes: int
    read_options: dict[str, Any]
    scan_seconds: float = 0.0
    created: float = field(default_factory=time.time)
    version: int = MANIFEST_VERSION
    vocabulary_size: int = 0  # the K of the top-K vocabularies (0: not recorded)
    bad_lines: int = 0  # malformed lines skipped (bad_lines="skip" | "quarantine")
    aligned_files: int = 0  # files whose header lists the columns in another order
    # text of every skipped line with its file and byte range (quarantine); not in the JSON
    rejects: list[dict[str, str]] = field(default_factory=list, repr=False)
    notes: list[str] = field(default_factory=list, repr=False)  # the scan's warnings
    # rows per class of a binary / multiclass label ({"0": n0, "1": n1}); {} for regression
    label_counts: dict[str, int] = field(default_factory=dict)
    # the part of a split this manifest describes (see :func:`scan`); None: the whole data
    split: dict[str, Any] | None = None

    def warn_notes(self, stacklevel: int = 2) -> None:
        """Repeat the scan's warnings (rows without a label, bad lines, wide numbers...)."""
        for note in self.notes:
            warnings.warn(note, stacklevel=stacklevel + 1)

    # -- convenience -------------------------------------------------------------------
    @property
    def counts(self) -> list[int]:
        """Usable rows (label present) per partition, in partition order."""
        return [p["rows"] for p in self.partitions]

    @property
    def bytes_per_row(self) -> float:
        """Average input bytes per row (CSV bytes, or an estimate for frames)."""
        raw = sum(p.get("raw_rows", p["rows"]) for p in self.partitions)
        if not raw or not self.nbytes:
            return 8.0 * max(1, len(self.columns))
        return self.nbytes / raw

    def feature_names(self, features: list[str] | None = None,
                      exclude: tuple[str, ...] | list[str] = ()) -> list[str]:
        """Resolve ``features`` / ``exclude`` against the columns; errors name the column."""
        usable = [c for c, col in self.columns.items() if c != self.label and col.kind != "empty"]
        for name in list(exclude) + list(features or []):
            if name not in self.columns:
                raise SchemaError(_unknown_column(name, list(self.columns), "feature"))
        if features is not None:
            if self.label in features:
                raise SchemaError(
                    f"The label column cannot also be a feature. Received: features containing "
                    f"{self.label!r}.\nHint: drop it from --features."
                )
            empty = [f for f in features if self.columns[f].kind == "empty"]
            if empty:
                raise SchemaError(
                    f"Feature column(s) {empty} have no values in any partition.\n"
                    "Hint: exclude them."
                )
            chosen = list(features)
        else:
            chosen = usable
        chosen = [c for c in chosen if c not in set(exclude)]
        if not chosen:
            raise SchemaError(
                f"No feature columns left. Received: features={features}, exclude={list(exclude)}; "
                f"columns are {list(self.columns)}.\nHint: keep at least one column besides "
                f"the label {self.label!r}."
            )
        return chosen

    def class_weights(self, spec: str | dict[Any, float] = "balanced") -> dict[int, float]:
        """Weights per class for ``model.fit(..., class_weight=...)``, from the scan's label counts.

        No pass over the data: the scan counted the rows of every class (``label_counts``; of
        the training part only when the manifest is made for a split).

        Parameters
        ----------
        spec
            ``"balanced"``: ``rows / (classes * rows of the class)`` for every class present,
            as scikit-learn's ``compute_class_weight("balanced", ...)``, so each class weighs
            as much in total. Or a mapping ``{class: weight}`` (keys as ints or their text,
            e.g. parsed from ``'{"0": 1, "1": 9}'``), checked against the label's classes;
            classes it leaves out get 1.0, as Keras gives them, and are listed.

        Returns
        -------
        dict of int to float
            ``{class id: weight}`` of every class present in the data.

        Raises
        ------
        SchemaError
            For a regression label, an unknown class, a negative or non-finite weight, or a
            manifest without label counts (made by an older daskfeed: rescan).
        """
        if self.task == "regression":
            raise SchemaError(
                f"Expected a class label (0/1 or class ids) for class weights. Received: label "
                f"{self.label!r}, a regression label.\nHint: weigh rows with a weight column "
                "instead (weight='COL', --weight COL)."
            )
        if not self.label_counts:
            raise SchemaError(
                f"Expected the label counts of {self.label!r} in the manifest. Received: a "
                "manifest without them (made by an older daskfeed).\nHint: rescan the data "
                "(remove manifest.json, or pass manifest=None)."
            )
        counts = {int(k): int(n) for k, n in self.label_counts.items() if n > 0}
        if isinstance(spec, str):
            if spec != "balanced":
                raise SchemaError(f"Expected class weights 'balanced' or a mapping {{class: "
                                  f"weight}}. Received: {spec!r}.\nHint: e.g. "
                                  "'{\"0\": 1, \"1\": 9}'.")
            total = sum(counts.values())
            return {c: total / (len(counts) * n) for c, n in sorted(counts.items())}
        given = {_class_id(k, counts, self.label): _class_weight(k, v) for k, v in spec.items()}
        return {c: given.get(c, 1.0) for c in sorted(counts)}

    def mismatch(self, source: Any, *, label: str, vocabulary_size: int,
                 split: dict[str, Any] | None = None) -> tuple[str, Any, Any] | None:
        """The first setting that shaped this manifest and differs now: ``(name, made with, now)``.

        None when the label, the vocabulary size, the split (:func:`split_settings`) and every
        read option match (the files themselves are checked by :meth:`check_fingerprint`).
        """
        now = {"label": label, "vocabulary_size": vocabulary_size, **_read_settings(source),
               "split": split}
        made = {"label": self.label, "vocabulary_size": self.vocabulary_size, **self.read_options,
                "split": {k: v for k, v in self.split.items() if k != "validation_partitions"}
                if self.split else None}
        for name, value in now.items():
            old = made.get(name, _DEFAULT_SETTINGS.get(name))
            if name == "vocabulary_size" and not old:  # a manifest from before it was recorded
                continue
            if _comparable(old) != _comparable(value):
                return name, old, value
        return None

    def check_settings(self, source: Any, *, label: str, vocabulary_size: int,
                       split: dict[str, Any] | None = None) -> None:
        """Refuse a manifest made with another setting or for other files, naming what differs.

        Raises
        ------
        ManifestMismatchError
            When the label, the vocabulary size, the split or a read option (sep, encoding,
            dtype, bad_lines, na_values, blocksize) differs, or the files changed.
        """
        diff = self.mismatch(source, label=label, vocabulary_size=vocabulary_size, split=split)
        if diff is not None:
            name, old, new = diff
            raise ManifestMismatchError(
                f"The manifest was made with {name}={old!r}. Received: {name}={new!r}.\nHint: "
                "rescan (pass manifest=None, or remove the manifest.json) to use the new setting, "
                "or keep the one the manifest was made with."
            )
        self.check_fingerprint(source.fingerprint())

    def check_fingerprint(self, fingerprint: str, what: str = "data") -> None:
        """Refuse a manifest that was made for other data or other read options."""
        if fingerprint != self.fingerprint:
            raise ManifestMismatchError(
                f"The manifest was made for other {what}. Expected fingerprint "
                f"{self.fingerprint}. Received: {fingerprint} (files, sizes, mtimes or read "
                "options changed).\nHint: rescan (pass manifest=None) or point at the data "
                "the manifest was made from."
            )

    # -- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON representation."""
        d = asdict(self)
        d.pop("rejects")
        d["columns"] = {k: asdict(v) for k, v in self.columns.items()}
        return d

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write the manifest as UTF-8 JSON (atomically: temp file + rename)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(_jsonable(self.to_dict()), f, ensure_ascii=False, indent=1)
        os.replace(tmp, path)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        if d.get("version") != MANIFEST_VERSION:
            raise ManifestMismatchError(
                f"Expected manifest version {MANIFEST_VERSION}. Received: {d.get('version')}.\n"
                "Hint: rescan the data."
            )
        d["columns"] = {k: Column(**v) for k, v in d["columns"].items()}
        return cls(**d)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read a manifest written by :meth:`to_json`."""
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def column_lines(self) -> list[str]:
        """One line per column: kind, dtype, missing (by null marker), statistics or vocabulary."""
        lines = []
        for c in self.columns.values():
            if c.kind in ("numeric", "datetime"):
                extra = f"mean {c.mean:.4g} sd {c.var ** 0.5:.4g}"
            elif c.kind == "categorical":
                extra = (f"{len(c.vocabulary):,} of {'~' if c.approximate else ''}{c.distinct:,} "
                         "values kept")
            else:
                extra = ""
            shown = {("empty" if k == "" else k): n for k, n in c.missing_markers.items()}
            how = f" ({', '.join(f'{k} {n:,}' for k, n in shown.items())})" if shown else ""
            lines.append(f"{c.name:<24} {c.kind:<12} {c.dtype:<8} missing "
                         f"{f'{c.missing:,}{how}':<28} {extra}".rstrip())
        return lines

    def summary(self) -> str:
        """A few human lines: rows, partitions, task, columns by kind."""
        kinds: dict[str, list[str]] = {}
        for c in self.columns.values():
            kinds.setdefault(c.kind, []).append(c.name)
        parts = ", ".join(f"{len(v)} {k}" for k, v in kinds.items())
        where = f"{len(self.partitions)} partitions ("
        if self.split:
            used = len(scanned_partitions(len(self.partitions), self.split))
            where = (f"{used} of {len(self.partitions)} partitions (the {self.split['subset']} part "
                     f"of validation_split={self.split['validation_split']:g}, seed="
                     f"{self.split['seed']}; ")
        return (
            f"{self.rows:,} rows in {where}"
            f"{self.nbytes / 1e9:.2f} GB); label {self.label!r}: {self.task}"
            f"{f' ({self.num_classes} classes)' if self.task == 'multiclass' else ''}; "
            f"columns: {parts}"
        )


# what a manifest from before a setting was recorded was made with
_DEFAULT_SETTINGS: dict[str, Any] = {"na_values": [], "dtype": {}}


def _read_settings(source: Any) -> dict[str, Any]:
    """The read options of ``source`` that shape a manifest, as the manifest records them."""
    o = source.options
    return {"blocksize": o.blocksize, "sep": o.sep, "encoding": o.encoding, "dtype": dict(o.dtype),
            "bad_lines": o.bad_lines, "na_values": list(getattr(o, "na_values", ()))}


def _comparable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _unknown_column(name: str, columns: list[str], what: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, columns, n=3)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else (
        f"the columns are {', '.join(map(repr, columns[:20]))}{' ...' if len(columns) > 20 else ''}.")
    return f"Expected a {what} column of the data. Received: {what}={name!r}.\nHint: {hint}"


# ----------------------------------------------------------------------------- scan
def scan(
    data: Any,
    *,
    label: str,
    client: Any = None,
    vocabulary_size: int | None = None,
    blocksize: int | str | None = None,
    encoding: str = "utf-8",
    dtype: dict[str, str] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache: str | os.PathLike[str] | None = None,
    bad_lines: str = "error",
    partition_cache: Any = None,
    timeout: float | str | None = None,
    sep: str = ",",
    na_values: list[str] | tuple[str, ...] | None = None,
    validation_split: float | None = None,
    subset: str | None = None,
    seed: int = 0,
    progress: Callable[[int, int, int, float, bool], None] | None = None,
) -> Manifest:
    """Scan ``data`` once on the cluster and return its :class:`Manifest`.

    Parameters
    ----------
    data
        Path, glob, list of paths, URL, :class:`~daskfeed.source.Source`, or dask DataFrame.
    label
        Name of the label column (must be numeric).
    client
        A ``distributed.Client``; by default the current one, else a local cluster is started
        for the scan.
    vocabulary_size
        Most frequent K values kept per string column (default ``daskfeed.vocabulary-size``).
    cache
        A JSON path: if it holds a manifest of these files made with the same settings (label,
        vocabulary size, read options) it is returned without scanning (its warnings repeated);
        otherwise the new manifest is written there.
    sep, na_values
        The delimiter, and null markers that are missing in every column (text too); see
        :class:`~daskfeed.source.Source`.
    progress
        Called about every second while the scan runs, and once at its end, with
        ``(rows, bytes done, bytes in all, seconds, finished)`` (e.g. a progress bar).
    bad_lines
        ``"error"``, ``"skip"`` or ``"quarantine"`` (see :class:`~daskfeed.source.Source`);
        skipped lines are counted in ``Manifest.bad_lines`` and, for quarantine, their text
        kept in ``Manifest.rejects`` (not written to the JSON).
    partition_cache
        A :class:`~daskfeed.cache.PartitionCache`: the scan writes every parsed partition
        there, so the CSV is parsed once for the scan and all epochs.
    timeout
        Seconds without any scan task finishing before :class:`~daskfeed.exceptions.
        FeedTimeoutError` (default ``daskfeed.timeout``): a read that blocks never hangs the run.
    validation_split, subset, seed
        Scan one part of a split of the data into whole partitions
        (:func:`~daskfeed.plan.split_partitions`): ``subset="training"`` scans only the
        partitions left for training, ``"validation"`` only the held-out ones. The other
        partitions count 0 rows in the manifest (its ``split`` names them), so every statistic
        comes from that part alone, and the two parts together cost one pass over the data.

    Returns
    -------
    Manifest

    Examples
    --------
    >>> m = daskfeed.scan("data/log_quest/**/*.csv", label="cleared")  # doctest: +SKIP
    >>> m.rows, m.columns["level"].mean  # doctest: +SKIP
    """
    from daskfeed.source import Source

    src = data if isinstance(data, Source) else Source(
        data, blocksize=blocksize, encoding=encoding, dtype=dtype, storage_options=storage_options,
        bad_lines=bad_lines, sep=sep, na_values=na_values)
    fingerprint = src.fingerprint()
    vocabulary_size = int(config.get("vocabulary-size", vocabulary_size))
    split = split_settings(validation_split, subset, seed)
    if cache is not None and os.path.exists(cache):
        try:
            cached = Manifest.from_json(cache)
            cached.check_settings(src, label=label, vocabulary_size=vocabulary_size, split=split)
            cached.warn_notes(stacklevel=2)
            return cached
        except (ValueError, TypeError, KeyError, ManifestMismatchError):
            pass  # unreadable, stale, or made with other settings: rescan and overwrite
    header = src.header()
    if label not in header:
        raise SchemaError(
            f"Expected a label column {label!r} in the data. Received: columns "
            f"{header[:20]}{' ...' if len(header) > 20 else ''} in "
            f"{src.files[0].path if src.files else 'the DataFrame'}.\n"
            f"Hint: {_unknown_column(label, header, 'label').split('Hint: ')[1]}"
        )
    from daskfeed.cluster import client_context

    if split is not None:
        split["validation_partitions"] = list(held_out(src, split))
    only = scanned_partitions(src.npartitions, split)
    t0 = time.perf_counter()
    with client_context(client) as c:
        summaries, stats = _run_scan(src, label, c, fingerprint, partition_cache,
                                     config.get_seconds("timeout", timeout), only, progress)
    facts: list[dict[str, Any]] = [_unscanned() for _ in range(src.npartitions)]
    for i, f in zip(only, summaries, strict=True):
        facts[i] = f
    manifest = _build_manifest(src, label, facts, stats, vocabulary_size, fingerprint, split)
    manifest.scan_seconds = time.perf_counter() - t0
    if cache is not None:
        manifest.to_json(cache)
    return manifest


def _run_scan(src: Any, label: str, client: Any, token: str, partition_cache: Any,
              timeout: float, only: list[int], progress: Any = None,
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Facts of partitions ``only`` (in that order) and their merged statistics."""
    from dask import delayed

    from daskfeed.prefetch import explain

    if src.frame is not None:
        parts = src.partitions()
        summ = [delayed(summarize_partition, pure=True)(parts[i], label,
                                                        dask_key_name=f"daskfeed-scan-{i}-{token}")
                for i in only]
        facts = [delayed(_facts_list)(s) for s in summ]
        level = [delayed(_stats)(s) for s in summ]
        while len(level) > 1:  # tree reduction on the cluster, fan-in 8
            level = [delayed(merge_stats)(*level[i : i + 8]) for i in range(0, len(level), 8)]
        futures = client.compute([*facts, level[0]])
        try:
            results = client.gather(futures)
        finally:
            for f in futures:
                f.release()
        return [f for group in results[:-1] for f in group], results[-1]
    # parse each block once: summary + bad lines + the parse cache; small files grouped
    nthreads = sum(client.nthreads().values()) or 1
    groups = _scan_groups(src, nthreads, only)
    topic = f"daskfeed-scan-{token}"
    sizes = block_sizes(src)
    futures = [client.submit(scan_blocks, [(i, src.blocks[i]) for i in g], src.options, label,
                             partition_cache, topic, [sizes[i] for i in g],
                             key=f"daskfeed-scan-{g[0]}-{token}", retries=1)
               for g in groups]
    try:
        _await_scan(client, futures, groups, src, timeout, topic, progress)
        level = [client.submit(operator.getitem, f, "stats", pure=False) for f in futures]
        while len(level) > 1:  # tree reduction on the cluster, fan-in 8
            level = [client.submit(merge_stats, *level[i : i + 8], pure=False)
                     for i in range(0, len(level), 8)]
        facts = client.gather([client.submit(operator.getitem, f, "facts", pure=False) for f in futures])
        stats = level[0].result()
    except Exception as err:
        new = explain(err, "the scan's statistics")
        if new is err:
            raise
        raise new from err
    finally:
        for f in futures:
            f.release()
    return [f for group in facts for f in group], stats


class ScanProgress:
    """What the scan tasks report while they run (events on ``topic``, see :func:`report`).

    Each event says a task parsed a table of partition ``block`` (rows and bytes so far) or
    wrote a cache segment: progress, whether or not a task has finished yet.
    """

    def __init__(self, groups: list[list[int]]) -> None:
        self.last = time.monotonic()
        self.rows = 0
        self.nbytes = 0
        self.at: dict[int, int] = {}  # scan task (its first partition) -> partition being read
        self._first = {g[0] for g in groups}

    def __call__(self, event: tuple[float, dict[str, Any]]) -> None:
        msg = event[1]
        if not isinstance(msg, dict) or msg.get("task") not in self._first:
            return
        self.last = time.monotonic()
        self.rows += int(msg.get("rows", 0))
        self.nbytes += int(msg.get("bytes", 0))
        self.at[int(msg["task"])] = int(msg.get("block", msg["task"]))


REPORT_EVERY = 0.5  # seconds between progress events of one scan task
_pending: dict[tuple[str, int], list[int]] = {}  # (topic, task) -> [rows, bytes, last time]


def report(topic: str | None, task: int, block: int, rows: int = 0, nbytes: int = 0,
           *, flush: bool = False) -> None:
    """Tell the trainer's scan watchdog that task ``task`` is at partition ``block`` (on a worker).

    Rows and bytes parsed accumulate; at most one event per ``REPORT_EVERY`` seconds per task,
    and one with the rest when ``flush`` (the task's end), so the totals add up.
    """
    if topic is None:
        return
    acc = _pending.setdefault((topic, task), [0, 0, 0])
    acc[0] += rows
    acc[1] += nbytes
    now = time.monotonic()
    if now - acc[2] < REPORT_EVERY and not (flush and (acc[0] or acc[1])):
        return
    try:
        from distributed import get_worker

        worker = get_worker()
    except ValueError:  # not running on a dask worker (called directly)
        return
    worker.log_event(topic, {"task": task, "block": block, "rows": acc[0], "bytes": acc[1]})
    acc[:] = [0, 0, now]


def _await_scan(client: Any, futures: list[Any], groups: list[list[int]], src: Any,
                timeout: float, topic: str, on_progress: Any = None) -> ScanProgress:
    """Wait for the scan tasks, judging progress, not completion; fail fast with the files named.

    A scan task reports each table it parses and each cache segment it writes (:func:`report`);
    the scan is stuck only when no task reported progress or finished for ``timeout`` seconds
    (a read that blocks: hung storage, a FIFO), however slow the disk. A task that fails for
    good (after its retry) ends the scan with a clear error.
    """
    from distributed import wait

    from daskfeed.exceptions import FeedTimeoutError
    from daskfeed.prefetch import explain

    def what(g: list[int], at: int | None = None) -> str:
        if at is not None and at != g[0]:
            return f"the scan of {src.blocks[at].describe()} (partition {at})"
        first, last = src.blocks[g[0]], src.blocks[g[-1]]
        more = f" … {last.describe()} ({len(g)} partitions)" if len(g) > 1 else ""
        return f"the scan of {first.describe()}{more}"

    progress = ScanProgress(groups)
    sizes = block_sizes(src)
    total = sum(sizes[i] for g in groups for i in g)
    t0 = time.monotonic()
    task = {f.key: g for f, g in zip(futures, groups, strict=True)}
    client.subscribe_topic(topic, progress)
    try:
        pending = set(futures)
        while pending:
            try:
                with client.as_current():  # wait() takes the current client
                    done, pending = wait(list(pending), timeout=min(1.0, timeout),
                                         return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = set()
            if on_progress is not None:
                on_progress(progress.rows, progress.nbytes, total, time.monotonic() - t0,
                            not pending)
            for f in done:
                progress.last = time.monotonic()
                if f.status != "finished":
                    try:
                        f.result()
                    except Exception as err:
                        new = explain(err, what(task[f.key]))
                        if new is err:
                            raise
                        raise new from err
            if pending and time.monotonic() - progress.last > timeout:
                stuck = sorted(pending, key=lambda f: task[f.key][0])[:3]
                raise FeedTimeoutError(
                    f"No scan task made progress within {timeout:.0f}s; still reading "
                    f"{'; '.join(what(task[f.key], progress.at.get(task[f.key][0])) for f in stuck)}"
                    f"{f' and {len(pending) - 3} more' if len(pending) > 3 else ''}.\n"
                    "Hint: a read that blocks (hung storage, a FIFO) never finishes: check the "
                    "workers on the dashboard; for storage that stalls longer between reads raise "
                    "--timeout (daskfeed.timeout)."
                )
    finally:
        client.unsubscribe_topic(topic)
    return progress


def block_sizes(src: Any) -> list[int]:
    """Bytes of every partition of ``src`` (a whole file: its size; a frame's partition: 1)."""
    if src.frame is not None:
        return [1] * src.npartitions
    return [b.length if b.length >= 0 else src.files[b.file_index].size for b in src.blocks]


def _scan_groups(src: Any, nthreads: int, only: list[int]) -> list[list[int]]:
    """The blocks ``only``, in order, in groups of about blocksize bytes, one scan task each.

    At least four groups per worker thread when there is enough data; thousands of small
    files cost a few tasks, not thousands.
    """
    sizes = block_sizes(src)
    target = max(1, min(src.options.blocksize, sum(sizes[i] for i in only) // (4 * nthreads)))
    groups: list[list[int]] = []
    current: list[int] = []
    acc = 0
    for i in only:
        n = sizes[i]
        current.append(i)
        acc += n
        if acc >= target:
            groups.append(current)
            current, acc = [], 0
    if current:
        groups.append(current)
    return groups


def scan_blocks(items: list[tuple[int, Any]], options: Any, label: str,
                cache: Any = None, topic: str | None = None,
                sizes: list[int] | None = None) -> dict[str, Any]:
    """:func:`scan_block` of several blocks in one task: their facts and merged statistics.

    The blocks' parsed tables go to the cache as one group (a few segment files and one
    marker), unless every one of them is cached already.
    """
    writer = None
    if cache is not None and not all(cache.has(i) for i, _ in items):
        writer = cache.writer(items[0][0])
    run = _StatsRun(label)
    task = items[0][0]
    try:
        summaries = [scan_block(i, b, options, label, writer, run, topic, task, size)
                     for (i, b), size in zip(items, sizes or [0] * len(items), strict=True)]
        stats = run.flush()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is not None:
        writer.commit()
    report(topic, task, items[-1][0], flush=True)
    _pending.pop((topic or "", task), None)
    return {"facts": summaries, "stats": stats}


def _facts_list(s: dict[str, Any]) -> list[dict[str, Any]]:
    return [_facts(s)]


def _facts(s: dict[str, Any]) -> dict[str, Any]:
    if "samples" in s:
        return {k: v for k, v in s.items() if k != "stats"}
    return {k: v for k, v in s.items() if k != "stats"} | {
        "samples": {c: list(st.get("values", {}))[:3] for c, st in s["stats"].items()
                    if s["kinds"].get(c) in ("string", "mixed")}}


def _stats(s: dict[str, Any]) -> dict[str, Any]:
    return s["stats"]


def _where(src: Any, i: int) -> str:
    return f"partition {i} ({src.blocks[i].describe()})"


def _build_manifest(src: Any, label: str, facts: list[dict[str, Any]], stats: dict[str, Any],
                    vocabulary_size: int, fingerprint: str,
                    split: dict[str, Any] | None = None) -> Manifest:
    notes: list[str] = []  # what the scan has to say; kept in the manifest, repeated on reuse
    # header consistency: the same column names in every partition; another order is aligned
    # by name (the feed takes columns by name), other names are refused
    ref_cols: list[str] | None = None
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
                f"Header of {_where(src, i)} differs from {_where(src, ref_i)}: "
                f"{what or 'same names in another order'}.\nExpected: {ref_cols}.\n"
                f"Received: {f['columns']}.\nHint: give all files the same header."
            )
    empty = [src.blocks[i].path for i, f in enumerate(facts)
             if not f["columns"] and not f.get("unscanned")]
    if empty and ref_cols is not None:
        notes.append(
            f"{len(empty)} empty file(s) skipped (no header, no rows), e.g. {empty[0]}."
        )
    if ref_cols is None:
        raise SchemaError(
            "Expected rows in the data. Received: every file is empty.\n"
            "Hint: check the glob matches the files you mean."
        )
    columns: dict[str, Column] = {}
    for name in ref_cols:
        kinds: dict[str, int] = {}  # kind -> first partition index showing it
        for i, f in enumerate(facts):
            k = f["kinds"].get(name)
            if k is not None and f["rows"] and k not in kinds:
                kinds[k] = i
        missing = sum(f["missing"].get(name, 0) for f in facts)
        st = stats.get(name, {})
        col = _resolve_column(src, name, kinds, missing, st, facts, vocabulary_size)
        col.missing_markers = _markers_of(name, col.kind, facts)
        if col.kind != "categorical":  # partitions of nothing but markers: missing values too
            col.missing += sum(n for f in facts for n in f.get("marker_values", {}).get(name, {}).values())
        columns[name] = col

    lab = columns[label]
    if lab.kind != "numeric":
        first = next((i for i, f in enumerate(facts) if f["kinds"].get(label) in ("string", "mixed")), 0)
        samples = facts[first].get("samples", {}).get(label, [])
        raise SchemaError(
            f"Expected a numeric label column {label!r} (0/1, class ids, or numbers). "
            f"Received: {'no values at all' if lab.kind == 'empty' else f'text such as {samples}'}"
            f" in {_where(src, first)}.\nHint: encode the label as numbers, e.g. 0 and 1."
        )
    values = stats.get(label, {}).get("values") or {}
    task, num_classes = _label_task(values)
    label_counts = _class_counts(values) if task != "regression" else {}
    label_rows = sum(f["label_rows"] for f in facts)
    rows_total = sum(f["rows"] for f in facts)
    if label_rows == 0:
        raise SchemaError(f"Label column {label!r} is empty in every row.\nHint: check the label name.")
    if rows_total - label_rows:
        notes.append(
            f"{rows_total - label_rows:,} of {rows_total:,} rows have no value in label "
            f"{label!r}; they are skipped (counted in manifest.label_missing)."
        )
    if aligned:
        notes.append(
            f"{len(aligned)} file(s) list the same columns in another order, e.g. "
            f"{sorted(aligned)[0]}; their columns are aligned by name (counted in "
            "manifest.aligned_files)."
        )
    bad_lines = sum(f.get("bad_lines", 0) for f in facts)
    rejects = [{"where": src.blocks[i].describe(), "line": line}
               for i, f in enumerate(facts) for line in f.get("rejects", ())]
    kept = [(i, f["bad_lines"] - len(f.get("rejects", ()))) for i, f in enumerate(facts) if f.get("rejects")]
    rejects += [{"where": src.blocks[i].describe(),
                 "line": f"[{n:,} more malformed lines of this partition not kept (first "
                         f"{MAX_REJECTS_KEPT:,} are)]"} for i, n in kept if n > 0]
    if bad_lines:
        first = next(i for i, f in enumerate(facts) if f.get("bad_lines"))
        notes.append(
            f"{bad_lines:,} malformed line(s) skipped (bad_lines={src.options.bad_lines!r}), first in "
            f"{_where(src, first)}; counted in manifest.bad_lines"
            f"{' and kept in manifest.rejects' if rejects else ''}."
        )
    notes += _wide_notes(columns, label)
    for note in notes:
        warnings.warn(note, stacklevel=3)
    partitions = [
        {"path": b.path, "offset": b.offset, "length": b.length, "rows": f["label_rows"],
         "raw_rows": f["rows"]}
        for b, f in zip(src.blocks, facts, strict=False)
    ]
    scanned = [i for i, f in enumerate(facts) if not f.get("unscanned")]
    nbytes = src.nbytes if split is None or src.frame is not None else sum(
        block_sizes(src)[i] for i in scanned)
    return Manifest(
        fingerprint=fingerprint, label=label, task=task, num_classes=num_classes, columns=columns,
        partitions=partitions, rows=label_rows, label_missing=rows_total - label_rows,
        nbytes=nbytes, read_options=_read_settings(src), vocabulary_size=vocabulary_size,
        bad_lines=bad_lines, aligned_files=len(aligned), rejects=rejects, notes=notes,
        label_counts=label_counts, split=split,
    )


def _class_id(key: Any, counts: dict[int, int], label: str) -> int:
    """A class of ``spec`` as an int, checked against the classes present."""
    try:
        c = int(str(key).strip())
    except ValueError:
        c = None
    if c is None or c not in counts:
        raise SchemaError(
            f"Expected class weights for the classes of label {label!r} "
            f"({', '.join(map(str, sorted(counts)))}). Received: class {key!r}.\nHint: name "
            "classes by their id, e.g. '{\"0\": 1, \"1\": 9}'."
        )
    return c


def _class_weight(key: Any, value: Any) -> float:
    """A weight of ``spec``: a finite number >= 0."""
    try:
        w = float(value)
    except (TypeError, ValueError):
        w = math.nan
    if not (math.isfinite(w) and w >= 0):
        raise SchemaError(
            f"Expected a class weight that is a number >= 0. Received: {value!r} for class "
            f"{key!r}.\nHint: e.g. '{{\"0\": 1, \"1\": 9}}'."
        )
    return w


def _unscanned() -> dict[str, Any]:
    """The facts of a partition outside the scanned part of a split: no rows."""
    return {"rows": 0, "columns": [], "kinds": {}, "missing": {}, "label_rows": 0, "samples": {},
            "unscanned": True}


def _class_counts(values: dict[str, int]) -> dict[str, int]:
    """``{"0": rows, "1": rows, ...}`` of a class label from the scan's label value counts."""
    counts: dict[str, int] = {}
    for value, n in values.items():
        if _is_number(value):
            key = str(int(float(value)))
            counts[key] = counts.get(key, 0) + int(n)
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


SUBSETS = ("training", "validation")


def split_settings(validation_split: float | None, subset: str | None,
                   seed: int) -> dict[str, Any] | None:
    """The split a manifest is made for, checked (None: the whole data).

    Raises
    ------
    ValueError
        When the fraction is outside (0, 1) or ``subset`` is not "training" / "validation".
    """
    if validation_split is None or validation_split == 0:
        if subset is not None:
            raise ValueError(f"Expected subset=None without validation_split. Received: "
                             f"subset={subset!r}.\nHint: pass validation_split=0.1 (for example) "
                             "to split the data.")
        return None
    if not 0.0 < float(validation_split) < 1.0:
        raise ValueError(f"Expected 0 < validation_split < 1. Received: "
                         f"validation_split={validation_split!r}.")
    if subset not in SUBSETS:
        raise ValueError(
            f"Expected subset='training' or subset='validation' with validation_split="
            f"{validation_split}. Received: subset={subset!r}.\nHint: make the training sequence "
            "with subset='training' and the validation one with subset='validation' and the "
            "same seed (as Keras' image_dataset_from_directory does)."
        )
    return {"validation_split": float(validation_split), "subset": subset, "seed": int(seed)}


def held_out(src: Any, split: dict[str, Any]) -> tuple[int, ...]:
    """The partitions of ``src`` held out for validation by ``split`` (whole partitions)."""
    from daskfeed.plan import split_partitions

    keys = [f"{b.path}\0{b.offset}" for b in src.blocks]
    return split_partitions(keys, block_sizes(src), validation_split=split["validation_split"],
                            seed=split["seed"])


def scanned_partitions(npartitions: int, split: dict[str, Any] | None) -> list[int]:
    """The partitions a manifest made for ``split`` describes (all of them without one)."""
    if split is None:
        return list(range(npartitions))
    validation = set(split["validation_partitions"])
    keep = split["subset"] == "validation"
    return [i for i in range(npartitions) if (i in validation) == keep]


def _wide_notes(columns: dict[str, Column], label: str) -> list[str]:
    """A note per numeric column whose values reach 2**24, where float32 stops being exact."""
    from daskfeed.feed import EXACT_FLOAT32, numeric_dtype

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


def _markers_of(name: str, kind: str, facts: list[dict[str, Any]]) -> dict[str, int]:
    """Values each null marker made missing in column ``name`` (``""``: empty fields).

    The parser's counts, plus, when the column is not text, the partitions where it held
    nothing but markers (text there, missing here).
    """
    counts: dict[str, dict[str, int]] = {}
    for f in facts:
        counts = _add_counts(counts, {name: f.get("na_counts", {}).get(name, {})})
        if kind != "categorical":
            counts = _add_counts(counts, {name: f.get("marker_values", {}).get(name, {})})
    return {k: n for k, n in sorted(counts.get(name, {}).items(), key=lambda kv: -kv[1]) if n}


def _resolve_column(src: Any, name: str, kinds: dict[str, int], missing: int,
                    st: dict[str, Any], facts: list[dict[str, Any]], k: int) -> Column:
    real = {kd: i for kd, i in kinds.items() if kd != "null"}
    if len(real) > 1:  # markers only in some partitions: the other partitions say what it is
        real.pop("markers", None)
    if "markers" in real:  # nothing but markers anywhere: text, as written
        real["string"] = real.pop("markers")
    count = int(st.get("count", 0))
    if not real:
        return Column(name, "empty", "null", missing=missing)
    if "mixed" in real or (real.keys() & _NUMERIC_KINDS and real.keys() & {"string", "datetime"}) or (
            "string" in real and "datetime" in real):
        if "mixed" in real:
            i = real["mixed"]
            samples = facts[i].get("samples", {}).get(name, [])
            detail = f"numbers mixed with text such as {samples} in {_where(src, i)}"
        else:
            nums = [v for kd, v in real.items() if kd in _NUMERIC_KINDS]
            num_i = min(nums) if nums else None
            txt_kind = "string" if "string" in real else "datetime"
            txt_i = real[txt_kind]
            samples = facts[txt_i].get("samples", {}).get(name, [])
            detail = (f"numbers in {_where(src, num_i)} but {txt_kind} values "
                      f"{samples} in {_where(src, txt_i)}") if num_i is not None else (
                f"dates in {_where(src, real['datetime'])} but text in {_where(src, real['string'])}")
        raise SchemaError(
            f"Column {name!r} changes type within the data set: {detail}.\n"
            f"Expected one type in every partition. Hint: pass dtype={{{name!r}: 'string'}} to "
            f"treat it as a category, or exclude it."
        )
    if real.keys() <= _NUMERIC_KINDS:
        dtype = "int64" if real.keys() == {"int"} and missing == 0 else "float64"
        n = max(count, 1)
        return Column(name, "numeric", dtype, missing=missing, count=count,
                      mean=float(st.get("mean", 0.0)), var=float(st.get("m2", 0.0)) / n,
                      min=_finite(st.get("min")), max=_finite(st.get("max")),
                      integer=real.keys() == {"int"})
    if real.keys() == {"datetime"}:
        n = max(count, 1)
        return Column(name, "datetime", "datetime64", missing=missing, count=count,
                      mean=float(st.get("mean", 0.0)), var=float(st.get("m2", 0.0)) / n,
                      min=_finite(st.get("min")), max=_finite(st.get("max")))
    values: dict[str, int] = st.get("values", {})
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    vocab = [v for v, _ in ranked[:k]]
    oov = sum(c for _, c in ranked[k:])
    count += int(st.get("markers", 0))  # text that reads "NA" is a value here
    return Column(name, "categorical", "string", missing=missing, count=count, vocabulary=vocab,
                  distinct=distinct_estimate(st["kmv"]) if st.get("approximate") and st.get("kmv")
                  else len(values), oov_rows=oov, approximate=bool(st.get("approximate")))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _finite(x: Any) -> float | None:
    if isinstance(x, int):  # exact bounds of a whole-number column
        return x
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _label_task(values: dict[str, int]) -> tuple[str, int]:
    nums = sorted(float(v) for v in values if _is_number(v))  # (null markers of text partitions)
    if not nums or len(nums) > _MAX_LABEL_VALUES:
        return "regression", 0
    if all(v == int(v) for v in nums) and nums[0] >= 0:
        if set(nums) <= {0.0, 1.0}:
            return "binary", 2
        if nums[-1] < _MAX_LABEL_VALUES and len(nums) <= 200:
            return "multiclass", int(nums[-1]) + 1
    return "regression", 0
