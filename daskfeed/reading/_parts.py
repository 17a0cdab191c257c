"""Parts: the files of a source in groups that stay the same when files are added or removed.

A part is a run of consecutive files (in the source's order) with its blocks; it is what the
scan keeps results for and what the parse cache keeps entries for, each keyed by the part's
:attr:`Part.key`: a hash of its files' identities (path, size, mtime, ETag) and the read options.
A file added, removed or rewritten changes the key of its own part only, so the data grown by a
day of files is scanned and cached for that day (:mod:`daskfeed.scanning._scan`). A part that
grew at its end (files appended to its folder) is one whose first files are an earlier part's:
its :attr:`Part.anchor` (its first file and the read options) is the same, and so are the ids of
its blocks (the anchor and their number in the part), so what was kept of the earlier part
stays valid for those blocks: only the new files are scanned and cached
(:mod:`daskfeed.cache._lineage`).

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
    anchor
        32 hex digits: its first file's identity and the read options (with the block's number
        in the part, what a block's id is made of: the same in every part that starts with
        the same file, i.e. after files were appended to it).
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
    anchor: str = ""

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


def part_key(salt: str, files: Sequence[FileInfo]) -> str:
    """The key of a part of ``files`` read with the options ``salt`` (JSON): 32 hex digits."""
    payload = json.dumps([salt, [file_key(f) for f in files]])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def options_salt(options: dict[str, Any]) -> str:
    """The read options as they enter a part's key (and its anchor)."""
    return json.dumps(options, sort_keys=True)


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
    salt = options_salt(options)
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
            parts.append(Part(part_key(salt, files[lo:hi]), (lo, hi),
                              (first_block[lo], first_block[hi]),
                              sum(f.size for f in files[lo:hi]), part_key(salt, files[lo:lo + 1])))
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
