"""Hand-off by chunk: the sequence as a ``tf.data`` pipeline with no Python in it (TensorFlow).

Keras feeds a ``PyDataset`` through ``tf.data.Dataset.from_generator``: one Python call, through
``py_function``, per batch. Any ``py_function`` in a pipeline makes each training step dearer
(about 0.9 ms of trainer CPU per step on the bench's model, even with one call per 300 batches:
measured with ``from_generator`` yielding chunks, against the same chunks read from a queue). So
:class:`TFDataHandoff` runs no Python inside TensorFlow: a producer thread of its own assembles
*chunks* of up to ``chunk`` equal batches, stacked as one array per column, and puts them in a
``tf.queue.FIFOQueue`` (two chunks at most); the dataset takes chunk after chunk from the queue
and ``unbatch`` splits them again. The batches, their order and their rows are exactly the
sequence's ``seq[0] .. seq[len(seq) - 1]``; a short last batch comes on its own.

Epochs. Keras tells a dataset nothing about epochs; it starts a new iterator each epoch, and
may start one it throws away. Each chunk carries its pass, epoch and index; a pass (one
iterator's reads) takes the chunks ``0 .. n - 1`` of its pass in order and drops any other.

- The producer serves the sequence's epochs one after the other from where the sequence stood
  when the feed was made, reading up to two chunks ahead (into the next epoch, whose windows
  are then computed while Keras ends the current one). An epoch ends for the sequence when its
  last chunk is assembled, before it is queued, so :meth:`~daskfeed.DaskSequence.stats_of` has
  its figures by the time Keras reads that chunk.
- With :meth:`TFDataHandoff.callback` in ``fit``'s callbacks (:func:`~daskfeed.training._callbacks.fit_from`
  adds it), the epoch Keras begins is served, counted from the sequence's epoch when the feed
  was made: when what is queued is not its start (a pass cut short, or read ahead and thrown
  away, as under a ``tf.distribute`` strategy), a new pass serves it again from its start.
- Without it (``model.fit(seq.to_tf_dataset())``), each pass is the next epoch; after a pass cut
  short, the next pass drops the rest of that epoch and is the epoch after it.
- A *stream* (``dataset(stream=True)``, what :func:`~daskfeed.adapters._handoff.fit_inputs` hands ``fit`` with
  ``steps_per_epoch=len(seq)``) is one pass over epoch after epoch, endless: Keras then keeps one
  iterator for the whole ``fit``. A new iterator each epoch (what Keras makes of a dataset of
  known length) made the first batch of about one steady epoch in five wait 0.3 to 1.9 s, for
  ``fit(x, y)`` from numpy too (``benchmarks/feed_pipelines.py``: 7 of 42 epochs with a bare
  queue, 4 of 21 for ``fit(x, y)``, 0 of 42 for the stream).
  Keras reads exactly ``len(seq)`` batches an epoch, so epochs and chunks stay aligned; the
  callback starts a new pass only at the first epoch of a ``fit`` when what is queued is not
  its start.

Either way every epoch Keras trains has every row once. An error of the producer (bad data, a
lost cluster, a stop request) reaches ``fit`` as a TensorFlow error holding its text, the
original kept in the sequence's ``failure``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from daskfeed.adapters._keras import keras
from daskfeed.batches import BatchStream, EpochPlan
from daskfeed.cluster import WindowCancelled
from daskfeed.core import Aborted, DaskfeedError, SettingError, handoff_name
from daskfeed.manifest import WindowData

QUEUED = 2  # chunks waiting in TensorFlow's queue, at most
_TAGS = 4  # each queued chunk: pass, epoch, index, error text; then its arrays
_ROOM_LOOK = 0.01  # seconds between looks at the queue's room for a stop's error chunk


class _Closed(Exception):
    """The feed was closed: the producer ends."""


def uses_tf_data(handoff: str) -> bool:
    """Whether the hand-off ``handoff`` (a name of ``HANDOFFS``) is a :class:`TFDataHandoff`.

    ``auto`` is ``tf-data`` on the TensorFlow backend only (JAX's and PyTorch's trainers read
    without ``tf.data``; :func:`~daskfeed.adapters._handoff.chosen_handoff` says what instead).

    Parameters
    ----------
    handoff
        The setting (``--handoff`` / ``daskfeed.handoff``; the old names ``windows`` and
        ``batches`` are understood, with a warning).

    Returns
    -------
    bool

    Raises
    ------
    SettingError
        ``handoff`` is no hand-off's name, or ``tf-data`` on a backend other than TensorFlow.
    """
    handoff = handoff_name(handoff)
    backend = keras.backend.backend()
    if handoff == "tf-data" and backend != "tensorflow":
        raise SettingError(f"Expected the TensorFlow backend with the tf-data hand-off (a tf.data "
                           f"pipeline). Received: KERAS_BACKEND={backend!r}.\nHint: --handoff "
                           "pydataset (or auto).")
    return handoff == "tf-data" or (handoff == "auto" and backend == "tensorflow")


class TFDataHandoff:
    """A :class:`~daskfeed.DaskSequence` as a ``tf.data.Dataset`` fed a chunk of batches at a time.

    Parameters
    ----------
    stream
        The batch stream (a sequence's ``seq.stream``); the feed serves its epochs from where it
        stands now (its ``epoch`` and ``start``: a feed of a resumed epoch serves that epoch
        only).
    chunk_bytes
        Encoded bytes per chunk at most (default: ``RUN_BYTES``, 8 MiB, or a sixteenth of the
        sequence's ``prefetch_bytes`` when less); at least one batch.

    Notes
    -----
    The feed owns a thread: :meth:`close` it (closing the sequence closes it too).

    Examples
    --------
    >>> feed = TFDataHandoff(seq.stream)  # doctest: +SKIP
    >>> model.fit(feed.dataset(), epochs=3, callbacks=[feed.callback()])  # doctest: +SKIP
    >>> feed.close()  # doctest: +SKIP
    """

    def __init__(self, stream: BatchStream, *, chunk_bytes: int | None = None) -> None:
        import tensorflow as tf

        self.stream = stream
        self.epoch, self.start = stream.epoch, stream.start  # where the first pass begins
        self.chunk = stream.batches_per_run(chunk_bytes)
        self._arrays = _array_specs(stream)  # (dtype, inner shape) of each array of a chunk
        self._len = len(stream)  # batches per pass
        self._chunks = len(self._bounds(stream.plan, self.start))  # per pass
        self._full = len(self._bounds(stream.plan, 0))  # per whole epoch
        self._queue = tf.queue.FIFOQueue(
            QUEUED, [tf.int64, tf.int64, tf.int64, tf.string,
                     *(tf.as_dtype(d) for d, _ in self._arrays)])
        self._pass = tf.Variable(0, dtype=tf.int64, trainable=False)  # the pass Keras reads
        self._taken = tf.Variable([-1, -1], dtype=tf.int64, trainable=False)  # its last chunk
        self._open = tf.Variable(True, trainable=False)  # False once closed: passes refuse
        self._lock = threading.Condition()
        self._request: tuple[int, int, int] | None = None  # a new pass: (pass, epoch, start)
        self._passes = 0
        self._offset: int | None = None  # sequence epoch - Keras epoch, once Keras began one
        self._stream = False  # the dataset is a stream (see dataset)
        self._began = False  # begin() was called (a stream checks only the first epoch)
        self._closed = False
        self._thread: threading.Thread | None = None
        stream.close_with(self)

    # -- what Keras is handed ----------------------------------------------------------
    def dataset(self, stream: bool = False) -> Any:
        """The ``tf.data.Dataset`` of ``len(seq)`` batches per pass (its cardinality).

        Parameters
        ----------
        stream
            One endless pass over epoch after epoch instead, for ``fit`` with
            ``steps_per_epoch=len(seq)`` (see the module docstring); not for a resumed epoch's
            feed.

        Returns
        -------
        tf.data.Dataset
            Elements ``(x, y)``, or ``(x, y, w)`` with a weight column, as ``seq[i]``.

        Raises
        ------
        ValueError
            ``stream`` for a resumed epoch's feed.
        """
        import tensorflow as tf

        if stream and self.start:
            raise ValueError(f"Expected a feed from an epoch's start for a stream. Received: "
                             f"epoch {self.epoch} from batch {self.start}.\nHint: fit a resumed "
                             "epoch alone, with dataset() (fit_from does).")
        self.stream.check_usable()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._produce, daemon=True,
                                                name="daskfeed-tf-feed")
                self._thread.start()
        take = tf.autograph.experimental.do_not_convert(self._take)  # graph ops only: no
        if stream:                                                     # AutoGraph rewrite
            self._stream = True
            ds = tf.data.Dataset.range(2**62).map(take).unbatch()
            ds = ds.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
        else:
            ds = tf.data.Dataset.range(self._chunks).map(take).unbatch()
            ds = ds.apply(tf.data.experimental.assert_cardinality(self._len))
        # no autotuning: nothing here is tuned (one map, a fixed prefetch), and its model
        # thread holds an iterator's destruction until its next look, which comes later and
        # later (fit returned 4-5 s late in about one run of three: the iterator's destructor
        # waiting for Model::OptimizeLoop, seen with gdb)
        options = tf.data.Options()
        options.autotune.enabled = False
        return ds.prefetch(self.chunk).with_options(options)

    def callback(self) -> keras.callbacks.Callback:
        """The callback telling the feed which epoch Keras begins (see the module docstring).

        Returns
        -------
        keras.callbacks.Callback
            For ``fit``'s callbacks.
        """
        return _EpochSync(self)

    def close(self) -> None:
        """End the producer (a pass still reading gets a closed queue). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        self._open.assign(False)
        self._queue.close(cancel_pending_enqueues=True)

    # -- the TensorFlow side -----------------------------------------------------------
    def _take(self, k: Any) -> tuple[Any, ...]:
        """Chunk ``k`` of the pass Keras reads (traced once by ``tf.data``; no Python runs).

        Of a stream, chunk ``k % n`` of its ``k // n``-th epoch (``n`` chunks an epoch).
        """
        import tensorflow as tf

        i = k % self._full if self._stream else k
        opened = tf.debugging.Assert(self._open, [
            "daskfeed: this feed is closed (or its DaskSequence). Expected an open one.\nHint: "
            "make a new dataset of an open DaskSequence (seq.to_tf_dataset())."])
        with tf.control_dependencies([opened]):  # checked before any dequeue
            p = self._pass.read_value()

            def other(*item: Any) -> Any:  # an earlier pass's chunk, or another index: drop it
                ok = tf.logical_and(tf.equal(item[0], p), tf.equal(item[2], i))
                return tf.logical_and(item[0] >= 0, tf.logical_not(ok))

            item = tf.while_loop(other, lambda *_: tuple(self._queue.dequeue()),
                                 tuple(self._queue.dequeue()))
        failed = tf.debugging.Assert(item[0] >= 0, [item[3]])
        with tf.control_dependencies([failed, self._taken.assign(tf.stack([item[1], item[2]]))]):
            arrays = [tf.identity(a) for a in item[_TAGS:]]
        for a, (_, inner) in zip(arrays, self._arrays, strict=True):
            a.set_shape((None, None, *inner))
        enc = self.stream.data.encoding
        n = 1 if enc.as_matrix else len(enc.columns)
        x = arrays[0] if enc.as_matrix else dict(zip([c.name for c in enc.columns], arrays[:n],
                                                     strict=True))
        return (x, *arrays[n:])

    # -- epochs ------------------------------------------------------------------------
    def begin(self, keras_epoch: int) -> None:
        """Keras begins its epoch ``keras_epoch``: serve the matching one from its start.

        Raises
        ------
        DaskfeedError
            For another epoch than a resumed epoch's feed serves.
        """
        if self._offset is None:
            self._offset = self.epoch - int(keras_epoch)
        epoch = int(keras_epoch) + self._offset
        if self.start and epoch != self.epoch:
            raise DaskfeedError(
                f"This feed serves epoch {self.epoch} from batch {self.start} (a resumed epoch) "
                f"only. Received: Keras began epoch {epoch}.\nHint: fit the resumed epoch alone, "
                "then make a new feed for the next epochs (daskfeed.training._callbacks.fit_from does both).")
        first, self._began = not self._began, True
        if self._stream and not first:
            return  # the same iterator reads on: the stream is at this epoch's start
        taken = tuple(int(v) for v in self._taken.numpy())
        if taken == (epoch - 1, self._full - 1) or (taken == (-1, -1) and epoch == self.epoch):
            return  # what comes next is this epoch's start
        with self._lock:  # a new pass: Keras drops what was queued before it
            self._passes += 1
            self._request = (self._passes, epoch, self.start if epoch == self.epoch else 0)
            self._pass.assign(self._passes)
            self._lock.notify_all()

    # -- the producer ------------------------------------------------------------------
    def _produce(self) -> None:
        """Queue the chunks of epoch after epoch, restarting where :meth:`begin` asks."""
        tag, epoch, start = 0, self.epoch, self.start
        try:
            while True:
                if self._serve(tag, epoch, start):
                    if self.start:  # a resumed epoch only: refuse any further pass
                        self._put_error(f"This feed serves epoch {self.epoch} from batch "
                                        f"{self.start} (a resumed epoch) only.")
                        self._wait_request()
                    else:
                        epoch, start = epoch + 1, 0
                with self._lock:
                    if self._request is not None:
                        (tag, epoch, start), self._request = self._request, None
        except _Closed:
            return
        except WindowCancelled:  # the sequence was closed
            if not self.stream.closed:
                self._fail(DaskfeedError("A window of the epoch being fed was cancelled. Expected "
                                         "one feed at a time over a DaskSequence.\nHint: close "
                                         "other feeds, and do not call set_epoch while fit reads."))
        except DaskfeedError as err:
            self._fail(err)
        except Aborted as err:  # the process is stopping (a signal, a stop request)
            self._abort(err)
        except Exception as err:  # a bug of ours: fit gets it as an error, never waits forever
            failure = DaskfeedError(f"The tf.data hand-off stopped on an unexpected error. Received: "
                                    f"{type(err).__name__}: {err}\nHint: fit with "
                                    "--handoff pydataset to go on, and report this.")
            failure.__cause__ = err
            self._fail(failure)

    def _serve(self, tag: int, epoch: int, start: int) -> bool:
        """Queue ``epoch``'s chunks from batch ``start``; False if a new pass was asked for first."""
        plan, pf = self.stream.open_pass(epoch, start)
        bounds = self._bounds(plan, start)
        if self._stream and len(bounds) != self._full:  # a stream counts n chunks an epoch
            raise DaskfeedError(f"Expected {self._full} chunks in every epoch of a stream. "
                                f"Received: {len(bounds)} in epoch {epoch}.\nHint: fit with "
                                "--handoff pydataset, and report this.")
        for index, (i, j) in enumerate(bounds):
            if self._request is not None:
                return False
            data = self.stream.take(plan, pf, i, j)
            if index == len(bounds) - 1:  # its figures are kept before Keras can read its end;
                self.stream.finish(plan, advance=not self.start)  # resumed: fit_from moves on
            self._put(tag, epoch, index, _stacked(data, j - i, plan.batch_rows(i)))
        return True

    def _bounds(self, plan: EpochPlan, start: int) -> list[tuple[int, int]]:
        """The chunks from batch ``start``: ``(first, end)`` batches, equal batches each."""
        out, i = [], start
        while i < plan.num_batches:
            j = min(i + self.chunk, plan.num_batches)
            if j - i > 1 and plan.batch_rows(j - 1) != plan.batch_rows(i):
                j -= 1  # the short last batch alone
            out.append((i, j))
            i = j
        return out

    def _put(self, tag: int, epoch: int, index: int, arrays: list[np.ndarray],
             error: str = "") -> None:
        """Queue one chunk (blocks while two wait); the feed closed: :class:`_Closed`."""
        import tensorflow as tf

        if self._closed:
            raise _Closed
        try:
            self._queue.enqueue((np.int64(tag), np.int64(epoch), np.int64(index), error.encode(),
                                 *arrays))
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            raise _Closed from None

    def _put_error(self, text: str) -> None:
        """Queue an error for the next pass: its ``fit`` raises with ``text``."""
        empty = [np.zeros((0, 0, *inner), dtype) for dtype, inner in self._arrays]
        self._put(-1, -1, -1, empty, error=f"daskfeed: {text}")

    def _abort(self, err: Aborted) -> None:
        """Hand a stop to ``fit``: an error chunk, queued once there is room (never blocking).

        ``fit`` may wait in the queue's dequeue inside TensorFlow, every chunk queued read: there
        a signal's Python handler never runs (it runs between bytecodes of the main thread) and
        nothing else would come, so the error chunk is what brings ``fit`` back to Python, where
        the handler raises (a stop request without a signal: ``fit`` raises the chunk's error).
        On a busy machine that is where SIGTERM found the trainer, which then waited for good.
        While the queue is full ``fit`` has chunks to read and returns to Python between steps;
        an enqueue then could block inside TensorFlow for good (``fit`` unwinding reads no more),
        so the room is looked at until the feed is closed.
        """
        import time

        while not self._closed:
            if int(self._queue.size()) < QUEUED:  # only this thread enqueues: it will not block
                try:
                    self._put_error(str(err))
                except _Closed:
                    pass
                return
            time.sleep(_ROOM_LOOK)  # the queue's room, looked at (a state, not a duration)

    def _fail(self, err: DaskfeedError) -> None:
        """Keep ``err`` for ``train`` and hand its text to whatever pass reads next."""
        self.stream.failure = err
        try:
            self._put_error(str(err))
        except _Closed:
            pass

    def _wait_request(self) -> None:
        with self._lock:
            while self._request is None:
                if self._closed:
                    raise _Closed
                self._lock.wait()


class _EpochSync(keras.callbacks.Callback):
    """Tells a :class:`TFDataHandoff` which epoch Keras begins."""

    def __init__(self, feed: TFDataHandoff) -> None:
        super().__init__()
        self.feed = feed

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras begins ``epoch``.

        Parameters
        ----------
        epoch
            Keras' epoch (0-based).
        logs
            Keras' logs (may be None).
        """
        self.feed.begin(epoch)


def _array_specs(stream: BatchStream) -> list[tuple[str, tuple[int, ...]]]:
    """The arrays of a batch in order (features, label, weight): dtype and shape past the rows."""
    enc = stream.data.encoding
    x = ([(enc.matrix_dtype, (len(enc.columns),))] if enc.as_matrix
         else [(c.dtype, ()) for c in enc.columns])
    return [*x, (enc.label_dtype, ()), *([("float32", ())] if enc.weight else [])]


def _stacked(data: WindowData, k: int, rows: int) -> list[np.ndarray]:
    """``data`` (``k * rows`` rows) as ``k`` batches stacked: each array ``(k, rows, ...)``."""
    xs = list(data.x.values()) if isinstance(data.x, dict) else [data.x]
    arrays = [*xs, data.y, *([] if data.w is None else [data.w])]
    return [a.reshape(k, rows, *a.shape[1:]) for a in arrays]
