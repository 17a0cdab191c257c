"""Cluster: the one place that starts a LocalCluster or connects to a scheduler.

The cluster is started in a memory budget for the WHOLE process tree (:mod:`daskfeed.cluster._budget`
splits it); this module starts, reaches, owns and closes it, and sets its workers up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from daskfeed.cluster._budget import (
    MAX_BLOCKSIZE,
    TRAINER_RESERVE,
    WINDOW_BYTES,
    Budget,
    default_memory_limit,
    parse_memory_limit,
)
from daskfeed.cluster._remote import connect, refuse_plaintext_credentials
from daskfeed.core import ClusterError, SettingError, config

if TYPE_CHECKING:
    from distributed import Client, LocalCluster, Security, Worker

logger = logging.getLogger(__name__)


def start_local_cluster(
    budget: Budget | None = None,
    *,
    dashboard_address: str | None = None,
    processes: bool = True,
    host: str = "127.0.0.1",
    tls: bool | None = None,
    spawning: Callable[[], None] | None = None,
) -> Client:
    """Start a LocalCluster on loopback inside ``budget`` and return a Client owning it.

    Closing the client (``client.close()``) also closes the cluster. With ``tls`` (None:
    ``daskfeed.local-tls``, true as shipped) the scheduler, nannies and workers speak TLS with
    credentials made here, in memory (see ``docs/security.md``, "The local cluster"): a client
    that does not hold them is refused. The dashboard (and ``/metrics``, daskfeed's page) stays
    HTTP on loopback. ``spawning`` is called once this process's own share of the start is done
    (its TLS credentials made, the scheduler's dashboard imported), as the workers' processes
    start.
    """
    from distributed import Client, LocalCluster

    if tls is None:
        tls = config.local_tls()
    if dashboard_address is None:
        dashboard_address = config.dashboard_address()
    if dashboard_address:  # the port asked for (8787) when free, else distributed binds port 0
        dhost, _, dport = str(dashboard_address).rpartition(":")
        dashboard_address = f"{dhost or host}:{dport or 8787}"
    import tempfile

    # workers spill here: private to this user (0700), removed with the cluster
    spill = tempfile.mkdtemp(prefix="daskfeed-spill-")
    os.chmod(spill, 0o700)
    kwargs: dict[str, Any] = {
        "local_directory": spill,
        "host": host,
        # said, not inferred: without processes distributed infers inproc://, which refuses a host
        "protocol": "tls://" if tls else "tcp://",
        "processes": processes,
        "dashboard_address": dashboard_address or None,
        # task errors are re-raised in the trainer with file/partition named; don't log twice
        "silence_logs": logging.CRITICAL,
    }
    if processes:  # Ctrl-C in a terminal reaches the workers too, and priority: see dask_setup
        worker_nice()  # a bad value is refused here, not in each worker
        kwargs["preload"] = ["daskfeed.cluster._start"]
        # pyarrow's default pool (mimalloc) keeps what it freed in the worker's RSS: at a small
        # budget (2GB: workers of 384 MiB) a worker stayed paused at 320 MiB for good with
        # nothing allocated; glibc's malloc gives it back (the nanny sets its trim threshold)
        kwargs["env"] = {"ARROW_DEFAULT_MEMORY_POOL":
                         os.environ.get("ARROW_DEFAULT_MEMORY_POOL", "system")}
    else:  # the workers run in this process: their close is quiet here (see _quiet)
        from daskfeed.cluster import _quiet

        _quiet.install()
    if tls:
        kwargs["security"] = local_security()
    _scheduler_imports(bool(dashboard_address))
    if spawning is not None:
        spawning()
    if budget is not None:
        # workers in this process measure this process's memory, the caller's (Python, Keras,
        # a model) with theirs: the tree is this one process, so each one's limit is the whole
        # budget; a worker's share of it paused them for good under a caller holding more
        kwargs.update(n_workers=budget.nworkers, threads_per_worker=budget.nthreads,
                      memory_limit=budget.worker if processes else budget.total)
    # one start at a time: another's restore must not unset what this one's nannies just set;
    # "Port 8787 is already in use" is not warned: the new port is printed
    with _STARTING, warnings.catch_warnings(), _worker_settings(processes):
        warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
        environ = _spawn_environ()
        try:
            cluster = LocalCluster(**kwargs)
        finally:
            _restore_environ(environ)
    client = Client(cluster, set_as_default=False)
    _OWNED[client] = _Owned(cluster, spill, environ)
    return client


_STARTING = threading.Lock()


def _scheduler_imports(dashboard: bool) -> None:
    """Import here what the scheduler imports as it starts: its dashboard's modules.

    The scheduler is made in this process's event loop before a worker's process is started,
    and its dashboard's import (bokeh's models: about a second of this interpreter) ran there
    while another thread of this process ran Python too: keras' import, 4-5 s of the
    interpreter's lock, which ``daskfeed train`` starts meanwhile. The two shared one core,
    and the workers waited for both: on 2 cores the second core idled until ~5 s into
    ``daskfeed train`` (a run whose cluster was up at ~2 s alone). Imported here first, the
    scheduler finds them loaded and starts the workers at once; the caller's ``spawning`` runs
    after this. A dashboard that cannot be imported is left to the scheduler, which then serves
    without it, as it would.
    """
    if dashboard:
        with contextlib.suppress(ImportError):
            import distributed.dashboard.scheduler  # noqa: F401


@contextlib.contextmanager
def _worker_settings(processes: bool) -> Iterator[None]:
    """Distributed's settings for the workers started here, where the user's config leaves them.

    - **One malloc arena from the start** (``MALLOC_ARENA_MAX=1``, worker processes; see
      :mod:`daskfeed.cluster._heap`). Set by ``mallopt`` in their preload it came too late for
      an arena that a thread of the worker made before it: glibc hands such an arena to the next
      task thread, and a thread's own arena is made of 64 MiB heaps, so a block's buffers were
      mapped and faulted in anew for every task (a CI run: 16,385 faults of 16,384 pages for a
      second 64 MiB task). The C library reads the variable when the process starts, so it
      goes in the nanny's ``pre-spawn-environ``; a value the user's config gives there stays.
    - **The dashboard's profile sampled every** :data:`PROFILE_INTERVAL` (distributed samples
      every worker thread's stack every 10 ms): an idle worker spent 0.52 s of CPU in 10 s,
      0.25 s at 100 ms, on the cores the trainer trains on. The Profile page keeps its data,
      coarser; an interval the user's config sets (other than distributed's 10 ms) stays.
    """
    import dask

    settings: dict[str, Any] = {}
    spawn = dask.config.get("distributed.nanny.pre-spawn-environ", None) or {}
    if processes and spawn.get("MALLOC_ARENA_MAX") is None:
        settings["distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX"] = 1
    if dask.config.get("distributed.worker.profile.interval", None) == "10ms":
        settings["distributed.worker.profile.interval"] = PROFILE_INTERVAL
    with dask.config.set(settings):
        yield


PROFILE_INTERVAL = "100ms"  # the local workers' profile sampling (distributed's default: 10 ms)


def _spawn_environ() -> dict[str, str | None]:
    """The values, in this process, of what distributed's nannies set in it before they spawn.

    A nanny sets ``distributed.nanny.pre-spawn-environ`` (``OMP_NUM_THREADS=1``,
    ``MKL_NUM_THREADS=1``, ``MALLOC_TRIM_THRESHOLD_``, ...) and ``PYTHONHASHSEED`` in the
    ``os.environ`` of the process that starts it, for its worker process to inherit: torch
    imported afterwards here (a model on the torch backend) would take one thread.
    """
    import dask

    names = {*(dask.config.get("distributed.nanny.pre-spawn-environ", None) or {}),
             "PYTHONHASHSEED"}
    return {name: os.environ.get(name) for name in names}


def _restore_environ(environ: Mapping[str, str | None]) -> None:
    """Put back this process's values (:func:`_spawn_environ`): the workers keep theirs."""
    for name, value in environ.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def local_security() -> Security:
    """Credentials for one local cluster: a key and a self-signed certificate, in memory only.

    distributed's ``Security.temporary()``: every role (scheduler, worker, client) holds the
    same certificate, which is also the one CA trusted, and encryption is required, so a peer
    is accepted only if it holds this key. The key lives in memory: distributed writes it to a
    private temporary directory (0700) only while OpenSSL loads it into a TLS context, and the
    cluster's worker processes receive it from their nanny, never from a file.

    Returns
    -------
    distributed.Security

    Raises
    ------
    ClusterError
        Without the ``cryptography`` package, which makes them.
    """
    from distributed import Security

    try:
        made: Security = Security.temporary()
        return made
    except ImportError as err:
        raise ClusterError(
            "Expected the cryptography package, which makes the local cluster's TLS "
            f"credentials. Received: {err}.\nHint: pip install cryptography (a dependency of "
            "daskfeed), or set daskfeed.local-tls: false (DASK_DASKFEED__LOCAL_TLS=false) for a "
            "plain tcp:// cluster that any user of this machine can connect to.") from err


