"""Lifecycle: a script that trains on a DaskSequence exits promptly and cleanly however ``fit``
ended and whatever was (not) closed; Ctrl-C ends a wait for a batch; Keras' worker processes
are refused, a fork's copy says so, a pickled copy works in a spawned process.

The exit tests run real scripts (a real LocalCluster with worker processes, a real
``model.fit``) as subprocesses and time them from a timestamp printed right after ``fit``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import foreground, load_factor

import daskfeed
from daskfeed import SettingError

ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
EXIT_WITHIN = 10.0  # seconds from fit's return to the end of the process (times load_factor())

# Trains with EarlyStopping (stops after epoch 2 of 5), prints FIT_DONE <time> <epochs>, then ends
# the way MODE says: close both / close nothing / close the client first / `with` block / close
# nothing of a sequence that started its own LocalCluster. Modes "steps" (steps_per_epoch=3,
# windows left in flight mid-epoch) and "raises" (a callback raises in epoch 1, caught) close
# nothing either.
SCRIPT = '''
import json, os, sys, threading, time

MODE, DATA = sys.argv[1], sys.argv[2]


def main():
    import keras
    from distributed import Client

    import daskfeed

    client = None
    if MODE != "owned":
        client = Client(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address="127.0.0.1:0", memory_limit="1GiB")
    kw = dict(label="cleared", client=client, batch_size=256, window_rows=1400,
              prefetch_bytes=2_000_000, cache=False, seed=1)
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)

    class Raises(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                raise RuntimeError("a callback failed")

    def fit(seq):
        model = daskfeed.default_model(seq.manifest)
        if MODE == "raises":
            try:
                model.fit(seq, epochs=5, callbacks=[Raises()], shuffle=False, verbose=0)
            except RuntimeError:
                print("FIT_DONE", time.time(), 0, flush=True)
            return
        more = {"steps_per_epoch": 3} if MODE == "steps" else {}
        history = model.fit(seq, epochs=5, callbacks=[stop], shuffle=False, verbose=0, **more)
        print("FIT_DONE", time.time(), len(history.history["loss"]), flush=True)

    if MODE == "with":
        with daskfeed.DaskSequence(DATA, **kw) as seq:
            fit(seq)
        pf = seq.stream._cursor.prefetcher
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                str(k).startswith("daskfeed-window") for k in client.futures):
            time.sleep(0.05)  # released keys leave client.futures on the client's loop
        print("STATE", json.dumps({
            "closed": seq.closed, "prefetcher_closed": pf.closed,
            "futures": sorted(str(k) for k in client.futures if str(k).startswith("daskfeed")),
            "fetch_threads": [t.name for t in threading.enumerate() if t.name == "daskfeed-fetch"
                              and t.is_alive()]}), flush=True)
        try:
            seq[0]
        except daskfeed.DaskfeedError as err:
            print("AFTER_CLOSE", type(err).__name__, str(err).splitlines()[0], flush=True)
        client.close()
        return
    seq = daskfeed.DaskSequence(DATA, **kw)
    assert seq.stream.owns_client == (MODE == "owned")
    fit(seq)
    if MODE == "close":
        seq.close()
        seq.close()  # idempotent
        client.close()
    elif MODE == "client-first":
        client.close()
        seq.close()


if __name__ == "__main__":
    main()
'''


def _run_script(tmp_path: pathlib.Path, script: str, *args: str, timeout: float = 300):
    """Run ``script`` to its end; (stdout, stderr, returncode, time.time() at its exit)."""
    path = tmp_path / "script.py"
    path.write_text(script, encoding="utf-8")
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, str(path), *args], stdout=o, stderr=e, env=ENV,
                                cwd=tmp_path, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"the script did not end within {timeout}s:\n"
                                 + err.read_text(errors="replace")[-3000:]) from None
        ended = time.time()
    _assert_no_survivors(proc.pid)
    return out.read_text(), err.read_text(errors="replace"), rc, ended


def _assert_no_survivors(session: int, timeout: float = 10) -> None:
    """No process of the script's session (its Dask workers, nannies) outlives it by long."""
    import psutil

    def survivors() -> list[int]:
        alive = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == session and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except (OSError, psutil.Error):
                continue
        return alive

    deadline = time.monotonic() + timeout
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling interval
    left = survivors()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the script outlived it: {left}"


def _exit_delay(stdout: str, ended: float, epochs: int) -> float:
    """Seconds from the FIT_DONE timestamp (checking that fit ended after ``epochs`` epochs)."""
    line = next(ln for ln in stdout.splitlines() if ln.startswith("FIT_DONE"))
    _, stamp, trained = line.split()
    assert int(trained) == epochs, f"fit should have ended after {epochs} of 5 epochs: {line}"
    return ended - float(stamp)


