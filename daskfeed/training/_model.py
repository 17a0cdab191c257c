"""Models: the default Keras model over a manifest, and user builders."""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import pkgutil
import re
import sys
from collections.abc import Callable
from types import ModuleType

import numpy as np

from daskfeed.adapters import DaskSequence, keras
from daskfeed.core import SchemaError, SettingError
from daskfeed.manifest import Encoding, Manifest, refuse_single_class
from daskfeed.training._options import (
    DEFAULT_DROPOUT,
    DEFAULT_HIDDEN,
    DEFAULT_LEARNING_RATE,
    Builder,
    FitOptions,
)


class _Names:
    """Layer names unique in one model, whatever the column names.

    ``a b`` and ``a_b``, ``a-b`` and ``a.b``, a column named ``features``: a name taken gets
    ``_2``, ``_3``... in column order, so the same columns always give the same names.
    """

    def __init__(self, reserved: list[str]) -> None:
        self.used = set(reserved)

    def take(self, name: str) -> str:
        base = name[:120]
        out, n = base, 2
        while out in self.used:
            out, n = f"{base[:112]}_{n}", n + 1
        self.used.add(out)
        return out

    def layer(self, prefix: str, column: str) -> str:
        return self.take(f"{prefix}_{re.sub(r'[^0-9A-Za-z_]', '_', column)}")

    def input(self, column: str) -> str:
        """Keras matches dict inputs by tensor name: the column name where TF accepts it."""
        if re.fullmatch(r"[A-Za-z0-9_.\-]+", column):
            return self.take(column)
        return self.layer("in", column)


def default_model(
    data: DaskSequence | Manifest,
    *,
    features: list[str] | None = None,
    exclude: tuple[str, ...] | list[str] = (),
    hidden: tuple[int, ...] | list[int] = DEFAULT_HIDDEN,
    embedding_dim: int | None = None,
    dropout: float = DEFAULT_DROPOUT,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    as_matrix: bool | None = None,
) -> keras.Model:
    """A compiled functional model over the batches of a :class:`DaskSequence`.

    Numeric columns go through a ``Normalization`` layer set from the manifest's mean and
    variance (no extra ``adapt`` pass over the data), string columns through an ``Embedding``
    of their vocabulary (+ missing and OOV codes), then an MLP; the head is a sigmoid for a
    0/1 label, a softmax for more classes, linear for a continuous label, followed by a fixed
    rescale to the label's units (``z * std + mean`` from the manifest), so the network learns
    standardized targets and predicts in the label's units.

    Parameters
    ----------
    data
        The training :class:`~daskfeed.DaskSequence`: its features (``features=`` /
        ``exclude=`` / ``weight=`` as given to it), its ``as_matrix`` and the statistics it
        encodes with are taken from it. Or the training data's
        :class:`~daskfeed.Manifest`, with ``features`` / ``exclude`` / ``as_matrix``
        repeating the sequence's selection.
    features, exclude
        With a manifest: the same selection as given to the ``DaskSequence``. Not with a
        sequence (it has its selection).
    hidden
        Units of the hidden Dense layers.
    embedding_dim
        Width of each embedding (default: grows with the vocabulary, at most 16).
    dropout
        Rate of a ``Dropout`` layer after each hidden layer (0: none).
    learning_rate
        Adam's learning rate.
    as_matrix
        Build for ``DaskSequence(..., as_matrix=True)`` (one matrix input); default: the
        sequence's, else False.

    Raises
    ------
    SettingError
        For ``features`` / ``exclude`` / a different ``as_matrix`` given with a sequence, or
        hidden sizes, dropout or learning rate out of range.
    """
    manifest, names, as_matrix = _selection(data, features, exclude, as_matrix)
    refuse_single_class(manifest)  # a classifier of one class learns nothing
    _check_knobs(hidden, dropout, learning_rate)
    enc = Encoding.from_manifest(manifest, names, as_matrix)
    if as_matrix:
        dtype = enc.matrix_dtype
        inputs: keras.KerasTensor | dict[str, keras.KerasTensor] = keras.Input(
            shape=(len(names),), name="features", dtype=dtype)
        mean = np.array([manifest.columns[n].mean for n in names], dtype="float64")
        var = np.array([max(manifest.columns[n].var, 1e-12) for n in names], dtype="float64")
        # a matrix with wide columns (float64) is standardized in float64, then cast to float32
        h = keras.layers.Normalization(mean=mean, variance=var, name="normalize", dtype=dtype)(inputs)
    else:
        inputs = {}
        parts = []
        names_of = _Names(["features", "normalize", "output", "label_units", "daskfeed_default",
                           *(f"{k}_{i}" for i in range(len(hidden)) for k in ("dense", "dropout"))])
        for code in enc.columns:
            col = manifest.columns[code.name]
            if code.kind == "categorical":
                inp = keras.Input(shape=(1,), name=names_of.input(code.name), dtype="int32")
                dim = embedding_dim or min(16, max(2, math.ceil(1.6 * code.input_dim**0.56)))
                e = keras.layers.Embedding(code.input_dim, dim, name=names_of.layer("embed", code.name))(inp)
                parts.append(keras.layers.Flatten(name=names_of.layer("flat", code.name))(e))
            else:  # a wide column (int64 / float64) is standardized in float64 before float32
                inp = keras.Input(shape=(1,), name=names_of.input(code.name), dtype=code.dtype)
                exact = "float32" if code.dtype == "float32" else "float64"
                parts.append(keras.layers.Normalization(
                    mean=[col.mean], variance=[max(col.var, 1e-12)], dtype=exact,
                    name=names_of.layer("norm", code.name))(inp))
            inputs[code.name] = inp
        h = parts[0] if len(parts) == 1 else keras.layers.Concatenate(name="features")(parts)
    for i, units in enumerate(hidden):
        h = keras.layers.Dense(units, activation="relu", name=f"dense_{i}")(h)
        if dropout:
            h = keras.layers.Dropout(dropout, name=f"dropout_{i}")(h)
    if manifest.task == "binary":
        out = keras.layers.Dense(1, activation="sigmoid", name="output")(h)
    elif manifest.task == "multiclass":
        out = keras.layers.Dense(manifest.num_classes, activation="softmax", name="output")(h)
    else:  # the network predicts in standardized units; a fixed rescale gives the label's
        out = _in_label_units(keras.layers.Dense(1, name="output")(h), manifest)
    model = keras.Model(inputs, out, name="daskfeed_default")
    compile_for(model, manifest, learning_rate=learning_rate,
                weighted=bool(getattr(data, "weight", None)))
    return model