@dataclass(frozen=True)
class _Owned:
    """What a client from :func:`start_local_cluster` owns: its cluster and spill directory."""

    cluster: LocalCluster
    spill: str
    environ: Mapping[str, str | None] = field(default_factory=dict)  # this process's, before


# the clients start_local_cluster made, and what close_client closes with them (weak: a client
# collected without close leaves its cluster to distributed's own finalizers)
_OWNED: weakref.WeakKeyDictionary[Client, _Owned] = weakref.WeakKeyDictionary()


def owned_environ(client: Client) -> Mapping[str, str | None] | None:
    """The environment :func:`start_local_cluster` found here before it made ``client``'s cluster.

    The values of what its nannies set here (:func:`_spawn_environ`); None for a client it did
    not make.
    """
    owned = _OWNED.get(client)
    return owned.environ if owned else None


def spill_directory(client: Client) -> str | None:
    """The directory where the workers of a cluster :func:`start_local_cluster` made spill."""
    owned = _OWNED.get(client)
    return owned.spill if owned else None




_Spec = TypeVar("_Spec", bound="ClusterSpec")


@dataclass(frozen=True)
class ClusterSpec:
    """Where work runs and within which memory: one description for train, predict and scan.

    Attributes
    ----------
    memory_limit
        Budget of the whole process tree, e.g. ``"14GB"`` (None: 75 % of RAM), as given: its
        spelling is what the summary line shows.
    total
        ``memory_limit`` in bytes, parsed once as the spec is made (75 % of RAM when None).
    nworkers, nthreads, processes
        The local cluster's shape (ignored with ``scheduler``).
    dashboard_address
        Where a local cluster's dashboard listens (resolved: ``daskfeed.dashboard-address``).
    local_tls
        Whether a local cluster speaks TLS with credentials of its own, refusing clients
        without them (resolved: ``daskfeed.local-tls``, true as shipped).
    scheduler
        Address or scheduler file of a running cluster; None: a LocalCluster on 127.0.0.1.
    security
        A ``distributed.Security`` for a ``tls://`` scheduler.
    trainer_reserve, window_bytes, max_blocksize
        What the budget keeps for the calling process and the caps of the window and block
        sizes it derives (resolved: ``daskfeed.trainer-reserve``, ``window-bytes``,
        ``blocksize``).
    """

    memory_limit: str | int | None = None
    total: int = field(init=False, default=0)
    nworkers: int | None = None
    nthreads: int = 1
    processes: bool = True
    dashboard_address: str | None = None
    local_tls: bool = True
    scheduler: str | None = None
    security: Security | None = field(default=None, repr=False)
    trainer_reserve: int = TRAINER_RESERVE
    window_bytes: int = WINDOW_BYTES
    max_blocksize: int = MAX_BLOCKSIZE

    @classmethod
    def resolve(cls: type[_Spec], **settings: Any) -> _Spec:
        """These settings, the ``daskfeed.*`` config filled in where not given (the one place).

        Parameters
        ----------
        **settings
            The attributes, by name (a subclass's too).

        Returns
        -------
        ClusterSpec
            The resolved settings (of the class it is called on).

        Raises
        ------
        BudgetError
            For a ``memory_limit`` that is not a size (``"14GB"``) or exceeds the machine.
        """
        settings["dashboard_address"] = config.dashboard_address(settings.get("dashboard_address"))
        settings["local_tls"] = config.local_tls(settings.get("local_tls"))
        settings["trainer_reserve"] = config.trainer_reserve(settings.get("trainer_reserve"))
        settings["window_bytes"] = config.window_bytes(settings.get("window_bytes"))
        settings["max_blocksize"] = config.blocksize(settings.get("max_blocksize"))
        return cls(**settings)

    def __post_init__(self) -> None:
        given = self.memory_limit
        object.__setattr__(self, "total", parse_memory_limit(given) if given is not None
                           else default_memory_limit())

    def open(self, echo: Callable[[str], None] = print, *, trainer_reserve: int | None = None,
             worker_reserve: int = 0, nworkers: int | None = None,
             storage_options: Mapping[str, Any] | None = None,
             spawning: Callable[[], None] | None = None) -> tuple[Client, Budget]:
        """A client and the budget it works in: a LocalCluster inside ``memory_limit``, or ``scheduler``.

        ``memory_limit`` (default 75 % of RAM) is the whole process tree's budget for a local
        cluster, the trainer's own for a running scheduler. ``trainer_reserve`` (default: the
        spec's) and ``worker_reserve`` as for :meth:`Budget.split`, ``nworkers`` the caller's
        own (default: the spec's); ``storage_options``: what the work will carry to the workers
        (credentials in it are refused for a scheduler on another host over plain ``tcp://``,
        :func:`connect`). Says what it made through ``echo``. ``spawning``: called once this
        process's share of a local cluster's start is done, as its workers start
        (:func:`start_local_cluster`); before connecting to a ``scheduler``.

        Returns
        -------
        tuple
            The client and the budget it works in.
        """
        shown = self.memory_limit if isinstance(self.memory_limit, str) else None
        limit = self.total
        if not self.scheduler:
            budget = Budget.split(
                limit, nworkers=self.nworkers if nworkers is None else nworkers,
                nthreads=self.nthreads,
                trainer_reserve=self.trainer_reserve if trainer_reserve is None else trainer_reserve,
                worker_reserve=worker_reserve, window_bytes=self.window_bytes,
                max_blocksize=self.max_blocksize)
            echo(f"memory limit: {budget.describe(shown)}")
            return start_local_cluster(budget, dashboard_address=self.dashboard_address,
                                       processes=self.processes, tls=self.local_tls,
                                       spawning=spawning), budget
        if spawning is not None:
            spawning()
        client = connect(self.scheduler, security=self.security, storage_options=storage_options)
        quiet_close(client)
        try:
            budget = Budget.remote(limit, client, window_bytes=self.window_bytes,
                                   max_blocksize=self.max_blocksize)
        except BaseException:
            close_client(client)
            raise
        echo(f"connected to {getattr(client.scheduler, 'address', self.scheduler)}: "
             f"{budget.nworkers} workers × {budget.worker / 1e9:.2f} GB ({budget.nthreads} "
             f"threads); memory limit of this trainer process "
             f"{shown or f'{budget.total / 1e9:.2f}GB'}: prefetch {budget.prefetch / 1e9:.2f} GB, "
             f"shuffle windows of {budget.window_bytes / 2**20:.0f} MiB CSV")
        return client, budget


