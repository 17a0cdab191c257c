"""The scan's results kept per part, on the trainer: what a data set that grew does not scan again.

A part (:class:`~daskfeed.reading._parts.Part`: a run of whole files) has one record per label
and split: the facts of each of its blocks and its merged statistics, under a key of its files'
identities, the read options, the label and the blocks of the split's subset in it. A data set
whose files changed scans the parts whose key is not stored and merges every part's record in
part order: the same merge a scan of every file makes, so the manifest is the one a full scan
gives (:mod:`daskfeed.scanning._scan`).

Per data set (its paths or globs, read options, label and split) the store keeps the files of
the last scan, to say what changed (:func:`changes_line`), and that scan's manifest, returned
as it is when no file changed. Layout: ``<cache root>/scans/parts/<key>.json`` and
``<cache root>/scans/sets/<key>.json``; written atomically, read by the trainer only.

Everything here is JSON data (a record names its format, version and key, and is checked on
load: a damaged or foreign one is scanned again, never executed), under a root and levels
checked to be the user's own (:func:`daskfeed.cache.own_root`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from dask.utils import format_bytes

from daskfeed.cache import own_dir, own_root
from daskfeed.core import CacheError, write_file
from daskfeed.reading import Part, Source
from daskfeed.scanning._task import shared_facts

# of what a record holds: bump it when the statistics change (old records are then scanned again);
# 2: a column of dates that pyarrow left as text is read as dates, times without a zone counted;
# 3: JSON, not pickle (nothing read back from a cache root is code); 4: moments as exact sums by
# segment (:mod:`daskfeed.scanning._moments`): a part's new files merge into its record exactly;
# 5: each block's line breaks and, where its rows are not one per line, their lines (a record
# without them would give the manifest's blocks no line)
RECORD_VERSION = 5
RECORD_FORMAT = "daskfeed scan record"

# a part's scan results: {"facts": [facts of each block], "stats": its merged statistics}
PartRecord = dict[str, Any]


@dataclass(frozen=True)
class ScanStore:
    """Where the scan keeps its results per part and per data set: ``<root>/scans``.

    Attributes
    ----------
    root
        The trainer's cache root (the parse cache's, or its default).
    """

    root: str

    def check(self) -> bool:
        """Check the root and the store's levels are the user's own; whether the store is usable.

        Raises
        ------
        CacheError
            A root or level that is a link, another user's, writable by others, or a root
            holding what daskfeed did not make (:func:`daskfeed.cache.own_root`).
        """
        try:
            own_root(self.root)
            for level in (self.path, *(os.path.join(self.path, s) for s in ("parts", "sets"))):
                own_dir(level)
        except CacheError:
            raise
        except OSError:  # (an unwritable place: the scan runs without its records)
            return False
        return True

    @property
    def path(self) -> str:
        """The store's directory."""
        return os.path.join(self.root, "scans")

    def record_key(self, part: Part, label: str, scanned: list[int] | None) -> str:
        """The key of ``part``'s record for ``label`` (``scanned``: the blocks of a split in it).

        Parameters
        ----------
        part
            The part.
        label
            The label column (facts and statistics count its rows).
        scanned
            Numbers (within the part) of the blocks a split's subset has; None: all.

        Returns
        -------
        str
            32 hex digits.
        """
        payload = json.dumps([RECORD_VERSION, part.key, label, scanned])
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def load(self, key: str) -> PartRecord | None:
        """The record ``key`` (None: none, unreadable, or not a record of this key and version)."""
        if not _KEY.fullmatch(key):  # (a key from a damaged set's file: scanned again)
            return None
        try:
            with open(self._record_path(key), encoding="utf-8") as f:
                body = json.load(f)
        except (OSError, ValueError):
            return None
        return record_of(body, key)

    def has(self, key: str) -> bool:
        """Whether the record ``key`` is stored (not read)."""
        return bool(_KEY.fullmatch(key)) and os.path.exists(self._record_path(key))

    def save(self, key: str, record: PartRecord) -> None:
        """Keep ``record`` under ``key`` (a full disk leaves it unkept: the part is scanned again)."""
        body = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "key": key, "record": record}
        try:
            text = json.dumps(body, default=_plain, ensure_ascii=False)
        except (TypeError, ValueError):  # (what JSON cannot hold: not kept, scanned again)
            return
        try:
            self._make("parts")
            write_file(self._record_path(key), text, perms=0o600)
        except OSError:
            return

    def _record_path(self, key: str) -> str:
        if not _KEY.fullmatch(key):  # (keys are made here: never a path of another shape)
            raise ValueError(f"not a record key: {key!r}")
        return os.path.join(self.path, "parts", f"{key}.json")

    def last(self, data_key: str) -> dict[str, Any] | None:
        """What the last scan of the data set ``data_key`` kept: its files and manifest."""
        try:
            with open(os.path.join(self.path, "sets", f"{data_key}.json"), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def remember(self, data_key: str, src: Source, records: list[str],
                 manifest: dict[str, Any], entries: tuple[str, ...] = ()) -> None:
        """Keep this scan of ``data_key``: its files, the records it merged, its manifest (JSON).

        ``entries``: the parse cache entries it read (default: one per part, as a part is kept
        until it grows).
        """
        body = {"files": {f.path: [f.size, f.mtime, f.etag] for f in src.files},
                "version": RECORD_VERSION, "records": records, "manifest": manifest,
                "given": src.given,
                "parts": list(entries) or [p.key for p in src.parts()]}
        try:
            self._make("sets")
            write_file(os.path.join(self.path, "sets", f"{data_key}.json"), json.dumps(body),
                       perms=0o600)
        except OSError:
            return

    def _make(self, sub: str) -> None:
        """Create ``<root>/scans/<sub>``, each level 0700 and checked to be ours."""
        own_root(self.root)
        for path in (self.path, os.path.join(self.path, sub)):
            own_dir(path)

    def served(self) -> dict[str, list[str]]:
        """Which data sets each cache entry (its key) serves, as their last scans kept them.

        Returns
        -------
        dict
            Entry key -> the data sets it serves (their paths or globs and label).
        """
        out: dict[str, list[str]] = {}
        try:
            names = sorted(os.listdir(os.path.join(self.path, "sets")))
        except OSError:
            return out
        for name in names:
            last = self.last(name.removesuffix(".json")) or {}
            label = (last.get("manifest") or {}).get("label", "?")
            shown = f"{' '.join(last.get('given', [])) or '?'} (label {label})"
            for key in last.get("parts", []):
                out.setdefault(key, []).append(shown)
        return out

    def prune(self) -> int:
        """Remove the part records no data set's last scan is made of; how many went.

        Returns
        -------
        int
            Records removed (of files that changed or went, or of settings no longer used).

        Raises
        ------
        CacheError
            A root or level that is not the user's own (see :meth:`check`).
        """
        if not (own_root(self.root, create=False)
                and own_dir(self.path, create=False)):
            return 0
        keep: set[str] = set()
        try:
            names = os.listdir(os.path.join(self.path, "sets"))
        except OSError:
            names = []
        for name in names:
            keep.update((self.last(name.removesuffix(".json")) or {}).get("records", []))
        removed = 0
        try:
            records = os.listdir(os.path.join(self.path, "parts"))
        except OSError:
            return 0
        for name in records:
            if name.endswith((".json", ".pkl")) and name.rsplit(".", 1)[0] not in keep:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.path, "parts", name))
                    removed += 1
        return removed


