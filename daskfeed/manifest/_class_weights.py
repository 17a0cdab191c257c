"""Class weights: weights per class for ``fit``'s ``class_weight``, from a scan's label counts."""

from __future__ import annotations

import math
from typing import Any

from daskfeed.core import ManifestMismatchError, SchemaError, SettingError


def class_weights(task: str, label: str, label_counts: dict[str, int],
                  label_classes: list[str] | None,
                  spec: str | dict[Any, float] = "balanced") -> dict[int, float]:
    """Weights per class for ``model.fit(..., class_weight=...)``, from the scan's label counts.

    No pass over the data: the scan counted the rows of every class (``label_counts``; of
    the training part only when the manifest is made for a split).

    Parameters
    ----------
    task, label, label_counts, label_classes
        The manifest's (:class:`~daskfeed.manifest._manifest.Manifest`).
    spec
        ``"balanced"``: ``rows / (classes * rows of the class)`` for every class present,
        as scikit-learn's ``compute_class_weight("balanced", ...)``, so each class weighs
        as much in total. Or a mapping ``{class: weight}`` (keys as ints or their text,
        e.g. parsed from ``'{"0": 1, "1": 9}'``; class names for a text label:
        ``{"gold": 5}``), checked against the label's classes;
        classes it leaves out get 1.0, as Keras gives them, and are listed.

    Returns
    -------
    dict of int to float
        ``{class code: weight}`` of every class present in the data (a text label's code i
        is ``classes[i]``).

    Raises
    ------
    SchemaError
        For a regression label or an unknown class.
    SettingError
        For a spec that is neither ``'balanced'`` nor a mapping, or a negative or non-finite
        weight.
    ManifestMismatchError
        For a manifest without label counts (made by an older daskfeed: rescan).
    """
    if task == "regression":
        raise SchemaError(
            f"Expected a class label (0/1 or class ids) for class weights. Received: label "
            f"{label!r}, a regression label.\nHint: weigh rows with a weight column "
            "instead (weight='COL', --weight COL)."
        )
    if not label_counts:
        raise ManifestMismatchError(
            f"Expected the label counts of {label!r} in the manifest. Received: a "
            "manifest without them (made by an older daskfeed).\nHint: rescan the data "
            "(remove manifest.json, or pass manifest=None)."
        )
    codes = {name: i for i, name in enumerate(label_classes or ())}
    counts = {codes[k] if codes else int(k): int(n) for k, n in label_counts.items() if n > 0}
    if isinstance(spec, str):
        if spec != "balanced":
            raise SettingError(f"Expected class weights 'balanced' or a mapping {{class: "
                              f"weight}}. Received: {spec!r}.\nHint: e.g. "
                              "'{\"0\": 1, \"1\": 9}'.")
        total = sum(counts.values())
        return {c: total / (len(counts) * n) for c, n in sorted(counts.items())}
    given = {_class_id(k, counts, label, label_classes): _class_weight(k, v)
             for k, v in spec.items()}
    return {c: given.get(c, 1.0) for c in sorted(counts)}


def _class_id(key: object, counts: dict[int, int], label: str, classes: list[str] | None) -> int:
    """A class of ``spec`` (its id, or its name for a text label) as its code, checked."""
    if classes is not None:
        c = classes.index(str(key)) if str(key) in classes else None
        names, example = classes, f"'{{\"{classes[0]}\": 2}}'" if classes else ""
    else:
        try:
            c = int(str(key).strip())
        except ValueError:
            c = None
        names, example = [str(k) for k in sorted(counts)], "'{\"0\": 1, \"1\": 9}'"
    if c is None or c not in counts:
        raise SchemaError(
            f"Expected class weights for the classes of label {label!r} "
            f"({', '.join(names[:20])}{' ...' if len(names) > 20 else ''}). Received: class "
            f"{key!r}.\nHint: name classes by their {'name' if classes else 'id'}, e.g. {example}."
        )
    return c


def _class_weight(key: object, value: Any) -> float:
    """A weight of ``spec``: a finite number >= 0."""
    try:
        w = float(value)
    except (TypeError, ValueError):
        w = math.nan
    if not (math.isfinite(w) and w >= 0):
        raise SettingError(
            f"Expected a class weight that is a number >= 0. Received: {value!r} for class "
            f"{key!r}.\nHint: e.g. '{{\"0\": 1, \"1\": 9}}'."
        )
    return w
