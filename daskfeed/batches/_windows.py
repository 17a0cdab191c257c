"""Window tasks: how a sequence's windows are submitted to the cluster, estimated and described.

A window's task reads its blocks (or computes its dask partitions), encodes and shuffles the
rows on a worker (:func:`~daskfeed.batches._read.read_window`, :func:`~daskfeed.batches._read.encode_window`),
and sends back a :class:`~daskfeed.manifest._encoding.WindowData`. A window of the global order
is read by the trainer itself where its cluster is this machine (:mod:`daskfeed.batches._here`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dask.base import tokenize

from daskfeed.batches._here import HereReads
from daskfeed.batches._memory_buckets import MemoryBuckets
from daskfeed.batches._plan import EpochPlan
from daskfeed.batches._read import encode_window, read_buckets, read_window
from daskfeed.dashboard import EpochSpans
from daskfeed.manifest import Encoding
from daskfeed.reading import Source

if TYPE_CHECKING:
    from dask.delayed import Delayed
    from distributed import Client, Future

    from daskfeed.batches._here import HereReads
    from daskfeed.batches._memory_buckets import BucketFiles
    from daskfeed.cache import BlockCache
    from daskfeed.cluster import Pending


class WindowTasks:
    """The windows of one data set and encoding as tasks on a cluster.

    Parameters
    ----------
    source
        The data (files' blocks, or a dask DataFrame's partitions).
    fingerprint
        The manifest's fingerprint: part of every window's key.
    encoding
        How rows become model inputs.
    cache
        The block cache on the workers (see :mod:`daskfeed.cache._blocks`), or None.
    spans
        One ``distributed.span`` per epoch for its windows (the dashboard), or None.
    """

    def __init__(self, source: Source, fingerprint: str, encoding: Encoding, cache: BlockCache | None,
                 spans: EpochSpans | None) -> None:
        self.source = source
        self.fingerprint = fingerprint
        self.encoding = encoding
        self.cache = cache
        self.spans = spans
        self.buckets: BucketFiles | None = None  # the global order's bucket files, once built
        self.here: HereReads | None = None  # the trainer's own threads reading bucket windows
        self._frames: list[Delayed] | None = None  # a dask DataFrame's partitions, made once

    def close(self) -> None:
        """Stop the trainer's own reading threads, if any (windows waiting for one are dropped)."""
        if self.here is not None:
            self.here.close()

    def submit(self, client: Client, plan: EpochPlan, w: int) -> Pending[Any]:
        """Start computing window ``w`` of ``plan`` (inside its epoch's span).

        Parameters
        ----------
        client
            The cluster's client.
        plan, w
            The epoch plan and the window's index in it.

        Returns
        -------
        distributed.Future or concurrent.futures.Future
            Of the window's :class:`~daskfeed.manifest._encoding.WindowData` (the latter when
            the trainer reads it itself).
        """
        win = plan.windows[w]
        seed = (plan.seed_of(w) if plan.order is None or win.units is None else
                (plan.order.window(*win.units), win.span, plan.lanes))
        # a tuple key: each window its own task group (so its epoch's span), prefix daskfeed-window
        token = tokenize(self.fingerprint, self.encoding, win.blocks, seed, self.buckets)
        key = (f"daskfeed-window-{token}", w)
        if self.spans is not None:
            with self.spans(plan.epoch):
                return self._submit(client, plan, w, key, seed)
        return self._submit(client, plan, w, key, seed)

    def _submit(self, client: Client, plan: EpochPlan, w: int, key: tuple[str, int],
                seed: Any) -> Pending[Any]:
        win = plan.windows[w]
        blocks = win.blocks
        if plan.order is not None and win.units is not None:  # whole buckets of the global order
            units, span, lanes = seed
            if self.here is None and isinstance(self.buckets, MemoryBuckets):
                # rows held in this process (a copy unpickled here, a scheduler that did not
                # answer): read here, never sent to a worker, which would take them all again
                self.here = HereReads(1, client)
            if self.here is not None and self.buckets is not None:
                return self.here.submit(self.buckets, units, span, lanes, self.encoding)
            return client.submit(read_buckets, self.buckets, units, span, lanes, self.encoding,
                                 key=key, retries=1)
        if self.source.frame is None:
            return client.submit(read_window, [(b, self.source.blocks[b]) for b in blocks],
                                 self.source.options, self.encoding, seed, self.cache, key=key,
                                 retries=1)
        from dask.delayed import delayed

        if self._frames is None:
            self._frames = self.source.partitions()
        d = delayed(encode_window, pure=True)(
            *[self._frames[b] for b in blocks], encoding=self.encoding, seed=seed,
            dask_key_name=key,
        )
        future: Future[Any] = client.compute(d, retries=1)
        return future

    def estimate(self, plan: EpochPlan, w: int) -> int:
        """Expected bytes of window ``w`` of ``plan`` once encoded.

        Parameters
        ----------
        plan, w
            The epoch plan and the window's index in it.

        Returns
        -------
        int
            Its rows times the encoding's bytes per row.
        """
        return int(plan.windows[w].rows * self.encoding.bytes_per_row)

    def describe(self, plan: EpochPlan, w: int) -> str:
        """Which epoch and blocks window ``w`` of ``plan`` reads, for messages.

        Parameters
        ----------
        plan, w
            The epoch plan and the window's index in it.

        Returns
        -------
        str
            E.g. ``"epoch 0, blocks a.csv[0:64MB], b.csv[0:12MB]"``.
        """
        win = plan.windows[w]
        blocks = win.blocks
        if plan.order is not None and win.units is not None:
            shown = [str(plan.order.bucket(u)) for u in range(*win.units)]
            return (f"epoch {plan.epoch}, units {win.units[0]}..{win.units[1] - 1} of "
                    f"{plan.order.units} (buckets {', '.join(shown[:5])}"
                    f"{' ...' if len(shown) > 5 else ''})")
        names = [self.source.blocks[b].describe() for b in blocks[:3]]
        more = f" and {len(blocks) - 3} more" if len(blocks) > 3 else ""
        return f"epoch {plan.epoch}, blocks {', '.join(names)}{more}"

    def __getstate__(self) -> dict[str, Any]:
        # a copy in another process: its workers read (the reading threads are this process's)
        return {**self.__dict__, "_frames": None, "here": None}
