"""TensorFlow's load-time INFO lines on stderr are dropped; everything else written there passes."""

from __future__ import annotations

import os
import subprocess
import sys

from daskfeed.core import native_logs_filtered

_ABSL = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
         b"I0000 00:00:1795771763.594201    2743 port.cc:153] oneDNN custom operations are on.\n")


def test_the_load_time_lines_are_dropped_and_the_rest_passes(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    with native_logs_filtered():
        os.write(2, b"before\n" + _ABSL + b"E0000 an error line stays\n")
        os.write(2, b"a line written in two writes: ")
        os.write(2, b"it stays whole\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == ("before\nE0000 an error line stays\n"
                                      "a line written in two writes: it stays whole\nafter\n")


def test_with_tf_cpp_min_log_level_0_nothing_is_dropped(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    with native_logs_filtered():
        os.write(2, _ABSL)
    assert capfd.readouterr().err == _ABSL.decode()


def test_importing_keras_through_daskfeed_prints_nothing_on_stderr():
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_BACKEND")}
    out = subprocess.run([sys.executable, "-c", "import daskfeed.adapters._keras; import keras; "
                          "keras.ops.add(1.0, 2.0)"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "absl" not in out.stderr and "port.cc" not in out.stderr, out.stderr


def test_a_process_started_while_filtering_neither_holds_it_up_nor_loses_its_lines(tmp_path, monkeypatch):
    """A child started inside the filter keeps the pipe as its stderr: the context still ends
    (the child still running), and what the child writes later is forwarded, filtered."""
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    err = tmp_path / "stderr.txt"
    script = (
        "import os, subprocess, sys\n"
        "from daskfeed.core import native_logs_filtered\n"
        "with native_logs_filtered():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read(); "
        "sys.stderr.write(\"child line\\\\n\")'], stdin=subprocess.PIPE)\n"
        "    os.write(2, b'parent line\\n')\n"
        "os.write(2, b'after\\n')\n"
        "child.communicate(b'go')\n"  # the child writes only now, the context ended
        "import threading\n"  # the filter ends once the child (its last writer) has exited
        "[t.join() for t in threading.enumerate() if t.name == 'daskfeed-stderr-filter']\n"
        "os.write(2, b'end\\n')\n")
    with open(err, "wb") as f:
        out = subprocess.run([sys.executable, "-c", script], stderr=f, timeout=120)
    assert out.returncode == 0
    lines = err.read_text().splitlines()
    assert lines == ["parent line", "after", "child line", "end"], lines
