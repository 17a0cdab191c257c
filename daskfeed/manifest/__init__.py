"""Manifest: what a scan found, persisted as JSON, and what follows from it.

Columns and blocks (and the line of each block's rows), the encoding of columns into arrays,
class labels, class and sample weights, the validation split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.manifest._encoding import (
        ENCODE_BYTES,
        EXACT_FLOAT32,
        MISSING_CODE,
        ColumnCode,
        Encoding,
        WindowData,
        concat,
        empty_window,
        encode_features,
        encode_table,
        epoch_seconds,
        labelled,
        numeric_dtype,
    )
    from daskfeed.manifest._ids import id_like, id_warning, joined
    from daskfeed.manifest._labels import refuse_single_class, text_classes, unknown_classes
    from daskfeed.manifest._lines import pack_row_lines, row_line, row_lines
    from daskfeed.manifest._manifest import Column, Manifest, read_reusable, read_settings, unknown_column
    from daskfeed.manifest._numbers import HEX, NUMBER, WHOLE
    from daskfeed.manifest._split import block_sizes, held_out, scanned_blocks, split_settings
    from daskfeed.manifest._weights import frame_weight_faults, record_line, weight_faults

__all__ = [
    "ENCODE_BYTES",
    "EXACT_FLOAT32",
    "HEX",
    "MISSING_CODE",
    "NUMBER",
    "WHOLE",
    "Column",
    "ColumnCode",
    "Encoding",
    "Manifest",
    "WindowData",
    "block_sizes",
    "concat",
    "empty_window",
    "encode_features",
    "encode_table",
    "epoch_seconds",
    "frame_weight_faults",
    "held_out",
    "id_like",
    "id_warning",
    "joined",
    "labelled",
    "numeric_dtype",
    "pack_row_lines",
    "read_reusable",
    "read_settings",
    "record_line",
    "refuse_single_class",
    "row_line",
    "row_lines",
    "scanned_blocks",
    "split_settings",
    "text_classes",
    "unknown_classes",
    "unknown_column",
    "weight_faults",
]

__getattr__, __dir__ = attach(__name__, {
    "HEX": "_numbers", "NUMBER": "_numbers", "WHOLE": "_numbers",
    "ColumnCode": "_encoding", "ENCODE_BYTES": "_encoding", "EXACT_FLOAT32": "_encoding", "Encoding":
    "_encoding", "MISSING_CODE": "_encoding", "WindowData": "_encoding", "concat": "_encoding",
    "empty_window": "_encoding", "encode_features": "_encoding", "encode_table": "_encoding",
    "labelled": "_encoding",
    "epoch_seconds": "_encoding", "numeric_dtype": "_encoding",
    "id_like": "_ids", "id_warning": "_ids", "joined": "_ids",
    "refuse_single_class": "_labels", "text_classes": "_labels", "unknown_classes": "_labels",
    "pack_row_lines": "_lines", "row_line": "_lines", "row_lines": "_lines",
    "Column": "_manifest", "Manifest": "_manifest", "read_reusable": "_manifest", "read_settings":
    "_manifest", "unknown_column": "_manifest",
    "block_sizes": "_split", "held_out": "_split", "scanned_blocks": "_split", "split_settings": "_split",
    "frame_weight_faults": "_weights", "record_line": "_weights", "weight_faults": "_weights",
})
