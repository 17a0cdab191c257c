"""docs/torch.md runs as written: its Python loop over TorchDataset on the demo data (then again,
resuming from the checkpoint it wrote), and its command on the PyTorch backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT
from test_backend_matrix import needs

PAGE = ROOT / "docs" / "torch.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(PAGE.read_text(encoding="utf-8")) if lang == language]


@pytest.fixture()
def workdir(tmp_path):
    from daskfeed.cli._demo import write_demo_data

    write_demo_data(tmp_path / "data", rows=6000, validate_rows=1000)
    return tmp_path


def _env() -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.slow  # two epochs and a resume on the demo data (~40 s); make test-torch runs it
def test_the_plain_loop_trains_two_epochs_then_resumes_from_its_checkpoint(workdir) -> None:
    needs("torch")
    [loop] = _blocks("python")
    (workdir / "loop.py").write_text(loop, encoding="utf-8")
    run = subprocess.run([sys.executable, "loop.py"], cwd=workdir, env=_env(), capture_output=True,
                         text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = re.findall(r"epoch (\d): loss ([\d.]+) over ([\d,]+) rows", run.stdout)
    assert [e for e, _, _ in lines] == ["1", "2"], run.stdout
    assert all(r == "6,000" for _, _, r in lines)  # every row once per epoch
    assert float(lines[1][1]) < float(lines[0][1])
    again = subprocess.run([sys.executable, "loop.py"], cwd=workdir, env=_env(),
                           capture_output=True, text=True, timeout=400)
    assert again.returncode == 0 and "epoch" not in again.stdout  # resumed at its end: done


@pytest.mark.slow  # a daskfeed train on PyTorch (~1 min)
def test_the_page_command_trains_on_torch(workdir) -> None:
    needs("torch")
    [command] = [c for c in _blocks("sh")[0].splitlines() if c.strip()]
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=workdir, env=_env(),
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (workdir / "torch-run" / "model.keras").is_file()
    assert (workdir / "torch-run" / "serving" / "saved_model.pb").is_file()