def _check_clean_exit(tmp_path: pathlib.Path, data: str, mode: str) -> tuple[float, str]:
    out, err, rc, ended = _run_script(tmp_path, SCRIPT, mode, data)
    assert rc == 0, (rc, err[-3000:])
    delay = _exit_delay(out, ended, 0 if mode == "raises" else 2)
    assert "Traceback" not in err, err[-4000:]
    assert "cannot schedule new futures" not in err, err[-4000:]
    bound = EXIT_WITHIN * load_factor()  # on a busy machine the same exit takes longer
    assert delay < bound, f"exited {delay:.1f}s after fit returned (bound {bound:.1f}s)\n{err[-3000:]}"
    return delay, out


@pytest.mark.slow
def test_script_exits_promptly_after_early_stopping_five_runs(id_data, tmp_path):
    """The issue's "done when": EarlyStopping ends fit at epoch 2 of 5; the script closes the
    sequence and the client and exits within 10 s of fit returning, five runs in a row, with
    no traceback."""
    delays = []
    for i in range(5):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        delays.append(_check_clean_exit(run_dir, id_data.train_glob, "close")[0])
    print("exit delays after fit (s):", [round(d, 2) for d in delays])


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs every mode (make test-slow)
@pytest.mark.parametrize("mode", ["close", "never", "client-first", "owned", "steps", "raises"])
def test_script_exits_promptly_whatever_is_closed(id_data, tmp_path, mode):
    """Closed as the README says (one run of the five-run test, which is slow), nothing closed at
    all (the interpreter's exit does it), the client closed before the
    sequence, nothing closed of a sequence that started its own LocalCluster (its exit hook
    closes it), fit ended by ``steps_per_epoch`` or by a callback's exception: the same prompt,
    clean exit."""
    delay, _ = _check_clean_exit(tmp_path, id_data.train_glob, mode)
    print(f"{mode}: exit {delay:.2f}s after fit")


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_with_block_closes_the_sequence(id_data, tmp_path):
    """Leaving ``with DaskSequence(...) as seq:`` closes it: prefetcher closed, its futures
    released on the cluster, no fetch thread left; a closed sequence refuses batches."""
    _, out = _check_clean_exit(tmp_path, id_data.train_glob, "with")
    state = json.loads(next(ln for ln in out.splitlines() if ln.startswith("STATE"))[6:])
    assert state == {"closed": True, "prefetcher_closed": True, "futures": [],
                     "fetch_threads": []}, state
    assert "AFTER_CLOSE DaskfeedError This DaskSequence is closed." in out, out


# A file of the epoch's last window becomes a FIFO after the scan: the batch that needs it waits
# (timeout 120 s) inside fit; WAITING is printed when Keras asks for that batch, INTERRUPTED when
# fit raises KeyboardInterrupt.
SIGINT_SCRIPT = '''
import os, sys, threading, time

DATA = sys.argv[1]


def main():
    import keras
    from distributed import Client

    import daskfeed

    reached = threading.Event()  # the batch before the stuck one was trained
    asked = []  # the thread asking for the stuck batch

    class Marked(daskfeed.DaskSequence):
        def __getitem__(self, i):
            if i == self.block_at:  # asked ahead by tf.data's thread: wait until fit waits
                reached.wait()
                asked.append(threading.get_ident())
            return super().__getitem__(i)

    def in_window_wait(ident):
        frame = sys._current_frames().get(ident)
        while frame is not None:
            if frame.f_code.co_name == "_wait" and frame.f_code.co_filename.endswith("prefetch.py"):
                return True
            frame = frame.f_back
        return False

    def announce():  # WAITING once the stuck batch's wait began and fit waits inside TensorFlow
        main, deadline = threading.main_thread().ident, time.monotonic() + 240
        while not (asked and in_window_wait(asked[0])
                   and sys._current_frames()[main].f_code.co_name == "quick_execute"):
            if time.monotonic() > deadline:
                print("NEVER_WAITED", flush=True)  # the test fails on its own deadline
                return
            time.sleep(0.01)  # polls the two threads' stacks (a state, not a duration)
        print("WAITING", time.time(), flush=True)

    threading.Thread(target=announce, daemon=True).start()

    class Reached(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == seq.block_at - 1:
                reached.set()

    client = Client(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                    dashboard_address="127.0.0.1:0", memory_limit="1GiB")
    seq = Marked(DATA, label="cleared", client=client, batch_size=256, window_rows=1400,
                 prefetch_bytes=250_000, cache=False, seed=1, timeout=120)
    plan = seq.plan
    last = plan.windows[-1]
    others = {seq.source.blocks[p].path for w in plan.windows[:-1] for p in w.blocks}
    victim = next(seq.source.blocks[p].path for p in last.blocks
                  if seq.source.blocks[p].path not in others)
    seq.block_at = min(b for b in range(len(seq)) if any(s.window == last.index
                                                          for s in plan.batch(b)))
    os.remove(victim)
    os.mkfifo(victim)
    if seq.block_at == 0:
        reached.set()
    model = daskfeed.default_model(seq.manifest)
    try:
        model.fit(seq, epochs=1, shuffle=False, verbose=0, callbacks=[Reached()])
    except KeyboardInterrupt:
        print("INTERRUPTED", time.time(), flush=True)
        raise
    print("FIT_RETURNED", flush=True)


if __name__ == "__main__":
    main()
'''


