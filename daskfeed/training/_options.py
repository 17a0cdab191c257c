"""The settings of a training run: resolved once where they enter, handed down as plain values.

CLI flags or ``train``'s keyword arguments first, then the ``daskfeed.*`` config.

No I/O and no heavy imports: the CLI checks its flags with these before any work.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Union

from daskfeed.cache import CacheChoice
from daskfeed.cluster import ClusterSpec
from daskfeed.core import FEEDS, config, refuse_setting
from daskfeed.reading import ReadOptions, read_options

if TYPE_CHECKING:
    from keras import Model


__all__ = ["ClusterOptions", "DataOptions", "FitOptions", "TrainOptions"]

DataSpec = Union[str, "os.PathLike[str]", Sequence[str]]
"""Paths, globs, URLs, or a list of them."""

DEFAULT_HIDDEN = (64, 64)
DEFAULT_DROPOUT = 0.0
DEFAULT_LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class FitOptions:
    """How :func:`~daskfeed.training._train.train` fits, resolved once from its arguments (:meth:`resolve`).

    Attributes
    ----------
    weight
        The sample-weight column, or None.
    class_weight
        ``"balanced"`` or ``{class: weight}`` (checked against the manifest later), or None.
    validation_split
        Fraction held out by whole blocks when there is no validation data, or None.
    patience, monitor
        Early stopping: epochs without improvement of ``monitor``; None: no early stopping.
    hidden, dropout, learning_rate
        The default model's shape and Adam's learning rate (None: a ``--model`` builder's
        own; a learning rate is applied to a builder's model only if it comes uncompiled).
    feed
        How batches reach Keras (resolved: ``daskfeed.feed``): ``auto``, ``windows`` or
        ``batches`` (see :func:`daskfeed.training._callbacks.fit_from`).
    """

    weight: str | None = None
    class_weight: str | dict[int, float] | None = None
    validation_split: float | None = None
    patience: int | None = None
    monitor: str | None = None
    hidden: tuple[int, ...] | None = DEFAULT_HIDDEN
    dropout: float | None = DEFAULT_DROPOUT
    learning_rate: float | None = DEFAULT_LEARNING_RATE
    feed: str = "auto"

    @classmethod
    def resolve(cls, *, validation: DataSpec | None = None, builder: bool = False,
                weight: str | None = None, class_weight: str | dict[Any, float] | None = None,
                validation_split: float | None = None, early_stopping: int | None = None,
                monitor: str | None = None, hidden: Sequence[int] | None = None,
                dropout: float | None = None, learning_rate: float | None = None,
                feed: str | None = None) -> FitOptions:
        """Check the fit settings together and fill in defaults (no I/O).

        Parameters
        ----------
        validation
            The validation data, if any (only whether there are some matters here).
        builder
            Whether a ``model`` builder replaces the default model.
        weight, class_weight, validation_split, early_stopping, monitor, hidden, dropout, learning_rate, feed
            As :func:`~daskfeed.training._train.train` takes them.

        Returns
        -------
        FitOptions
            The checked settings with their defaults.

        Raises
        ------
        SettingError
            For settings that exclude each other, or a value out of range, with a hint.
        """
        if validation_split is not None and not 0.0 < float(validation_split) < 1.0:
            refuse_setting("Expected 0 < validation_split < 1.", f"validation_split={validation_split!r}",
                    "e.g. 0.1 holds out about 10% of the data (--validation-split 0.1).")
        if validation_split and validation:
            refuse_setting("Expected validation data or a validation split, not both.",
                    f"validation={validation!r} and validation_split={validation_split}",
                    "drop --validation-split to validate on that data, or drop --validation.")
        feed = str(config.get("feed", feed))
        if feed not in FEEDS:
            refuse_setting(f"Expected feed to be one of {', '.join(FEEDS)}.", f"feed={feed!r}",
                    "auto (the default) picks the fastest for the Keras backend (--feed auto).")
        has_validation = bool(validation or validation_split)
        patience, monitor = _early_stopping(early_stopping, monitor, has_validation)
        if builder and (hidden is not None or dropout is not None):
            refuse_setting("Expected --hidden/--dropout only for the default model: a --model builder "
                    "shapes its own.", f"hidden={hidden!r}, dropout={dropout!r} with a builder",
                    "set them in your builder, or drop --model.")
        return cls(
            weight=weight, class_weight=_class_weight_spec(class_weight),
            validation_split=float(validation_split) if validation_split else None,
            patience=patience, monitor=monitor,
            hidden=None if builder else tuple(int(u) for u in (hidden or DEFAULT_HIDDEN)),
            dropout=None if builder else float(DEFAULT_DROPOUT if dropout is None else dropout),
            learning_rate=(learning_rate if builder else
                           float(DEFAULT_LEARNING_RATE if learning_rate is None else learning_rate)),
            feed=feed,
        )


def _early_stopping(patience: int | None, monitor: str | None,
                    has_validation: bool) -> tuple[int | None, str | None]:
    """Patience and the monitored quantity: val_loss with validation data, else loss."""
    if patience is None:
        if monitor is not None:
            refuse_setting("Expected --monitor only with early stopping.", f"monitor={monitor!r}",
                    "add --early-stopping PATIENCE (e.g. 3).")
        return None, None
    if int(patience) < 0:
        refuse_setting("Expected a patience >= 0 (epochs without improvement).",
                f"early_stopping={patience!r}", "e.g. --early-stopping 3.")
    monitor = monitor or ("val_loss" if has_validation else "loss")
    if monitor.startswith("val_") and not has_validation:
        refuse_setting(f"Expected validation data to monitor {monitor!r}.", "no validation data",
                "pass --validation DATA or --validation-split 0.1, or monitor 'loss'.")
    return int(patience), monitor


def _class_weight_spec(spec: str | dict[Any, float] | None) -> str | dict[Any, float] | None:
    """``"balanced"``, a mapping, or JSON text of one (``'{"0": 1, "1": 9}'``)."""
    if spec is None or isinstance(spec, dict):
        return spec
    text = str(spec).strip()
    if text == "balanced":
        return text
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        refuse_setting("Expected class weights 'balanced' or a JSON object {class: weight}.",
                f"class_weight={spec!r}", "e.g. --class-weight balanced or --class-weight "
                "'{\"0\": 1, \"1\": 9}'.")
    return parsed


@dataclass(frozen=True)
class DataOptions:
    """How the data are read, encoded and batched; the read settings shape the manifest.

    Attributes
    ----------
    features, exclude
        Feature columns (None: all but the label and weight) and columns left out.
    batch_size
        Rows per batch (resolved: ``daskfeed.batch-size`` when not given).
    seed
        Seed of the batch order, the validation split and Keras' initial weights.
    as_matrix
        Feed x as one float32 matrix of numeric features.
    blocksize
        CSV bytes per block asked for (a flag or a configured ``daskfeed.blocksize``); None:
        a reused manifest's, else what the memory budget gives.
    vocabulary_size
        Top-K values kept per text column (resolved: ``daskfeed.vocabulary-size``).
    timeout
        Longest wait for one window in seconds (resolved: ``daskfeed.timeout``).
    cache
        Where the parse cache goes (resolved from True: the configured or default place, a
        directory, or False: off).
    encoding, sep, na_values, decimal, dtype, bad_lines, storage_options
        As :class:`~daskfeed.reading._source.Source` takes them.
    """

    features: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    batch_size: int = 1024
    seed: int = 0
    as_matrix: bool = False
    blocksize: int | None = None
    vocabulary_size: int = 1000
    timeout: float = 300.0
    cache: CacheChoice = field(default_factory=CacheChoice)
    encoding: str = "utf-8"
    sep: str | None = None
    na_values: tuple[str, ...] | None = None
    decimal: str = "."
    dtype: dict[str, str] | None = None
    bad_lines: str = "error"
    storage_options: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def resolve(cls, *, features: Sequence[str] | None = None, exclude: Sequence[str] = (),
                batch_size: int | None = None, seed: int = 0, as_matrix: bool = False,
                blocksize: int | str | None = None, vocabulary_size: int | None = None,
                timeout: float | str | None = None,
                cache: bool | str | os.PathLike[str] = True, encoding: str = "utf-8",
                sep: str | None = None, na_values: Sequence[str] | None = None,
                decimal: str = ".",
                dtype: dict[str, str] | None = None, bad_lines: str = "error",
                storage_options: dict[str, Any] | None = None) -> DataOptions:
        """Fill in the ``daskfeed.*`` config values for the settings not given.

        Parameters
        ----------
        features, exclude, batch_size, seed, as_matrix, blocksize, vocabulary_size, timeout
            As :func:`~daskfeed.training._train.train` takes them.
        cache, encoding, sep, na_values, decimal, dtype, bad_lines, storage_options
            Likewise.

        Returns
        -------
        DataOptions
            The resolved settings.
        """
        asked = config.resolve_blocksize(blocksize, 0)
        return cls(
            features=tuple(features) if features is not None else None,
            exclude=tuple(exclude or ()), batch_size=int(config.get("batch-size", batch_size)),
            seed=int(seed), as_matrix=bool(as_matrix), blocksize=asked or None,
            vocabulary_size=int(config.get("vocabulary-size", vocabulary_size)),
            timeout=config.get_seconds("timeout", timeout),
            cache=CacheChoice.resolve(cache), encoding=encoding,
            sep=sep, na_values=tuple(na_values) if na_values is not None else None,
            decimal=decimal, dtype=dtype,
            bad_lines=bad_lines, storage_options=storage_options)

    def read(self, blocksize: int) -> ReadOptions:
        """How the files are read, at ``blocksize`` (resolved: nothing is looked up).

        Parameters
        ----------
        blocksize
            CSV bytes per block.

        Returns
        -------
        ReadOptions
        """
        return read_options(blocksize=blocksize, sep=self.sep, encoding=self.encoding,
                            dtype=self.dtype, na_values=self.na_values, decimal=self.decimal,
                            bad_lines=self.bad_lines, storage_options=self.storage_options)


@dataclass(frozen=True)
class ClusterOptions(ClusterSpec):
    """Where training runs (:class:`~daskfeed.cluster.ClusterSpec`), and this trainer's rank.

    Attributes
    ----------
    rank, world_size
        This trainer's place among several (None: from the environment, see
        :func:`daskfeed.training._ranks.resolve_rank`).
    rank_wait
        Seconds a rank waits for the scan another rank makes (resolved: ``daskfeed.rank-wait``).
    """

    rank: int | None = None
    world_size: int | None = None
    rank_wait: float = 7200.0

    @classmethod
    def resolve(cls, **settings: Any) -> ClusterOptions:
        """The cluster's settings resolved as for every command, and the rank's wait.

        Parameters
        ----------
        **settings
            The attributes, by name.

        Returns
        -------
        ClusterOptions
            The resolved settings.
        """
        settings["rank_wait"] = config.get_seconds("rank-wait", settings.get("rank_wait"))
        return super().resolve(**settings)  # type: ignore[no-any-return]


Builder = Callable[..., "Model"]
"""A model builder: called with the training manifest (and ``features=``, the features chosen,
when it takes them), returns a ``keras.Model``."""


@dataclass(frozen=True)
class TrainOptions:
    """Everything :func:`~daskfeed.training._train.train` needs besides the data, resolved once.

    Build it with :meth:`resolve` from ``train``'s keyword arguments (the CLI maps its flags
    onto the same names).

    Attributes
    ----------
    data, cluster, fit
        The read and batch settings, the cluster and budget, the fit settings.
    epochs
        Epochs to train.
    model
        ``"module:function"`` or a callable returning a ``keras.Model`` from the manifest;
        None: :func:`daskfeed.training._model.default_model`.
    output
        Directory for ``model.keras``, ``manifest.json``, ``history.json``, checkpoints.
    resume
        Continue from the newest good checkpoint in ``output``.
    checkpoint_every
        Batches between mid-epoch checkpoints (resolved: ``daskfeed.checkpoint-every``).
    tensorboard
        Also write TensorBoard logs there.
    verbose
        Keras' verbosity (resolved: 1 on a terminal, else 2).
    """

    data: DataOptions = field(default_factory=DataOptions)
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    fit: FitOptions = field(default_factory=FitOptions)
    epochs: int = 3
    model: str | Builder | None = None
    output: str = "daskfeed-out"
    resume: bool = False
    checkpoint_every: int = 1000
    tensorboard: str | None = None
    verbose: int = 2

    @classmethod
    def resolve(cls, *, validation: DataSpec | None = None, epochs: int = 3,
                model: str | Builder | None = None,
                output: str | os.PathLike[str] = "daskfeed-out", resume: bool = False,
                checkpoint_every: int | None = None,
                tensorboard: str | os.PathLike[str] | None = None,
                verbose: int | str = "auto", **settings: Any) -> TrainOptions:
        """Sort ``train``'s keyword arguments into the groups, check and resolve them.

        Parameters
        ----------
        validation
            The validation data, if any (the fit settings are checked against it).
        epochs, model, output, resume, checkpoint_every, tensorboard, verbose
            As :func:`~daskfeed.training._train.train` takes them.
        **settings
            The attributes of :class:`DataOptions`, :class:`ClusterOptions` and the arguments
            of :meth:`FitOptions.resolve`, by name.

        Returns
        -------
        TrainOptions
            The resolved settings.

        Raises
        ------
        TypeError
            For a keyword that no group takes.
        SettingError
            For settings that exclude each other or a value out of range.
        """
        groups = {name: {k: settings.pop(k) for k in keys if k in settings}
                  for name, keys in _GROUP_KEYS.items()}
        if settings:
            raise TypeError(f"train() got unexpected keyword arguments: {', '.join(sorted(settings))}")
        if int(epochs) < 1:
            refuse_setting("Expected epochs >= 1.", f"epochs={epochs!r}", "e.g. --epochs 3.")
        return cls(
            data=DataOptions.resolve(**groups["data"]),
            cluster=ClusterOptions.resolve(**groups["cluster"]),
            fit=FitOptions.resolve(validation=validation, builder=model is not None, **groups["fit"]),
            epochs=int(epochs), model=model, output=os.fspath(output), resume=bool(resume),
            checkpoint_every=int(config.get("checkpoint-every", checkpoint_every)),
            tensorboard=os.fspath(tensorboard) if tensorboard else None,
            verbose=(1 if sys.stdout.isatty() else 2) if verbose == "auto" else int(verbose))


_GROUP_KEYS = {
    "data": [f.name for f in fields(DataOptions)],
    "cluster": [f.name for f in fields(ClusterOptions)],
    "fit": ["weight", "class_weight", "validation_split", "early_stopping", "monitor", "hidden",
            "dropout", "learning_rate", "feed"],
}
