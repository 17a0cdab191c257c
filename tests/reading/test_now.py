"""What a process's threads read now (daskfeed.reading._now): the timeout messages' source."""

from __future__ import annotations

import threading

import pytest

from daskfeed.reading import named, reading, reads_now

MINE = ("a.csv bytes 0-10", "b.csv (whole file)", "bucket 3", "c.csv bytes 0-99")


def _mine(older_than: float = 0.0) -> list[str]:
    """The reads of this process that these tests started (other tests' are not theirs)."""
    return [what for what, _ in reads_now(older_than) if what in MINE]


def test_reads_are_named_per_thread_while_they_run_and_forgotten_after():
    began, finish = threading.Event(), threading.Event()

    def hang() -> None:
        with reading(lambda: "b.csv (whole file)"):
            began.set()
            finish.wait()

    other = threading.Thread(target=hang)
    other.start()
    began.wait()
    try:
        with reading(lambda: "a.csv bytes 0-10"):
            with reading(lambda: "bucket 3"):  # nested: the inner read, then the outer again
                assert sorted(_mine()) == ["b.csv (whole file)", "bucket 3"]
            assert sorted(_mine()) == ["a.csv bytes 0-10", "b.csv (whole file)"]
            assert _mine()[0] == "b.csv (whole file)"  # the longest first
        assert _mine() == ["b.csv (whole file)"]
        assert _mine(older_than=1e9) == []
    finally:
        finish.set()
        other.join()
    assert _mine() == []


def test_named_records_each_read_not_the_work_between():
    seen = []

    def tables():
        for i in range(3):
            seen.append(_mine())  # while the reader reads item i
            yield i

    got = []
    for item in named(tables(), lambda: "c.csv bytes 0-99"):
        got.append(item)
        assert _mine() == []  # the caller's work on the item is not a read
    assert got == [0, 1, 2] and seen == [["c.csv bytes 0-99"]] * 3
    assert _mine() == []


def test_named_closes_the_reader_when_its_caller_stops_on_an_error():
    closed = []

    def tables():
        try:
            yield from range(3)
        finally:
            closed.append(True)  # (a reader's file closed here)

    reader = tables()
    with pytest.raises(ValueError):
        for _ in named(reader, lambda: "c.csv bytes 0-99"):
            raise ValueError("the caller's own error")
    assert closed == [True] and _mine() == []
