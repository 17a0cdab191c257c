"""The persisted result of a scan: :class:`Column` and :class:`Manifest` (JSON).

A manifest carries the fingerprint of the data and the settings it was made with, so it can be
reused instead of rescanning (:meth:`Manifest.check_settings`). The scan itself is
:func:`daskfeed.scanning._scan.scan`.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from daskfeed.core import ManifestMismatchError, SchemaError, warn_user, write_file
from daskfeed.manifest._class_weights import class_weights
from daskfeed.manifest._ids import id_like
from daskfeed.manifest._packing import pack_blocks, unpack_blocks
from daskfeed.manifest._split import scanned_blocks

if TYPE_CHECKING:
    from daskfeed.reading import Source

# 2: a text label's classes (label_classes); 3: the blocks packed (daskfeed.manifest._packing).
# A manifest of another version is scanned again (read_reusable says so in one line).
MANIFEST_VERSION = 3

ORDERED = 4.0  # label_order above this: the data look ordered (random order gives about 1)


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
    # rows a value may have beyond its count (approximate counts); the vocabulary is the top of
    # the counts kept, decided when its last value's count exceeds any other's by more than this
    count_bound: int = 0
    vocabulary_decided: bool = True
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
    blocks: list[dict[str, Any]]  # path, offset, length, rows (usable), raw_rows (JSON: "blocks")
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
    # rows per class of a binary / multiclass label ({"0": n0, "1": n1}, or by class name for
    # a text label, in code order); {} for regression
    label_counts: dict[str, int] = field(default_factory=dict)
    # a text label's class names, sorted: class code i is label_classes[i]; None: numeric label
    label_classes: list[str] | None = None
    # the part of a split this manifest describes (see :func:`scan`); None: the whole data
    split: dict[str, Any] | None = None
    # the label's between-block variance over its variance (about 1 in random order; far more
    # when the rows are ordered by it or by what it follows); None: a text label, few blocks
    label_order: float | None = None
    # what the scan did: files new, changed and gone since the last scan of the data, parts
    # reused (:func:`~daskfeed.scanning._store.changes_line`); "" when nothing was kept
    scan_line: str = ""
    # files whose blocks start where the whole file says, not where each block guessed
    # (quoted fields with line breaks: :meth:`daskfeed.reading._source.Source.use_splits`)
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)
    # parts of the files the scan that made this manifest parsed (0: every part's record was
    # kept from an earlier scan, nothing parsed); None: not known (a dask DataFrame, or read
    # from JSON). Not in the JSON: it is about one scan, not the data
    scanned_parts: int | None = field(default=None, repr=False, compare=False)

    @property
    def looks_ordered(self) -> bool:
        """Whether the label's block means spread far more than rows in random order give."""
        return self.label_order is not None and self.label_order > ORDERED

    @property
    def partitions(self) -> list[dict[str, Any]]:
        """The blocks, by their old name (the glossary's word is *block*: :attr:`blocks`)."""
        return self.blocks

    def warn_notes(self) -> None:
        """Repeat the scan's warnings (rows without a label, bad lines, wide numbers...)."""
        for note in self.notes:
            warn_user(note)

    # -- convenience -------------------------------------------------------------------
    @property
    def classes(self) -> list[str] | None:
        """The class names of a text label, in code order (code i is ``classes[i]``).

        None for a numeric label (0/1 or class ids, which are their own codes) and for
        regression.
        """
        return list(self.label_classes) if self.label_classes is not None else None

    @property
    def counts(self) -> list[int]:
        """Usable rows (label present) per block, in block order."""
        return [p["rows"] for p in self.blocks]

    @property
    def bytes_per_row(self) -> float:
        """Average input bytes per row (CSV bytes, or an estimate for frames)."""
        raw = sum(p.get("raw_rows", p["rows"]) for p in self.blocks)
        if not raw or not self.nbytes:
            return 8.0 * max(1, len(self.columns))
        return float(self.nbytes / raw)

    def feature_names(self, features: list[str] | None = None,
                      exclude: tuple[str, ...] | list[str] = ()) -> list[str]:
        """Resolve ``features`` / ``exclude`` against the columns; errors name the column."""
        usable = [c for c, col in self.columns.items() if c != self.label and col.kind != "empty"]
        for name in list(exclude) + list(features or []):
            if name not in self.columns:
                raise SchemaError(unknown_column(name, list(self.columns), "feature"))
        if features is not None:
            if self.label in features:
                raise SchemaError(
                    f"The label column cannot also be a feature. Received: features containing "
                    f"{self.label!r}.\nHint: drop it from --features."
                )
            empty = [f for f in features if self.columns[f].kind == "empty"]
            if empty:
                raise SchemaError(
                    f"Feature column(s) {empty} have no values in any block.\n"
                    "Hint: exclude them."
                )
            chosen = list(features)
        else:
            chosen = usable
        chosen = [c for c in chosen if c not in set(exclude)]
        if not chosen:
            empty = [c for c, col in self.columns.items() if c != self.label and col.kind == "empty"]
            raise SchemaError(
                f"No feature columns left. Received: features={features}, exclude={list(exclude)}; "
                f"columns are {list(self.columns)}"
                + (f", of which {empty} have no values in any row" if empty else "")
                + f".\nHint: keep at least one column with values besides the label {self.label!r}."
            )
        return chosen

    def class_weights(self, spec: str | dict[Any, float] = "balanced") -> dict[int, float]:
        """Weights per class for ``model.fit(..., class_weight=...)``, from the scan's label counts.

        No pass over the data: the scan counted the rows of every class (``label_counts``; of the
        training part only when the manifest is made for a split).

        Parameters
        ----------
        spec
            ``"balanced"`` (``rows / (classes * rows of the class)``, as scikit-learn's), or a
            mapping ``{class: weight}`` (ids or their text; class names for a text label); classes
            it leaves out get 1.0.

        Returns
        -------
        dict of int to float
            ``{class code: weight}`` of every class present in the data.

        Raises
        ------
        SchemaError
            For a regression label, an unknown class, a negative or non-finite weight, or a
            manifest without label counts.
        """
        return class_weights(self.task, self.label, self.label_counts, self.label_classes, spec)

    def mismatch(self, source: Source, *, label: str, vocabulary_size: int,
                 split: dict[str, Any] | None = None) -> tuple[str, object, object] | None:
        """The first setting that shaped this manifest and differs now: ``(name, made with, now)``.

        None when the label, the vocabulary size, the split (:func:`split_settings`) and every
        read option match (the files themselves are checked by :meth:`check_fingerprint`).
        """
        now = {"label": label, "vocabulary_size": vocabulary_size, **read_settings(source),
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

    def check_settings(self, source: Source, *, label: str, vocabulary_size: int,
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
                "or keep the one the manifest was made with.",
                change=f"{name} is now {new!r} (the manifest was made with {old!r})")
        if source.fingerprint() != self.fingerprint:
            self.check_fingerprint(source.fingerprint(), change=self.files_changed(source))

    def files_changed(self, source: Source) -> str:
        """What changed in the files since this manifest was made, said as information.

        Files new and gone by path; where the paths are the same, their sizes or modification
        times changed (the scan that follows names the parts it reads again).
        """
        then = {str(b["path"]) for b in self.blocks if "path" in b}
        now = {f.path for f in source.files}
        new, gone = len(now - then), len(then - now)
        parts = [f"{new:,} new file{'s' if new != 1 else ''}" if new else "",
                 f"{gone:,} gone" if gone else ""]
        which = ", ".join(p for p in parts if p) or "files rewritten (sizes or modification times)"
        return f"the data changed since the last scan: {which}"

    def check_fingerprint(self, fingerprint: str, what: str = "data", change: str = "") -> None:
        """Refuse a manifest that was made for other data or other read options.

        ``change``: what changed, as :class:`~daskfeed.core.ManifestMismatchError` carries it.
        """
        if fingerprint != self.fingerprint:
            raise ManifestMismatchError(
                f"The manifest was made for other {what}. Expected fingerprint "
                f"{self.fingerprint}. Received: {fingerprint} (files, sizes, mtimes or read "
                "options changed).\nHint: rescan (pass manifest=None) or point at the data "
                "the manifest was made from.",
                change=change or f"the {what} changed since the last scan (files, sizes or "
                "modification times)")

    # -- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON representation; the blocks packed (each path once, each per-block field one array)."""
        d = asdict(replace(self, blocks=[], rejects=[]))
        del d["rejects"], d["scanned_parts"]
        d["blocks"] = pack_blocks(self.blocks)
        return d

    def plain(self) -> dict[str, Any]:
        """:meth:`to_dict` as JSON holds it (a value that is not finite: None)."""
        out: dict[str, Any] = _jsonable(self.to_dict())
        return out

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write the manifest as UTF-8 JSON (atomically: temp file + rename)."""
        write_file(path, json.dumps(self.plain(), ensure_ascii=False, indent=1))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ManifestMismatchError
            When the manifest is of another format version (made by another daskfeed).
        """
        d = dict(d)
        if d.get("version") != MANIFEST_VERSION:
            raise ManifestMismatchError(
                f"Expected manifest version {MANIFEST_VERSION}. Received: {d.get('version')} "
                "(made by another daskfeed).\nHint: rescan the data (pass manifest=None, or "
                "remove the manifest.json)."
            )
        d["blocks"] = unpack_blocks(d["blocks"])
        d["columns"] = {k: Column(**v) for k, v in d["columns"].items()}
        return cls(**d)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read a manifest written by :meth:`to_json`.

        Raises
        ------
        ManifestMismatchError
            When the manifest is of another format version (see :func:`read_reusable`).
        """
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def column_lines(self) -> list[str]:
        """One line per column: kind, dtype, missing (by null marker), statistics or vocabulary.

        A column that looks like a row id (:func:`~daskfeed.manifest.id_like`) says so at the end.
        """
        lines = []
        ids = id_like(self.columns, [n for n, c in self.columns.items()
                                     if n != self.label and c.kind != "empty"])
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
            if c.name in ids:
                extra += f"; looks like a row id ({ids[c.name]})"
            lines.append(f"{c.name:<24} {c.kind:<12} {c.dtype:<8} missing "
                         f"{f'{c.missing:,}{how}':<28} {extra}".rstrip())
        return lines

    def summary(self) -> str:
        """A few human lines: rows, blocks, task, columns by kind."""
        kinds: dict[str, list[str]] = {}
        for c in self.columns.values():
            kinds.setdefault(c.kind, []).append(c.name)
        parts = ", ".join(f"{len(v)} {k}" for k, v in kinds.items())
        where = f"{len(self.blocks)} blocks ("
        if self.split:
            used = len(scanned_blocks(len(self.blocks), self.split))
            where = (f"{used} of {len(self.blocks)} blocks (the {self.split['subset']} part "
                     f"of validation_split={self.split['validation_split']:g}, seed="
                     f"{self.split['seed']}; ")
        classes = f" ({self.num_classes} classes{_named(self.label_classes)})"
        return (
            f"{self.rows:,} rows in {where}"
            f"{self.nbytes / 1e9:.2f} GB); label {self.label!r}: {self.task}"
            f"{classes if self.task == 'multiclass' else ''}; columns: {parts}"
        )


def _named(classes: list[str] | None) -> str:
    """``: a, b, c`` (the first ten) of a text label's classes; nothing for a numeric label."""
    if not classes:
        return ""
    return f": {', '.join(classes[:10])}{' ...' if len(classes) > 10 else ''}"


# what a manifest from before a setting was recorded was made with
_DEFAULT_SETTINGS: dict[str, Any] = {"na_values": [], "dtype": {}, "decimal": "."}


def read_settings(source: Source) -> dict[str, Any]:
    """The read options of ``source`` that shape a manifest, as the manifest records them."""
    o = source.options
    return {"blocksize": o.blocksize, "sep": o.sep, "encoding": o.encoding, "dtype": dict(o.dtype),
            "bad_lines": o.bad_lines, "na_values": list(getattr(o, "na_values", ())),
            "decimal": o.decimal}


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


def unknown_column(name: str, columns: list[str], what: str) -> str:
    """The message for column ``name`` missing from ``columns``, with the closest names as a hint."""
    close = difflib.get_close_matches(name, columns, n=3)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else (
        f"the columns are {', '.join(map(repr, columns[:20]))}{' ...' if len(columns) > 20 else ''}.")
    return f"Expected a {what} column of the data. Received: {what}={name!r}.\nHint: {hint}"



def read_reusable(path: str | os.PathLike[str]) -> Manifest | None:
    """The manifest an earlier run wrote to ``path``, to reuse; None when there is none to reuse.

    None too when it is unreadable, or of another format version: then the data are scanned
    again, which a one-line warning says.
    """
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if d.get("version") != MANIFEST_VERSION:
            warnings.warn(f"{os.fspath(path)} is a manifest of format version {d.get('version')} "
                          f"(this daskfeed reads {MANIFEST_VERSION}): the data are scanned again.",
                          stacklevel=2)
            return None
        manifest = Manifest.from_dict(d)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ManifestMismatchError):
        return None
    files = [b for b in manifest.blocks if not str(b["path"]).startswith("partition ")]
    if files and not any("line" in b for b in files):  # (a scan gives each file's block a line)
        warnings.warn(f"{os.fspath(path)} is a manifest of a daskfeed that kept no line of its rows "
                      "(before 2026-11-30): the data are scanned again, so that daskfeed rows can "
                      "name each row's line.", stacklevel=2)
        return None
    return manifest
