"""Budget: one memory budget for the whole process tree, and what the workers' memory holds.

Splits a budget (trainer + every worker) into a trainer reserve, a prefetch allowance and a
per-worker ``memory_limit``, and derives the block size and the shuffle window from it; checks
that running workers can hold the planned windows, and turns workers paused for good into a
clear error. :mod:`daskfeed.cluster._start` starts the cluster in a budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dask.utils import format_bytes, parse_bytes

from daskfeed.core import BudgetError, DaskfeedError, config

if TYPE_CHECKING:
    from distributed import Client

# measured: an idle dask worker ≈ 0.15 GB RSS; it also needs room to parse one block
MIN_WORKER = 384 * 2**20
# the fewest bytes a worker gets when the number of workers is not asked for: a worker of
# 384 MiB is at ~250 MiB after its first tasks (the runtime, pyarrow, pandas) and pauses at
# 80 % of its limit (307 MiB), for good (make soak at 2GB: the scan's watchdog tripped, workers
# paused with nothing to spill); fewer, larger workers then
ROOMY_WORKER = 640 * 2**20



# parsing a CSV window costs several × its bytes (arrow buffers, pandas frames, concat, encode)
PARSE_FACTOR = 6.0


# keep a window's peak under dask's "target" fraction so workers neither spill nor pause
WORKER_TARGET = 0.6


MAX_BLOCKSIZE = 64 * 2**20


# the shipped daskfeed.* defaults; the entry points pass the configured values
TRAINER_RESERVE = int(parse_bytes(config.shipped("trainer-reserve")))


WINDOW_BYTES = int(parse_bytes(config.shipped("window-bytes")))


def parse_memory_limit(text: str | int | float) -> int:
    """Parse ``"14GB"`` / ``"14GiB"`` / bytes into an int, refusing nonsense.

    Raises
    ------
    BudgetError
        For empty, negative, zero, unparsable values or more than this machine has.
    """
    if isinstance(text, (int, float)):
        value = int(text)
    else:
        s = str(text).strip()
        if not s:
            raise BudgetError("Expected a memory size such as '14GB' or '14GiB'. Received: ''.")
        try:
            value = int(parse_bytes(s))
        except (ValueError, TypeError) as err:
            raise BudgetError(
                f"Expected a memory size such as '14GB' or '14GiB'. Received: {s!r}.\n"
                "Hint: units are B, kB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024)."
            ) from err
    if value <= 0:
        raise BudgetError(f"Expected a positive memory size. Received: {text!r}.")
    import psutil

    physical = psutil.virtual_memory().total
    if value > physical:
        raise BudgetError(
            f"Expected a memory limit this machine can honour. Received: {text!r} "
            f"({format_bytes(value)}) but it has {format_bytes(physical)} of RAM.\n"
            f"Hint: pass at most {physical / 1e9:.0f}GB."
        )
    return value


@dataclass(frozen=True)
class Budget:
    """How one memory budget is split across the process tree."""

    total: int
    trainer: int  # trainer process: Python + TF + model + prefetched windows
    prefetch: int  # encoded bytes the trainer keeps ready or in flight
    nworkers: int
    nthreads: int
    worker: int  # memory_limit of each worker (dask's spill/pause/terminate apply)
    window_bytes: int  # CSV bytes whose rows are shuffled together in one task
    blocksize: int  # CSV bytes per block

    @classmethod
    def split(
        cls,
        total: int | str,
        *,
        nworkers: int | None = None,
        nthreads: int = 1,
        trainer_reserve: int = TRAINER_RESERVE,
        worker_reserve: int = 0,
        window_bytes: int = WINDOW_BYTES,
        max_blocksize: int = MAX_BLOCKSIZE,
    ) -> Budget:
        """Split ``total`` bytes; refuse (with the minimum) a budget too small to work.

        Parameters
        ----------
        total
            The whole process tree's budget, e.g. ``"14GB"`` or bytes.
        nworkers, nthreads
            The local cluster's shape (None: :func:`default_nworkers`, fewer while each would
            get less than ``ROOMY_WORKER``).
        trainer_reserve
            Bytes kept for the trainer before prefetch (``daskfeed.trainer-reserve``).
        worker_reserve
            Bytes each worker needs beyond its minimum (a model it loads).
        window_bytes, max_blocksize
            ``daskfeed.window-bytes`` and ``daskfeed.blocksize``: caps of the derived sizes.

        Returns
        -------
        Budget
            The split.

        Raises
        ------
        BudgetError
            For a budget too small for the trainer and the workers (with the minimum).
        """
        total = parse_memory_limit(total)
        if not nworkers:  # not asked for: as many as the cores, while each keeps room to work
            nworkers = default_nworkers()
            room = total - int(trainer_reserve) - int(min(max(0.1 * total, 32 * 2**20), 2**30))
            while nworkers > 1 and room // nworkers < ROOMY_WORKER + worker_reserve:
                nworkers -= 1
        if nworkers < 1 or nthreads < 1:
            raise BudgetError(
                f"Expected at least one worker and one thread. Received: nworkers={nworkers}, "
                f"nthreads={nthreads}."
            )
        base = int(trainer_reserve)
        least = MIN_WORKER + worker_reserve  # each worker's minimum
        minimum = base + 32 * 2**20 + nworkers * least
        if total < minimum:
            # the hint fits the shape asked for: fewer workers only when there are several and
            # fewer would fit this budget
            fit = min(nworkers - 1, (total - base - 32 * 2**20) // least)
            fewer = f", or lower --nworkers to {fit}" if fit >= 1 else ""
            raise BudgetError(
                f"A memory limit of {format_bytes(total)} is too small for a trainer and "
                f"{nworkers} worker(s). Expected at least {format_bytes(minimum)} "
                f"({minimum / 1e9:.2f}GB): trainer {format_bytes(base)} + "
                f"{nworkers} × {format_bytes(least)} per worker.\n"
                f"Hint: raise --memory-limit to {-(-minimum // 10**8) / 10:.1f}GB or more{fewer}."
            )
        prefetch = int(min(max(0.1 * total, 32 * 2**20), 2**30))
        worker = (total - base - prefetch) // nworkers
        if worker < least:  # small budgets: give workers their minimum first
            worker = least
            prefetch = total - base - nworkers * worker
        # The shuffle window is part of the epoch plan, so it must not change with --nworkers:
        # size it for max(nworkers, 4) workers sharing the budget (smaller only beyond 4).
        window, blocksize = _window_and_block((total - base - prefetch) / max(nworkers, 4), nthreads,
                                              window_bytes, max_blocksize)
        return cls(total, base + prefetch, prefetch, nworkers, nthreads, worker, window, blocksize)

    @classmethod
    def remote(cls, trainer: int | str, client: Client, *, timeout: float = 60,
               window_bytes: int = WINDOW_BYTES, max_blocksize: int = MAX_BLOCKSIZE) -> Budget:
        """Budget for a running cluster: ``trainer`` bytes here, workers as they are configured.

        Waits (up to ``timeout`` s) for at least one worker; window size follows from the
        smallest worker ``memory_limit`` and the most threads per worker.
        """
        total = parse_memory_limit(trainer)
        try:
            client.wait_for_workers(1, timeout=timeout)
        except (TimeoutError, OSError) as err:
            raise DaskfeedError(
                f"The scheduler at {getattr(client.scheduler, 'address', '?')} has no workers "
                f"after {timeout:g}s.\n"
                "Hint: start workers with 'dask worker <scheduler address>' (see deploy/)."
            ) from err
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        limits = [w.get("memory_limit") or 0 for w in workers]
        worker = min((m for m in limits if m), default=4 * 2**30)
        nthreads = max((w.get("nthreads") or 1 for w in workers), default=1)
        prefetch = int(min(max(0.25 * total, 32 * 2**20), 2**30))
        window, blocksize = _window_and_block(worker, nthreads, window_bytes, max_blocksize)
        return cls(total, total, prefetch, len(limits), nthreads, worker, window, blocksize)

    def stream_share(self) -> int:
        """Prefetch bytes of the training stream: two thirds of the allowance."""
        return self.prefetch * 2 // 3

    def validation_share(self) -> int:
        """Prefetch bytes of the validation stream: the third the training stream leaves."""
        return self.prefetch // 3

    def describe(self, text: str | None = None) -> str:
        """E.g. ``14GB (13.04 GiB): trainer 2.40 GB, 2 workers × 5.80 GB, ...``."""
        shown = text or f"{self.total / 1e9:g}GB"
        return (
            f"{shown} = {self.total / 1e9:.2f} GB ({self.total / 2**30:.2f} GiB): "
            f"trainer {self.trainer / 1e9:.2f} GB (incl. prefetch {self.prefetch / 1e9:.2f} GB), "
            f"{self.nworkers} worker{'s' if self.nworkers > 1 else ''} × "
            f"{self.worker / 1e9:.2f} GB ({self.nthreads} thread{'s' if self.nthreads > 1 else ''}"
            f" each); blocks of {format_bytes(self.blocksize)}, shuffle windows of "
            f"{format_bytes(self.window_bytes)} CSV"
        )


@dataclass(frozen=True)
class WorkerMemory:
    """One worker's memory limit, threads, and the fraction at which its nanny restarts it."""

    address: str
    name: str
    limit: int  # bytes; 0: no limit
    nthreads: int
    terminate: float  # distributed.worker.memory.terminate on that worker (1.0: off)

    @property
    def usable(self) -> float:
        """Bytes the worker may hold before its nanny restarts it (inf without a limit)."""
        return self.limit * self.terminate if self.limit else float("inf")


