"""Messages point the right way: a hint names only flags of the command that prints it.

Every command's user errors that print a hint are triggered (in-process through click's runner,
so keras loads once), and every ``--flag`` a message names must be an option listed in that
command's ``--help``. Warnings print as one line (``warning: …``), in the trainer and in the
local cluster's workers (subprocesses: pytest records warnings in-process).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from daskfeed.cli._commands import cli

BIN = os.path.dirname(sys.executable)
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
QUICK = ("--nworkers", "1", "--dashboard-address", "127.0.0.1:0")


def _commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    found: dict[tuple[str, ...], click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            found.update(_commands(cmd, (*prefix, name)))
        else:
            found[(*prefix, name)] = cmd
    return found


def help_flags(path: tuple[str, ...]) -> set[str]:
    """The options listed in the left column of ``daskfeed <path> --help``."""
    out = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert out.exit_code == 0, out.output
    flags: set[str] = set()
    for line in out.output.splitlines():
        m = re.match(r"^  (-\S.*?)(?:\s{2,}|$)", line)  # the option column, aliases included
        if m:
            flags.update(re.findall(r"--[\w-]+", m.group(1)))
    return flags


def named_flags(text: str) -> set[str]:
    return set(FLAG.findall(text))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Small quest logs (text columns), a file with a malformed line, an empty directory."""
    from daskfeed.cli._demo import write_demo_data

    root = tmp_path_factory.mktemp("messages")
    demo = write_demo_data(root / "demo", rows=3000, validate_rows=1000)
    bad = root / "bad"
    bad.mkdir()
    rows = "".join(f"{i},{i % 7},{i % 2}\n" for i in range(200))
    (bad / "a.csv").write_text(f"x,z,y\n{rows}1,2,3,4,5\n{rows}", encoding="utf-8")
    (root / "empty").mkdir()
    (root / "notes").mkdir()
    (root / "notes" / "readme.json").write_text("{}", encoding="utf-8")
    return {"train": demo.train_glob, "bad": str(bad / "a.csv"), "empty": str(root / "empty"),
            "notes": str(root / "notes"), "root": str(root)}


# (command, args, must appear in the message, must not appear); {name} → the data fixture's paths
CASES = [
    ("train", ["{bad}", "--label", "y", "--memory-limit", "3GB", *QUICK, "--no-cache"],
     ["--bad-lines skip", "a.csv"], []),
    ("scan", ["{bad}", "--label", "y", "--memory-limit", "3GB", *QUICK, "--no-cache"],
     ["--bad-lines skip", "a.csv"], []),
    ("train", ["{train}", "--label", "cleared", "--memory-limit", "1.2GB", "--nworkers", "1"],
     ["--memory-limit"], ["--nworkers"]),
    ("train", ["{train}", "--label", "cleared", "--memory-limit", "2GB", "--nworkers", "4"],
     ["--memory-limit", "--nworkers to 2"], []),
    ("scan", ["{train}", "--label", "cleared", "--memory-limit", "1.2GB", "--nworkers", "1"],
     ["--memory-limit"], ["--nworkers"]),
    ("demo", ["--rows", "1000", "--validate-rows", "1000", "--data-dir", "{root}/demo-cmd",
              "--memory-limit", "1.2GB", "--nworkers", "1"], ["--memory-limit"], ["--nworkers"]),
    ("train", ["{train}", "--label", "clearedd", "--memory-limit", "3GB", *QUICK, "--no-cache"],
     ["did you mean 'cleared'"], []),
    ("scan", ["{train}", "--label", "clearedd", "--memory-limit", "3GB", *QUICK, "--no-cache"],
     ["did you mean 'cleared'"], []),
    ("train", ["{train}", "--label", "cleared", "--as-matrix", "--memory-limit", "3GB", *QUICK,
               "--no-cache"],
     ["quest_id", "class", "region", "--features", "--exclude"], []),
    ("train", ["{train}", "--label", "cleared", "--features", "cleared,level", "--memory-limit",
               "3GB", *QUICK, "--no-cache"], ["--features"], []),
    ("train", ["{empty}", "--label", "y", "--memory-limit", "3GB", *QUICK],
     ["it is empty", ".csv", ".parquet"], ["No such file"]),
    ("scan", ["{notes}", "--label", "y", "--memory-limit", "3GB", *QUICK],
     ["readme.json", ".csv"], ["No such file"]),
    ("train", ["{train}", "--label", "cleared", "--model", "nocolon", "--memory-limit", "3GB",
               *QUICK], ["--model"], []),
    ("train", ["{train}", "--label", "cleared", "--cache", "{bad}/sub", "--memory-limit", "3GB",
               *QUICK], ["--cache DIR", "--no-cache"], []),
    ("scan", ["{train}", "--label", "cleared", "--cache", "{bad}/sub", "--memory-limit", "3GB",
              *QUICK], ["--cache DIR", "--no-cache"], []),
]


