"""Parts: the files of a source in groups that stay the same when files are added or removed.

A part is a run of consecutive files (in the source's order) with its blocks; it is what the
scan keeps results for and what the parse cache keeps an entry for, each keyed by the part's
:attr:`Part.key`: a hash of its files' identities (path, size, mtime, ETag) and the read options.
A file added, removed or rewritten changes the key of its own part only, so the data grown by a
day of files is scanned and cached for that day (:mod:`daskfeed.scanning._scan`).

Where a part ends is decided by each file alone, never by a count from the start: a file of at
least half a block, and each compressed or Parquet file, is a part of its own; otherwise a part
ends at a change of directory, after a file whose path hashes to 0 modulo :data:`SPREAD` (one
file in 256: the cut is content-defined, as in rsync's rolling chunks), or once it holds a
block's worth of bytes or :data:`MAX_FILES` files. A file inserted between two others moves the
cuts of its own part at most (and of those after it, where a part was cut by size or count, up
to the next cut by hash). New files in a new directory (a day of logs) make parts of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from daskfeed.reading._files import Block, FileInfo, compression_of, is_parquet

SPREAD = 256  # one small file in SPREAD ends a part (content-defined: by its path's hash)
MAX_FILES = 4 * SPREAD  # nor does a part hold more files than this


@dataclass(frozen=True)
class Part:
    """A run of whole files of a source: ``files[lo:hi]`` and their blocks ``blocks[first:end]``.

    Attributes
    ----------
    key
        32 hex digits: its files' identities and the read options.
    files
        ``(lo, hi)``: the source's files ``lo`` to ``hi - 1``.
    blocks
        ``(first, end)``: the source's blocks ``first`` to ``end - 1``.
    nbytes
        Input bytes of its files.
    """

    key: str
    files: tuple[int, int]
    blocks: tuple[int, int]
    nbytes: int

    @property
    def nblocks(self) -> int:
        """Number of blocks of the part."""
        return self.blocks[1] - self.blocks[0]


def file_key(info: FileInfo) -> dict[str, Any]:
    """What identifies a file's contents: path, size, mtime and an ETag if any.

    Parameters
    ----------
    info
        The listed file.

    Returns
    -------
    dict
        ``path``, ``size``, ``mtime`` (and ``etag`` for objects that have one).
    """
    key: dict[str, Any] = {"path": info.path, "size": info.size, "mtime": info.mtime}
    if info.etag:  # local files: the same fingerprints as before ETags were kept
        key["etag"] = info.etag
    return key


def _cut_after(info: FileInfo) -> bool:
    """Whether a part ends after this small file (its path hashes to 0 modulo SPREAD)."""
    digest = hashlib.blake2b(info.path.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SPREAD == 0


def _alone(info: FileInfo, blocksize: int) -> bool:
    """A file that is a part of its own: half a block or more, compressed, or Parquet."""
    return 2 * info.size >= blocksize or bool(compression_of(info.path)) or is_parquet(info.path)


def make_parts(files: Sequence[FileInfo], blocks: Sequence[Block], blocksize: int,
               options: dict[str, Any]) -> list[Part]:
    """The parts of a source's files (see the module's docstring for where one ends).

    Parameters
    ----------
    files
        The source's files, in order.
    blocks
        Its blocks (:func:`~daskfeed.reading._files.make_blocks`: each file's blocks together,
        in file order).
    blocksize
        Bytes per block.
    options
        The read options as they enter a fingerprint (JSON-able).

    Returns
    -------
    list of Part
        Every file in exactly one part, in order.
    """
    salt = json.dumps(options, sort_keys=True)
    first_block = [0] * (len(files) + 1)  # first block of each file (and the end)
    for b in reversed(range(len(blocks))):
        first_block[blocks[b].file_index] = b
    first_block[len(files)] = len(blocks)
    for i in reversed(range(len(files))):  # (a file has at least one block: none is skipped)
        first_block[i] = min(first_block[i], first_block[i + 1])
    parts: list[Part] = []
    lo, acc = 0, 0

    def close(hi: int) -> None:
        nonlocal lo, acc
        if hi > lo:
            payload = json.dumps([salt, [file_key(f) for f in files[lo:hi]]])
            key = hashlib.sha256(payload.encode()).hexdigest()[:32]
            parts.append(Part(key, (lo, hi), (first_block[lo], first_block[hi]),
                              sum(f.size for f in files[lo:hi])))
        lo, acc = hi, 0

    for i, info in enumerate(files):
        if _alone(info, blocksize):
            close(i)
            close(i + 1)
            continue
        if i > lo and os.path.dirname(info.path) != os.path.dirname(files[i - 1].path):
            close(i)
        acc += info.size
        if _cut_after(info) or acc >= blocksize or i + 1 - lo >= MAX_FILES:
            close(i + 1)
    close(len(files))
    return parts
