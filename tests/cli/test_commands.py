"""The command line, run as real subprocesses: light imports, clear errors, a real train."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

BIN = os.path.dirname(sys.executable)
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


def run(*args: str, timeout: float = 300, cwd: str | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("daskfeed", path=BIN) or "daskfeed"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV, cwd=cwd)


def test_import_and_help_load_neither_keras_nor_tensorflow():
    code = (
        "import sys, daskfeed\n"
        "assert daskfeed.__version__\n"
        "from daskfeed.cli._commands import cli\n"
        "for args in (['--help'], ['train', '--help'], ['demo', '--help']):\n"
        "    try:\n"
        "        cli(args)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "heavy = [m for m in ('keras', 'tensorflow', 'pandas', 'distributed') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    heavy = out.stdout.strip().splitlines()[-1]
    assert "keras" not in heavy and "tensorflow" not in heavy, heavy


def test_console_script_and_dask_plugin_help():
    out = run("--help")
    assert out.returncode == 0 and "train" in out.stdout and "demo" in out.stdout
    out = run("train", "--help")
    for flag in ("--label", "--validation", "--features", "--exclude", "--epochs", "--batch-size",
                 "--memory-limit", "--nworkers", "--dashboard-address", "--model", "--seed",
                 "--output"):
        assert flag in out.stdout, flag
    dask = shutil.which("dask", path=BIN)
    out = subprocess.run([dask, "feed", "--help"], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert out.returncode == 0 and "train" in out.stdout, out.stderr


@pytest.mark.parametrize(("args", "status"), [(["--version"], 0), (["train", "--bogus"], 2)])
def test_the_command_ends_past_tensorflows_teardown_as_the_interpreter_would(args, status, tmp_path):
    """With TensorFlow loaded, main() ends the process itself: same status and output, the
    threads joined and the exit hooks run (a file written by each), the streams flushed."""
    done = tmp_path / "done"
    code = (
        "import atexit, sys, threading\n"
        "import tensorflow\n"
        f"def mark(what): open({str(done)!r}, 'a').write(what + '\\n')\n"
        "atexit.register(mark, 'atexit')\n"
        "threading.Thread(target=lambda: (sum(range(10**7)), mark('thread'))).start()  # busy\n"
        "print('unflushed output', end='')\n"
        f"sys.argv = ['daskfeed', *{args!r}]\n"
        "from daskfeed.cli._commands import main\n"
        "main()\n"
        "mark('returned')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert out.returncode == status, out.stderr[-2000:]
    assert out.stdout.startswith("unflushed output")
    assert ("daskfeed, version" in out.stdout) if status == 0 else ("No such option" in out.stderr)
    assert sorted(done.read_text().split()) == ["atexit", "thread"]  # and main() never returned


def test_missing_label_is_a_clear_error_without_traceback(demo_data, tmp_path):
    out = run("train", demo_data.train_glob, "--label", "clearedd", "--memory-limit", "3GB",
              "--nworkers", "1", "--dashboard-address", "", "--output", str(tmp_path / "o"))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr + out.stdout
    assert "Error: Expected a label column 'clearedd'" in out.stderr
    assert "did you mean 'cleared'" in out.stderr


def test_glob_matching_nothing_is_a_clear_error(tmp_path):
    pattern = str(tmp_path / "nothing" / "**" / "*.csv")
    out = run("train", pattern, "--label", "y", "--memory-limit", "3GB")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr + out.stdout
    assert "No file matches" in out.stderr and "Hint:" in out.stderr
    assert "memory limit:" not in out.stdout  # refused before a cluster started


def test_a_missing_path_is_refused_before_a_cluster_starts(small_data, tmp_path):
    """train (library) and scan: a local path naming nothing fails at once (predict: test_predict)."""
    from daskfeed.core._exceptions import DataNotFoundError
    from daskfeed.training._train import train

    lines: list[str] = []
    with pytest.raises(DataNotFoundError, match="No such file"):
        train([small_data.train_glob, str(tmp_path / "typo.csv")], label="cleared",
              output=str(tmp_path / "o"), echo=lines.append)
    with pytest.raises(DataNotFoundError, match="No file matches"):
        train(small_data.train_glob, label="cleared", validation=str(tmp_path / "v" / "*.csv"),
              output=str(tmp_path / "o"), echo=lines.append)
    assert lines == []  # nothing started, nothing said
    out = run("scan", str(tmp_path / "typo.csv"), "--label", "y")
    assert out.returncode == 1 and "No such file" in out.stderr
    assert "memory limit:" not in out.stdout


@pytest.mark.parametrize("bad", ["", "-1GB", "abc", "900TB"])
def test_nonsense_memory_limit_is_a_usage_error(bad, tmp_path):
    out = run("train", str(tmp_path), "--label", "y", "--memory-limit", bad)
    assert out.returncode == 2
    assert "Usage:" in out.stderr and "--memory-limit" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_demo_writes_the_old_layout_and_trains(tmp_path):
    out = run("demo", "--rows", "6000", "--validate-rows", "2000", "--epochs", "1",
              "--nworkers", "1", "--dashboard-address", "127.0.0.1:0", cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    # where the README's commands look: data/log_quest/**/*.csv and data/log_quest_validate/
    assert (tmp_path / "data/log_quest/splited/split_data_00005.csv").exists()
    assert (tmp_path / "data/log_quest_validate/splited/split_data_00001.csv").exists()
    assert "val accuracy:" in out.stdout
    assert (tmp_path / "demo-out" / "model.keras").exists()


def test_train_end_to_end_with_real_worker_processes(demo_data, tmp_path):
    out_dir = tmp_path / "run"
    out = run("train", demo_data.train_glob, "--label", "cleared", "--validation",
              demo_data.validate_glob, "--epochs", "1", "--memory-limit", "3GB", "--nworkers", "2",
              "--exclude", "hour", "--dashboard-address", "127.0.0.1:0", "--output", str(out_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "memory limit: 3GB = 3.00 GB (2.79 GiB)" in out.stdout
    assert "dashboard: http://127.0.0.1:" in out.stdout
    assert "val accuracy:" in out.stdout
    assert {"model.keras", "manifest.json", "history.json"} <= set(os.listdir(out_dir))
    hist = json.loads((out_dir / "history.json").read_text())
    assert hist["epochs"][0]["rows"] == demo_data.train_rows
    man = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    assert "東京" in man["columns"]["region"]["vocabulary"]


# -- settings: flag > dask.config (DASK_DASKFEED__…) > shipped default, for the CLI too ----------

@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """6 files of 1000 quest rows (about 100 kB each)."""
    from daskfeed.cli._demo import write_demo_data

    return write_demo_data(tmp_path_factory.mktemp("small"), rows=6000, validate_rows=2000)


def run_env(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = shutil.which("daskfeed", path=BIN) or "daskfeed"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **env})


def _blocks(stdout: str) -> int:
    import re

    m = re.search(r"train data: [\d,]+ rows in ([\d,]+) blocks", stdout)
    assert m, stdout
    return int(m.group(1).replace(",", ""))


def test_config_env_var_reaches_train_and_a_flag_beats_it(small_data, tmp_path):
    """One run: the blocksize comes from the environment, the batch size from the flag over it."""
    env = {"DASK_DASKFEED__BATCH_SIZE": "77", "DASK_DASKFEED__BLOCKSIZE": "30kB"}
    out = run_env(env, "train", small_data.train_glob, "--label", "cleared", "--epochs", "1",
                  "--memory-limit", "3GB", "--nworkers", "1", "--dashboard-address",
                  "127.0.0.1:0", "--verbose", "0", "--no-cache", "--batch-size", "500",
                  "--output", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "12 batches of 500 per epoch" in out.stdout  # the flag beats the 77 of the env
    assert "blocks of 29.30 kiB" in out.stdout  # the env's blocksize reached train
    assert _blocks(out.stdout) > 6  # each 100 kB file split into byte ranges of 30 kB
    hist = json.loads((tmp_path / "out" / "history.json").read_text())
    assert hist["epochs"][0]["rows"] == 6000


def test_help_shows_the_configured_default():
    out = run_env({"DASK_DASKFEED__BATCH_SIZE": "77"}, "train", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "[default: 77 (daskfeed.batch-size); x>=1]" in text
    assert "[default: 300s (daskfeed.timeout)]" in text
    assert "(daskfeed.blocksize)" in text and "--blocksize SIZE" in text
    out = run_env({}, "train", "--help")
    assert "[default: 1024 (daskfeed.batch-size); x>=1]" in " ".join(out.stdout.split())


def _scan_blocks(stdout: str) -> int:
    import re

    m = re.search(r"^[\d,]+ rows in ([\d,]+) blocks", stdout, re.M)
    assert m, stdout
    return int(m.group(1).replace(",", ""))


def test_scan_takes_blocksize_from_config_and_flag(small_data, tmp_path):
    args = ("scan", small_data.train_glob, "--label", "cleared", "--memory-limit", "3GB",
            "--nworkers", "1", "--dashboard-address", "127.0.0.1:0", "--no-cache")
    out = run_env({}, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _scan_blocks(out.stdout) == 6
    assert "cleared" in out.stdout and "categorical" in out.stdout  # the column summary
    out = run_env({"DASK_DASKFEED__BLOCKSIZE": "30kB"}, *args, "--output", str(tmp_path / "m.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert _scan_blocks(out.stdout) > 6
    assert json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))["rows"] == 6000
    out = run_env({"DASK_DASKFEED__BLOCKSIZE": "30kB"}, *args, "--blocksize", "1MB")
    assert out.returncode == 0, out.stderr[-3000:]
    assert _scan_blocks(out.stdout) == 6  # the flag beats the environment


@pytest.mark.parametrize("bad", ["", "0", "-1MB", "lots"])
def test_nonsense_blocksize_is_a_usage_error(bad, tmp_path):
    for command in ("train", "scan"):
        out = run(command, str(tmp_path), "--label", "y", "--blocksize", bad)
        assert out.returncode == 2, (command, out.stderr)
        assert "Usage:" in out.stderr and "--blocksize" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_configured_blocksize_is_told_from_the_shipped_default():
    import dask.config

    from daskfeed.core import _config as config

    assert not config.configured("blocksize")
    assert config.resolve_blocksize(None, 1234) == 1234  # the budget's derivation
    with dask.config.set({"daskfeed.blocksize": "64 MiB"}):  # the shipped value, spelled otherwise
        assert not config.configured("blocksize")
    with dask.config.set({"daskfeed.blocksize": "200MiB"}):
        assert config.configured("blocksize")
        assert config.resolve_blocksize(None, 1234) == 200 * 2**20
        assert config.resolve_blocksize("1MB", 1234) == 10**6  # an argument wins
