"""Atomic writes (daskfeed.core._atomic): a file appears whole under its name, or not at all."""

from __future__ import annotations

import os
import re

import pytest

from daskfeed.core._atomic import create_new, fsync, replace, temporary_name, write_file, writing


def test_the_temporary_name_is_beside_the_path_this_process_s_and_fresh_each_time(tmp_path):
    path = str(tmp_path / "manifest.json")
    names = {temporary_name(path) for _ in range(100)}
    assert len(names) == 100
    assert all(re.fullmatch(re.escape(f"{path}.tmp-{os.getpid()}-") + "[0-9a-f]{12}", n) for n in names)


def test_a_link_planted_at_the_temporary_name_is_refused_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = tmp_path / "x.tmp-1-abcdefabcdef"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        create_new(str(planted))
    assert victim.read_text() == "precious"
    made = tmp_path / "y"
    create_new(str(made), perms=0o600).close()
    assert (os.stat(made).st_mode & 0o777) == 0o600


@pytest.mark.parametrize(("data", "expected"), [("gold,été\n", "gold,été\n".encode()),
                                                (b"\x00\xff raw", b"\x00\xff raw")])
def test_write_file_writes_text_or_bytes_and_leaves_no_temporary_file(tmp_path, data, expected):
    path = tmp_path / "out.txt"
    path.write_text("the previous version")
    write_file(path, data)
    assert path.read_bytes() == expected
    assert os.listdir(tmp_path) == ["out.txt"]


def test_write_file_encodes_text_as_asked(tmp_path):
    write_file(tmp_path / "x.csv", "été", encoding="latin-1")
    assert (tmp_path / "x.csv").read_bytes() == b"\xe9t\xe9"


def test_the_final_name_shows_the_old_content_until_the_write_is_done(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("old")
    with writing(path, "w", encoding="utf-8") as f:
        f.write("new")
        f.flush()
        assert path.read_text() == "old"
        (tmp,) = set(os.listdir(tmp_path)) - {"state.json"}
        assert tmp.startswith(f"state.json.tmp-{os.getpid()}-")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["state.json"]


class Boom(Exception):
    pass


@pytest.mark.parametrize("exists", [True, False])
def test_an_error_while_writing_leaves_the_path_as_it_was_and_removes_the_temporary_file(tmp_path, exists):
    path = tmp_path / "model.keras"
    if exists:
        path.write_bytes(b"good")
    with pytest.raises(Boom), writing(path) as f:
        f.write(b"half")
        raise Boom
    assert os.listdir(tmp_path) == (["model.keras"] if exists else [])
    if exists:
        assert path.read_bytes() == b"good"


def test_a_path_that_cannot_be_written_raises_and_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError), writing(tmp_path / "missing-dir" / "f.bin") as f:
        f.write(b"x")
    assert os.listdir(tmp_path) == []


def test_replace_moves_a_finished_directory_onto_its_name(tmp_path):
    tmp = tmp_path / "ckpt.tmp"
    tmp.mkdir()
    (tmp / "weights").write_bytes(b"w")
    replace(str(tmp), str(tmp_path / "ckpt"))
    assert os.listdir(tmp_path) == ["ckpt"] and (tmp_path / "ckpt" / "weights").read_bytes() == b"w"


def test_fsync_takes_files_and_directories_and_ignores_what_it_cannot_open(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    fsync(tmp_path / "f")
    fsync(tmp_path)
    fsync(tmp_path / "nothing here")  # no error: a no-op
