"""Public docstrings cite public names: what ``help()`` and ``--help`` show names no private module.

The public set: the package's docstring, each subpackage face's (``daskfeed/<pkg>/__init__.py``),
every object in ``daskfeed.__all__`` and in each face's ``__all__`` (a module handed on whole, such
as ``daskfeed.core.config``, with the functions and classes it defines), the public members (no
leading ``_``) those classes define or inherit from daskfeed's own classes, and the ``--help`` of
the ``daskfeed`` command and of each of its commands. Objects that are not daskfeed's own (the
``keras`` module ``daskfeed.adapters`` hands on, a constant's ``int`` or ``tuple``) are skipped:
their docstrings are not daskfeed's to fix. A private module (``daskfeed.reading._files``,
``daskfeed/batches/_stream.py``) is no name a user can look up; a docstring there cites the
public name, a docs/ page, or says it in words. The private modules' own internal docstrings are
not walked.

A bare Sphinx cross-reference (``:class:``, ``:func:``, ``:meth:``, ``:data:``, ``:attr:``, with
or without ``~`` and a dotted prefix) in a public docstring must name something public, too.
Its target resolves when:

* it starts with ``daskfeed``: it is a public path, ``daskfeed.X``, ``daskfeed.<pkg>``,
  ``daskfeed.<pkg>.X`` or either followed by ``.member`` (a public member of the class ``X``);
* it is bare (no dot): it is a public name (in ``daskfeed.__all__`` or a face's ``__all__``), a
  public member of the class whose docstring cites it, or a Python builtin (``dict``, ``len``);
* it is dotted and its first part is a public name or a face (``BatchStream.end``,
  ``batches.StreamState``): the whole, or its last two parts, is ``X.member``, or ``<pkg>.X``;
* it is dotted and its first part is anything else (``keras.Model.fit``, ``numpy.ndarray``,
  ``dask.config.set``): an outside library's name, taken as given.

So ``:class:`EpochTelemetry``` (a private class by its bare name) fails, and so does
``:func:`~daskfeed.batches.window_seed``` (a path through a face that does not hand it on). An
inline literal that is one bare name (````TFDataHandoff````) fails when it is a class daskfeed
defines and no face hands on (and no member of the docstring's class); other literals are left
alone (``fit`` is Keras', a parameter's name is no reference).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import pathlib
import pkgutil
import re
import types
import warnings
from collections.abc import Iterator

import click
from click.testing import CliRunner

import daskfeed
from daskfeed.core import BackendError

# a dotted path through a private module (a Sphinx role's ``~daskfeed.x._y.name`` included), or
# a private module's file; dunders (``Source.__init__``) are no private module
PRIVATE = [re.compile(r"daskfeed(?:\.\w+)*\._(?!_)\w+(?:\.\w+)*"), re.compile(r"daskfeed/(?:\w+/)*_\w+\.py")]


def private_references(text: str | None) -> list[str]:
    return [m.group(0) for pattern in PRIVATE for m in pattern.finditer(text or "")]


def _member_doc(value: object) -> str | None:
    """The docstring ``help()`` shows for a class attribute, or None for plain data (a default)."""
    if isinstance(value, (classmethod, staticmethod)):
        return value.__func__.__doc__
    if isinstance(value, (property, functools.cached_property)) or inspect.isfunction(value) \
            or inspect.isclass(value):
        return value.__doc__
    return None


def _class_members(cls: type) -> Iterator[tuple[str, str | None]]:
    """Public members of ``cls`` defined by it or by daskfeed's classes it stands on."""
    seen: set[str] = set()
    for owner in cls.__mro__:
        if not owner.__module__.startswith("daskfeed"):
            continue
        for name, value in vars(owner).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            yield name, _member_doc(value)


def _cli_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, cmd in group.commands.items():
        yield (*prefix, name)
        if isinstance(cmd, click.Group):
            yield from _cli_paths(cmd, (*prefix, name))


def _faces() -> list[types.ModuleType]:
    return [importlib.import_module(f"daskfeed.{sub.name}")
            for sub in pkgutil.iter_modules(daskfeed.__path__) if not sub.name.startswith("_")]


def _public_objects() -> Iterator[tuple[str, object]]:
    """(public path, object) for each name in ``daskfeed.__all__`` and in each face's ``__all__``."""
    for face in (daskfeed, *_faces()):
        for name in face.__all__:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # DataOptions, a deprecated alias
                    obj = getattr(face, name)
            except BackendError:  # behind an optional extra that is not installed (torch)
                continue
            yield f"{face.__name__}.{name}", obj


def _own(obj: object) -> bool:
    """Whether ``obj`` is daskfeed's own (its docstring is daskfeed's to write)."""
    if inspect.ismodule(obj):
        return obj.__name__.startswith("daskfeed")
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return obj.__module__.startswith("daskfeed")
    return False


