"""Compressed CSV: every member / stream / frame is read, every row once; clear errors otherwise."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import subprocess
import sys
import warnings

import pytest
import zstandard

from daskfeed import DataError
from daskfeed.reading._files import CSV_SUFFIXES, compression_of
from daskfeed.reading._source import Source
from daskfeed.reading._tables import iter_tables

ROWS = 250_001


def _compress(name: str, data: bytes) -> bytes:
    return {
        "gzip": gzip.compress,
        "bz2": bz2.compress,
        "xz": lzma.compress,
        "zstd": zstandard.ZstdCompressor().compress,
    }[name](data)


def _pieces(data: bytes, n: int) -> list[bytes]:
    """``data`` in ``n`` pieces cut at byte positions that fall inside lines."""
    step = len(data) // n + 7
    return [data[i:i + step] for i in range(0, len(data), step)]


def _tables(path: str, blocksize: int):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "1 compressed file", UserWarning)
        src = Source(path, blocksize=blocksize)
    assert len(src.blocks) == 1 and src.blocks[0].length == -1  # never split into byte ranges
    return list(iter_tables(src.blocks[0], src.options))


@pytest.mark.parametrize(("suffix", "name"), [
    (".csv.gz", "gzip"), (".csv.gzip", "gzip"), (".csv.bz2", "bz2"), (".csv.xz", "xz"),
    (".csv.zst", "zstd"), (".csv.zstd", "zstd"), (".tsv.zst", "zstd"),
])
def test_every_member_stream_and_frame_is_read(tmp_path, suffix, name):
    sep = "\t" if suffix.startswith(".tsv") else ","
    text = f"x{sep}y\n" + "".join(f"{i}{sep}{i % 2}\n" for i in range(ROWS))
    pieces = _pieces(text.encode(), 9)
    path = tmp_path / f"data{suffix}"
    path.write_bytes(b"".join(_compress(name, p) for p in pieces))  # 9 members / streams / frames
    assert compression_of(str(path)) == name and suffix in CSV_SUFFIXES

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "1 compressed file", UserWarning)
        src = Source(str(path), blocksize=64 * 1024, sep=sep)
    tables = list(iter_tables(src.blocks[0], src.options))

    assert len(tables) > 20  # the chunker looped many times, across member boundaries
    assert sum(t.num_rows for t in tables) == ROWS
    xs = [x for t in tables for x in t.column("x").to_pylist()]
    assert xs == list(range(ROWS))


def test_a_directory_lists_every_supported_compressed_suffix(tmp_path):
    rows = "x,y\n1,0\n2,1\n"
    for suffix, name in [(".csv.zstd", "zstd"), (".csv.gzip", "gzip"), (".txt.xz", "xz"),
                         (".tsv.bz2", "bz2")]:
        (tmp_path / f"part{suffix}").write_bytes(_compress(name, rows.encode()))
    (tmp_path / "notes.md").write_text("not data")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "3 compressed file", UserWarning)
        warnings.filterwarnings("ignore", "Left out 1 .txt file", UserWarning)  # test_files.py
        src = Source(str(tmp_path))
    assert sorted(f.path.rsplit("/", 1)[1] for f in src.files) == [
        "part.csv.gzip", "part.csv.zstd", "part.tsv.bz2"]
    assert all(b.length == -1 for b in src.blocks)
    (tmp_path / "txt").mkdir()  # .txt files alone are the data
    (tmp_path / "txt" / "part.txt.xz").write_bytes(_compress("xz", rows.encode()))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "1 compressed file", UserWarning)
        assert [f.path.rsplit("/", 1)[1] for f in Source(str(tmp_path / "txt")).files] == [
            "part.txt.xz"]


def test_a_truncated_gzip_file_is_a_clear_error_naming_it(tmp_path):
    data = gzip.compress(("x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(50_000))).encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as err:
        _tables(str(path), 64 * 1024)
    msg = str(err.value)
    assert "cut.csv.gz" in msg and "gzip" in msg and "truncated" in msg and "Hint:" in msg


def test_zst_without_the_zstandard_module_says_how_to_install_it(tmp_path):
    path = tmp_path / "a.csv.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"x,y\n1,0\n"))
    # a fresh interpreter in which `import zstandard` fails, as where it is not installed
    code = (
        "import sys, json, warnings\n"
        "sys.modules['zstandard'] = None\n"
        "warnings.simplefilter('ignore')\n"
        "from daskfeed.reading._source import Source\nfrom daskfeed.reading._tables import iter_tables\n"
        "from daskfeed import DataError\n"
        f"src = Source({str(path)!r})\n"
        "try:\n"
        "    list(iter_tables(src.blocks[0], src.options))\n"
        "except DataError as err:\n"
        "    print(json.dumps(str(err)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    msg = json.loads(out.stdout)
    assert "a.csv.zst" in msg and "pip install 'daskfeed[zstd]'" in msg and "Hint:" in msg


def test_read_at_most_asks_a_local_file_for_what_it_holds(tmp_path):
    """All of a small file within a block's bound, one byte more than the bound when larger, and
    the bytes after the header only; a stream that cannot say its size reads as before."""
    import io

    from daskfeed.reading._streams import read_at_most

    path = tmp_path / "small.csv"
    path.write_bytes(b"a,b\n1,2\n3,4\n")
    with open(path, "rb") as f:
        assert read_at_most(f, 64 << 20) == b"a,b\n1,2\n3,4\n"
    with open(path, "rb") as f:
        assert read_at_most(f, 5) == b"a,b\n1"  # (the caller sees it is past the bound)
    with open(path, "rb") as f:
        f.read(4)
        assert read_at_most(f, 64 << 20) == b"1,2\n3,4\n"
        assert read_at_most(f, 64 << 20) == b""
    with open(path, "rb") as f, open(path, "ab") as grow:
        grow.write(b"5,6\n")  # (grew after it was opened: read to its new end)
        grow.flush()
        assert read_at_most(f, 64 << 20) == b"a,b\n1,2\n3,4\n5,6\n"
    assert read_at_most(io.BytesIO(b"x" * 10), 4) == b"xxxx"

    class Asked(io.BufferedReader):  # what each read asked for
        asked: list[int] = []

        def read(self, size=-1):
            self.asked.append(size)
            return super().read(size)

    with Asked(io.FileIO(path, "rb")) as f:
        read_at_most(f, 64 << 20)
    assert Asked.asked == [len(b"a,b\n1,2\n3,4\n5,6\n") + 1]  # not 64 MiB


def test_read_at_most_reads_a_pipe_to_the_bound(tmp_path):
    """A FIFO (no size to trust): read as before, up to the bound."""
    import os
    import threading

    from daskfeed.reading._streams import read_at_most

    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(b"a,b\n1,2\n"))
    writer.start()
    with open(fifo, "rb") as f:
        assert read_at_most(f, 1 << 20) == b"a,b\n1,2\n"
    writer.join()
