"""The manifest's blocks in compact form: each file path once, each per-block field one array.

A manifest of many small files is mostly its blocks. As JSON objects they cost ~171 bytes each;
packed, the paths are one NUL-separated text and every field (file index, offset, length,
rows, raw rows) an int64 array of differences, each compressed (zlib) and base64-encoded into
the JSON: a few bytes per block, while the rest of the manifest stays readable.

Where each block's rows are in its file (:func:`daskfeed.manifest.row_line`) packs the same way:
``line``, each block's first line (0: not known), and, for the few blocks whose rows are not
one per line, ``row_lines``: which blocks, and each one's rows' lines, packed on their own
(:func:`daskfeed.manifest.pack_row_lines`), as the blocks hold them. A manifest without them
(made before daskfeed kept lines) reads back with no line.
"""

from __future__ import annotations

import base64
import sys
import zlib
from array import array
from typing import Any

FIELDS = ("offset", "length", "rows", "raw_rows")  # per-block integers besides the file
ENCODING = "zlib+base64; int64 little-endian differences; paths NUL-separated"


def _pack_bytes(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def _unpack_bytes(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


def _pack_ints(values: list[int]) -> str:
    """Differences of ``values`` (runs and steady strides compress to almost nothing)."""
    diffs = array("q", (b - a for a, b in zip([0, *values], values, strict=False)))
    if sys.byteorder == "big":
        diffs.byteswap()
    return _pack_bytes(diffs.tobytes())


def _unpack_ints(text: str) -> list[int]:
    diffs = array("q")
    diffs.frombytes(_unpack_bytes(text))
    if sys.byteorder == "big":
        diffs.byteswap()
    out, acc = [], 0
    for d in diffs:
        acc += d
        out.append(acc)
    return out


def pack_blocks(partitions: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's blocks (``{"path", "offset", "length", "rows", "raw_rows"}`` each), packed.

    Parameters
    ----------
    partitions
        ``Manifest.blocks``; each may have its ``line`` (None: not known) and ``row_lines``.

    Returns
    -------
    dict
        ``{"count", "encoding", "paths", "file", "offset", "length", "rows", "raw_rows"}``, and
        ``"line"`` (``"row_lines"``) when some block has one: plain JSON, read back by
        :func:`unpack_blocks`.
    """
    paths: list[str] = []
    file_of: dict[str, int] = {}
    for p in partitions:
        if p["path"] not in file_of:
            file_of[p["path"]] = len(paths)
            paths.append(p["path"])
    out: dict[str, Any] = {"count": len(partitions), "encoding": ENCODING,
                           "paths": _pack_bytes("\0".join(paths).encode("utf-8")),
                           "file": _pack_ints([file_of[p["path"]] for p in partitions])}
    for name in FIELDS:
        out[name] = _pack_ints([int(p.get(name, p["rows"])) for p in partitions])
    if any("line" in p for p in partitions):
        out["line"] = _pack_ints([int(p.get("line") or 0) for p in partitions])
        irregular = [i for i, p in enumerate(partitions)
                     if p.get("row_lines") is not None and p.get("line")]
        if irregular:
            out["row_lines"] = {"blocks": _pack_ints(irregular),
                                "lines": [_packed_lines(partitions[i]["row_lines"]) for i in irregular]}
    return out


def unpack_blocks(packed: dict[str, Any]) -> list[dict[str, Any]]:
    """Inverse of :func:`pack_blocks`.

    Parameters
    ----------
    packed
        What :func:`pack_blocks` made (read back from ``manifest.json``).

    Returns
    -------
    list of dict
        One ``{"path", "offset", "length", "rows", "raw_rows"}`` per block, in order, with its
        ``"line"`` (None: not known) and ``"row_lines"`` where they were packed.

    Raises
    ------
    ValueError
        When the arrays do not hold ``count`` blocks each, or ``row_lines`` not the packed
        lines of each block it names (a damaged manifest).
    """
    n = int(packed["count"])
    paths = _unpack_bytes(packed["paths"]).decode("utf-8").split("\0") if n else []
    files = _unpack_ints(packed["file"])
    fields = [_unpack_ints(packed[name]) for name in FIELDS]
    lines = _unpack_ints(packed["line"]) if "line" in packed else None
    if any(len(f) != n for f in (files, *fields, *([lines] if lines is not None else []))):
        raise ValueError(f"Expected {n} blocks in every array of the packed manifest blocks.")
    blocks = [{"path": paths[f], "offset": o, "length": ln, "rows": r, "raw_rows": raw}
              for f, o, ln, r, raw in zip(files, *fields, strict=True)]
    if lines is not None:
        for block, line in zip(blocks, lines, strict=True):
            block["line"] = line or None
        _unpack_row_lines(packed.get("row_lines"), blocks)
    return blocks


def _packed_lines(lines: str | list[int]) -> str:
    """A block's ``row_lines`` as the manifest keeps them (packed; a list is packed here)."""
    return lines if isinstance(lines, str) else _pack_ints([int(x) for x in lines])


def _unpack_row_lines(packed: dict[str, Any] | None, blocks: list[dict[str, Any]]) -> None:
    """Give the blocks named in ``row_lines`` their rows' lines, as packed (unpacked when asked)."""
    if not packed:
        return
    irregular, lines = _unpack_ints(packed["blocks"]), packed["lines"]
    if (not isinstance(lines, list) or len(lines) != len(irregular)
            or any(not 0 <= i < len(blocks) for i in irregular)
            or not all(isinstance(text, str) for text in lines)):
        raise ValueError(f"Expected the packed lines of each of the {len(irregular)} blocks in "
                         "the packed manifest blocks' row_lines.")
    for i, text in zip(irregular, lines, strict=True):
        blocks[i]["row_lines"] = text
