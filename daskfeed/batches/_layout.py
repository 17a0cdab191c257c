"""Layout: the sizes a run reads with against its budget (blocks and windows).

The blocksize a run reads with, the rows per window, and the largest block and window it plans
(what a worker must hold, checked against the workers' memory before anything is sent to them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dask.utils import format_bytes

from daskfeed.cluster import Budget
from daskfeed.manifest import Manifest


class Planned(Protocol):
    """What :func:`planned_window_bytes` reads of a sequence."""

    window_rows: int
    manifest: Manifest


MIN_WINDOWS = 8  # windows per epoch at least, so the cluster reads ahead of the trainer


def blocksize_for(asked: int | None, budget: Budget, cached: Manifest | None, cache: bool | str,
                  echo: Callable[[str], None]) -> int:
    """CSV bytes per block: asked for > the reused manifest's > what the budget gives.

    A manifest (and its parse cache) made under another budget is reused with its blocks:
    one scan per data set, whatever the budget. Without a parse cache, its blocks must
    also fit this budget's parse peak, else the data are scanned again in smaller ones.

    Parameters
    ----------
    asked
        The blocksize given (``--blocksize`` / ``daskfeed.blocksize``), or None.
    budget
        The run's memory budget (its ``blocksize``: what the parse peak allows).
    cached
        The manifest to reuse, or None.
    cache
        The parse cache setting (``False``: off).
    echo
        Where the line saying a given blocksize differs from the budget's goes.

    Returns
    -------
    int
        Bytes per block.
    """
    if asked:
        if asked != budget.blocksize:
            echo(f"blocks of {format_bytes(asked)} (blocksize / daskfeed.blocksize; the "
                 f"budget alone gives {format_bytes(budget.blocksize)})")
        return asked
    reused = (cached.read_options or {}).get("blocksize") if cached is not None else None
    if reused and (cache is not False or reused <= budget.blocksize):
        return int(reused)
    return budget.blocksize


def planned_window_bytes(*seqs: Planned | None) -> int:
    """CSV bytes of the largest planned window: its target rows, or one whole block.

    Parameters
    ----------
    *seqs
        The run's sequences (None: absent).

    Returns
    -------
    int
        The bytes of the largest window of any of them.
    """
    return max(max(int(seq.window_rows * seq.manifest.bytes_per_row), largest_block(seq.manifest))
               for seq in seqs if seq is not None)


def largest_block(manifest: Manifest) -> int:
    """CSV bytes of the manifest's largest block (a window holds at least one).

    Parameters
    ----------
    manifest
        The data's manifest.

    Returns
    -------
    int
        Rows of its largest block times its bytes per row.
    """
    return int(max(manifest.counts, default=0) * manifest.bytes_per_row)


def window_rows_for(window_rows: int | None, window_bytes: int, manifest: Manifest,
                    encoded_row_bytes: int, prefetch_bytes: int, batch_size: int) -> int:
    """Rows per window: as given, else from ``window_bytes`` within the prefetch budget.

    Parameters
    ----------
    window_rows
        Rows per window given, or None.
    window_bytes
        Input bytes per window aimed at (``daskfeed.window-bytes``).
    manifest
        The data's manifest (rows, bytes per row).
    encoded_row_bytes
        Bytes of one encoded row (features, label, weight).
    prefetch_bytes
        The trainer's budget for windows held or in flight.
    batch_size
        Rows per batch: a window holds at least one batch.

    Returns
    -------
    int
        Rows per window.
    """
    if window_rows is None:
        window_rows = int(window_bytes / max(manifest.bytes_per_row, 1.0))
        # the trainer must hold the current window and the next one within prefetch_bytes
        window_rows = min(window_rows, prefetch_bytes // (3 * encoded_row_bytes))
        # at least MIN_WINDOWS windows so the cluster reads ahead while the first is consumed
        # (a function of the data only: the plan must not depend on the number of workers)
        window_rows = min(window_rows, -(-manifest.rows // MIN_WINDOWS))
    return max(int(window_rows), batch_size, 1)
