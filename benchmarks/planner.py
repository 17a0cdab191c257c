"""The global order's planner without data: memory and time at 20,000 and 1.4 million blocks.

    .venv/bin/python benchmarks/planner.py

The seed's layout: 1,000-row blocks (files), ~70 bytes of CSV a row. Times the buckets' sizes
from the blocks' counts (``O(blocks + K)``) and one epoch's plan (``O(K)``), and the peak of
Python's allocations (tracemalloc) for both.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from daskfeed.batches._order import (
    BUCKET_ROWS,
    GlobalOrder,
    block_offsets,
    bucket_count,
    bucket_sizes,
)
from daskfeed.batches._plan import make_order_plan


def main() -> None:
    """Print one line per size."""
    for blocks in (20_000, 200_000, 1_400_000):
        counts = np.full(blocks, 1000, dtype=np.int64)
        tracemalloc.start()
        t0 = time.perf_counter()
        k = bucket_count(int(counts.sum()), blocks * 70_000)
        sizes = bucket_sizes(counts, block_offsets(np.arange(blocks, dtype=np.uint64), k), k)
        t1 = time.perf_counter()
        order = GlobalOrder.of(sizes, seed=0, epoch=3)
        plan = make_order_plan(order, batch_size=1024, window_rows=4 * BUCKET_ROWS)
        t2 = time.perf_counter()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"blocks {blocks:>9,}  buckets {k:>6,}  sizes {t1 - t0:6.3f} s  plan {t2 - t1:6.3f} s  "
              f"windows {len(plan.windows):>5,}  peak {peak / 2**20:6.1f} MiB")


if __name__ == "__main__":
    main()
