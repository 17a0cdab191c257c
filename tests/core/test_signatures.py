"""No function over 10 parameters outside a settings object (issue 43, item 4).

Settings travel as one resolved object (``DataSettings``, ``ClusterSpec``, ``TrainOptions``...),
not as long argument lists. Two kinds of function may take more: a settings class's own
``resolve`` (it is where the settings are named, one keyword each), and the public entries
whose explicit keyword-only signatures users call (``DaskSequence``, ``TorchDataset``,
``daskfeed.scan``, ``daskfeed.predict``: a Keras or Dask user expects the keywords spelled
out, as in ``keras.Model.fit``); ``tests/batches/test_settings.py`` checks the entries
against the one list of settings.
"""

from __future__ import annotations

import ast
from pathlib import Path

import daskfeed

MOST = 10
PUBLIC_ENTRIES = {"adapters/_sequence.py:DaskSequence.__init__",
                  "adapters/_torch.py:TorchDataset.__init__",
                  "scanning/_scan.py:scan", "inference/_predict.py:predict"}
SETTINGS_CLASSES = ("Settings", "Options", "Spec")  # a class named so is a settings object


def _long_functions() -> dict[str, int]:
    """Every function of the package with more than MOST parameters: ``file:Class.name`` → count."""
    package = Path(daskfeed.__file__).parent
    found: dict[str, int] = {}

    def visit(node: ast.AST, path: str, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, path, child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]
                         if x.arg not in ("self", "cls")]
                count = len(names) + bool(a.vararg) + bool(a.kwarg)
                if count > MOST:
                    found[f"{path}:{owner + '.' if owner else ''}{child.name}"] = count
                visit(child, path, owner)

    for file in sorted(package.rglob("*.py")):
        visit(ast.parse(file.read_text(encoding="utf-8")), str(file.relative_to(package)), "")
    return found


def test_no_function_over_ten_parameters_outside_a_settings_object():
    found = _long_functions()
    assert set(PUBLIC_ENTRIES) <= set(found)  # (the walk sees them: the check can fail)
    resolvers = {name for name in found
                 if name.endswith(".resolve") and name.split(":")[1].split(".")[0].endswith(SETTINGS_CLASSES)}
    assert resolvers, found  # DataSettings.resolve, FitOptions.resolve
    others = {name: n for name, n in found.items() if name not in PUBLIC_ENTRIES | resolvers}
    assert others == {}, (f"functions over {MOST} parameters (pass a settings object or a "
                          f"record instead): {others}")