def dask_setup(worker: Worker) -> None:
    """Worker preload of the local cluster's workers: Ctrl-C and, first, the CPU are the trainer's.

    A terminal sends SIGINT to the whole process group; the trainer then unwinds and closes the
    cluster, which stops its workers. Ignoring SIGINT in the workers keeps them from dying
    mid-task (and the nannies from restarting them) and from printing tracebacks.

    The workers run ``daskfeed.worker-nice`` (default 10) lower than the trainer: on cores both
    want, TensorFlow's threads run first, and the workers read ahead in what it leaves idle (a
    trainer that waits for data leaves them every core). Steady epochs on 2 cores: +5.8 %.
    Their close logs no traceback for a heartbeat it cut off (:mod:`daskfeed.cluster._quiet`).
    """
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    lower_priority(worker_nice())
    from daskfeed.cluster import _heap, _quiet

    _heap.serve_from_heap(worker.memory_manager.memory_limit)

    _quiet.install()  # no traceback for a heartbeat the worker's own close cut off
    # what the first scan task imports (pyarrow.csv, pandas, ...), while the trainer lists files
    threading.Thread(target=_warm_imports, daemon=True, name="daskfeed-imports").start()


def _warm_imports() -> None:
    import importlib

    for name in ("daskfeed.batches._read", "daskfeed.scanning._task"):
        with contextlib.suppress(Exception):  # a task that needs it imports it again, or says why
            importlib.import_module(name)


