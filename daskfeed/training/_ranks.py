"""Ranks: several trainers (data-parallel) on one Dask cluster, one scan between them.

Each trainer is a *rank* of ``world_size``; in the global order (the parse cache on) it trains on
the batches ``b % world_size == rank`` of each epoch's order (:mod:`daskfeed.batches._order`),
without it on the disjoint shard of blocks ``b % world_size == rank``
(:func:`daskfeed.batches._plan.make_plan`); every rank serves the same number of batches per epoch.
The rank comes from ``--rank`` / ``--world-size``, else ``TF_CONFIG``, else ``RANK`` / ``WORLD_SIZE``.

One scan for all ranks: the scheduler they share is the meeting point. Each rank takes the
Dask ``Lock`` named after the data and the settings that shape a manifest; under it, a rank
finds the manifests another rank published on the scheduler (``Client.set_metadata``) and
reuses them, or, the first to come, scans and publishes them. The lock is held while the
first rank scans, so the others wait (up to ``daskfeed.rank-wait``, resolved by the caller)
instead of scanning too;
a rank that dies holding it loses it when its lease expires, and the next one scans. A
published manifest is checked like any reused one (files and settings): one left on a
long-lived scheduler by an earlier run is used only if it still describes the data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskfeed.core import ClusterError, redact_text, refuse_setting
from daskfeed.manifest import Manifest

if TYPE_CHECKING:
    from distributed import Client, Lock

    from daskfeed.adapters import DaskSequence

_METADATA = "daskfeed-manifests"


@dataclass(frozen=True)
class Rank:
    """A trainer's place among ``world_size`` trainers, and where that was read."""

    rank: int = 0
    world_size: int = 1
    origin: str = "default"  # "--rank/--world-size" | "TF_CONFIG" | "RANK/WORLD_SIZE" | "default"

    @property
    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` as :class:`~daskfeed.DaskSequence` takes it."""
        return self.rank, self.world_size

    @property
    def several(self) -> bool:
        """True when this is one of several trainers."""
        return self.world_size > 1

    def describe(self) -> str:
        """E.g. ``rank 1 of 3 (from TF_CONFIG)``."""
        return f"rank {self.rank} of {self.world_size} (from {self.origin})"


def resolve_rank(rank: int | None = None, world_size: int | None = None,
                 environ: Mapping[str, str] | None = None) -> Rank:
    """The rank of this trainer: the arguments, else ``TF_CONFIG``, else ``RANK``/``WORLD_SIZE``.

    ``TF_CONFIG`` is ``tf.distribute``'s: ``{"cluster": {"chief": [...], "worker": [...]},
    "task": {"type": "worker", "index": 1}}``; the chief is rank 0, worker ``i`` is rank
    ``i + 1`` when there is a chief, else rank ``i``. ``RANK`` / ``WORLD_SIZE`` are what
    ``torchrun`` and most launchers set.

    Raises
    ------
    SettingError
        For half a pair (a rank without a world size), a rank outside ``[0, world_size)``,
        ``TF_CONFIG`` that is not JSON or names a task that does not train (``ps``,
        ``evaluator``), or ``RANK``/``WORLD_SIZE`` that are not integers.
    """
    env = os.environ if environ is None else environ
    if rank is not None or world_size is not None:
        return _checked(rank, world_size, "--rank/--world-size")
    if env.get("TF_CONFIG", "").strip():
        return _from_tf_config(env["TF_CONFIG"])
    if env.get("WORLD_SIZE", "").strip():
        try:
            got_rank, got_size = int(env.get("RANK", "0")), int(env["WORLD_SIZE"])
        except ValueError:
            refuse_setting("Expected integers in RANK and WORLD_SIZE.",
                    f"RANK={env.get('RANK')!r}, WORLD_SIZE={env.get('WORLD_SIZE')!r}",
                    "unset them, or pass --rank and --world-size.")
        return _checked(got_rank, got_size, "RANK/WORLD_SIZE")
    return Rank()


def _checked(rank: int | None, world_size: int | None, origin: str) -> Rank:
    if rank is None or world_size is None:
        refuse_setting("Expected both a rank and a world size (several trainers).",
                f"rank={rank!r}, world_size={world_size!r}",
                "pass both, e.g. --rank 0 --world-size 3 (one command per trainer).")
    if world_size < 1 or not 0 <= rank < world_size:
        refuse_setting("Expected 0 <= rank < world_size.", f"rank={rank}, world_size={world_size} "
                f"(from {origin})", "ranks count from 0: with 3 trainers, ranks 0, 1 and 2.")
    return Rank(int(rank), int(world_size), origin)


def _from_tf_config(text: str) -> Rank:
    try:
        cfg = json.loads(text)
        cluster, task = cfg["cluster"], cfg["task"]
        kind, index = str(task["type"]), int(task["index"])
    except (ValueError, KeyError, TypeError):
        refuse_setting("Expected TF_CONFIG as tf.distribute writes it: {\"cluster\": {...}, \"task\": "
                "{\"type\": ..., \"index\": ...}}.", f"TF_CONFIG={text[:200]!r}",
                "fix TF_CONFIG, or unset it and pass --rank and --world-size.")
    chiefs = len(cluster.get("chief", []))
    workers = len(cluster.get("worker", []))
    if kind not in ("chief", "worker"):
        refuse_setting("Expected a TF_CONFIG task of type 'chief' or 'worker' (the tasks that train).",
                f"task type {kind!r}", "run daskfeed train only in the chief and worker tasks; "
                "parameter servers and evaluators are not supported.")
    rank = index if kind == "chief" else chiefs + index
    return _checked(rank, chiefs + workers, "TF_CONFIG")


def scan_key(**settings: Any) -> str:
    """A name for the manifests of these data and settings (the same on every rank).

    The data's URLs enter it without credentials: ranks given other credentials for the same
    files share one scan.
    """
    text = redact_text(json.dumps(settings, sort_keys=True, default=str))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass
class SharedScan:
    """The scan lock of ``key``, held, and the manifests published under it (empty: none yet).

    Made by :func:`join_scan`; :meth:`share` publishes what this rank scanned and releases the
    lock, :meth:`close` releases it (idempotent).
    """

    client: Client
    key: str
    lock: Lock | None = None
    found: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Manifest | None:
        """The published manifest ``name`` (``"train"``, ``"validation"``), or None.

        Parameters
        ----------
        name
            ``"train"`` or ``"validation"``.

        Returns
        -------
        Manifest or None
            The manifest another rank (or this one) published, or None.
        """
        text = self.found.get(name)
        return Manifest.from_dict(json.loads(text)) if text else None

    def publish(self, **manifests: Manifest | None) -> None:
        """Publish these manifests (None: none) for the other ranks."""
        payload: dict[str, Any] = {name: json.dumps(m.to_dict())
                                   for name, m in manifests.items() if m is not None}
        payload["published"] = time.time()
        self.client.set_metadata([_METADATA, self.key], payload)
        self.found = payload

    def share(self, **manifests: Manifest | None) -> bool:
        """Publish the manifests unless they are the ones found; release the lock.

        Returns True when something was published (this rank scanned).
        """
        fresh = any(m is not None and self.found.get(name) != json.dumps(m.to_dict())
                    for name, m in manifests.items())
        try:
            if fresh:
                self.publish(**manifests)
        finally:
            self.close()
        return fresh

    def close(self) -> None:
        """Release the scan lock (if still held)."""
        lock, self.lock = self.lock, None
        if lock is not None:
            with contextlib.suppress(Exception):
                lock.release()


def join_scan(client: Client, key: str, *, wait: float,
              echo: Callable[[str], None] = print) -> SharedScan:
    """Take the scan lock of ``key`` on the shared scheduler; what was published there.

    Parameters
    ----------
    client
        A client of the scheduler every rank uses.
    key
        :func:`scan_key` of the data and the settings that shape their manifests.
    wait
        Seconds to wait for the lock (another rank scanning) before giving up (the entry
        resolves ``daskfeed.rank-wait``).
    echo
        Where to say that this rank waits.

    Returns
    -------
    SharedScan
        The lock, held, and the manifests published under ``key`` (empty: none yet).

    Raises
    ------
    ClusterError
        When the lock is not had within ``wait`` seconds: another rank still scans (or hangs).
    """
    from distributed import Lock

    lock = Lock(f"daskfeed-scan-{key}", scheduler_rpc=client.scheduler, loop=client.loop)
    t0 = time.monotonic()
    if not lock.acquire(blocking=False):
        echo(f"waiting for another trainer's scan of these data (up to {wait:g}s)")
        if not lock.acquire(timeout=wait):
            raise ClusterError(
                f"Expected the scan shared by the trainers within {wait:g}s. Received: the lock "
                f"'daskfeed-scan-{key}' on {client.scheduler.address} still held by another "
                "trainer after that time.\nHint: check the rank that scans (its log and the "
                "dashboard); for data that take longer to scan raise daskfeed.rank-wait "
                "(DASK_DASKFEED__RANK_WAIT=4h)."
            )
        echo(f"the other trainer's scan ended after {time.monotonic() - t0:.1f}s")
    try:
        found = client.get_metadata([_METADATA, key], default=None) or {}
    except BaseException:
        lock.release()
        raise
    return SharedScan(client, key, lock, dict(found))


@contextlib.contextmanager
def scan_once(client: Client, key: str, *, wait: float,
              echo: Callable[[str], None] = print) -> Iterator[SharedScan]:
    """:func:`join_scan` as a context manager: the lock is released on exit.

    Parameters
    ----------
    client, key, wait, echo
        As :func:`join_scan` takes them.

    Yields
    ------
    SharedScan
        The lock, held until the block ends, and what was published under ``key``.

    Examples
    --------
    >>> with scan_once(client, scan_key(data=path, label="cleared"), wait=3600) as shared:  # doctest: +SKIP
    ...     seq = DaskSequence(path, label="cleared", manifest=shared.get("train"),
    ...                        shard=(rank, world_size))
    ...     shared.share(train=seq.manifest)
    """
    shared = join_scan(client, key, wait=wait, echo=echo)
    try:
        yield shared
    finally:
        shared.close()


def rank_output(output: str, rank: Rank) -> str:
    """Where a rank writes: ``output`` for rank 0 (and a single trainer), else ``output/rank-N``."""
    return os.path.join(output, f"rank-{rank.rank}") if rank.rank > 0 else output


def shard_line(rank: Rank, seq: DaskSequence) -> str:
    """What a rank says of its shard: rows, batches, rows dropped to keep the counts equal."""
    plan = seq.plan
    served = plan.rows
    if plan.lanes is not None:
        world = rank.world_size
        return (f"{rank.describe()}: batches {rank.rank}, {rank.rank + world}, "
                f"{rank.rank + 2 * world}, ... of each epoch's global order; "
                f"{plan.num_batches} batches of {plan.batch_size} per epoch on every rank "
                f"({served:,} rows), {plan.dropped:,} rows of the epoch left out by all ranks "
                "to keep the counts equal (the order's last rows: other rows each epoch)")
    return (f"{rank.describe()}: blocks b % {rank.world_size} == {rank.rank}, "
            f"{served + plan.dropped:,} rows; {plan.num_batches} batches of {plan.batch_size} per "
            f"epoch on every rank ({served:,} rows), {plan.dropped:,} rows of this shard left out "
            "per epoch to keep the counts equal (the tail of each epoch's shuffled order)")


def shard_report(rank: Rank, seq: DaskSequence) -> dict[str, Any] | None:
    """What ``history.json`` says of the rank (None: a single trainer)."""
    if not rank.several:
        return None
    plan = seq.plan
    if plan.lanes is not None:
        return {"rank": rank.rank, "world_size": rank.world_size, "from": rank.origin,
                "shard": f"batches b of the global order with b % {rank.world_size} == {rank.rank}",
                "rows_per_epoch": plan.rows, "batches_per_epoch": plan.num_batches,
                "dropped_rows_per_epoch": plan.dropped,
                "remainder_policy": "equal batch counts: the epoch's last rows are left out by all ranks"}
    return {"rank": rank.rank, "world_size": rank.world_size, "from": rank.origin,
            "shard_rows": plan.rows + plan.dropped, "rows_per_epoch": plan.rows,
            "batches_per_epoch": plan.num_batches, "dropped_rows_per_epoch": plan.dropped,
            "remainder_policy": "equal batch counts: each rank drops the rest of its shard"}
