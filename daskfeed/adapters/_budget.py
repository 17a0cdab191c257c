"""One memory budget for a data set served in this process: DaskSequence's and TorchDataset's.

``memory_limit=`` opens (or reaches) the cluster within the budget
(:func:`~daskfeed.cluster.open_in_budget`) and derives the sizes not given from it: the batches
prefetched, the shuffle windows and, for a LocalCluster started for it, the blocks, as
``daskfeed train`` derives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from daskfeed.cluster import open_in_budget
from daskfeed.core import refuse_setting

if TYPE_CHECKING:
    from distributed import Client


@dataclass(frozen=True)
class InBudget:
    """A data set's client and its sizes within one ``memory_limit``.

    Attributes
    ----------
    client
        The ``distributed.Client`` the data are served by.
    owned
        Whether it was started (or connected) for these data: closed with them.
    prefetch_bytes, window_bytes, blocksize
        The sizes given, else the budget's (``blocksize``: only for a LocalCluster started in
        the budget; None: the ``daskfeed.*`` config's).
    """

    client: Client
    owned: bool
    prefetch_bytes: int | str
    window_bytes: int | str
    blocksize: int | str | None

    @classmethod
    def open(cls, memory_limit: int | str | None, *, client: Client | str | None,
             nworkers: int | None, prefetch_bytes: int | str | None,
             window_bytes: int | str | None, blocksize: int | str | None) -> InBudget | None:
        """The client and sizes of data served within ``memory_limit`` (None: no budget given).

        Parameters
        ----------
        memory_limit
            Without ``client``: the whole process tree's budget (a LocalCluster of ``nworkers``
            started in it). With a ``client``: this process's own. None: nothing is opened.
        client, nworkers
            As :func:`~daskfeed.cluster.open_in_budget` takes them.
        prefetch_bytes, window_bytes, blocksize
            The sizes asked for (None: the budget's).

        Returns
        -------
        InBudget or None
            None without ``memory_limit``: the caller's client and sizes stand.

        Raises
        ------
        BudgetError
            A budget that is no memory size, more than this machine has, or too small.
        SettingError
            ``nworkers`` without ``memory_limit`` (it shapes the cluster started in a budget).
        """
        if memory_limit is None:
            if nworkers is not None:
                refuse_setting("Expected nworkers= with memory_limit= (the workers of the "
                               "LocalCluster started within that budget).",
                               f"nworkers={nworkers!r} without memory_limit",
                               "add memory_limit='4GB' (say), or pass client= a cluster of your own.")
            return None
        local = client is None  # a LocalCluster started in the budget: its blocks too
        client, owned, budget = open_in_budget(memory_limit, client, nworkers)
        return cls(client, owned,
                   budget.stream_share() if prefetch_bytes is None else prefetch_bytes,
                   budget.window_bytes if window_bytes is None else window_bytes,
                   budget.blocksize if local and blocksize is None else blocksize)