@pytest.mark.parametrize(("command", "args", "present", "absent"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_hint_names_only_flags_of_its_command(data, command, args, present, absent, tmp_path):
    args = [a.format(**data) for a in args]
    if command in ("train", "demo"):
        args += ["--output", str(tmp_path / "out")]
    out = CliRunner().invoke(cli, [command, *args])
    message = out.stderr
    assert out.exit_code == 1, (out.exit_code, out.output, repr(out.exception))
    assert message.startswith("Error: ") and "Traceback" not in out.output, message
    for text in present:
        assert text in message, (text, message)
    for text in absent:
        assert text not in message, (text, message)
    unknown = named_flags(message) - help_flags((command,))
    assert not unknown, f"{command}'s message names {sorted(unknown)}, not its flags:\n{message}"


def test_every_command_is_walked_and_its_help_names_only_its_flags():
    commands = _commands()
    assert {"train", "scan", "demo"} <= {p[-1] for p in commands}
    for path in commands:
        out = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
        own = help_flags(path)
        assert {"--help"} <= own
        unknown = named_flags(out.output) - own
        assert not unknown, f"{' '.join(path)} --help names {sorted(unknown)}"
    walked = {c[0] for c in CASES}
    assert {"train", "scan", "demo"} <= walked


def test_help_flags_parser_reads_the_option_column():
    flags = help_flags(("train",))
    assert {"--label", "--batch-size", "--bad-lines", "--no-cache", "--blocksize", "--nworkers",
            "--help"} <= flags
    assert "--rows" not in flags
    assert "--rows" in help_flags(("demo",))


def _daskfeed(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("daskfeed", path=BIN) or "daskfeed"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300, env=ENV,
                          cwd=cwd)


def test_a_warning_is_one_line_without_source(data, tmp_path):
    shutil.copy(data["bad"], tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("", encoding="utf-8")  # an empty file: skipped, warned about
    out = _daskfeed("scan", str(tmp_path), "--label", "y", "--bad-lines", "skip",
                    "--memory-limit", "3GB", *QUICK, "--no-cache")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stderr.splitlines()
    empty = [x for x in lines if "empty file(s) skipped" in x]
    skipped = [x for x in lines if "malformed line(s) skipped" in x]
    assert len(empty) == 1 and empty[0].startswith("warning: 1 empty file(s) skipped"), out.stderr
    assert len(skipped) == 1 and skipped[0].startswith("warning: 1 malformed line(s)"), out.stderr
    assert "warnings.warn(" not in out.stderr and "UserWarning" not in out.stderr, out.stderr
    assert not re.search(r"daskfeed/\w+\.py:\d+", out.stderr), out.stderr


def test_a_worker_warning_is_one_line_too():
    code = (
        "import warnings\n"
        "from daskfeed.cli._commands import _warnings_as_lines\n"
        "from daskfeed.cluster._budget import Budget\n"
        "from daskfeed.cluster._start import close_client, start_local_cluster\n"
        "undo = _warnings_as_lines()\n"
        "client = start_local_cluster(Budget.split('3GB', nworkers=1), dashboard_address='127.0.0.1:0')\n"
        "def warn():\n"
        "    warnings.warn('from a worker\\nsecond line', stacklevel=1)\n"
        "    import os\n"
        "    return os.getpid()\n"
        "pids = client.run(warn)\n"
        "close_client(client)\n"
        "import os\n"
        "assert all(p != os.getpid() for p in pids.values()), pids\n"
        "undo()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stderr.splitlines() if "from a worker" in x]
    assert lines == ["warning: from a worker second line"], out.stderr
    assert "warnings.warn(" not in out.stderr, out.stderr


def test_an_uncompiled_model_from_a_builder_says_how_it_was_compiled(data, tmp_path):
    (tmp_path / "mymodel.py").write_text(
        "import keras\n"
        "def build(manifest):\n"
        "    inputs = {n: keras.Input(shape=(1,), name=n) for n in ('level', 'hour')}\n"
        "    h = keras.layers.Concatenate()(list(inputs.values()))\n"
        "    return keras.Model(inputs, keras.layers.Dense(1, activation='sigmoid')(h))\n",
        encoding="utf-8")
    out = CliRunner().invoke(cli, [
        "train", data["train"], "--label", "cleared", "--features", "level,hour", "--epochs", "1",
        "--model", f"{tmp_path / 'mymodel.py'}:build", "--memory-limit", "3GB", *QUICK,
        "--no-cache", "--verbose", "0", "--output", str(tmp_path / "out")])
    assert out.exit_code == 0, (out.output, repr(out.exception))
    line = next((x for x in out.stdout.splitlines() if "was not compiled" in x), "")
    assert "mymodel.py:build" in line and "binary label" in line, out.stdout
    assert "loss binary_crossentropy" in line and "optimizer Adam(learning_rate=0.001)" in line, line
    assert "metrics ['accuracy', 'auc', 'precision', 'recall']" in line, line
