"""The one private CPython hook daskfeed leans on at exit (``threading._register_atexit``).

``run_at_exit`` and ``close_at_exit`` must run before the interpreter joins the
``concurrent.futures`` threads (distributed's clients and a prefetcher's pool need them then);
``atexit`` runs after that join. If CPython changed or dropped the hook, the fallback
(``atexit``) would run too late and the process below would hang at exit: this test fails then.
The CLI's fast exit (``threading._shutdown``, ``atexit._run_exitfuncs``) has its own test in
``tests/cli/test_commands.py``.
"""

from __future__ import annotations

import subprocess
import sys


def test_a_callback_at_exit_runs_before_the_pools_threads_are_joined(tmp_path):
    done = tmp_path / "done"
    code = (
        "import threading\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from daskfeed.core import run_at_exit\n"
        "release = threading.Event()\n"
        "pool = ThreadPoolExecutor(1)\n"
        "pool.submit(release.wait)  # a pool thread the interpreter will join at exit\n"
        f"def last(): open({str(done)!r}, 'w').write('ran'); release.set()\n"
        "run_at_exit(last)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)  # (hangs, and fails here, if the callback ran after the join)
    assert out.returncode == 0, out.stderr[-2000:]
    assert done.read_text() == "ran"
