"""The README's and the guides' code runs as written: each ```python block as a script, each ```sh command.

The README first, then the guides in ``docs/`` in the order the README lists them. Each block
and each command runs in a directory of its own, holding small demo data at the README's paths
(``data/log_quest/…``, ``data/log_quest_validate/…``) and what it needs prepared: a
``daskfeed predict RUN`` command gets the run the README's own ``daskfeed train … --output RUN``
writes, trained by the test (once per module, copied), so no command relies on another having
run before it, in any order or on any xdist worker. ``make`` lines are skipped (they build the
environment this test runs in). Every block must say its language, so none is skipped silently.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import psutil
import pytest
from helpers import ROOT

README = str(ROOT / "README.md")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LANGUAGES = {"python", "sh", "text"}


# its blocks need the torch extra: tests/backends/test_torch_docs.py runs them (make test-torch)
NEEDS_TORCH = {"docs/torch.md"}


def pages() -> list[str]:
    """The README and the guides it links to in ``docs/``, in the order it lists them."""
    with open(README, encoding="utf-8") as f:
        guides = re.findall(r"\]\((docs/[\w-]+\.md)\)", f.read())
    return [README, *(str(ROOT / g) for g in dict.fromkeys(guides) if g not in NEEDS_TORCH)]


def _found() -> list[tuple[str, str]]:
    out = []
    for page in pages():
        with open(page, encoding="utf-8") as f:
            out += BLOCK.findall(f.read())
    return out


def blocks(language: str) -> list[str]:
    return [body for lang, body in _found() if lang == language]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo data at the README's paths, written once (read, never written, by the commands)."""
    from daskfeed.cli._demo import write_demo_data

    root = tmp_path_factory.mktemp("readme-data")
    write_demo_data(root / "data", rows=3000, validate_rows=1000)
    return root / "data"


@pytest.fixture()
def workdir(tmp_path, demo):
    """A directory of this test's own, the demo data at ``data/``."""
    (tmp_path / "data").symlink_to(demo, target_is_directory=True)
    return tmp_path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo):
    """``trained(run)``: a directory holding the run the README's train command for ``run`` writes."""
    made: dict[str, str] = {}

    def train(run: str) -> str:
        if run not in made:
            [command] = [c for c in _commands() if c.startswith("daskfeed train ")
                         and re.search(rf"--output {re.escape(run)}(\s|$)", c)]
            root = tmp_path_factory.mktemp(f"readme-{run}")
            (root / "data").symlink_to(demo, target_is_directory=True)
            _run(_fit_machine(_prepared(command)), root)
            made[run] = str(root / run)
        return made[run]

    return train


def _run(command: str, cwd) -> subprocess.CompletedProcess:
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"README command {command!r}:\n{out.stderr[-4000:]}"
    return out


def _env() -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_every_block_says_its_language():
    assert len(pages()) >= 10 and all(os.path.exists(p) for p in pages()), pages()
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    assert all(f"]({page})" in readme for page in NEEDS_TORCH)  # linked, run elsewhere
    langs = [lang for lang, _ in _found()]
    assert langs, "no code blocks found in README.md and the guides"
    assert set(langs) <= LANGUAGES, langs
    assert blocks("python") and blocks("sh")


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs_as_a_script(index, workdir):
    script = workdir / f"readme_{index}.py"
    script.write_text(blocks("python")[index], encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], cwd=workdir, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"README python block {index}:\n{out.stderr[-4000:]}"


# what a run of the README's example must not print: Keras' "shuffle ignored" warning, TensorFlow's
# load-time log lines, distributed's warning of a task cancelled by its worker's close
NOISE = ("`shuffle=True` was passed", "oneDNN custom operations", "absl::InitializeLog",
         "ended with CancelledError")


@pytest.mark.slow  # a whole fit on a cluster of its own (CI's slow tier)
def test_the_readme_example_prints_no_expected_noise(workdir):
    """The README's Python example as a user runs it (no TF_CPP_MIN_LOG_LEVEL of their own)."""
    script = workdir / "readme_example.py"
    script.write_text(blocks("python")[0], encoding="utf-8")
    env = {k: v for k, v in _env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-W", "always", str(script)], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "Epoch 3/3" in out.stdout + out.stderr  # it ran: Keras' progress
    said = [n for n in NOISE if n in out.stderr]
    assert not said, f"{said}:\n{out.stderr[-4000:]}"


def _commands() -> list[str]:
    """The ```sh blocks' commands, ``make`` lines left out (continuation lines joined)."""
    return [command for _, command in _block_commands()]


def _block_commands() -> list[tuple[int, str]]:
    """Each ```sh block's commands with the block's index."""
    found = []
    for i, body in enumerate(blocks("sh")):
        for command in body.replace("\\\n", " ").splitlines():
            command = command.split("#", 1)[0].strip()
            if command and not command.startswith("make "):
                found.append((i, command))
    return found


def _prepared(command: str) -> str:
    """``command`` after what prepares its files: the commands before it in its block that are
    not daskfeed's (``mkdir``, ``awk``: a guide that makes its own data), joined with ``&&``."""
    listed = _block_commands()
    at = next(k for k, (_, c) in enumerate(listed) if c == command)
    block = listed[at][0]
    before = [c for b, c in listed[:at] if b == block and not c.startswith("daskfeed ")]
    return " && ".join([*before, command])


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


def test_every_predicted_run_is_trained_by_a_readme_command():
    trained_runs = {m.group(1) for c in _commands() if c.startswith("daskfeed train ")
                    for m in [re.search(r"--output (\S+)", c)] if m}
    predicted = {c.split()[2] for c in _commands() if c.startswith(("daskfeed predict ", "daskfeed rows "))}
    assert predicted and predicted <= trained_runs, (predicted, trained_runs)


@pytest.mark.slow  # each a whole `daskfeed train` (the Python blocks are slow too)
@pytest.mark.parametrize("index", range(len(_commands())))
def test_shell_command_runs(index, workdir, trained):
    command = _fit_machine(_commands()[index])
    if command.startswith(("daskfeed predict ", "daskfeed rows ")):  # its run, prepared here
        run = command.split()[2]
        shutil.copytree(trained(run), workdir / run)
    out = _run(_fit_machine(_prepared(_commands()[index])), workdir)
    if command.startswith("daskfeed train "):
        assert re.search(r"^final: loss \d", out.stdout, re.M) and "wrote " in out.stdout, out.stdout
        if "--validation" in command:  # --validation DATA or --validation-split F: its figure
            assert re.search(r"^val (weighted )?(accuracy|mean absolute error|loss): \d", out.stdout,
                             re.M), out.stdout
        else:
            assert "val " not in out.stdout, out.stdout
    if command.startswith("daskfeed scan "):
        assert "3,000 rows in" in out.stdout, out.stdout
    if command.startswith("daskfeed rows "):  # a batch's rows, each with its file and line
        rows = out.stdout.splitlines()
        header = rows[0] if "--format csv" in command else rows[1]
        assert all(c in header for c in ("file", "line", "block", "block_row")), out.stdout[:2000]
        assert len(rows) > 64, out.stdout[:2000]
    if command.startswith("daskfeed predict "):  # a score for every validation row, in a file
        import pandas as pd

        path = workdir / re.search(r"--output (\S+)", command).group(1)
        scores = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        assert len(scores) == 1000 and scores.notna().all().all(), scores.head()