_KEY = re.compile(r"[0-9a-f]{32}")


def record_of(body: Any, key: str) -> PartRecord | None:
    """The part record in ``body`` (a record file's JSON) if it is one of ``key``, else None.

    Checked: the format, the version, the key, and the shape the merge relies on (facts: one
    dict per block with its rows; statistics: a dict per column).
    """
    if not (isinstance(body, dict) and body.get("format") == RECORD_FORMAT
            and body.get("version") == RECORD_VERSION and body.get("key") == key):
        return None
    record = body.get("record")
    if not isinstance(record, dict):
        return None
    facts, stats = record.get("facts"), record.get("stats")
    if not (isinstance(facts, list) and isinstance(stats, dict)
            and all(isinstance(f, dict) and isinstance(f.get("rows"), int) and f["rows"] >= 0
                    and isinstance(f.get("columns"), list) and isinstance(f.get("kinds"), dict)
                    for f in facts)
            and all(isinstance(c, dict) for c in stats.values())):
        return None
    record["facts"] = shared_facts(facts)  # (blocks of one header share their lists again)
    return record


def _plain(value: Any) -> Any:
    """What JSON holds of a numpy scalar (the statistics are plain Python otherwise)."""
    if hasattr(value, "item") and not hasattr(value, "__len__"):
        return value.item()
    raise TypeError(f"not kept in a scan record: {type(value).__name__}")


def data_key(src: Source, label: str, split: dict[str, Any] | None) -> str:
    """The data set a scan is of: the paths or globs given, read options, label and split.

    The split by its settings (fraction, subset, seed), not by the blocks it holds out: those
    move as files come and go.
    """
    settings = None if split is None else {k: v for k, v in split.items()
                                            if k != "validation_partitions"}
    payload = json.dumps([src.given, src.options_key(), label, settings], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def changes_line(src: Source, last: dict[str, Any] | None, scanned: list[Part]) -> str:
    """One line saying what the scan did: new, changed and gone files; parts reused.

    E.g. ``scan: 24 new files (1.1 GB), 1 changed, 3 gone; 2,180 unchanged reused``.

    Parameters
    ----------
    src
        The data.
    last
        What the last scan of the same data set kept (None: none).
    scanned
        The parts scanned now (the others were reused).

    Returns
    -------
    str
        The line.
    """
    before: dict[str, list[Any]] = (last or {}).get("files", {})
    rescanned = {i for p in scanned for i in range(*p.files)}
    new = [f for f in src.files if f.path not in before]
    changed = [f for f in src.files if f.path in before and before[f.path] != [f.size, f.mtime, f.etag]]
    now = {f.path for f in src.files}
    gone = sum(1 for path in before if path not in now)
    touched = {f.path for f in new} | {f.path for f in changed}
    again = sum(1 for i in rescanned if src.files[i].path not in touched)
    reused = len(src.files) - len(rescanned)
    if last is None:
        shown = f"scan: {len(src.files):,} files ({format_bytes(src.nbytes)})"
        if not reused:
            return f"{shown} scanned"
        return (f"{shown}: {len(rescanned):,} scanned, {reused:,} reused from an earlier scan of "
                "other data")
    head = f"scan: {len(new):,} new file{'s' if len(new) != 1 else ''}"
    if new:
        head += f" ({format_bytes(sum(f.size for f in new))})"
    head += f", {len(changed):,} changed, {gone:,} gone; {reused:,} unchanged reused"
    if again:
        head += f", {again:,} unchanged scanned again with them (their part changed)"
    return head
