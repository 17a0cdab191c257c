"""The one place daskfeed imports keras: the TensorFlow backend by default, or JAX; others refused.

Under JAX, 64-bit types are on unless ``JAX_ENABLE_X64`` says otherwise: daskfeed's batches carry
int64 / float64 columns exactly (values beyond float32's 2**24), which JAX would narrow to 32 bits.
"""

from __future__ import annotations

import os

from daskfeed.exceptions import BackendError, SchemaError

#: The Keras backends daskfeed is tested on (tests/test_backends.py).
BACKENDS = ("tensorflow", "jax")
_HINT = ("Hint: KERAS_BACKEND=tensorflow (the default) or KERAS_BACKEND=jax; daskfeed is not "
         "tested on the torch, numpy or openvino backends, so it refuses them.")


def _refuse(backend: str) -> None:
    if backend not in BACKENDS:
        raise BackendError(f"Expected the Keras backend tensorflow or jax. Received: "
                           f"KERAS_BACKEND={backend!r}.\n{_HINT}")


_refuse(os.environ.setdefault("KERAS_BACKEND", "tensorflow"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ["KERAS_BACKEND"] == "jax":
    os.environ.setdefault("JAX_ENABLE_X64", "1")

import keras  # noqa: E402  (after the backend is chosen)

_refuse(keras.backend.backend())  # keras imported earlier with another backend

__all__ = ["BACKENDS", "keras", "refuse_narrowed"]


def refuse_narrowed(dtypes: dict[str, str]) -> None:
    """Refuse int64 / float64 columns that the backend would narrow to 32 bits.

    Only JAX with 64-bit types off (``JAX_ENABLE_X64=0``, or jax imported before daskfeed
    without it) narrows them, silently: an int64 id or timestamp would wrap around.

    Parameters
    ----------
    dtypes
        Column name → the dtype its batches carry (features and label).

    Raises
    ------
    SchemaError
        Naming the 64-bit columns, when the backend would narrow them.
    """
    if keras.backend.backend() != "jax":
        return
    import jax

    if jax.config.read("jax_enable_x64"):
        return
    wide = [name for name, dtype in dtypes.items() if dtype in ("int64", "float64")]
    if wide:
        raise SchemaError(
            "Expected 64-bit types on the JAX backend for columns whose values float32 cannot "
            f"hold exactly. Received: columns {wide} as int64/float64, with jax_enable_x64 off "
            "(JAX would narrow them to 32 bits).\nHint: set JAX_ENABLE_X64=1 before jax is "
            f"imported, or leave the columns out (exclude={wide!r})."
        )
