"""Parse cache: every block parsed once, kept as Arrow IPC files; open, write, list, clear."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.cache._arrow import one_table
    from daskfeed.cache._blocks import BlockCache, block_tables, stored_rows
    from daskfeed.cache._buckets import TRACE_COLUMNS, BucketSet, digest, generation_name
    from daskfeed.cache._entries import clear, gone_entries, list_entries
    from daskfeed.cache._layout import CacheLayout, default_root
    from daskfeed.cache._open import CacheChoice, estimate_bytes, open_cache
    from daskfeed.cache._root import own_dir, own_root
    from daskfeed.cache._scatter import block_order
    from daskfeed.cache._writer import PartWriters, compact

__all__ = [
    "TRACE_COLUMNS",
    "BlockCache",
    "BucketSet",
    "CacheChoice",
    "CacheLayout",
    "PartWriters",
    "block_order",
    "block_tables",
    "clear",
    "compact",
    "default_root",
    "digest",
    "estimate_bytes",
    "generation_name",
    "gone_entries",
    "list_entries",
    "one_table",
    "open_cache",
    "own_dir",
    "own_root",
    "stored_rows",
]

__getattr__, __dir__ = attach(__name__, {
    "BlockCache": "_blocks", "block_tables": "_blocks", "CacheLayout": "_layout",
    "default_root": "_layout",
    "stored_rows": "_blocks", "BucketSet": "_buckets", "TRACE_COLUMNS": "_buckets",
    "generation_name": "_buckets",
    "digest": "_buckets",
    "clear": "_entries", "gone_entries": "_entries", "list_entries": "_entries",
    "CacheChoice": "_open", "estimate_bytes": "_open", "open_cache": "_open", "compact": "_writer",
    "PartWriters": "_writer",
    "own_dir": "_root", "own_root": "_root",
    "block_order": "_scatter", "one_table": "_arrow",
})
