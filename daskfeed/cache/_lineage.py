"""Which entries a part's blocks are kept in: its own, or those of the part it grew from.

Files appended to a folder (a day of logs, named by date) extend the folder's last part: its key
changes, its first files and their blocks do not (nor do their ids: :attr:`Part.anchor` and the
block's number in the part). Such a part keeps the earlier part's entries for those blocks and
gets one entry more for its new files; the scan reads the new files alone and merges them into
the earlier part's record (:mod:`daskfeed.scanning._scan`), the buckets deal the new entry alone
(:mod:`daskfeed.batches._buckets`). A part scanned for the first time has one entry, keyed by
the part; one that grew :data:`MAX_ENTRIES` times is scanned again as one entry (a folder
growing by a file a minute keeps a bounded number of directories). The results are the same
either way (the same blocks, ids and stored orders): only where they are kept differs.

What each part was laid out as is kept on the trainer, under its cache root, per data set (the
paths or globs given and the read options): ``<root>/scans/lineage/<key>.json`` holds the
layouts of its parts that may grow (a part ending its folder's files) or grew, as its last
opening found them — one file read and at most one written per opening, whatever the number of
parts. JSON data, checked on load (a damaged or foreign file is not used: each part gets an
entry of its own), under a root and levels checked to be the user's own
(:func:`~daskfeed.cache._root.own_root`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskfeed.cache._root import own_dir, own_root
from daskfeed.core import CacheError, write_file
from daskfeed.reading import Part, Source, file_key, options_salt, part_key

LINEAGE_FORMAT = "daskfeed part lineage"
LINEAGE_VERSION = 1
MAX_ENTRIES = 32  # entries of a part at most: the 33rd growth scans the part again, as one entry

Entry = tuple[str, int, int]  # an entry's (key, files, blocks), in the order of its part's files


@dataclass(frozen=True)
class Layout:
    """Where one part's blocks are kept.

    Attributes
    ----------
    entries
        ``(key, files, blocks)`` of each entry, in order: the part's files and blocks, split.
    grew_from
        ``(key, files, blocks)`` of the earlier part this one extends (its first files), else
        None.
    """

    entries: tuple[Entry, ...]
    grew_from: Entry | None = None


def layouts(src: Source, root: str | None) -> list[Layout]:
    """Each part's layout: as remembered, extending a remembered part, or an entry of its own.

    Parameters
    ----------
    src
        The data (its parts).
    root
        The trainer's cache root (None: no lineage is kept: an entry per part).

    Returns
    -------
    list of Layout
        One per part, in order.

    Raises
    ------
    CacheError
        A root or level that is not the user's own (:func:`~daskfeed.cache._root.own_root`).
    """
    parts = src.parts()
    own = [Layout(((p.key, p.files[1] - p.files[0], p.nblocks),)) for p in parts]
    store = _Store(root, _set_key(src)) if root is not None else None
    known = store.load() if store is not None and store.usable() else {}
    if not known:
        return own
    by_anchor: dict[str, dict[str, Any]] = {}
    for key, kept in known.items():
        by_anchor.setdefault(str(kept.get("anchor", "")), {})[key] = kept
    salt = options_salt(src.options_key())
    firsts: list[np.ndarray] = []  # (the first block of each file: made when first needed)
    out = []
    for part, mine in zip(parts, own, strict=True):
        same = by_anchor.get(part.anchor) if part.anchor else None
        try:
            out.append((_layout(src, part, same, salt, firsts) if same else None) or mine)
        except (TypeError, ValueError, KeyError, IndexError):  # a damaged file: not used
            out.append(mine)
    return out


def remember(src: Source, root: str | None, found: list[Layout]) -> None:
    """Keep the layouts of the parts that may grow (ending their folder) or grew (trainer side)."""
    if root is None:
        return
    files, kept = src.files, {}
    for part, layout in zip(src.parts(), found, strict=True):
        hi = part.files[1]
        ends_folder = hi == len(files) or (os.path.dirname(files[hi - 1].path)
                                           != os.path.dirname(files[hi].path))
        if part.anchor and (ends_folder or len(layout.entries) > 1):
            kept[part.key] = {"anchor": part.anchor,
                              "files": sum(f for _, f, _ in layout.entries),
                              "blocks": sum(b for _, _, b in layout.entries),
                              "entries": [list(e) for e in layout.entries],
                              "grew_from": list(layout.grew_from) if layout.grew_from else None}
    store = _Store(root, _set_key(src))
    if store.usable() and store.load() == kept:
        return
    if kept and store.usable(create=True):
        store.keep(kept)


def _set_key(src: Source) -> str:
    """The data set whose layouts are kept together: the paths or globs given, the read options."""
    payload = json.dumps([src.given, options_salt(src.options_key())])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _layout(src: Source, part: Part, known: dict[str, Any], salt: str,
            firsts: list[np.ndarray]) -> Layout | None:
    """``part``'s layout from the kept layouts of parts with its anchor (None: an entry of its own)."""
    nfiles, lo = part.files[1] - part.files[0], part.files[0]
    mine = known.get(part.key)
    if mine is not None:
        entries = tuple((str(k), int(f), int(b)) for k, f, b in mine.get("entries", []))
        grew = mine.get("grew_from")
        if (sum(f for _, f, _ in entries) == nfiles and sum(b for _, _, b in entries) == part.nblocks
                and all(_KEY.fullmatch(k) for k, _, _ in entries)):
            return Layout(entries, (str(grew[0]), int(grew[1]), int(grew[2])) if grew else None)
    best: tuple[str, dict[str, Any]] | None = None
    for key, earlier in known.items():
        k = int(earlier.get("files", 0))
        if not 0 < k < nfiles or (best is not None and k <= int(best[1]["files"])):
            continue
        if not firsts:
            firsts.append(_first_blocks(src))
        blocks = int(firsts[0][lo + k] - part.blocks[0])
        if (int(earlier.get("blocks", -1)) == blocks
                and part_key(salt, src.files[lo:lo + k]) == key):
            best = (key, earlier)
    if best is None:
        return None
    key, earlier = best
    base = _layout(src, Part(key, (lo, lo + int(earlier["files"])),
                             (part.blocks[0], part.blocks[0] + int(earlier["blocks"])), 0,
                             part.anchor), {key: earlier}, salt, firsts)
    if base is None or len(base.entries) >= MAX_ENTRIES:
        return None
    k, b = int(earlier["files"]), int(earlier["blocks"])
    new_files = src.files[lo + k:part.files[1]]
    payload = json.dumps([salt, part.anchor, b, [file_key(f) for f in new_files]])
    new_key = hashlib.sha256(payload.encode()).hexdigest()[:32]
    return Layout((*base.entries, (new_key, nfiles - k, part.nblocks - b)), (key, k, b))