def _copy_data(id_data, dest: pathlib.Path) -> str:
    """A private copy of the id_data train files (the SIGINT test breaks one of them)."""
    import shutil

    src = pathlib.Path(id_data.train_glob.split("*")[0])
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.rglob("*.csv")):
        shutil.copy(f, dest / f.name)
    return str(dest / "*.csv")


class _Lines:
    """The stdout lines of ``proc``, read by a thread, awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        import queue
        import threading

        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for raw in stream:
            self._lines.put(raw.decode(errors="replace"))
        self._lines.put(None)

    def wait(self, prefix: str, timeout: float) -> str:
        """The next line starting with ``prefix``."""
        import queue

        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise AssertionError(f"no {prefix} line within {timeout:g}s") from None
            if line is None:
                raise AssertionError(f"the script ended before printing {prefix}")
            if line.startswith(prefix):
                return line


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_sigint_while_fit_waits_for_a_batch_exits_within_seconds(id_data, tmp_path):
    """Ctrl-C (SIGINT) while fit waits inside TensorFlow for a batch whose window never comes
    (a FIFO nobody writes; timeout 120 s; sent once the main thread is in TensorFlow's step, where
    a KeyboardInterrupt used to come out as pybind11's RuntimeError about mismatched exception
    types): fit raises KeyboardInterrupt (not a RuntimeError) within 5 s and the
    process ends within seconds, not at the timeout. (The exit includes distributed closing
    the script's LocalCluster, whose nanny kills the worker stuck on the FIFO after 4 s.)"""
    data = _copy_data(id_data, tmp_path / "data")
    script = tmp_path / "sigint.py"
    script.write_text(SIGINT_SCRIPT, encoding="utf-8")
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        inherited = signal.getsignal(signal.SIGINT)  # what the child would inherit
        proc = subprocess.Popen([sys.executable, str(script), data], stdout=subprocess.PIPE,
                                stderr=err, env=ENV, cwd=tmp_path, start_new_session=True,
                                preexec_fn=foreground)
        try:
            lines = _Lines(proc)
            lines.wait("WAITING", timeout=240)
            t0, sent = time.monotonic(), time.time()
            os.kill(proc.pid, signal.SIGINT)
            try:
                interrupted = float(lines.wait("INTERRUPTED", timeout=60).split()[1]) - sent
            except AssertionError as err:
                raise AssertionError(f"{err} (SIGINT in this pytest process: {inherited!r}; "
                                     f"the child's stderr: {err_path.read_text()[-2000:]})") from None
            rc = proc.wait(timeout=60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    _assert_no_survivors(proc.pid)
    stderr = err_path.read_text(errors="replace")
    print(f"SIGINT to KeyboardInterrupt out of fit: {interrupted:.2f}s, to exit: {took:.2f}s")
    assert rc in (-signal.SIGINT, 128 + signal.SIGINT, 1), (rc, stderr[-3000:])
    assert "KeyboardInterrupt" in stderr, stderr[-3000:]
    assert "FeedTimeoutError" not in stderr, stderr[-3000:]
    assert interrupted < 5, f"fit was interrupted {interrupted:.1f}s after SIGINT"
    assert took < 15 * load_factor(), f"the process ended {took:.1f}s after SIGINT\n{stderr[-3000:]}"


# -- use_multiprocessing (issue 11 item 3) -------------------------------------------------------
def test_use_multiprocessing_is_refused_before_any_work():
    """Refused at construction, before the data or the cluster is touched: a path that does not
    exist and a scheduler nobody listens on are never looked at."""
    seq_class = daskfeed.DaskSequence  # (imports keras: not part of the timing)
    t0 = time.monotonic()
    with pytest.raises(SettingError) as info:
        seq_class("/nonexistent/dir/*.csv", label="cleared", client="tcp://127.0.0.1:9",
                  use_multiprocessing=True, workers=2)
    assert time.monotonic() - t0 < load_factor()
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, daskfeed.DaskfeedError)
    msg = str(err)
    assert "Expected use_multiprocessing=False" in msg and "Received: use_multiprocessing=True" in msg
    assert "Hint:" in msg and "leave the default" in msg, msg


def _make(id_data, client):
    return daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client,
                                 batch_size=256, window_rows=2000, seed=5)