def worker_memory(client: Client) -> list[WorkerMemory]:
    """Memory limit, threads and restart fraction of every worker of ``client``'s cluster."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    try:  # each worker's own setting (its config, its environment)
        fractions = client.run(_terminate_fraction)
    except Exception:
        fractions = {}
    out = []
    for address, w in sorted(info.items()):
        frac = fractions.get(address, 0.95)
        out.append(WorkerMemory(address, str(w.get("name", address)), int(w.get("memory_limit") or 0),
                                int(w.get("nthreads") or 1), float(frac) if frac else 1.0))
    return out


def _terminate_fraction() -> float:
    """On a worker: the fraction of its memory limit at which the nanny restarts it."""
    import dask.config

    return float(dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0)


def check_worker_memory(client: Client, window_bytes: int, *, what: str = "shuffle window") -> None:
    """Refuse workers whose memory limit cannot hold the parse peak of the planned window.

    Parsing a window of ``window_bytes`` CSV bytes peaks at about 6 times that on the worker,
    once per thread (each thread may parse a window). A worker whose peak would pass the
    fraction of its limit at which its nanny restarts it (``distributed.worker.memory.terminate``,
    95 %) would die in the first epoch; this says so before anything is trained.

    Raises
    ------
    BudgetError
        Naming the first worker too small (address and name), its limit, the window's size
        and the memory the window needs, with the limit to start workers with.
    """
    need = int(PARSE_FACTOR * window_bytes)
    small = [w for w in worker_memory(client) if need * w.nthreads > w.usable]
    if not small:
        return
    w = small[0]
    want = -(-need * w.nthreads / w.terminate // 10**8) / 10  # GB, rounded up to 0.1
    others = f" ({len(small) - 1} other worker(s) too)" if len(small) > 1 else ""
    raise BudgetError(
        f"Expected Dask workers whose memory limit holds the planned {what} of "
        f"{format_bytes(window_bytes)} CSV: parsing it takes about {format_bytes(need)} "
        f"({PARSE_FACTOR:g} × its bytes) per thread. Received: worker {w.address} "
        f"(name {w.name!r}) with a memory limit of {format_bytes(w.limit)} ({w.limit / 1e9:.2f} GB) "
        f"and {w.nthreads} thread(s), restarted by its nanny at {w.terminate:.0%} of it, "
        f"{format_bytes(int(w.usable))}{others}.\n"
        f"Hint: start the workers with --memory-limit {want:g}GB or more (or fewer --nthreads), "
        "or use smaller blocks (--blocksize) so windows are smaller."
    )


def _window_and_block(worker_memory: float, nthreads: int, window_bytes: int,
                      max_blocksize: int) -> tuple[int, int]:
    """CSV bytes per shuffle window and per block so a window's parse peak fits a worker."""
    per_task = worker_memory * WORKER_TARGET / (PARSE_FACTOR * nthreads)
    window = int(max(min(per_task, window_bytes * 4), 4 * 2**20))
    return window, int(min(MAX_BLOCKSIZE, max_blocksize, window))


def default_nworkers() -> int:
    """One single-threaded worker per core, at most 4, at least 1."""
    return max(1, min(4, os.cpu_count() or 1))


def default_memory_limit() -> int:
    """75 % of this machine's RAM."""
    import psutil

    return int(psutil.virtual_memory().total * 0.75)
