"""The threads a model may compute on in this process, beside the workers of its own cluster.

On a machine shared by the trainer and a LocalCluster, the cores are the budget's too: the
workers read, encode and deal on theirs, the model's step on the rest. A library whose threads
spin while they wait (torch's OpenMP pool) slows to a crawl when it takes cores the workers
use, and its default is every core, or one: distributed's nannies set ``OMP_NUM_THREADS=1`` in
the process that starts them (:func:`~daskfeed.cluster._start._spawn_environ`), so before this
module the count depended on whether torch was imported before the cluster started or after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.cluster._start import owned_environ

if TYPE_CHECKING:
    from distributed import Client


def trainer_threads(client: Client) -> tuple[int, str] | None:
    """How many threads a model in this process computes on, and why, beside ``client``'s workers.

    Parameters
    ----------
    client
        The client of the cluster the data are read by.

    Returns
    -------
    tuple or None
        ``(threads, why)`` for a LocalCluster daskfeed started in this process
        (:func:`~daskfeed.cluster.start_local_cluster`): this process's ``OMP_NUM_THREADS``
        as it was before the cluster started, where set to a whole number ≥ 1; else the
        machine's cores less its workers' threads, at least one. None for a cluster given
        (a client or an address): how its workers share this machine is its owner's to say.
    """
    environ = owned_environ(client)
    if environ is None:
        return None
    asked = (environ.get("OMP_NUM_THREADS") or "").strip()
    if asked.isdigit() and int(asked) >= 1:
        return int(asked), f"OMP_NUM_THREADS={asked}"
    from dask.system import CPU_COUNT

    try:
        busy = sum(client.nthreads().values())
    except Exception:  # (a cluster closing: no worker left to share the cores with)
        busy = 0
    return max(1, CPU_COUNT - busy), (f"the {CPU_COUNT} core(s) the local cluster's {busy} "
                                      "worker thread(s) leave, at least 1")
