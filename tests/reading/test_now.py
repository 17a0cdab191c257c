"""What a process's threads read now (daskfeed.reading._now): the timeout message's source."""

from __future__ import annotations

import threading

from daskfeed.reading import reading, reads_now


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