def worker_nice() -> int:
    """``daskfeed.worker-nice``: how much lower than the trainer the local workers run (0 .. 19).

    Raises
    ------
    SettingError
        Not a whole number from 0 to 19 (a ``ValueError``).
    """
    value = config.get("worker-nice")
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit() \
            or int(value) > 19:
        raise SettingError(f"Expected daskfeed.worker-nice to be a whole number from 0 to 19. "
                         f"Received: {value!r}.\nHint: 10 (the default) runs the workers below the "
                         "trainer; 0 runs them at its priority.")
    return int(value)


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by ``nice`` (Unix), every thread it has and will have.

    Linux keeps a nice value per thread (new threads take their creator's): each thread that
    exists is lowered, the calling one too. Where that cannot be done, nothing changes.
    """
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]  # the calling thread (or the process, off Linux)
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))


def close_client(client: Client) -> None:
    """Close a client and, if it owns one, its LocalCluster."""
    owned = _OWNED.pop(client, None)
    with contextlib.suppress(Exception):
        client.close()
    if owned is not None:
        with contextlib.suppress(Exception):
            owned.cluster.close()
        import shutil

        shutil.rmtree(owned.spill, ignore_errors=True)


def acquire_client(client: Client | str | None = None,
                   storage_options: Mapping[str, Any] | None = None) -> tuple[Client, bool]:
    """Resolve ``client`` → ``(Client, owned)``.

    A Client is used as is; an address string connects; ``None`` takes the current default
    client, else starts a LocalCluster that the caller owns (and must close). Credentials in
    ``storage_options`` (what the work will carry) are refused for a scheduler on another host
    over plain ``tcp://``, unless ``daskfeed.allow-plaintext-credentials: true`` (see
    ``docs/security.md``, "Remote clusters: yours to protect").
    """
    if client is not None and not isinstance(client, str):
        refuse_plaintext_credentials(_address(client), storage_options)
        return quiet_close(client), False
    if isinstance(client, str):
        return quiet_close(connect(client, storage_options=storage_options)), True
    from distributed import get_client

    try:
        default = get_client()
    except ValueError:
        default = None
    if default is not None:
        refuse_plaintext_credentials(_address(default), storage_options)
        return quiet_close(default), False
    logger.info("daskfeed: no Dask client found; starting a LocalCluster on 127.0.0.1")
    return start_local_cluster(), True


def open_in_budget(memory_limit: int | str, client: Client | str | None = None,
                   nworkers: int | None = None) -> tuple[Client, bool, Budget]:
    """A client for one data set served in this process, and the budget it is served in.

    What :class:`~daskfeed.DaskSequence` and :class:`~daskfeed.TorchDataset` do with a
    ``memory_limit``: without ``client``, the whole process tree's budget, split as
    ``daskfeed train`` splits it (:meth:`ClusterSpec.open`: a LocalCluster of ``nworkers``
    started in it, the ``daskfeed.*`` config as train has it); with a ``client`` (or an
    address), this process's own budget, the windows sized from its workers
    (:meth:`Budget.remote`).

    Parameters
    ----------
    memory_limit
        The budget, e.g. ``"4GB"`` or bytes.
    client
        A ``distributed.Client`` or scheduler address; None: a LocalCluster started here.
    nworkers
        Workers of that LocalCluster (None: from the CPUs and the budget).

    Returns
    -------
    tuple
        The client, whether the caller owns it (must close it: :func:`close_client`), and the
        budget.

    Raises
    ------
    BudgetError
        A budget that is no memory size, more than this machine has, or too small.
    """
    if client is not None:
        given, owned = acquire_client(client)  # (an address: a connection of its own)
        try:
            return given, owned, Budget.remote(memory_limit, given)
        except BaseException:
            if owned:
                close_client(given)
            raise
    spec: ClusterSpec = ClusterSpec.resolve(memory_limit=memory_limit, nworkers=nworkers)
    started, budget = spec.open(echo=lambda _line: None)  # the daskfeed.* config as train has it
    return started, True, budget


def _address(client: Client) -> str:
    """The scheduler address of ``client`` ("" where it has none: closed, not yet started)."""
    return str(getattr(getattr(client, "scheduler", None), "address", "") or "")


# the clients whose workers quiet_close set up (weak: one registration per client, not per use)
_QUIETED: weakref.WeakSet[Client] = weakref.WeakSet()


def quiet_close(client: Client) -> Client:
    """Set up the workers of ``client``'s cluster to close without a heartbeat's traceback.

    A worker plugin (:class:`daskfeed.cluster._quiet.QuietClose`, for the workers that join later
    too) drops the one record distributed logs when a worker's own close cuts off its heartbeat
    in flight: the traceback a healthy script printed at exit on a busy machine. Once per
    client; where it cannot be registered (an asynchronous client, an old scheduler), nothing
    changes but that noise. Returns ``client``.
    """
    if client in _QUIETED or getattr(client, "asynchronous", False):
        return client
    from daskfeed.cluster._quiet import QuietClose

    try:
        client.register_plugin(QuietClose())
    except Exception as err:  # only the noise at close is at stake: never fail the caller for it
        logger.debug("daskfeed: worker plugin %s not registered: %r", QuietClose.name, err)
    else:
        _QUIETED.add(client)
    return client


@contextlib.contextmanager
def client_context(client: Client | str | None = None,
                   storage_options: Mapping[str, Any] | None = None) -> Iterator[Client]:
    """Like :func:`acquire_client`, closing what it started on exit."""
    c, owned = acquire_client(client, storage_options)
    try:
        yield c
    finally:
        if owned:
            close_client(c)
