"""Keras loads in a thread while the cluster starts, once the data name what the settings ask."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from daskfeed.core import choose
from daskfeed.reading import Listing, first_header
from daskfeed.training._deferred import keras_imported

if TYPE_CHECKING:
    from daskfeed.checkpoint import Checkpoint
    from daskfeed.scanning import ProgressCallback
    from daskfeed.training._options import TrainOptions

_PEEK_BLOCKSIZE = 16 * 2**20  # (for a header, it only sets how long a quoted name may run)


class KerasLoad:
    """Import keras (and TensorFlow, JAX or PyTorch) in a thread while the cluster starts.

    Loading TensorFlow takes seconds of the trainer's time (5-9 s on 2 cores), as long as
    starting a local cluster, and more than a reused scan of 20,000 files; done one after the
    other they were most of a rerun's start. The thread starts as soon as the data are known to
    have what the settings name, so that a mistake there is still said with no keras loaded:

    - a new run: once a file's header (read in a thread of its own, of the first file a local
      glob meets while the listing goes on, :meth:`ahead`) names the label, the features and
      the weight asked for;
    - a resumed run: at once when its label and features are its checkpoint's (checked by the
      run that wrote it);
    - otherwise (a header that does not name them, one that cannot be read, a DataFrame): at
      the scan's first progress report, as its tasks are submitted, once the scan checked them.

    Started, it waits for :meth:`allow`: the cluster's start calls it once the trainer's own
    share of that start is done, as the workers' processes start
    (:meth:`~daskfeed.cluster.ClusterSpec.open`'s ``spawning``). Before, keras' import and the
    scheduler's own imports (its dashboard's) shared the interpreter's lock, and the workers'
    start waited on both: in ``daskfeed train`` of 2,000 files on 2 cores the second core idled
    until ~5 s, where the cluster alone was up at ~2 s.

    While keras loads, the process's stderr passes through a pipe that drops TensorFlow's
    load-time lines (:func:`daskfeed.core.native_logs_filtered`); a cluster process started
    meanwhile keeps the pipe as its stderr, its lines forwarded for as long as it lives. The
    main thread's own import of keras waits for this one (Python's lock on a module being
    imported) instead of loading keras again; the optional packages keras would import for
    functions ``train`` never calls are put off until something calls them
    (:func:`~daskfeed.training._deferred.keras_imported`); if this one failed, that import
    fails the same way and says why. ``train`` joins the thread on its way out (and no load
    starts after), so that an error found meanwhile is said on the process's own stderr.
    """

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.peeking: threading.Thread | None = None  # reading a file's header
        self._lock = threading.Lock()
        self._closed = False
        self._allowed = False  # the cluster's start no longer needs the interpreter (allow)
        self._go = threading.Event()  # allowed, or joined: a started load waits for it

    def ahead(self, label: str, opts: TrainOptions, listing: Listing | None,
              ckpt: Checkpoint | None) -> None:
        """Start loading now, or once a file's header names what the settings name."""
        named = {label, *(opts.data.features or ()), *([opts.data.weight] if opts.data.weight else [])}
        if ckpt is not None:
            cur = ckpt.cursor
            if cur.label == label and set(opts.data.features or ()) <= set(cur.features):
                self.start()
            return
        if listing is None:  # (a DataFrame: its columns are checked by the scan)
            return
        read = replace(opts.data.read, blocksize=opts.data.asked_blocksize or _PEEK_BLOCKSIZE)

        def peek() -> None:
            try:
                header = first_header(listing.glimpse(), read)
            except Exception:  # (said by the scan, before keras loads)
                return
            if named <= set(header):
                self.start()

        self.peeking = threading.Thread(target=peek, daemon=True, name="daskfeed-header-peek")
        self.peeking.start()

    def once_scanning(self, progress: ProgressCallback) -> ProgressCallback:
        """``progress`` (a scan's callback), starting the thread at its first call."""

        def report(rows: int, done: int, total: int, seconds: float, finished: bool) -> None:
            self.start()
            progress(rows, done, total, seconds, finished)

        return report

    def start(self) -> None:
        """Start loading (once; not after :meth:`join`)."""
        with self._lock:
            if self.thread is None and not self._closed:
                self.thread = threading.Thread(target=self._load, daemon=True,
                                               name="daskfeed-keras-load")
                self.thread.start()

    def allow(self) -> None:
        """Let the load begin (now, or once started): the cluster's start has done its share here."""
        with self._lock:
            self._allowed = True
        self._go.set()

    def join(self) -> None:
        """Wait until keras is loaded (at once if never started or never allowed); none starts after."""
        with self._lock:
            self._closed = True
        self._go.set()  # (a load never allowed does not begin)
        if self.thread is not None:
            self.thread.join()

    def _load(self) -> None:
        self._go.wait()
        with self._lock:
            if not self._allowed:  # joined before it was allowed: the run ends without keras
                return
        try:
            keras_imported(_import_keras, choose())
        except Exception:  # (said by the main thread's import, which fails the same way)
            pass


def _import_keras() -> None:
    from daskfeed.adapters import keras  # noqa: F401
