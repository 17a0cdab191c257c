"""glibc's malloc in the local workers: Arrow's buffers served from the heap, kept for the next task.

distributed's nanny sets ``MALLOC_TRIM_THRESHOLD_`` (64 KiB) so that freed memory goes back to the
system; any such variable also fixes malloc's mmap threshold at 128 KiB, so every column of a
parsed block was mapped, faulted in page by page and unmapped when freed, again for the next block.
Page faults are dear on these machines (a virtual machine's memory): a scan task of one 64 MiB
block faulted in ~80,000 fresh pages (~320 MB) and spent a third of its time in the kernel. The
workers' preload (:func:`daskfeed.cluster._start.dask_setup`) raises the mmap threshold, keeps up
to :data:`KEEP_SHARE` of the worker's memory limit free in the heap for the next task
(:func:`serve_from_heap`). Every thread is served from malloc's main arena: the workers start with
``MALLOC_ARENA_MAX=1`` (the nanny's pre-spawn environment,
:func:`daskfeed.cluster._start.start_local_cluster`), as a task thread's own arena is made of
64-MiB heaps that cannot hold a block's buffers; set by ``mallopt`` in the preload, it came after
the arenas a worker's threads had made, which glibc then handed to task threads. A task's end gives
the free heap back to the system only where the worker's memory is above :data:`TRIM_ABOVE` of its
limit (:func:`trim_heap`; the budget keeps a task's peak under 60%). Where the C library is not
glibc, all of this does nothing.

One scan task of a 64 MiB block in a thread, the workers' settings, per block (``getrusage``):
0.95-0.99 s, 80,000 page faults and 0.27-0.30 s in the kernel before; 0.65-0.75 s, 5,000 faults
and 0.03 s after; the process's peak RSS 589 against 435 MiB.
"""

from __future__ import annotations

import ctypes

# allocations below this come from malloc's heap, above it from their own mapping
MMAP_THRESHOLD = 256 * 2**20
KEEP_SHARE = 0.25  # of a worker's memory limit: free heap kept for its next task
TRIM_ABOVE = 0.5  # of a worker's memory limit: above it, a task's end gives the free heap back
_M_TRIM_THRESHOLD = -1  # mallopt's parameters (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
HEAP_SET = False  # whether this process's threshold was set (a worker's preload)
_LIMIT = 0  # the worker's memory limit (0: none known: every task's end trims)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):  # (TypeError: Windows takes no None)
        return None


def heap_below(nbytes: int) -> bool:
    """Let glibc's malloc serve allocations below ``nbytes`` from its heap (this process).

    Whole-process ``daskfeed scan`` of 0.9 GB in four files on 2 cores, 32 MiB against malloc's
    fixed 128 KiB, A-B-A x3: wall 0.77x, system time 2.9 against 6.4 s, the largest process's
    peak RSS 546 against 436 MiB (no bound: 610 MiB, no faster); with :func:`trim_heap` after
    each scan task, wall 0.88x and 479 MiB (the trim alone: 1.05x the time, 471 against 546 MiB).

    Returns
    -------
    bool
        Whether it was set (False where the C library has no ``mallopt``: not glibc).
    """
    libc = _libc()
    try:
        return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, int(nbytes)))
    except AttributeError:
        return False


def serve_from_heap(memory_limit: int | None = None) -> None:
    """Serve this worker's buffers below :data:`MMAP_THRESHOLD` from the heap (its preload).

    Parameters
    ----------
    memory_limit
        The worker's memory limit: up to :data:`KEEP_SHARE` of it stays free in the heap for
        the next task (None or 0: the nanny's trim threshold stays, and every task's end trims).
    """
    global HEAP_SET, _LIMIT
    HEAP_SET = heap_below(MMAP_THRESHOLD)
    _LIMIT = 0
    if HEAP_SET and memory_limit:
        libc = _libc()
        keep = min(int(memory_limit * KEEP_SHARE), 2**31 - 1)  # (mallopt takes a C int)
        if libc is not None and libc.mallopt(_M_TRIM_THRESHOLD, keep):
            _LIMIT = int(memory_limit)


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (``malloc_trim``; after a task).

    Only where the worker's memory is above half its limit (``TRIM_ABOVE``), or no limit is
    known: below it, the pages are the next task's, not faulted in again.

    Returns
    -------
    bool
        Whether memory was given back (False where there is no glibc, nothing to give, or the
        worker keeps it).
    """
    if not HEAP_SET:
        return False
    if _LIMIT:
        import psutil

        if psutil.Process().memory_info().rss <= TRIM_ABOVE * _LIMIT:
            return False
    libc = _libc()
    try:
        return bool(libc is not None and libc.malloc_trim(0))
    except AttributeError:
        return False


def release_after_task() -> None:
    """Give back what a task freed, where it should go.

    In a local worker (its heap set): kept for the next task, or trimmed (:func:`trim_heap`).
    Elsewhere (the trainer's own threads, a cluster's workers not started here): Arrow's memory
    pool gives back what it holds unused.
    """
    if HEAP_SET:
        trim_heap()
        return
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
