"""The settings of a training run: resolved once where they enter, handed down as plain values.

CLI flags or ``train``'s keyword arguments first, then the ``daskfeed.*`` config.

No I/O and no heavy imports: the CLI checks its flags with these before any work.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Union

from daskfeed.batches import DataSettings
from daskfeed.cluster import ClusterSpec
from daskfeed.core import config, handoff_name, refuse_setting, warn_user

if TYPE_CHECKING:
    from keras import Model


DataSpec = Union[str, "os.PathLike[str]", Sequence[str]]
"""Paths, globs, URLs, or a list of them."""

DEFAULT_HIDDEN = (64, 64)
DEFAULT_DROPOUT = 0.0
DEFAULT_LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class FitOptions:
    """How :func:`~daskfeed.train` fits, resolved once from its arguments (:meth:`resolve`).

    The sample-weight column and the validation split are the data's settings
    (:class:`~daskfeed.batches.DataSettings`: ``weight``, ``validation_split``); they are checked
    here with the rest of the fit's.

    Attributes
    ----------
    class_weight
        ``"balanced"`` or ``{class: weight}`` (checked against the manifest later), or None.
    patience, monitor
        Early stopping: epochs without improvement of ``monitor``; None: no early stopping.
    hidden, dropout, learning_rate
        The default model's shape and Adam's learning rate (None: a ``--model`` builder's
        own; a learning rate is applied to a builder's model only if it comes uncompiled).
    handoff
        How batches reach Keras (resolved: ``daskfeed.handoff``): ``auto``, ``tf-data``,
        ``dataloader`` or ``pydataset`` (see :func:`daskfeed.fit_from`).
    """

    class_weight: str | dict[int, float] | None = None
    patience: int | None = None
    monitor: str | None = None
    hidden: tuple[int, ...] | None = DEFAULT_HIDDEN
    dropout: float | None = DEFAULT_DROPOUT
    learning_rate: float | None = DEFAULT_LEARNING_RATE
    handoff: str = "auto"

    @classmethod
    def resolve(cls, *, validation: DataSpec | None = None, builder: bool = False,
                class_weight: str | dict[Any, float] | None = None,
                validation_split: float | None = None, early_stopping: int | None = None,
                monitor: str | None = None, hidden: Sequence[int] | None = None,
                dropout: float | None = None, learning_rate: float | None = None,
                handoff: str | None = None, feed: str | None = None) -> FitOptions:
        """Check the fit settings together and fill in defaults (no I/O).

        Parameters
        ----------
        validation
            The validation data, if any (only whether there are some matters here).
        builder
            Whether a ``model`` builder replaces the default model.
        class_weight, validation_split, early_stopping, monitor, hidden, dropout, learning_rate
            As :func:`~daskfeed.train` takes them (the split only checked here).
        handoff
            Likewise.
        feed
            The hand-off's old name (``windows``, ``batches``): still taken, with a warning.

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
        if handoff is not None and feed is not None:
            refuse_setting("Expected one hand-off: --handoff (handoff=), or its old name --feed.",
                           f"handoff={handoff!r} and feed={feed!r}", "drop --feed.")
        if feed is not None:  # its old values are said by handoff_name, the old keyword here
            handoff = handoff_name(str(feed), what="feed")
            if handoff == feed:
                warn_user("feed= (--feed) is the old name of handoff= (--handoff); it works, but "
                          "will go.\nHint: --handoff auto|tf-data|dataloader|pydataset.",
                          FutureWarning)
        handoff = handoff_name(str(config.get_renamed("handoff", "feed", handoff)))
        has_validation = bool(validation or validation_split)
        patience, monitor = _early_stopping(early_stopping, monitor, has_validation)
        if builder and (hidden is not None or dropout is not None):
            refuse_setting("Expected --hidden/--dropout only for the default model: a --model builder "
                    "shapes its own.", f"hidden={hidden!r}, dropout={dropout!r} with a builder",
                    "set them in your builder, or drop --model.")
        return cls(
            class_weight=_class_weight_spec(class_weight), patience=patience, monitor=monitor,
            hidden=None if builder else tuple(int(u) for u in (hidden or DEFAULT_HIDDEN)),
            dropout=None if builder else float(DEFAULT_DROPOUT if dropout is None else dropout),
            learning_rate=(learning_rate if builder else
                           float(DEFAULT_LEARNING_RATE if learning_rate is None else learning_rate)),
            handoff=handoff,
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
class ClusterOptions(ClusterSpec):
    """Where training runs (:class:`~daskfeed.cluster.ClusterSpec`), and this trainer's rank.

    Attributes
    ----------
    rank, world_size
        This trainer's place among several (None: from the environment, ``TF_CONFIG`` else
        ``RANK``/``WORLD_SIZE``; see ``docs/scale-out.md``).
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
    """Everything :func:`~daskfeed.train` needs besides the data, resolved once.

    Build it with :meth:`resolve` from ``train``'s keyword arguments (the CLI maps its flags
    onto the same names).

    Attributes
    ----------
    data, cluster, fit
        The training data's settings (:class:`~daskfeed.batches.DataSettings`, resolved once
        with the label; the budget's shares, the rank's shard and the block size are set on it
        once the cluster is up), the cluster and budget, the fit settings.
    epochs
        Epochs to train.
    model
        ``"module:function"`` or a callable returning a ``keras.Model`` from the manifest;
        None: :func:`daskfeed.default_model`.
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

    data: DataSettings = field(default_factory=lambda: DataSettings(label=""))
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
    def resolve(cls, *, label: str = "", validation: DataSpec | None = None, epochs: int = 3,
                model: str | Builder | None = None,
                output: str | os.PathLike[str] = "daskfeed-out", resume: bool = False,
                checkpoint_every: int | None = None,
                tensorboard: str | os.PathLike[str] | None = None,
                verbose: int | str = "auto", **settings: Any) -> TrainOptions:
        """Sort ``train``'s keyword arguments into the groups, check and resolve them.

        Parameters
        ----------
        label
            The label column (the data settings are resolved with it).
        validation
            The validation data, if any (the fit settings are checked against it).
        epochs, model, output, resume, checkpoint_every, tensorboard, verbose
            As :func:`~daskfeed.train` takes them.
        **settings
            The arguments of :meth:`DataSettings.resolve <daskfeed.batches.DataSettings.resolve>`
            that ``train`` takes (all but those the run sets: the label, the shard, the budget's
            shares, the split's side, the shuffle), the attributes of :class:`ClusterOptions`
            and the arguments of :meth:`FitOptions.resolve`, by name.

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
        BudgetError
            For a ``memory_limit`` that is not a size (``"14GB"``) or exceeds the machine.
        """
        groups = {name: {k: settings.pop(k) for k in keys if k in settings}
                  for name, keys in _GROUP_KEYS.items()}
        if settings:
            raise TypeError(f"train() got unexpected keyword arguments: {', '.join(sorted(settings))}")
        if int(epochs) < 1:
            refuse_setting("Expected epochs >= 1.", f"epochs={epochs!r}", "e.g. --epochs 3.")
        fit = FitOptions.resolve(validation=validation, builder=model is not None,
                                 validation_split=groups["data"].get("validation_split"),
                                 **groups["fit"])
        data = groups["data"]
        split = data.pop("validation_split", None)
        # a block size asked for: the flag, else a configured daskfeed.blocksize (else the
        # budget's, or a reused manifest's, decided once the cluster is up)
        asked = config.resolve_blocksize(data.pop("blocksize", None), 0) or None
        return cls(
            data=DataSettings.resolve(label=label, blocksize=asked, validation_split=split or None,
                                      subset="training" if split else None, **data),
            cluster=ClusterOptions.resolve(**groups["cluster"]),
            fit=fit,
            epochs=int(epochs), model=model, output=os.fspath(output), resume=bool(resume),
            checkpoint_every=int(config.get("checkpoint-every", checkpoint_every)),
            tensorboard=os.fspath(tensorboard) if tensorboard else None,
            verbose=(1 if sys.stdout.isatty() else 2) if verbose == "auto" else int(verbose))


DATA_KEYS = ("features", "exclude", "weight", "batch_size", "seed", "as_matrix", "blocksize",
             "vocabulary_size", "timeout", "cache", "validation_split", "encoding", "sep",
             "na_values", "decimal", "dtype", "bad_lines", "storage_options", "skip_batches")
"""The data settings ``train`` takes (of :meth:`DataSettings.resolve
<daskfeed.batches.DataSettings.resolve>`'s; the rest are set by the run: the label, the shard,
the budget's shares, the split's side, the shuffle)."""

def __getattr__(name: str) -> Any:
    """``DataOptions``: the old name of the data's settings (deprecated; one class now)."""
    if name == "DataOptions":
        warnings.warn("daskfeed.DataOptions is deprecated: a data set's settings are one "
                      "daskfeed.DataSettings (resolved with the label, DataSettings.resolve), "
                      "which TrainOptions.data holds; DataOptions is that class now.",
                      DeprecationWarning, stacklevel=2)
        return DataSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_GROUP_KEYS = {
    "data": list(DATA_KEYS),
    "cluster": [f.name for f in fields(ClusterOptions) if f.init],
    "fit": ["class_weight", "early_stopping", "monitor", "hidden", "dropout", "learning_rate",
            "handoff", "feed"],
}
