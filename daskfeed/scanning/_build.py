"""The manifest of a scan: the blocks' facts and the merged statistics made one ``Manifest``.

Headers are checked and columns' kinds reconciled (:mod:`daskfeed.scanning._schema`), the label
judged (binary, classes or a regression target), and the notes (rows without a label, aligned
headers, bad lines, wide numbers, naive times, vocabularies cut) warned and kept in it.
"""

from __future__ import annotations

from typing import Any

from daskfeed.core import SchemaError, warn_user
from daskfeed.manifest import Manifest, block_sizes, read_settings, text_classes
from daskfeed.reading import Source
from daskfeed.scanning._counts import MAX_LABEL_VALUES
from daskfeed.scanning._notes import naive_notes, vocabulary_notes, wide_notes
from daskfeed.scanning._refusals import is_number
from daskfeed.scanning._schema import BlockFacts, Stats, check_headers, check_label, resolve_columns
from daskfeed.scanning._stats import finish_stats, order_ratio
from daskfeed.scanning._task import quarantined


def build_manifest(src: Source, label: str, facts: list[BlockFacts], stats: Stats,
                   vocabulary_size: int, fingerprint: str,
                   split: dict[str, Any] | None = None) -> Manifest:
    """The :class:`~daskfeed.manifest._manifest.Manifest` of the scanned blocks' facts and merged statistics.

    Its notes (rows without a label, aligned headers, bad lines, wide numbers) are warned
    here and kept in the manifest, so a reused manifest repeats them.

    Raises
    ------
    SchemaError
        When headers differ, every file is empty, a column changes type, or the label is
        empty in every row, neither numbers nor text, or text with more than
        :data:`~daskfeed.manifest._labels.MAX_CLASSES` classes.
    """
    notes: list[str] = []
    ref_cols, aligned = check_headers(src, facts, notes)
    columns = resolve_columns(src, ref_cols, facts, finish_stats(stats), vocabulary_size)
    if ref_cols and not split and not any(f["rows"] for f in facts):
        files = [f.path for f in src.files[:3]]
        raise SchemaError(
            f"Expected rows of data. Received: a header line and no rows in every file "
            f"({', '.join(files)}{' ...' if len(src.files) > 3 else ''}).\nHint: check that the "
            "files are complete (an export cut short?) and that the path points at the data.")
    check_label(src, label, columns[label], facts)
    values = stats.get(label, {}).get("values") or {}
    classes = text_classes(columns[label], values) if columns[label].kind == "categorical" else None
    task, num_classes = ("multiclass", len(classes)) if classes is not None else label_task(values)
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
    rejects = quarantined(src, facts, bad_lines, notes)
    notes += naive_notes(facts) + wide_notes(columns, label) + vocabulary_notes(columns)
    for note in notes:
        warn_user(note)
    partitions = [
        {"path": b.path, "offset": b.offset, "length": b.length, "rows": f["label_rows"],
         "raw_rows": f["rows"], **lines}
        for b, f, lines in zip(src.blocks, facts, block_lines(src, facts), strict=False)
    ]
    scanned = [i for i, f in enumerate(facts) if not f.get("unscanned")]
    sizes = block_sizes(src)
    nbytes = src.nbytes if split is None or src.frame is not None else sum(sizes[i] for i in scanned)
    return Manifest(
        fingerprint=fingerprint, label=label, task=task, num_classes=num_classes, columns=columns,
        blocks=partitions, rows=label_rows, label_missing=rows_total - label_rows,
        nbytes=nbytes, read_options=read_settings(src), vocabulary_size=vocabulary_size,
        bad_lines=bad_lines, aligned_files=len(aligned), rejects=rejects, notes=notes,
        label_counts=classes if classes is not None else class_counts(values) if task != "regression"
        else {}, label_classes=list(classes) if classes is not None else None, split=split,
        label_order=order_ratio(facts), splits=dict(src.splits),
    )


def block_lines(src: Source, facts: list[BlockFacts]) -> list[dict[str, Any]]:
    """Where each block's rows are in its file: ``{"line": ...}``, with ``"row_lines"`` if irregular.

    A file's blocks tile its text after its one-line header, in order (each from its first
    record's first byte to the next block's), so block ``k``'s first line is 2 plus the line
    breaks of blocks ``0..k-1`` (:mod:`daskfeed.reading._lines`). A block follows none of the
    file's blocks whose line breaks are not known (a block of a split's other part, a dask
    DataFrame's partition, a Parquet file): its ``line`` is None, as is that of a block whose
    rows' lines could not be found.

    Parameters
    ----------
    src
        The data.
    facts
        The scan's facts of each block (``breaks``, ``row_lines``: see
        :func:`daskfeed.scanning._task.line_facts`).

    Returns
    -------
    list of dict
        Per block: ``{"line": int or None}``, and ``"row_lines"`` (each row's line from
        ``line``) where its rows are not one per line.
    """
    if src.frame is not None:
        return [{} for _ in facts]
    out: list[dict[str, Any]] = []
    at: int | None = None  # the line the next block of the same file starts on
    for block, f in zip(src.blocks, facts, strict=False):
        if block.length < 0 or block.offset == 0:
            at = 2  # (the header is line 1)
        breaks = f.get("breaks")
        line = at if breaks is not None else None
        at = None if line is None or breaks is None else line + breaks
        offsets = f.get("row_lines", ())
        if offsets is None:  # (rows not one per line, and their lines not found)
            line = None
        out.append({"line": line} if line is None or not offsets else
                   {"line": line, "row_lines": offsets})
    return out


def class_counts(values: dict[str, int]) -> dict[str, int]:
    """``{"0": rows, "1": rows, ...}`` of a class label from the scan's label value counts.

    Parameters
    ----------
    values
        The label's value counts, by the value as text.

    Returns
    -------
    dict of str to int
        Rows per class id, as text.
    """
    counts: dict[str, int] = {}
    for value, n in values.items():
        if is_number(value):
            key = str(int(float(value)))
            counts[key] = counts.get(key, 0) + int(n)
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def label_task(values: dict[str, int]) -> tuple[str, int]:
    """``(task, classes)`` of a label from its value counts: binary, multiclass or regression.

    Parameters
    ----------
    values
        The label's value counts, by the value as text.

    Returns
    -------
    tuple of (str, int)
        ``"binary"``, ``"multiclass"`` or ``"regression"``, and the number of classes.
    """
    nums = sorted(float(v) for v in values if is_number(v))  # (null markers of text blocks)
    if not nums or len(nums) > MAX_LABEL_VALUES:
        return "regression", 0
    if all(v == int(v) for v in nums) and nums[0] >= 0:
        if set(nums) <= {0.0, 1.0}:
            return "binary", 2
        if nums[-1] < MAX_LABEL_VALUES and len(nums) <= 200:
            return "multiclass", int(nums[-1]) + 1
    return "regression", 0
