"""Counting again what the kept counts cannot decide: a text column's top K past 50,000 values.

A part whose column holds more distinct values than the scan counts exactly keeps the most
frequent and a bound on what it dropped (:func:`~daskfeed.scanning._stats.merge_stats`). When the
merged counts do not decide the column's K most frequent values
(:func:`~daskfeed.scanning._schema.decided`), the values that may belong there — those whose kept
count plus the bound reaches the K-th count — are counted again, exactly, in the parts that
dropped values (from the parse cache where it has them); the other parts' counts are exact
already. Their exact counts then decide the top K. Where even a value never kept may belong
there (the bound reaches the K-th count), nothing short of counting every value decides it: the
scan says so in a note (:func:`~daskfeed.scanning._notes.vocabulary_notes`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from distributed import Client

from daskfeed.cache import BlockCache, block_tables
from daskfeed.reading import Block, ReadOptions, Source
from daskfeed.scanning._schema import Stats, decided


def count_values(items: list[tuple[int, Block]], options: ReadOptions, column: str,
                 values: list[str], cache: BlockCache | None) -> dict[str, int]:
    """Rows of each of ``values`` in ``column`` of the blocks ``items`` (runs on a worker).

    Parameters
    ----------
    items
        ``(block index, block)`` of each block.
    options
        How the files are read.
    column
        The text column.
    values
        The values to count.
    cache
        The parse cache (its blocks are read, not parsed; others are parsed).

    Returns
    -------
    dict
        Value -> rows (values with none left out).
    """
    wanted = pa.array(values, pa.string())
    counts: Counter[str] = Counter()
    for index, block in items:
        for table in block_tables(index, block, options, cache, columns=[column]):
            if column not in table.column_names:
                continue
            col = table.column(column)
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            col = pc.cast(col, pa.string())
            vc = pc.value_counts(pc.filter(col, pc.is_in(col, value_set=wanted)))
            counts.update(dict(zip(vc.field("values").to_pylist(),
                                   vc.field("counts").to_pylist(), strict=True)))
    return dict(counts)


def recount(src: Source, client: Client, records: list[dict[str, Any]], stats: Stats, k: int,
            cache: BlockCache | None) -> list[str]:
    """Count again the values that may be in an undecided top ``k``; fix ``stats`` in place.

    Parameters
    ----------
    src
        The data.
    client
        The cluster.
    records
        Each part's record, in part order (their statistics say which parts dropped values).
    stats
        The merged statistics: each recounted column's candidates get their exact counts and
        the column is marked ``decided``.
    k
        The vocabulary size.
    cache
        The parse cache.

    Returns
    -------
    list of str
        What was counted again, one phrase per column (for the scan's line).
    """
    said = []
    for name, st in stats.items():
        bound = int(st.get("bound", 0))
        if "kmv" not in st or not bound:  # not text, or every count exact
            continue
        ranked = sorted((st.get("values") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
        if decided(ranked, k, bound) or len(ranked) < k or bound >= ranked[k - 1][1]:
            continue  # decided, or a value never kept may belong there (said in a note)
        floor = ranked[k - 1][1]
        candidates = [v for v, c in ranked if c + bound >= floor]
        parts = [n for n, r in enumerate(records) if int(r["stats"].get(name, {}).get("bound", 0))]
        exact: Counter[str] = Counter()
        for n, r in enumerate(records):
            if n not in parts:  # every value of this part was kept: its counts are exact
                kept = r["stats"].get(name, {}).get("values", {})
                exact.update({v: kept[v] for v in candidates if v in kept})
        blocks = [i for n in parts for i in range(*src.parts()[n].blocks)]
        futures = [client.submit(count_values, [(i, src.blocks[i]) for i in blocks[j : j + 64]],
                                 src.options, name, candidates, cache, pure=False)
                   for j in range(0, len(blocks), 64)]
        for found in client.gather(futures):
            exact.update(found)
        st["values"] = {**st["values"], **{v: int(exact.get(v, 0)) for v in candidates}}
        st["decided"] = True
        said.append(f"column {name!r}: its top {k:,} decided by counting {len(candidates):,} "
                    f"values again in {len(parts):,} part(s)")
    return said
