"""The one place daskfeed imports keras (TensorFlow backend unless the user chose another)."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

__all__ = ["keras"]
