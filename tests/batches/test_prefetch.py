"""Prefetcher: bounded in bytes, reads ahead in plan order, recovers from errors and resets."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from daskfeed import FeedTimeoutError
from daskfeed.batches._prefetch import Prefetcher
from daskfeed.cluster._futures import WindowCancelled


def _arrays(n: int, w: int) -> np.ndarray:
    return np.full(n, w, dtype=np.uint8)


def make(client, order, *, budget, size=100, delay=0.0, timeout=30.0, on_submit=None):
    """A Prefetcher over real tasks; ``delay``: seconds each task takes on its worker (a slow
    read: the behaviour under test, not a synchronisation); ``on_submit(w)`` runs after each
    submit (inside ``get`` / ``start``, with the Prefetcher's lock held)."""
    submitted: list[int] = []

    def submit(w: int):
        submitted.append(w)
        if delay:
            fut = client.submit(lambda n, w: (time.sleep(delay), _arrays(n, w))[1], size, w, pure=False)
        else:
            fut = client.submit(_arrays, size, w, pure=False)
        if on_submit is not None:
            on_submit(w)
        return fut

    pf = Prefetcher(submit, lambda w: size, order, budget=budget, timeout=timeout)
    return pf, submitted


def test_reads_ahead_in_order_within_the_byte_budget(client):
    pf, submitted = make(client, [3, 1, 0, 2], budget=250)
    pf.start()
    assert submitted == [3, 1]  # 2 × 100 bytes fit in 250, a third does not
    assert pf.get(3)[0] == 3
    pf.done_serving(3)  # 3 may now be evicted: the next window in order starts
    assert submitted == [3, 1, 0]
    assert pf.get(1)[0] == 1 and pf.held_bytes <= 250
    pf.done_serving(1)
    assert submitted == [3, 1, 0, 2]
    assert [pf.get(w)[0] for w in (0, 2)] == [0, 2]
    assert len(submitted) == 4  # nothing computed twice


def test_served_windows_stay_until_their_room_is_needed(client):
    pf, submitted = make(client, [0, 1, 2], budget=1000)
    pf.start()
    for w in (0, 1, 2):
        pf.get(w)
        pf.done_serving(w)
    pf.get(0)  # re-read of a served window (Keras' peek): still held, not recomputed
    assert submitted == [0, 1, 2]


def test_concurrent_gets_of_one_window_compute_it_once(client):
    pf, submitted = make(client, [0, 1], budget=1000, delay=0.3)
    results = []
    threads = [threading.Thread(target=lambda: results.append(pf.get(0)[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0, 0, 0, 0] and submitted.count(0) == 1


def test_timeout_is_an_error_naming_the_window_and_a_retry_recomputes(client):
    pf, submitted = make(client, [0], budget=1000, delay=2.0, timeout=0.2)
    with pytest.raises(FeedTimeoutError, match="Window 0"):
        pf.get(0)
    pf.timeout = 30
    assert pf.get(0)[0] == 0 and submitted == [0, 0]


def test_reset_cancels_and_a_waiting_caller_is_told(client):
    """``reset`` while a caller waits inside ``get`` for a window still computing (a 5 s task):
    the caller is told at once (WindowCancelled), not after the task or the timeout."""
    in_get = threading.Event()
    # no start(): the caller's own get(0) submits window 0, so in_get means the caller is inside
    # get() holding the lock; reset() (which takes the lock) then runs once it waits for the data
    pf, submitted = make(client, [0, 1], budget=1000, delay=5.0,
                         on_submit=lambda w: w == 0 and in_get.set())
    outcome: list[BaseException | object] = []

    def wait():
        try:
            outcome.append(pf.get(0))
        except BaseException as e:  # recorded, asserted below
            outcome.append(e)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    assert in_get.wait(10), "the caller never submitted window 0"
    t0 = time.monotonic()
    pf.reset()
    t.join(10)
    assert not t.is_alive(), "the caller still waits 10 s after reset()"
    assert time.monotonic() - t0 < 4, "the caller was told only after the task ended"
    assert len(outcome) == 1 and isinstance(outcome[0], WindowCancelled), outcome
    assert "window 0" in str(outcome[0])
    assert pf.held_bytes == 0 and submitted[0] == 0


class _InterruptOnce:
    """A future whose first result() is interrupted (Ctrl-C), as a notebook user would."""

    def __init__(self):
        self.calls = 0

    def result(self, timeout=None):
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt
        return _arrays(10, 0)

    def cancel(self):
        pass


def test_interrupted_wait_does_not_poison_the_window():
    fut = _InterruptOnce()
    pf = Prefetcher(lambda w: fut, lambda w: 10, [0], budget=100, timeout=5)
    with pytest.raises(KeyboardInterrupt):
        pf.get(0)
    assert pf.get(0)[0] == 0


def test_room_is_lent_only_once_every_window_started(client):
    pf, submitted = make(client, [0, 1, 2], budget=250)
    pf.start()
    assert submitted == [0, 1] and not pf.started_all
    assert pf.lend() == 0  # window 2 still to start: nothing is lent
    pf.get(0)
    pf.done_serving(0)  # window 0's room goes to window 2: every window has started
    assert submitted == [0, 1, 2] and pf.started_all and pf.held_bytes == 200
    assert pf.lend() == 50  # what the budget holds beyond the windows held
    assert pf.lend() == 0 and pf.lent == 50  # lent already
    pf.close()


def test_the_next_epoch_starts_within_the_loan_and_both_stay_within_one_budget(client):
    pf, _ = make(client, [0, 1], budget=450)
    pf.start()
    lent = pf.lend()
    assert lent == 250
    nxt, taken = make(client, [7, 8, 9], budget=lent)
    nxt.start(within_budget=True)
    assert taken == [7, 8]  # 2 × 100 bytes fit the 250 lent, a third does not
    assert [pf.get(w)[0] for w in (0, 1)] == [0, 1] and [nxt.get(w)[0] for w in (7, 8)] == [7, 8]
    assert pf.held_bytes + pf.lent <= 450 and nxt.held_bytes <= lent
    pf.reset()
    assert pf.lent == 0  # the loan ends with the epoch
    nxt.close()


def test_served_windows_are_let_go_and_their_room_lent_on_as_the_epoch_is_served(client):
    pf, _ = make(client, [0, 1, 2], budget=300)
    pf.start()
    assert pf.started_all and pf.lend(let_go=True) == 0  # all three held: no room yet
    pf.get(0)
    pf.done_serving(0)
    assert pf.lend() == 0 and pf.held_bytes == 300  # kept for a reader out of order
    assert pf.lend(let_go=True) == 100 and pf.held_bytes == 200  # let go, its room lent
    nxt, taken = make(client, [7, 8, 9], budget=100)
    nxt.start(within_budget=True)
    assert taken == [7]
    pf.get(1)
    pf.done_serving(1)
    nxt.grow(pf.lend(let_go=True))  # window 1's room too
    assert taken == [7, 8] and nxt.budget == 200
    assert pf.held_bytes + pf.lent <= 300 and nxt.held_bytes <= pf.lent
    assert [nxt.get(w)[0] for w in (7, 8)] == [7, 8]
    pf.close()
    nxt.close()


def test_a_start_within_budget_starts_nothing_that_does_not_fit(client):
    pf, submitted = make(client, [0, 1], budget=50)  # 100-byte windows
    pf.start(within_budget=True)
    assert submitted == []
    pf.start()  # a plain start always starts the first window
    assert submitted == [0]
    pf.close()
