"""What a process's threads read now (daskfeed.reading._now): the timeout message's source."""

from __future__ import annotations

import threading

from daskfeed.reading import named, reading, reads_now


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
                assert sorted(what for what, _ in reads_now()) == ["b.csv (whole file)", "bucket 3"]
            names = [what for what, _ in reads_now()]
            assert sorted(names) == ["a.csv bytes 0-10", "b.csv (whole file)"]
            assert names[0] == "b.csv (whole file)"  # the longest first
        assert [what for what, _ in reads_now()] == ["b.csv (whole file)"]
        assert reads_now(older_than=1e9) == []
    finally:
        finish.set()
        other.join()
    assert reads_now() == []


def test_named_records_each_read_not_the_work_between():
    seen = []

    def tables():
        for i in range(3):
            seen.append([what for what, _ in reads_now()])  # while the reader reads item i
            yield i

    got = []
    for item in named(tables(), lambda: "c.csv bytes 0-99"):
        got.append(item)
        assert reads_now() == []  # the caller's work on the item is not a read
    assert got == [0, 1, 2] and seen == [["c.csv bytes 0-99"]] * 3
    assert reads_now() == []
