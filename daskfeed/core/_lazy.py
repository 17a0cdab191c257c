"""Package faces that load a name's private module only when the name is first used (PEP 562)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def attach(package: str, names: Mapping[str, str],
           modules: Mapping[str, str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package's ``__init__``: its face.

    Parameters
    ----------
    package
        The package (its ``__name__``).
    names
        Each public name → the private module of ``package`` that defines it.
    modules
        Each public name → a private module handed on whole (``config`` → ``_config``).

    Returns
    -------
    tuple
        ``(__getattr__, __dir__)``: a name is imported from its module on first use and then
        kept in the package's namespace, so later look-ups cost nothing.
    """
    modules = dict(modules or {})

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(import_module(f"{package}.{names[name]}"), name)
        elif name in modules:
            value = import_module(f"{package}.{modules[name]}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names) | set(modules))

    return __getattr__, __dir__