def _entries() -> Iterator[tuple[str, str | None, type | types.ModuleType | None]]:
    """(what, its text, the class or module it belongs to or None) for every docstring of the public set.

    An object handed on by two faces (``daskfeed.Source`` is ``daskfeed.reading.Source``) is walked
    once, by the first: the package's own face, then the subpackages' in order.
    """
    yield "daskfeed", daskfeed.__doc__, None
    for face in _faces():
        yield face.__name__, face.__doc__, None
    seen: set[int] = set()
    for path, obj in _public_objects():
        if id(obj) in seen or not _own(obj):
            continue
        seen.add(id(obj))
        if inspect.ismodule(obj):  # handed on whole: its docstring and what it defines
            yield path, obj.__doc__, None
            for name, value in vars(obj).items():
                if not name.startswith("_") and _own(value) and value.__module__ == obj.__name__:
                    yield f"{path}.{name}", value.__doc__, value if inspect.isclass(value) else obj
            continue
        cls = obj if inspect.isclass(obj) else None
        yield path, obj.__doc__, cls
        if cls is not None:
            for member, doc in _class_members(cls):
                yield f"{path}.{member}", doc, cls


def public_docs() -> Iterator[tuple[str, str | None]]:
    """(what, its text) for every docstring and help text of the public set."""
    for what, text, _ in _entries():
        yield what, text
    from daskfeed.cli import cli

    for path in [(), *_cli_paths(cli)]:
        out = CliRunner().invoke(cli, [*path, "--help"], terminal_width=10_000)
        assert out.exit_code == 0, out.output
        yield " ".join(("daskfeed", *path, "--help")), out.output


# a bare Sphinx cross-reference; its target is the last group (``title <target>`` gives ``target``)
ROLE = re.compile(r":(?:class|func|meth|data|attr):`(?:[^`<]*<)?~?\.?([\w.]+)>?`")


# an instance attribute a class sets on itself (``self.signum: int | None = None``)
SELF_ATTRIBUTE = re.compile(r"\bself\.(\w+)\s*(?::[^=\n]*)?=(?!=)")


@functools.cache
def _members(owner: type | types.ModuleType) -> frozenset[str]:
    """Member names of ``owner`` but its ``_private`` ones: a class's attributes, fields, annotations
    and the instance attributes its source sets, its bases' too; a module's names."""
    if inspect.ismodule(owner):
        return frozenset(name for name in vars(owner) if not name.startswith("_"))
    names: set[str] = set()
    for cls in owner.__mro__:
        if cls is object:
            continue
        names |= set(vars(cls)) | set(getattr(cls, "__annotations__", {}))
        if cls.__module__.startswith("daskfeed"):
            try:
                names |= set(SELF_ATTRIBUTE.findall(inspect.getsource(cls)))
            except (OSError, TypeError):
                pass
    return frozenset(name for name in names if not name.startswith("_") or name.endswith("__"))


@functools.cache
def public_names() -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    """daskfeed's public names: (every public name, those a dotted reference may start with — the
    faces, daskfeed's own classes and modules —, their ``X.member``s and ``<pkg>.X``s, the full paths)."""
    names: set[str] = set()
    scopes: set[str] = set()
    dotted: set[str] = set()
    paths: set[str] = {"daskfeed"}
    for face in _faces():
        short = face.__name__.removeprefix("daskfeed.")
        names.add(short)
        scopes.add(short)
        paths.add(face.__name__)
    for face in (daskfeed, *_faces()):  # a name behind an extra that is not installed is public too
        for name in face.__all__:
            names.add(name)
            paths.add(f"{face.__name__}.{name}")
    for path, obj in _public_objects():
        package, _, name = path.rpartition(".")
        names.add(name)
        paths.add(path)
        if package != "daskfeed":
            dotted.add(f"{package.removeprefix('daskfeed.')}.{name}")
        if _own(obj) and (inspect.isclass(obj) or inspect.ismodule(obj)):
            scopes.add(name)
            for member in _members(obj):  # type: ignore[arg-type]
                dotted.add(f"{name}.{member}")
                paths.add(f"{path}.{member}")
    return frozenset(names), frozenset(scopes), frozenset(dotted), frozenset(paths)


def resolves(target: str, owner: type | types.ModuleType | None = None) -> bool:
    """Whether a cross-reference's ``target`` names something public (the rule in this module's docstring)."""
    names, scopes, dotted, paths = public_names()
    parts = target.split(".")
    if any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts):
        return False  # a private module or name, with or without the package in front
    if len(parts) > 1 and parts[0] in unexported_classes():
        return False  # a member of a class no face hands on (``CacheWriter.add_parts``)
    if parts[0] == "daskfeed":
        return target in paths
    if len(parts) == 1:
        return (target in names or hasattr(builtins, target)
                or (owner is not None and target in _members(owner)))
    if parts[0] in scopes:
        return target in dotted or ".".join(parts[-2:]) in dotted
    return True


