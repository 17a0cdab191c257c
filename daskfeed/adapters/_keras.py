"""The one place daskfeed imports keras, with the backend :mod:`daskfeed.core._backend` chose.

TensorFlow by default, JAX or PyTorch; others refused (also when keras was imported earlier with
one).
"""

from __future__ import annotations

from daskfeed.core import SettingError, choose, native_logs_filtered, refuse

choose()

with native_logs_filtered():  # TensorFlow's load-time INFO lines, which TF_CPP_MIN_LOG_LEVEL misses
    import keras  # (after the backend is chosen)

refuse(keras.backend.backend())  # keras imported earlier with another backend


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
    SettingError
        Naming the 64-bit columns, when the backend would narrow them.
    """
    if keras.backend.backend() != "jax":
        return
    import jax

    if jax.config.read("jax_enable_x64"):
        return
    wide = [name for name, dtype in dtypes.items() if dtype in ("int64", "float64")]
    if wide:
        raise SettingError(
            "Expected 64-bit types on the JAX backend for columns whose values float32 cannot "
            f"hold exactly. Received: columns {wide} as int64/float64, with jax_enable_x64 off "
            "(JAX would narrow them to 32 bits).\nHint: set JAX_ENABLE_X64=1 before jax is "
            f"imported, or leave the columns out (exclude={wide!r})."
        )
