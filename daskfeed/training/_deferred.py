"""Keras' optional imports that ``daskfeed train`` never uses, put off until something uses them.

Importing keras imports, besides TensorFlow, packages only some of its functions need, when they
are installed: ``matplotlib.pyplot`` for ``keras.visualization`` (0.7 s of a 2-core machine's
start, as long as a reused scan of 20,000 files), and, on the TensorFlow backend, ``jax`` for
TensorFlow Lite's converter of JAX functions (0.9 s; installed with ``daskfeed[jax]``). Keras and
TensorFlow import them inside ``try: ... except ImportError``. :func:`keras_imported` imports
keras with those imports refused *in the importing thread only* (other threads import as ever),
then sets each module's name to a stand-in that imports the package at its first use, so every
function of keras and TensorFlow works as it did: only the seconds move, to a use that
``daskfeed train`` never makes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

# module → (its global, what the global was imported as): set after keras loaded, where None
_DEFERRED = {
    "keras.src.visualization.plot_image_gallery": ("plt", "matplotlib.pyplot"),
    "keras.src.visualization.plot_bounding_box_gallery": ("patches", "matplotlib.patches"),
}
_JAX_JIT = ("tensorflow.lite.python.util", "tensorflow.lite.python.lite")  # each: _jit = jax.jit


class _Later:
    """A module imported at the first use of one of its attributes."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<{self._name}, imported at its first use>"


def _jit(*args: Any, **kwargs: Any) -> Any:
    """``jax.jit``, imported at its first use (TensorFlow Lite's converter of JAX functions)."""
    from jax import jit

    return jit(*args, **kwargs)


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses packages to the threads that name them: their imports of them fail.

    One finder, put first in ``sys.meta_path`` once and never taken out: importlib walks that
    list itself while it imports, so a finder taken out while another thread's import walks it
    shifts the rest and that import skips one finder — the path finder, say, and a module that is
    installed is reported missing (the likeliest cause of a trainer's ``import matplotlib``
    failing on ``No module named 'cycler'`` in CI). Put in, a finder is at worst asked twice.
    With no thread refusing anything it returns at once.
    """

    def __init__(self) -> None:
        self._refused: dict[threading.Thread, frozenset[str]] = {}

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> None:
        if self._refused:
            refused = self._refused.get(threading.current_thread())
            if refused is not None and name.partition(".")[0] in refused:
                raise ModuleNotFoundError(f"{name} is imported at its first use", name=name)
        return None

    @contextmanager
    def refusing(self, packages: set[str]) -> Iterator[None]:
        """Refuse ``packages`` (and their modules) to the calling thread while in the block."""
        thread = threading.current_thread()
        with _INSTALL:
            if not any(f is self for f in sys.meta_path):
                sys.meta_path.insert(0, self)
        self._refused[thread] = frozenset(packages)
        try:
            yield
        finally:
            del self._refused[thread]


_INSTALL = threading.Lock()
REFUSE = _Refuse()


def keras_imported(load: Callable[[], object], backend: str) -> None:
    """Run ``load`` (which imports keras) with keras' unused optional imports put off.

    Parameters
    ----------
    load
        Imports keras (its errors are raised as they are).
    backend
        The keras backend chosen: ``jax`` is put off only on another one.
    """
    wanted = {"matplotlib"} | ({"jax"} if backend != "jax" else set())
    packages = {p for p in wanted if p not in sys.modules and importlib.util.find_spec(p)}
    if not packages or "keras" in sys.modules:
        load()
        return
    try:
        with REFUSE.refusing(packages):
            load()
    finally:
        _stand_ins(packages)


def _stand_ins(packages: set[str]) -> None:
    """Where keras or TensorFlow kept None for a refused import, a stand-in imported at first use."""
    for name, (attr, imported) in _DEFERRED.items():
        module = sys.modules.get(name)
        if imported.split(".")[0] in packages and module is not None and getattr(module, attr, 0) is None:
            setattr(module, attr, _Later(imported))
    if "jax" in packages:
        for name in _JAX_JIT:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "_jit", 0) is None:
                module._jit = _jit  # type: ignore[attr-defined]