def _selection(data: DaskSequence | Manifest, features: list[str] | None,
               exclude: tuple[str, ...] | list[str],
               as_matrix: bool | None) -> tuple[Manifest, list[str], bool]:
    """The manifest whose statistics encode, the feature names and ``as_matrix`` of ``data``."""
    if not isinstance(data, DaskSequence):  # a Manifest
        return data, data.feature_names(features, exclude), bool(as_matrix)
    if features is not None or exclude:
        raise SettingError(
            "Expected the feature selection from the DaskSequence alone. Received: "
            f"features={features!r}, exclude={list(exclude)!r} as well.\nHint: select features "
            "when creating the sequence (features=/exclude=), or pass seq.manifest here."
        )
    if as_matrix is not None and bool(as_matrix) != data.as_matrix:
        raise SettingError(
            f"Expected as_matrix={data.as_matrix} (the sequence's). Received: as_matrix={as_matrix}."
            "\nHint: leave as_matrix out when passing a DaskSequence."
        )
    return data.reference, list(data.features), bool(data.as_matrix)


def _in_label_units(z: keras.KerasTensor, manifest: Manifest) -> keras.KerasTensor:
    """``z * std + mean`` of the label (the manifest's statistics): fixed, saved with the model.

    Targets in the thousands then need no scaling by the user, and ``model.keras`` predicts
    in the label's units.
    """
    col = manifest.columns[manifest.label]
    std = math.sqrt(col.var) if col.var > 0 and math.isfinite(col.var) else 1.0
    mean = float(col.mean) if math.isfinite(col.mean) else 0.0
    return keras.layers.Rescaling(scale=std, offset=mean, name="label_units")(z)


def _check_knobs(hidden: tuple[int, ...] | list[int], dropout: float, learning_rate: float) -> None:
    """Refuse hidden sizes < 1, a dropout outside [0, 1), a learning rate < 0."""
    if any(int(u) < 1 for u in hidden):
        raise SettingError(f"Expected hidden layer sizes >= 1. Received: hidden={list(hidden)}.")
    if not 0.0 <= float(dropout) < 1.0:
        raise SettingError(f"Expected 0 <= dropout < 1. Received: dropout={dropout}.")
    if not float(learning_rate) >= 0.0:
        raise SettingError(f"Expected learning_rate >= 0. Received: learning_rate={learning_rate}.")


