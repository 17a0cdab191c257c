"""Hand-off by chunk: a ``tf.data`` pipeline fed many batches per Python call (TensorFlow backend).

Keras feeds a ``PyDataset`` through ``tf.data.Dataset.from_generator``: one Python call, through
``py_function``, per batch. That crossing costs the trainer more CPU per batch than anything
daskfeed does (README, "Where steady epochs stand"). :class:`WindowFeed` crosses once per
*chunk*: its generator yields up to ``chunk`` equal batches stacked as one array per column, and
``unbatch`` splits them again inside TensorFlow. The batches, their order and their rows are
exactly the sequence's ``seq[0] .. seq[len(seq) - 1]``; a short last batch comes on its own.

Epochs. Keras tells a dataset nothing about epochs; it starts a new iterator each epoch, and
may start one it throws away. One iterator's reads (a *pass*) serve one epoch from its start:

- with :meth:`WindowFeed.callback` in ``fit``'s callbacks (:func:`~daskfeed.callbacks.fit_from`
  adds it), the epoch Keras begins (``on_epoch_begin``), counted from the sequence's epoch when
  the dataset was made. The epoch ends, and the sequence moves to the next (its windows
  computed while Keras validates), when the training part of Keras' epoch is over
  (``on_test_begin`` or ``on_epoch_end``), or sooner when the pass read past its last batch;
- without it (``model.fit(seq.to_tf_dataset())``), the sequence's current epoch, or the next one
  when every batch of the current one was read: each epoch of ``fit`` is the next of the
  sequence's. (A ``tf.distribute`` strategy makes Keras read the first batch before training;
  an epoch that fits wholly in that read-ahead then counts once too often: use the callback.)

A pass that starts on an epoch partly read (a pass cut short, or read ahead and thrown away)
serves it again from its start, so every epoch Keras trains has every row once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from daskfeed._keras import keras
from daskfeed.exceptions import DaskfeedError, SchemaError
from daskfeed.feed import WindowData
from daskfeed.futures import WindowCancelled
from daskfeed.options import FEEDS
from daskfeed.plan import EpochPlan, Slice

if TYPE_CHECKING:
    from daskfeed.sequence import DaskSequence

__all__ = ["CHUNK_BYTES", "WindowFeed", "fit_inputs", "uses_windows"]

CHUNK_BYTES = 8 * 2**20  # encoded bytes crossing into TensorFlow per Python call, at most


def uses_windows(feed: str) -> bool:
    """Whether ``feed`` (``auto``, ``windows`` or ``batches``) hands Keras a :class:`WindowFeed`.

    ``auto`` is ``windows`` on the TensorFlow backend and ``batches`` (the ``PyDataset``) on JAX,
    whose trainer reads a ``PyDataset`` without ``tf.data``.

    Parameters
    ----------
    feed
        The setting (``--feed`` / ``daskfeed.feed``).

    Returns
    -------
    bool

    Raises
    ------
    SchemaError
        ``feed`` is none of the three, or ``windows`` on a backend other than TensorFlow.
    """
    if feed not in FEEDS:
        raise SchemaError(f"Expected feed to be one of {', '.join(FEEDS)}. Received: feed={feed!r}."
                          "\nHint: auto (the default) picks the fastest for the backend.")
    backend = keras.backend.backend()
    if feed == "windows" and backend != "tensorflow":
        raise SchemaError(f"Expected the TensorFlow backend with feed='windows' (a tf.data "
                          f"pipeline). Received: KERAS_BACKEND={backend!r}.\nHint: feed='batches' "
                          "(or auto).")
    return feed == "windows" or (feed == "auto" and backend == "tensorflow")


def fit_inputs(sequence: DaskSequence, feed: str, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """What one ``model.fit`` over ``sequence`` is handed: the data and its other arguments.

    With the window feed (:func:`uses_windows`): ``sequence`` as a :class:`WindowFeed`'s dataset,
    its callback first in ``callbacks``, a ``DaskSequence`` given as ``validation_data`` as a
    dataset too, and ``shuffle=False`` (daskfeed shuffles; Keras would warn that ``fit`` does not
    shuffle a dataset). Otherwise the sequence itself and ``kwargs`` as they are.

    Parameters
    ----------
    sequence
        The training sequence, where its next ``fit`` starts (epoch and batch).
    feed
        ``auto``, ``windows`` or ``batches``.
    kwargs
        ``fit``'s other arguments.

    Returns
    -------
    tuple
        ``(x, kwargs)`` for ``model.fit(x, **kwargs)``.
    """
    if not uses_windows(feed):
        return sequence, kwargs
    from daskfeed.sequence import DaskSequence

    train = WindowFeed(sequence)
    out = {**kwargs, "shuffle": False}
    out["callbacks"] = [train.callback(), *(kwargs.get("callbacks") or ())]
    if isinstance(kwargs.get("validation_data"), DaskSequence):
        out["validation_data"] = WindowFeed(kwargs["validation_data"]).dataset()
    return train.dataset(), out


class WindowFeed:
    """A :class:`~daskfeed.DaskSequence` as a ``tf.data.Dataset`` fed ``chunk`` batches per call.

    Parameters
    ----------
    seq
        The sequence; the dataset serves its epochs from where it stands now (its
        ``epoch`` and ``start``: a dataset of a resumed epoch serves that epoch only).
    chunk_bytes
        Encoded bytes per call at most (default: :data:`CHUNK_BYTES`, or a sixteenth of the
        sequence's ``prefetch_bytes`` when less); at least one batch.

    Examples
    --------
    >>> feed = WindowFeed(seq)  # doctest: +SKIP
    >>> model.fit(feed.dataset(), epochs=3, callbacks=[feed.callback()])  # doctest: +SKIP
    """

    def __init__(self, seq: DaskSequence, *, chunk_bytes: int | None = None) -> None:
        self.seq = seq
        self.epoch, self.start = seq.epoch, seq.start  # where the first pass begins
        cap = chunk_bytes or min(CHUNK_BYTES, max(seq.prefetch_bytes // 16, 1))
        self.chunk = max(1, int(cap) // (seq.batch_size * seq.encoding.bytes_per_row))
        self._offset: int | None = None  # sequence epoch - Keras epoch, once Keras began one
        self._keras_epoch: int | None = None
        self._plan: EpochPlan | None = None  # the plan of the latest pass

    # -- what Keras is handed ----------------------------------------------------------
    def dataset(self) -> Any:
        """The ``tf.data.Dataset`` of ``len(seq)`` batches per epoch (its cardinality).

        Returns
        -------
        tf.data.Dataset
            Elements ``(x, y)``, or ``(x, y, w)`` with a weight column, as ``seq[i]``.
        """
        import tensorflow as tf

        ds = tf.data.Dataset.from_generator(self._serve, output_signature=self._signature(tf))
        ds = ds.unbatch().apply(tf.data.experimental.assert_cardinality(len(self.seq)))
        return ds.prefetch(self.chunk)

    def callback(self) -> keras.callbacks.Callback:
        """The callback telling the dataset which epoch Keras trains (see the module docstring).

        Returns
        -------
        keras.callbacks.Callback
            To put first in ``fit``'s callbacks (before any reading ``seq.last_epoch_stats``).
        """
        return _EpochSync(self)

    def _signature(self, tf: Any) -> tuple[Any, ...]:
        """The generator's element: a chunk, ``(k, rows, ...)`` per array."""
        enc = self.seq.encoding

        def spec(dtype: str, *inner: int) -> Any:
            return tf.TensorSpec((None, None, *inner), tf.as_dtype(dtype))

        x: Any = (spec(enc.matrix_dtype, len(enc.columns)) if enc.as_matrix
                  else {c.name: spec(c.dtype) for c in enc.columns})
        y = spec(enc.label_dtype)
        return (x, y) if enc.weight is None else (x, y, spec("float32"))

    # -- epochs ------------------------------------------------------------------------
    def begin(self, keras_epoch: int) -> None:
        """Keras begins its epoch ``keras_epoch``: the next pass serves the matching one."""
        if self._offset is None:
            self._offset = self.epoch - int(keras_epoch)
        self._keras_epoch = int(keras_epoch)

    def end(self) -> None:
        """The training part of Keras' epoch is over: move on if every batch was read."""
        if self._plan is not None:
            self.seq._cursor.finish(self._plan)

    def _target(self) -> tuple[int, int]:
        """The epoch and first batch the pass now starting serves."""
        cursor = self.seq._cursor
        if self._keras_epoch is not None:
            assert self._offset is not None
            epoch = self._keras_epoch + self._offset
        else:
            with cursor.lock:
                cursor.finish(cursor.plan)  # read to its end by the last pass: the next epoch
                epoch = cursor.epoch
        if self.start and epoch != self.epoch:
            raise DaskfeedError(
                f"This dataset serves epoch {self.epoch} from batch {self.start} (a resumed "
                f"epoch) only. Received: a pass over epoch {epoch}.\nHint: fit the resumed epoch "
                "alone, then make a new dataset for the next epochs (daskfeed.callbacks.fit_from "
                "does both).")
        return epoch, self.start if epoch == self.epoch else 0

    # -- the generator -----------------------------------------------------------------
    def _serve(self) -> Iterator[tuple[Any, ...]]:
        """One pass: the epoch's batches, ``chunk`` at a time; then the epoch ends."""
        seq = self.seq
        try:
            seq._check_usable()
            plan, pf = seq._cursor.open_pass(*self._target())
            self._plan = plan
            i, n = seq._cursor.start, plan.num_batches
            while i < n:
                j = self._chunk_end(plan, i)
                per_batch = [plan.batch(b) for b in range(i, j)]
                data = seq._rows(plan, pf, _merged(per_batch))
                for b, slices in zip(range(i, j), per_batch, strict=True):
                    seq._cursor.served(plan, b, slices)
                yield _stacked(data, j - i, plan.batch_rows(i))
                i = j
            seq._cursor.finish(plan)
        except WindowCancelled:
            seq._check_usable()  # closed: say so
            raise DaskfeedError(
                "The epoch a tf.data pass was reading changed under it. Expected one pass at a "
                "time over a DaskSequence.\nHint: do not iterate two datasets of one sequence "
                "at once, nor call set_epoch while fit reads it.") from None
        except DaskfeedError as err:
            seq.failure = err  # train() re-raises it: TF wraps it in an UnknownError
            raise

    def _chunk_end(self, plan: EpochPlan, i: int) -> int:
        """The batch after the chunk starting at ``i``: equal batches only (a short last alone)."""
        j = min(i + self.chunk, plan.num_batches)
        if j - i > 1 and plan.batch_rows(j - 1) != plan.batch_rows(i):
            j -= 1
        return j


class _EpochSync(keras.callbacks.Callback):
    """Tells a :class:`WindowFeed` when Keras begins an epoch and when its training part ends."""

    def __init__(self, feed: WindowFeed) -> None:
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

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Validation begins: the epoch's batches were all trained.

        Parameters
        ----------
        logs
            Keras' logs (may be None).
        """
        self.feed.end()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras ends ``epoch``.

        Parameters
        ----------
        epoch
            Keras' epoch (0-based).
        logs
            Keras' logs (may be None).
        """
        self.feed.end()


def _merged(per_batch: list[list[Slice]]) -> list[Slice]:
    """The slices of consecutive batches, touching slices of one window joined."""
    out: list[Slice] = []
    for slices in per_batch:
        for s in slices:
            if out and out[-1].window == s.window and out[-1].stop == s.start:
                out[-1] = Slice(s.window, out[-1].start, s.stop)
            else:
                out.append(s)
    return out


def _stacked(data: WindowData, k: int, rows: int) -> tuple[Any, ...]:
    """``data`` (``k * rows`` rows) as ``k`` batches stacked: each array ``(k, rows, ...)``."""

    def stack(a: np.ndarray) -> np.ndarray:
        return a.reshape(k, rows, *a.shape[1:])

    x = {n: stack(a) for n, a in data.x.items()} if isinstance(data.x, dict) else stack(data.x)
    parts = (x, stack(data.y))
    return parts if data.w is None else (*parts, stack(data.w))
