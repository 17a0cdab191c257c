"""The trained-to mark (OUTPUT/trained.bin): rewritten in place, read back by the next run."""

from __future__ import annotations

import mmap

from daskfeed.training._certificate import MARK, TrainedMark, read_mark


def test_the_mark_reads_back_as_the_last_written_and_a_longer_file_is_cut(tmp_path):
    (tmp_path / MARK).write_bytes(b"x" * 40)  # an old file of another size
    mark = TrainedMark(str(tmp_path))
    mark(0, 7)
    assert read_mark(str(tmp_path)) == (0, 7)  # (read while mapped: the page cache's bytes)
    mark(2, 123456789012)
    mark(2, 123456789012)
    mark.close()
    assert read_mark(str(tmp_path)) == (2, 123456789012)
    assert (tmp_path / MARK).stat().st_size == 16


def test_without_a_shared_map_the_mark_is_written_with_pwrite(tmp_path, monkeypatch):
    def refused(*args, **kwargs):
        raise OSError(19, "No such device")  # what some FUSE and network mounts answer

    monkeypatch.setattr(mmap, "mmap", refused)
    mark = TrainedMark(str(tmp_path))
    mark(1, 5)
    assert read_mark(str(tmp_path)) == (1, 5)
    mark(1, 6)
    mark.close()
    assert read_mark(str(tmp_path)) == (1, 6)


def test_no_mark_reads_as_none(tmp_path):
    assert read_mark(str(tmp_path)) is None