def _first_blocks(src: Source) -> np.ndarray:
    """The first block of each file, and the number of blocks at the end."""
    index = np.fromiter((b.file_index for b in src.blocks), dtype=np.int64, count=len(src.blocks))
    return np.searchsorted(index, np.arange(len(src.files) + 1), side="left")


_KEY = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class _Store:
    """The layouts kept for one data set: ``<root>/scans/lineage/<key>.json``."""

    root: str
    key: str

    @property
    def path(self) -> str:
        return os.path.join(self.root, "scans", "lineage")

    def usable(self, create: bool = False) -> bool:
        """Check the root and the store's levels are the user's own; whether they exist.

        ``create``: make the levels missing (to keep layouts; reading makes nothing).
        """
        try:
            if not own_root(self.root, create=create):
                return False
            return all([own_dir(level, create=create)
                        for level in (os.path.dirname(self.path), self.path)])
        except CacheError:
            raise
        except OSError:  # (an unwritable place: every part gets an entry of its own)
            return False

    def load(self) -> dict[str, Any]:
        """The layouts kept: part key -> ``{"anchor", "files", "blocks", "entries", ...}``."""
        try:
            with open(os.path.join(self.path, f"{self.key}.json"), encoding="utf-8") as f:
                body = json.load(f)
        except (OSError, ValueError):
            return {}
        if not (isinstance(body, dict) and body.get("format") == LINEAGE_FORMAT
                and body.get("version") == LINEAGE_VERSION and body.get("key") == self.key
                and isinstance(body.get("parts"), dict)):
            return {}
        return {k: v for k, v in body["parts"].items()
                if _KEY.fullmatch(k) and isinstance(v, dict) and isinstance(v.get("entries"), list)}

    def keep(self, parts: dict[str, Any]) -> None:
        """Keep ``parts``' layouts (those of the last opening: the parts of the data now)."""
        body = {"format": LINEAGE_FORMAT, "version": LINEAGE_VERSION, "key": self.key,
                "parts": parts}
        try:
            write_file(os.path.join(self.path, f"{self.key}.json"), json.dumps(body), perms=0o600)
        except OSError:
            return