def _batch_in_child(seq, conn) -> None:
    """Child process body: ``seq[0]``'s row ids, or the error it raised, sent back on ``conn``."""
    try:
        conn.send(("ok", np.asarray(seq[0][0]["row_id"])))
    except BaseException as err:  # reported to the parent, asserted there
        conn.send(("error", type(err).__name__, str(err)))


def _batches_in_spawned_child(blob: bytes, conn) -> None:
    """Spawned child body: unpickle the sequence, send batches 0 and 3's row ids, close it."""
    seq = pickle.loads(blob)
    try:
        conn.send([np.asarray(seq[i][0]["row_id"]) for i in (0, 3)])
    finally:
        seq.close()


def _join(proc, conn, timeout: float):
    """What the child sent (within ``timeout`` s) and its exit code."""
    assert conn.poll(timeout), "the child sent nothing"
    got = conn.recv()
    proc.join(timeout)
    assert proc.exitcode is not None, "the child did not end"
    return got, proc.exitcode


def test_a_forked_copy_says_so_at_once(id_data, client):
    """A fork's inherited sequence (what Keras' process pool would use) raises a clear error
    on its first batch instead of waiting for a timeout."""
    ctx = multiprocessing.get_context("fork")
    with _make(id_data, client) as seq:
        seq[0]
        parent, child = ctx.Pipe()
        t0 = time.monotonic()
        proc = ctx.Process(target=_batch_in_child, args=(seq, child))
        proc.start()
        got, code = _join(proc, parent, 30)
        took = time.monotonic() - t0
        assert np.asarray(seq[1][0]["row_id"]).size  # the parent's sequence still works
    assert got[0] == "error" and got[1] == "SettingError", got
    assert "a fork of it" in got[2] and "use_multiprocessing" in got[2] and "Hint:" in got[2], got
    assert code == 0 and took < 10 * load_factor(), (code, took)


def test_a_pickled_copy_works_in_a_spawned_process(id_data, client):
    """A spawned process given the pickled sequence connects to the same scheduler and gets the
    same batches as the parent."""
    ctx = multiprocessing.get_context("spawn")
    with _make(id_data, client) as seq:
        expected = [np.asarray(seq[i][0]["row_id"]) for i in (0, 3)]
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_batches_in_spawned_child, args=(pickle.dumps(seq), child))
        proc.start()
        got, code = _join(proc, parent, 180)
    assert code == 0
    assert len(got) == 2 and all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


# -- the prefetcher's threads and futures --------------------------------------------------------
def _slow_window(seconds: float) -> np.ndarray:
    time.sleep(seconds)  # a slow read on the worker: the behaviour under test, not a synchronisation
    return np.zeros(10, dtype=np.uint8)


def _fetch_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "daskfeed-fetch" and t.is_alive()]


def _until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:g}s for {what}"
        time.sleep(0.05)  # polling interval


def test_a_wait_ends_when_its_client_closes():
    """A caller waiting for a window (an 8 s task) is told within seconds when the client is
    closed under it: a ClusterError saying so, not a wait until the task or the timeout."""
    import threading

    from distributed import Client, LocalCluster

    from daskfeed.batches._prefetch import Prefetcher
    from daskfeed.core._exceptions import ClusterError

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                           dashboard_address=None)
    client = Client(cluster)
    submitted = threading.Event()

    def submit(w):
        fut = client.submit(_slow_window, 8.0, pure=False)
        submitted.set()
        return fut

    pf = Prefetcher(submit, lambda w: 10, [0], budget=100, timeout=60)
    outcome: list[BaseException | object] = []

    def wait():
        try:
            outcome.append(pf.get(0))
        except BaseException as e:  # recorded, asserted below
            outcome.append(e)

    caller = threading.Thread(target=wait, daemon=True)
    try:
        caller.start()
        assert submitted.wait(10)
        t0 = time.monotonic()
        client.close()
        caller.join(10)
        took = time.monotonic() - t0
    finally:
        client.close()
        cluster.close()
    assert not caller.is_alive(), "the caller still waits after its client closed"
    assert len(outcome) == 1 and isinstance(outcome[0], ClusterError), outcome
    assert "closed" in str(outcome[0]) and "window 0" in str(outcome[0]), outcome[0]
    assert took < 5 * load_factor(), took