def compile_for(model: keras.Model, manifest: Manifest, *, learning_rate: float = 1e-3,
                weighted: bool = False) -> None:
    """Compile ``model`` with the loss and metrics that fit the label's task.

    Parameters
    ----------
    model
        The model to compile.
    manifest
        The training data's manifest (its ``task``).
    learning_rate
        Adam's learning rate.
    weighted
        The batches carry sample weights (a weight column): the metrics are also reported
        weighted (Keras' ``weighted_metrics``: ``weighted_accuracy``, ``val_weighted_accuracy``
        ...); the loss is weighted in any case.
    """
    loss = {"binary": "binary_crossentropy", "multiclass": "sparse_categorical_crossentropy",
            "regression": "mean_squared_error"}[manifest.task]
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss,
                  metrics=task_metrics(manifest.task),
                  weighted_metrics=task_metrics(manifest.task) if weighted else None,
                  loss_weights=_standardized_loss(model, manifest))


def task_metrics(task: str) -> list[str | keras.metrics.Metric]:
    """The metrics a task's users read: accuracy, and for a 0/1 label AUC, precision and recall.

    Fresh metric objects on each call (Keras keeps each one's state; the weighted set needs
    its own).

    Parameters
    ----------
    task
        ``binary``, ``multiclass`` or ``regression``.

    Returns
    -------
    list
        For ``model.compile(metrics=...)``.
    """
    if task == "binary":
        return ["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
                keras.metrics.Recall(name="recall")]
    return ["accuracy"] if task == "multiclass" else ["mean_absolute_error"]


def _standardized_loss(model: keras.Model, manifest: Manifest) -> float | None:
    """``1 / var`` of the label when the model ends in the label's units (``label_units``).

    The squared error is then that of standardized targets: gradients stay near 1 whatever the
    label's scale (a label in the 1e15s would overflow float32 in Adam's second moment).
    """
    if manifest.task != "regression" or "label_units" not in {x.name for x in model.layers}:
        return None
    var = manifest.columns[manifest.label].var
    return 1.0 / var if var > 0 and math.isfinite(var) else None


def load_builder(spec: str) -> Builder:
    """Load the user's model builder: ``module:function`` or ``path/to/file.py:function``.

    Parameters
    ----------
    spec
        Where the function is; a module is looked up from the working directory too.

    Returns
    -------
    callable
        The function (called with the manifest, it returns a ``keras.Model``).

    Raises
    ------
    SettingError
        When ``spec`` is not of that form, the module does not import, or it has no such
        function.
    """
    mod_name, sep, fn_name = spec.rpartition(":")
    if not sep or not mod_name or not fn_name:
        raise SettingError(
            f"Expected a model builder as 'module:function' or 'file.py:function'. "
            f"Received: {spec!r}.\nHint: e.g. --model mymodels:build."
        )
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            fn = getattr(_module_of_file(mod_name), fn_name, None)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            fn = pkgutil.resolve_name(f"{mod_name}:{fn_name}")
    except AttributeError:
        fn = None
    except (ImportError, FileNotFoundError) as err:
        raise SettingError(
            f"Cannot import the model module {mod_name!r}: {err}.\n"
            "Hint: run from the directory that holds it, or give a path to the .py file."
        ) from err
    if not callable(fn):
        raise SettingError(
            f"Expected a function {fn_name!r} in {mod_name!r}. Received: "
            f"{type(fn).__name__ if fn is not None else 'nothing by that name'}.\n"
            "Hint: it is called with the manifest and returns a keras.Model."
        )
    return fn


