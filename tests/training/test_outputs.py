"""model.keras is written whole or not at all: a save that fails halfway leaves the last good model."""

from __future__ import annotations

import os

import numpy as np
import pytest

from daskfeed.adapters import keras
from daskfeed.training._outputs import save_model


class _FailsWhileWritingWeights(keras.layers.Layer):
    """Its weights' write fails after Keras has begun writing the archive."""

    def call(self, x):
        return x

    def save_own_variables(self, store):
        raise OSError(28, "No space left on device")


def _model(extra: keras.layers.Layer | None = None) -> keras.Model:
    x = keras.Input(shape=(3,))
    h = keras.layers.Dense(2)(x)
    return keras.Model(x, extra(h) if extra is not None else h)


def test_a_save_that_fails_halfway_leaves_the_last_good_model(tmp_path):
    good = _model()
    path = save_model(good, str(tmp_path))
    assert path == str(tmp_path / "model.keras") and os.listdir(tmp_path) == ["model.keras"]
    before = (tmp_path / "model.keras").read_bytes()
    with pytest.raises(OSError, match="No space left"):
        save_model(_model(_FailsWhileWritingWeights()), str(tmp_path))
    assert (tmp_path / "model.keras").read_bytes() == before and os.listdir(tmp_path) == ["model.keras"]
    x = np.ones((4, 3), "float32")
    np.testing.assert_allclose(keras.models.load_model(path).predict(x, verbose=0),
                               good.predict(x, verbose=0))
