"""Package faces (daskfeed.core._lazy.attach): a name loads its private module on first use."""

from __future__ import annotations

import importlib
import sys

import pytest

from daskfeed.core import BackendError
from daskfeed.core._lazy import attach

# Names behind an optional extra: without it they are a BackendError naming the extra, not a crash.
NEEDS_TORCH = {("adapters", "TorchDataset"), ("adapters", "set_torch_threads")}


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True

SUBPACKAGES = ["core", "cluster", "dashboard", "reading", "cache", "manifest", "scanning", "batches",
               "checkpoint", "adapters", "inference", "training", "cli"]


@pytest.fixture
def face(tmp_path, monkeypatch):
    """A package ``facepkg`` whose ``__init__`` is a face over ``_one`` and ``_two``."""
    pkg = tmp_path / "facepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from daskfeed.core._lazy import attach\n"
        "__getattr__, __dir__ = attach(__name__, {'one': '_one', 'ONE_TOO': '_one'}, {'two': '_two'})\n"
        "PLAIN = 3\n")
    (pkg / "_one.py").write_text("LOADS = []\nLOADS.append(1)\none = 'the one'\nONE_TOO = 11\n")
    (pkg / "_two.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("facepkg")
    for name in [m for m in sys.modules if m == "facepkg" or m.startswith("facepkg.")]:
        del sys.modules[name]


def test_a_name_loads_its_module_on_first_use_and_is_then_kept(face):
    assert "facepkg._one" not in sys.modules
    assert face.one == "the one"
    assert "facepkg._one" in sys.modules and vars(face)["one"] == "the one"  # kept: no more look-ups
    assert face.ONE_TOO == 11 and sys.modules["facepkg._one"].LOADS == [1]  # loaded once
    assert "facepkg._two" not in sys.modules


def test_a_module_handed_on_whole(face):
    two = face.two
    assert two is sys.modules["facepkg._two"] and two.VALUE == 2


def test_dir_lists_the_face_s_names_before_they_are_loaded(face):
    names = dir(face)
    assert {"one", "ONE_TOO", "two", "PLAIN"} <= set(names) and names == sorted(names)
    assert "facepkg._one" not in sys.modules


def test_an_unknown_name_is_an_attribute_error_naming_the_package(face):
    with pytest.raises(AttributeError, match=r"^module 'facepkg' has no attribute 'three'$"):
        face.three  # noqa: B018
    assert not hasattr(face, "_one_private")


def test_attach_alone_returns_the_pair():
    getattr_, dir_ = attach("daskfeed.core", {"warn_user": "_exceptions"})
    from daskfeed.core._exceptions import warn_user

    assert getattr_("warn_user") is warn_user and "warn_user" in dir_()


@pytest.mark.parametrize("sub", SUBPACKAGES)
def test_every_name_of_every_face_resolves(sub):
    """What each subpackage's ``__all__`` promises is there (a face naming a moved name fails here)."""
    pkg = importlib.import_module(f"daskfeed.{sub}")
    assert pkg.__all__, sub
    missing = [n for n in pkg.__all__ if n not in dir(pkg)]
    assert missing == [], f"daskfeed.{sub}: __all__ names {missing}, its __dir__ does not"
    for name in pkg.__all__:
        if (sub, name) in NEEDS_TORCH and not _has_torch():
            hint = r"(?s)Expected PyTorch installed .*Hint: pip install 'daskfeed\[torch\]'"
            with pytest.raises(BackendError, match=hint):
                getattr(pkg, name)
            continue
        assert getattr(pkg, name) is not None, f"daskfeed.{sub}.{name}"


def test_the_top_face_resolves_too():
    """``daskfeed``'s own ``__all__``: each name is there (or, behind an extra not installed, names it)."""
    import daskfeed

    for name in daskfeed.__all__:
        if ("adapters", name) in NEEDS_TORCH and not _has_torch():
            with pytest.raises(BackendError, match="daskfeed\\[torch\\]"):
                getattr(daskfeed, name)
            continue
        assert getattr(daskfeed, name) is not None, f"daskfeed.{name}"


def _face(path) -> tuple[dict[str, str], dict[str, str], set[str], set[str]]:
    """A face's type-checking imports and its lazy map (name -> where), ``__all__``, eager imports.

    Read from the source (ast): what import-linter and mypy see is the ``if TYPE_CHECKING:``
    block; what runs is the ``attach`` call's maps.
    """
    import ast

    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text())
    typed: dict[str, str] = {}
    lazy: dict[str, str] = {}
    names: set[str] = set()
    eager: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module not in ("__future__", "typing"):
            eager |= {alias.asname or alias.name for alias in node.names}
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                for alias in imp.names:
                    typed[alias.asname or alias.name] = f"{imp.module}.{alias.name}"
        elif isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__":
            names = set(ast.literal_eval(node.value))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", None) == "attach":
            maps = [ast.literal_eval(a) for a in node.value.args[1:]]
            for kw in node.value.keywords:
                maps.append(ast.literal_eval(kw.value))
            for i, mapping in enumerate(maps):
                for name, module in mapping.items():
                    # names: the module's attribute; modules (the second map): the module itself
                    lazy[name] = f"{package}.{module}" + ("" if i else f".{name}")
    return typed, lazy, names, eager


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2] / "daskfeed"


@pytest.mark.parametrize("sub", ["", *SUBPACKAGES])
def test_each_face_s_type_checking_imports_equal_its_lazy_map_and_its_all(sub):
    """What import-linter and mypy see (the ``TYPE_CHECKING`` block) is what runs (``attach``)."""
    typed, lazy, names, eager = _face(ROOT / sub / "__init__.py")
    assert lazy, sub
    resolved = {k: v.replace("daskfeed.core._config.config", "daskfeed.core._config")  # (whole)
                for k, v in typed.items() if k not in DEPRECATED}
    assert resolved == {k: v for k, v in lazy.items() if k not in DEPRECATED}, sub
    assert DEPRECATED & set(typed) == DEPRECATED & set(lazy), sub
    assert set(lazy) <= names <= set(lazy) | eager, sub  # (the top face: error classes at once)


# old names kept with a deprecation warning: typed as the new, loaded through the old module
DEPRECATED = {"DataOptions"}


def test_the_faces_are_the_only_all():
    """A name is listed once, in its subpackage's face: no private module keeps an ``__all__``."""
    import ast
    from pathlib import Path

    import daskfeed

    package = Path(daskfeed.__file__).parent
    modules = [p for p in sorted(package.rglob("*.py")) if p.name != "__init__.py"]
    assert len(modules) > 50  # (the walk sees the private modules)

    def names_all(node: ast.stmt) -> bool:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        return any(getattr(t, "id", "") == "__all__" for t in targets)

    listing = [str(p.relative_to(package)) for p in modules
               if any(names_all(n) for n in ast.parse(p.read_text(encoding="utf-8")).body)]
    assert listing == []