# an inline literal that is one bare name (``TFDataHandoff``)
LITERAL = re.compile(r"``(\w+)``")


@functools.cache
def unexported_classes() -> frozenset[str]:
    """Names of the classes daskfeed's modules define at top level that no face hands on."""
    root = pathlib.Path(daskfeed.__file__).parent
    defined = {node.name for file in root.rglob("*.py") for node in ast.parse(file.read_text("utf-8")).body
               if isinstance(node, ast.ClassDef)}
    return frozenset(defined - public_names()[0])


def unresolved_references(text: str | None, owner: type | types.ModuleType | None = None) -> list[str]:
    """Cross-references whose target is not public, and literals naming a class no face hands on."""
    roles = [m.group(0) for m in ROLE.finditer(text or "") if not resolves(m.group(1), owner)]
    literals = [m.group(0) for m in LITERAL.finditer(text or "")
                if m.group(1) in unexported_classes()
                and not (owner is not None and m.group(1) in _members(owner))]
    return roles + literals


def test_the_walk_reaches_the_public_set():
    walked = dict(public_docs())
    for name in ("daskfeed", "daskfeed.batches", "daskfeed.DaskSequence", "daskfeed.scan",
                 "daskfeed.Source.partitions", "daskfeed.Manifest.to_dict", "daskfeed.FitOptions.resolve",
                 "daskfeed --help", "daskfeed train --help", "daskfeed cache clear --help"):
        assert name in walked, name
        assert walked[name], f"{name} has no docstring"


def test_public_docstrings_cite_no_private_module():
    offenders = {what: refs for what, text in public_docs() if (refs := private_references(text))}
    count = sum(len(refs) for refs in offenders.values())
    listing = "\n".join(f"  {what}: {', '.join(refs)}" for what, refs in sorted(offenders.items()))
    assert not offenders, f"{count} private references in {len(offenders)} public docstrings:\n{listing}"


def test_the_pattern_catches_every_form():
    text = ("see :func:`~daskfeed.reading._files.make_blocks`, daskfeed.batches._stream.BatchStream "
            "and daskfeed/batches/_stream.py; not daskfeed.Source.__init__ nor daskfeed.batches.BatchStream")
    assert private_references(text) == ["daskfeed.reading._files.make_blocks",
                                        "daskfeed.batches._stream.BatchStream", "daskfeed/batches/_stream.py"]


def test_the_walk_reaches_the_faces():
    walked = dict(public_docs())
    for name in ("daskfeed.batches.BatchStream", "daskfeed.batches.BatchStream.end",
                 "daskfeed.cache.BlockCache", "daskfeed.cache.BlockCache.place", "daskfeed.core.config",
                 "daskfeed.core.config.get"):
        assert name in walked, name
        assert walked[name], f"{name} has no docstring"
    assert "daskfeed.adapters.keras" not in walked  # keras' own, not daskfeed's
    assert "daskfeed.reading.Source" not in walked  # walked once, as daskfeed.Source


def test_public_docstrings_cross_reference_public_names():
    offenders = {what: refs for what, text, owner in _entries()
                 if (refs := unresolved_references(text, owner))}
    count = sum(len(refs) for refs in offenders.values())
    listing = "\n".join(f"  {what}: {', '.join(refs)}" for what, refs in sorted(offenders.items()))
    assert not offenders, f"{count} unresolved references in {len(offenders)} public docstrings:\n{listing}"


def test_the_resolution_rule():
    from daskfeed.batches import BatchStream

    good = ("Source", "daskfeed.Source", "~daskfeed.batches.BatchStream", "BatchStream.end",
            "batches.StreamState", "daskfeed.batches.BatchStream.end", "keras.Model.fit", "numpy.ndarray",
            "dict", "ValueError")
    for target in good:
        assert resolves(target), target
    assert resolves("end", BatchStream)
    assert resolves("__iter__", BatchStream)
    for target in ("EpochTelemetry", "window_seed", "daskfeed.batches.window_seed", "BatchStream.nothing",
                   "daskfeed.batches._stream.BatchStream"):
        assert not resolves(target), target
    text = ":class:`~daskfeed.Source` and :func:`equal_shard_batches`, :data:`DATA_KEYS`"
    assert unresolved_references(text) == [":func:`equal_shard_batches`", ":data:`DATA_KEYS`"]
    assert unresolved_references("``TFDataHandoff``, ``BatchStream``, ``fit``") == ["``TFDataHandoff``"]
