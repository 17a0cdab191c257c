"""daskfeed as its users run it: a LocalCluster inside a memory budget, a ``DaskSequence``, ``fit``.

:func:`daskfeed_fit` times epoch 1 from before the cluster starts (cluster start, scan and the
first epoch from raw CSV included); :func:`feed_only` reads every batch of each epoch with no
model, for the feed's own rate. Both use a fresh parse cache, so epoch 1 is always cold.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

from common import epoch_clock, epoch_records, losses, quest_mlp

from daskfeed import Budget, DaskSequence, fit_from
from daskfeed.cluster import close_client, connect, start_local_cluster
from daskfeed.core import RSSSampler


def _sequence(data: Any, features: Sequence[str], label: str, batch_size: int,
              client: Any, budget: Budget, cache: str) -> DaskSequence:
    """The sequence ``daskfeed train`` builds for this budget (as in ``daskfeed.training._train``)."""
    return DaskSequence(data, label=label, features=list(features), as_matrix=True,
                        batch_size=batch_size, client=client, seed=0,
                        window_bytes=budget.window_bytes, blocksize=budget.blocksize,
                        prefetch_bytes=budget.prefetch * 2 // 3, cache=cache)


def _epoch_stats(seq: DaskSequence, epoch: int) -> dict[str, Any]:
    """The sequence's stats of ``epoch`` (Keras may advance it before or after the callbacks).

    The tf.data hand-off reads ahead: with a few batches per epoch it ends an epoch, and begins the
    next, before Keras trained the first; ``stats_of`` keeps each ended epoch's own figures.
    """
    st = dict(seq.stats_of(epoch))
    if st:
        return st
    st = dict(seq.last_epoch_stats)
    return st if st.get("epoch") == epoch else dict(seq.epoch_stats())


def daskfeed_fit(data: Any, features: Sequence[str], label: str, batch_size: int, epochs: int,
                 memory_limit: str | int, nworkers: int | None, val: Any, workdir: str,
                 tag: str = "fit", handoff: str = "auto", hidden: Sequence[int] = (64, 64),
                 scheduler: str | None = None) -> dict[str, Any]:
    """Start a cluster in ``memory_limit``, scan, and fit as ``daskfeed train`` does (``fit_from``).

    ``hidden``: the model's hidden layers (:func:`common.quest_mlp`). ``scheduler``: the address
    of a running ``dask scheduler`` (with its workers) to use instead of a LocalCluster, as
    ``daskfeed train --scheduler`` does: its event loop is then outside the trainer's process
    (the peak RSS then covers the trainer alone).

    Returns
    -------
    dict
        Per-epoch records with ``data_wait_fraction`` (seconds the feed blocked on a window
        not yet arrived, over the epoch), ``assembly_fraction`` (all seconds assembling
        batches: waiting plus slicing, over the epoch); the cluster start and
        scan seconds; the budget; the peak RSS of the process tree (trainer + workers).
    """
    client = seq = None
    with RSSSampler(interval=0.1) as rss:
        t0 = time.perf_counter()
        budget = Budget.split(memory_limit, nworkers=nworkers)
        try:
            client = (connect(scheduler) if scheduler else
                      start_local_cluster(budget, dashboard_address=""))
            t_cluster = time.perf_counter()
            seq = _sequence(data, features, label, batch_size, client, budget,
                            os.path.join(workdir, f"cache-{tag}"))
            t_scan = time.perf_counter()
            m = seq.manifest
            model = quest_mlp([m.columns[c].mean for c in seq.features],
                              [m.columns[c].var for c in seq.features], hidden=hidden)
            seen = {"assembly": 0.0}

            def on_end(epoch: int) -> dict[str, Any]:
                st = _epoch_stats(seq, epoch)
                g = seq.stream.assembly_seconds - seen["assembly"]  # waiting + slicing
                seen["assembly"] = seq.stream.assembly_seconds
                return {"rows_served": st.get("rows"), "wait_seconds": round(st.get("wait_seconds", 0.0), 4),
                        "assembly_seconds": round(g, 4), "windows_computed": st.get("windows_computed"),
                        "rss_bytes": rss.sample()}

            clock = epoch_clock(on_end)
            hist = fit_from(model, seq, epochs=epochs, handoff=handoff, shuffle=False, verbose=0,
                            callbacks=[clock])[0]
        finally:
            if seq is not None:
                seq.close()
            if client is not None:
                close_client(client)
    rows = m.rows
    eps = epoch_records(clock, rows, t0)
    for e in eps:
        e["data_wait_fraction"] = round(min(1.0, e["wait_seconds"] / e["seconds"]), 4)
        e["assembly_fraction"] = round(min(1.0, e["assembly_seconds"] / e["seconds"]), 4)
    return {"rows": rows, "epochs": eps, "expected_steps": math.ceil(rows / batch_size),
            "cluster_start_seconds": round(t_cluster - t0, 4), "scan_seconds": round(t_scan - t_cluster, 4),
            "windows": len(seq.plan.windows), "window_rows": seq.window_rows,
            "cache_status": "fresh directory per run (epoch 1 cold)",
            "budget": {**budget.__dict__, "text": str(memory_limit),
                       "describe": budget.describe(str(memory_limit))},
            "data_bytes": int(seq.source.nbytes) if hasattr(seq.source, "nbytes") else None,
            "peak_rss_bytes": rss.peak, "rss_at_start_bytes": rss.start,
            "handoff": handoff,
            "note": "LocalCluster in the budget, DaskSequence(as_matrix=True, fresh cache), "
                    f"fit_from(handoff={handoff!r}) as daskfeed train fits; epoch 1 from start = "
                    "cluster + scan + epoch",
            **losses(model, hist, val, batch_size)}


def feed_only(data: Any, features: Sequence[str], label: str, batch_size: int, epochs: int,
              memory_limit: str | int, nworkers: int | None, workdir: str) -> dict[str, Any]:
    """Every batch of ``epochs`` epochs of a ``DaskSequence``, no model: the feed's own rate.

    Epoch 1 is also timed from before the cluster starts (cluster + scan + epoch, cold cache).
    """
    client = seq = None
    eps: list[dict[str, Any]] = []
    with RSSSampler(interval=0.1) as rss:
        t0 = time.perf_counter()
        budget = Budget.split(memory_limit, nworkers=nworkers)
        try:
            client = start_local_cluster(budget, dashboard_address="")
            t_cluster = time.perf_counter()
            seq = _sequence(data, features, label, batch_size, client, budget,
                            os.path.join(workdir, "cache-feed"))
            t_scan = time.perf_counter()
            for e in range(epochs):
                t = time.perf_counter()
                rows = 0
                for i in range(len(seq)):
                    rows += len(seq[i][1])
                done = time.perf_counter()
                st = seq.epoch_stats()
                # µs: an epoch read ahead entirely takes well under 0.1 ms on tiny data
                eps.append({"epoch": e + 1, "seconds": round(done - t, 6), "rows": rows,
                            "rows_per_s": round(rows / (done - t), 1), "steps": len(seq),
                            "wait_seconds": round(st.get("wait_seconds", 0.0), 4)})
                if e == 0:
                    eps[0]["seconds_from_start"] = round(done - t0, 4)
                    eps[0]["rows_per_s_from_start"] = round(rows / (done - t0), 1)
                if e + 1 < epochs:
                    seq.on_epoch_end()
        finally:
            if seq is not None:
                seq.close()
            if client is not None:
                close_client(client)
    rows = eps[0]["rows"]
    return {"rows": rows, "epochs": eps, "expected_steps": math.ceil(rows / batch_size),
            "cluster_start_seconds": round(t_cluster - t0, 4), "scan_seconds": round(t_scan - t_cluster, 4),
            "peak_rss_bytes": rss.peak, "rss_at_start_bytes": rss.start,
            "note": f"seq[i] for every batch, no model; {len(features) + 1} columns delivered"}