def _module_of_file(path: str) -> ModuleType:
    """Import the ``.py`` file at ``path`` as a module of its own."""
    path = os.path.abspath(path)
    spec = importlib.util.spec_from_file_location(f"_daskfeed_user_{abs(hash(path))}", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_for(spec: str | Builder | None, seq: DaskSequence, fit: FitOptions,
              echo: Callable[[str], None]) -> keras.Model:
    """The run's compiled model: the builder's (``spec``), else the default model.

    Parameters
    ----------
    spec
        ``"module:function"``, a builder, or None for :func:`default_model`.
    seq
        The training sequence (its manifest, features and encoding).
    fit
        The default model's shape and the learning rate.
    echo
        Where the model is described.

    Returns
    -------
    keras.Model
        Compiled for the label's task.

    Raises
    ------
    SettingError
        For a builder that returns no ``keras.Model``, or a compiled one with ``learning_rate``.
    """
    if spec is not None:
        builder = load_builder(spec) if isinstance(spec, str) else spec
        return _built(builder, seq, spec, fit, echo)
    lr = DEFAULT_LEARNING_RATE if fit.learning_rate is None else fit.learning_rate
    hidden = fit.hidden or DEFAULT_HIDDEN
    net = default_model(seq, hidden=hidden, dropout=fit.dropout or 0.0, learning_rate=lr)
    echo(f"default model: hidden {list(hidden)}, dropout {fit.dropout or 0.0:g}, "
         f"Adam(learning_rate={lr:g})")
    return net


def _built(builder: Builder, seq: DaskSequence, spec: str | Builder, fit: FitOptions,
           echo: Callable[[str], None]) -> keras.Model:
    """The builder's model, checked, compiled for the task if it comes uncompiled.

    A builder that takes a ``features`` argument is also handed the features chosen (in the
    order batches carry them: ``--features`` / ``--exclude`` applied).
    """
    manifest = seq.manifest
    net = (builder(manifest, features=list(seq.features)) if _takes_features(builder)
           else builder(manifest))
    if not isinstance(net, keras.Model):
        raise SettingError(
            f"Expected the model builder to return a keras.Model. Received: "
            f"{type(net).__name__}.\nHint: return the model from your function."
        )
    _check_inputs(net, seq, spec)
    if net.compiled and fit.learning_rate is not None:
        raise SettingError(
            "Expected an uncompiled model from the builder to apply --learning-rate. Received: a "
            f"model compiled with {describe_compile(net)}.\nHint: set the learning rate in your "
            "builder's compile, or return the model uncompiled."
        )
    if not net.compiled:
        lr = DEFAULT_LEARNING_RATE if fit.learning_rate is None else fit.learning_rate
        compile_for(net, manifest, learning_rate=lr, weighted=bool(seq.weight))
        echo(f"model from {spec if isinstance(spec, str) else 'the builder'} was not "
             f"compiled; compiled for the {manifest.task} label with {describe_compile(net)}")
    return net


def _takes_features(builder: Builder) -> bool:
    """Whether ``builder`` names a ``features`` parameter (``**kwargs`` alone is not asked).

    A builder that passes its ``**kwargs`` on (to ``keras.Model``) would fail on one it never
    asked for.
    """
    try:
        params = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: called with the manifest alone
        return False
    return any(p.name == "features" and p.kind is not p.POSITIONAL_ONLY for p in params)


def _check_inputs(net: keras.Model, seq: DaskSequence, spec: str | Builder) -> None:
    """Refuse a model whose named inputs are not all features the batches carry (before fit).

    Keras would stop the first step with a long traceback ("Missing data for input ...").
    """
    if seq.as_matrix:
        return  # one matrix: whatever the input is named
    struct = getattr(net, "_inputs_struct", None)
    try:  # inputs given as a dict are matched by key (a name may not hold '/'), else by name
        names = list(struct) if isinstance(struct, dict) else [t.name for t in net.inputs]
    except (AttributeError, ValueError):  # a model not built yet (Sequential without Input)
        return
    missing = [n for n in names if n not in seq.features]
    if missing:
        who = spec if isinstance(spec, str) else "the builder"
        raise SchemaError(
            f"Expected the inputs of the model from {who} to be features the batches carry: "
            f"{', '.join(seq.features)}. Received: input(s) {', '.join(map(repr, missing))} "
            "that are not (left out by --exclude / --features, or the label?).\nHint: build "
            "inputs for the chosen features only: a builder that takes them, "
            "def build(manifest, features): ..., is called with features=[...]."
        )


def describe_compile(net: keras.Model) -> str:
    """``loss …, optimizer Adam(learning_rate=0.001), metrics […]`` of a compiled model.

    Parameters
    ----------
    net
        A compiled model.

    Returns
    -------
    str
        Its loss, optimizer (with the learning rate) and metrics, in one line.
    """
    cfg = net.get_compile_config() or {}
    opt = net.optimizer
    lr = getattr(opt, "learning_rate", None)
    try:
        lr_text = f"(learning_rate={float(lr):g})" if lr is not None else ""
    except (TypeError, ValueError):  # a schedule
        lr_text = f"(learning_rate={type(lr).__name__})"
    metrics = cfg.get("metrics")
    listed = metrics if isinstance(metrics, (list, tuple)) else [metrics] if metrics else []
    names = [m if isinstance(m, str) else  # a serialized metric object: its config has the name
             (m.get("config") or {}).get("name", m.get("class_name")) if isinstance(m, dict)
             else getattr(m, "name", type(m).__name__) for m in listed]
    loss = cfg.get("loss", getattr(net, "loss", None))
    return (f"loss {loss if isinstance(loss, str) else getattr(loss, 'name', loss)}, optimizer "
            f"{type(opt).__name__}{lr_text}, metrics {names}")
