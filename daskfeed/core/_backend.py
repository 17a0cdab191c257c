"""The Keras backend daskfeed runs on, chosen from the environment before keras is imported.

TensorFlow by default, or JAX; others refused. Under JAX, 64-bit types are on unless
``JAX_ENABLE_X64`` says otherwise: daskfeed's batches carry int64 / float64 columns exactly
(values beyond float32's 2**24), which JAX would narrow to 32 bits.
"""

from __future__ import annotations

import os

from daskfeed.core._exceptions import BackendError

__all__ = ["BACKENDS", "FEEDS", "choose", "refuse"]

#: The Keras backends daskfeed is tested on (tests/core/test_backend.py).
BACKENDS = ("tensorflow", "jax")
#: How batches reach Keras (``--feed`` / ``daskfeed.feed``): ``windows`` (a tf.data pipeline,
#: TensorFlow only), ``batches`` (the ``PyDataset``) or ``auto`` (the first on TensorFlow).
FEEDS = ("auto", "windows", "batches")
_HINT = ("Hint: KERAS_BACKEND=tensorflow (the default) or KERAS_BACKEND=jax; daskfeed is not "
         "tested on the torch, numpy or openvino backends, so it refuses them.")


def refuse(backend: str) -> None:
    """Refuse a backend daskfeed does not run on.

    Parameters
    ----------
    backend
        The backend's name.

    Raises
    ------
    BackendError
        ``backend`` is not one of :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise BackendError(f"Expected the Keras backend tensorflow or jax. Received: "
                           f"KERAS_BACKEND={backend!r}.\n{_HINT}")


def choose() -> str:
    """Set ``KERAS_BACKEND`` (and its defaults) for the keras import to come; refuse others.

    Returns
    -------
    str
        The backend.

    Raises
    ------
    BackendError
        ``KERAS_BACKEND`` names a backend daskfeed does not run on.
    """
    backend = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    refuse(backend)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend == "jax":
        os.environ.setdefault("JAX_ENABLE_X64", "1")
    return backend
