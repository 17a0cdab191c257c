"""The README's and the guides' code runs as written: each ```python block as a script, each ```sh command.

The README first, then the guides in ``docs/`` in the order the README lists them. Run in a
temporary directory holding small demo data at the README's paths (``data/log_quest/…``,
``data/log_quest_validate/…``); ``make`` lines are skipped (they build the environment this
test runs in). Every block must say its language, so none is skipped silently.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psutil
import pytest
from helpers import ROOT

README = str(ROOT / "README.md")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LANGUAGES = {"python", "sh", "text"}


def pages() -> list[str]:
    """The README and the guides it links to in ``docs/``, in the order it lists them."""
    with open(README, encoding="utf-8") as f:
        guides = re.findall(r"\]\((docs/[\w-]+\.md)\)", f.read())
    return [README, *(str(ROOT / g) for g in dict.fromkeys(guides))]


def _found() -> list[tuple[str, str]]:
    out = []
    for page in pages():
        with open(page, encoding="utf-8") as f:
            out += BLOCK.findall(f.read())
    return out


def blocks(language: str) -> list[str]:
    return [body for lang, body in _found() if lang == language]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from daskfeed.cli._demo import write_demo_data

    root = tmp_path_factory.mktemp("readme")
    write_demo_data(root / "data", rows=3000, validate_rows=1000)
    return root


def _env() -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_every_block_says_its_language():
    assert len(pages()) >= 10 and all(os.path.exists(p) for p in pages()), pages()
    langs = [lang for lang, _ in _found()]
    assert langs, "no code blocks found in README.md and the guides"
    assert set(langs) <= LANGUAGES, langs
    assert blocks("python") and blocks("sh")


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs_as_a_script(index, workdir):
    script = workdir / f"readme_{index}.py"
    script.write_text(blocks("python")[index], encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], cwd=workdir, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"README python block {index}:\n{out.stderr[-4000:]}"


def _commands() -> list[str]:
    """The ```sh blocks' commands, ``make`` lines left out (continuation lines joined)."""
    found = []
    for body in blocks("sh"):
        for command in body.replace("\\\n", " ").splitlines():
            command = command.split("#", 1)[0].strip()
            if command and not command.startswith("make "):
                found.append(command)
    return found


def _fit_machine(command: str) -> str:
    """A --memory-limit above this machine's RAM (refused) becomes 4GB; nothing else changes."""
    from dask.utils import parse_bytes

    def fit(m: re.Match[str]) -> str:
        fits = parse_bytes(m.group(1)) <= psutil.virtual_memory().total
        return m.group(0) if fits else "--memory-limit 4GB"

    return re.sub(r"--memory-limit (\S+)", fit, command)


def test_readme_has_shell_commands_to_run():
    commands = _commands()
    assert any(c.startswith("daskfeed train ") for c in commands), commands
    assert any(c.startswith("daskfeed scan ") for c in commands), commands


@pytest.mark.slow  # each a whole `daskfeed train` (the Python blocks stay in make test)
@pytest.mark.parametrize("index", range(len(_commands())))
def test_shell_command_runs(index, workdir):
    command = _fit_machine(_commands()[index])
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=workdir, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"README command {command!r}:\n{out.stderr[-4000:]}"
    if command.startswith("daskfeed train "):
        assert re.search(r"^final: loss \d", out.stdout, re.M) and "wrote " in out.stdout, out.stdout
        if "--validation" in command:  # --validation DATA or --validation-split F: its figure
            assert re.search(r"^val (weighted )?(accuracy|mean absolute error|loss): \d", out.stdout,
                             re.M), out.stdout
        else:
            assert "val " not in out.stdout, out.stdout
    if command.startswith("daskfeed scan "):
        assert "3,000 rows in" in out.stdout, out.stdout
