"""Public docstrings cite public names: what ``help()`` and ``--help`` show names no private module.

The public set: the package's docstring, each subpackage face's (``daskfeed/<pkg>/__init__.py``),
every object in ``daskfeed.__all__``, the public members (no leading ``_``) those classes define or
inherit from daskfeed's own classes, and the ``--help`` of the ``daskfeed`` command and of each of
its commands. A private module (``daskfeed.reading._files``, ``daskfeed/batches/_stream.py``) is
no name a user can look up; a docstring there cites the public name, a docs/ page, or says it in words.
The private modules' own internal docstrings are not walked.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import warnings
from collections.abc import Iterator
from functools import cached_property

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
    if isinstance(value, (property, cached_property)) or inspect.isfunction(value) or inspect.isclass(value):
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


def public_docs() -> Iterator[tuple[str, str | None]]:
    """(what, its text) for every docstring and help text of the public set."""
    yield "daskfeed", daskfeed.__doc__
    for sub in pkgutil.iter_modules(daskfeed.__path__):
        if not sub.name.startswith("_"):
            face = importlib.import_module(f"daskfeed.{sub.name}")
            yield face.__name__, face.__doc__
    for name in daskfeed.__all__:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # DataOptions, a deprecated alias
                obj = getattr(daskfeed, name)
        except BackendError:  # behind an optional extra that is not installed (torch)
            continue
        yield f"daskfeed.{name}", obj.__doc__
        if inspect.isclass(obj):
            for member, doc in _class_members(obj):
                yield f"daskfeed.{name}.{member}", doc
    from daskfeed.cli import cli

    for path in [(), *_cli_paths(cli)]:
        out = CliRunner().invoke(cli, [*path, "--help"], terminal_width=10_000)
        assert out.exit_code == 0, out.output
        yield " ".join(("daskfeed", *path, "--help")), out.output


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