def test_an_unused_prefetcher_is_collected_with_its_futures_and_thread(client):
    """Nothing keeps a dropped prefetcher alive: its fetch thread holds it weakly and ends, and
    its futures are released on the cluster."""
    import gc
    import weakref

    from daskfeed.batches._prefetch import Prefetcher

    keys: list[str] = []

    def submit(w):
        fut = client.submit(_slow_window, 3.0, pure=False)
        keys.append(fut.key)
        return fut

    pf = Prefetcher(submit, lambda w: 10, [0, 1, 2], budget=1000, timeout=60)
    pf.start()
    assert len(keys) == 3 and _fetch_threads()
    ref = weakref.ref(pf)
    del pf
    # (the fetch thread holds it for a moment at each look: collected once it let go)
    _until(lambda: (gc.collect(), ref())[1] is None, 10, "the prefetcher to be collected")
    _until(lambda: not any(k in client.futures for k in keys), 10, "its futures to be released")
    _until(lambda: not _fetch_threads(), 10, "its fetch thread to end")


def test_close_is_idempotent_and_tells_a_waiting_caller(client):
    """``close`` while a caller waits for a window (a 5 s task): the caller gets WindowCancelled
    at once, the futures are released, a second close does nothing, later gets are refused."""
    import threading

    from daskfeed.batches._prefetch import Prefetcher
    from daskfeed.cluster._futures import WindowCancelled

    submitted = threading.Event()
    keys: list[str] = []

    def submit(w):
        fut = client.submit(_slow_window, 5.0, pure=False)
        keys.append(fut.key)
        submitted.set()
        return fut

    pf = Prefetcher(submit, lambda w: 10, [0, 1], budget=1000, timeout=60)
    outcome: list[BaseException | object] = []

    def wait():
        try:
            outcome.append(pf.get(0))
        except BaseException as e:  # recorded, asserted below
            outcome.append(e)

    caller = threading.Thread(target=wait, daemon=True)
    caller.start()
    assert submitted.wait(10)
    t0 = time.monotonic()
    pf.close()
    caller.join(10)
    took = time.monotonic() - t0
    pf.close()
    assert not caller.is_alive() and took < 3 * load_factor(), took
    assert len(outcome) == 1 and isinstance(outcome[0], WindowCancelled), outcome
    with pytest.raises(WindowCancelled, match="closed"):
        pf.get(1)
    _until(lambda: not any(k in client.futures for k in keys), 10, "its futures to be released")
    assert pf.held_bytes == 0


def test_a_command_stopped_in_process_gives_ctrl_c_back(monkeypatch, tmp_path):
    """A command run in this process (a notebook, ``standalone_mode=False``) that Ctrl-C stops
    exits 130 with its one line, and SIGINT's handler is what it was before, not ignored (it is
    ignored only while the line is printed)."""
    from click.testing import CliRunner

    from daskfeed.cli import _commands as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what Python's SIGINT handler raises where Ctrl-C lands

    monkeypatch.setattr(cli, "_start_cluster", interrupted)
    (tmp_path / "a.csv").write_text("x,cleared\n1,0\n", encoding="utf-8")
    # a notebook's SIGINT handler: Python's own (a pytest-xdist worker may start with SIGINT
    # ignored, which would make the check below say nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = signal.getsignal(signal.SIGINT)
    result = CliRunner().invoke(cli.cli, ["scan", str(tmp_path / "a.csv"), "--label", "cleared"])
    assert result.exit_code == 130, result.output
    assert "stopped by Ctrl-C (SIGINT)" in result.output
    assert "--resume" not in result.output  # scan has nothing to resume
    assert signal.getsignal(signal.SIGINT) is before
    assert before is not signal.SIG_IGN
    monkeypatch.setattr(cli, "_run_train", interrupted)  # train stopped: how to go on
    result = CliRunner().invoke(cli.cli, ["train", str(tmp_path / "a.csv"), "--label", "cleared",
                                          "--output", str(tmp_path / "run")])
    assert result.exit_code == 130, result.output
    assert (f"To go on from the last checkpoint in {tmp_path / 'run' / 'checkpoints'} (the batch "
            "it was written at), run the same command again with --resume.") in result.output
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, previous)
