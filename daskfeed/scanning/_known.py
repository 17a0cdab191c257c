"""What the scan knows from earlier scans: reusable parts, the last manifest, what changed since.

:class:`Known` stands between a scan and its :class:`~daskfeed.scanning._store.ScanStore` (none:
every part is scanned, nothing is kept). It gives a part's kept record, keeps the records of the
parts scanned now once their files are seen unchanged by the scan (a file rewritten while it was
read is refused, not kept), returns the last manifest when no file changed, and says in one line
what the scan did, naming a column whose type the new files changed.
"""

from __future__ import annotations

import os
from typing import Any

from daskfeed.core import DataError, ManifestMismatchError
from daskfeed.manifest import Manifest
from daskfeed.reading import FileInfo, Part, Source, protocol, relist
from daskfeed.scanning._schema import BlockFacts
from daskfeed.scanning._store import RECORD_VERSION, PartRecord, ScanStore, changes_line, data_key


class Known:
    """The earlier scans of one data set (``store`` None: none are kept).

    Parameters
    ----------
    store
        Where scans are kept.
    src, label, split
        The data set scanned now.
    entries
        The keys of its parse cache's entries (what ``daskfeed cache list`` says it serves).
    """

    def __init__(self, store: ScanStore | None, src: Source, label: str,
                 split: dict[str, Any] | None, entries: tuple[str, ...] = ()) -> None:
        self.store = store
        self.entries = entries
        self.src = src
        self.label = label
        self.split = split
        self.key = data_key(src, label, split) if store is not None else ""
        self.last = store.last(self.key) if store is not None else None
        self.records: list[str] = []  # the record of each part, in order
        self.scanned: list[Part] = []  # the parts scanned now
        self.recounted: list[str] = []  # columns whose top K was counted again (said in the line)

    def unchanged(self, fingerprint: str, vocabulary_size: int) -> Manifest | None:
        """The last scan's manifest when no file and no setting changed since (its notes repeated).

        A manifest whose skipped lines were quarantined is made again from the parts' records
        (their text is not in the manifest's JSON), as is one made of records of another
        version (:data:`~daskfeed.scanning._store.RECORD_VERSION`: e.g. without lines).
        """
        if self.last is None or self.store is None or self.last.get("version") != RECORD_VERSION:
            return None
        try:
            manifest = Manifest.from_dict(self.last["manifest"])
        except (ManifestMismatchError, KeyError, TypeError, ValueError):
            return None
        if (manifest.fingerprint != fingerprint or manifest.vocabulary_size != vocabulary_size
                or (manifest.bad_lines and self.src.options.bad_lines == "quarantine")
                or not all(self.store.has(r) for r in self.last.get("records", []))):
            return None
        manifest.scan_line = (f"scan: {len(self.src.files):,} files unchanged since the last scan "
                              "of this data: its manifest is reused, nothing scanned")
        manifest.warn_notes()
        return manifest

    def record(self, part: Part, scanned: list[int]) -> PartRecord | None:
        """``part``'s kept record for this label and split (``scanned``: its blocks in the subset)."""
        key = "" if self.store is None else self.store.record_key(
            part, self.label, None if len(scanned) == part.nblocks else scanned)
        self.records.append(key)
        return None if self.store is None else self.store.load(key)

    def earlier(self, part: Part, scanned: list[int]) -> PartRecord | None:
        """The kept record of an earlier ``part`` that one scanned now grew from (None: none)."""
        if self.store is None:
            return None
        return self.store.load(self.store.record_key(
            part, self.label, None if len(scanned) == part.nblocks else scanned))

    def keep(self, scanned: list[int], records: list[PartRecord], read: list[Part]) -> None:
        """Keep the records of the parts ``scanned`` now, once the files ``read`` are seen unchanged.

        ``read``: what was read of each (a part that grew: its new files only).

        Raises
        ------
        DataError
            When a file of them changed (or went) while the scan read it.
        """
        parts = self.scanned = read
        if not parts:
            return
        now = _seen([f for p in parts for f in self.src.files[p.files[0]:p.files[1]]], self.src)
        for part in parts:
            for info in self.src.files[part.files[0]:part.files[1]]:
                seen = now.get(info.path)
                if seen != info:
                    was = f"{info.size:,} bytes, modified at {info.mtime:.0f}"
                    became = ("gone" if seen is None else
                              f"{seen.size:,} bytes, modified at {seen.mtime:.0f}")
                    raise DataError(
                        f"Expected the files to stay unchanged while they are scanned. Received: "
                        f"{info.path} changed during the scan ({was} when listed, {became} "
                        "after).\nHint: scan again once the file is complete; keep files still "
                        "being written out of the glob (write them elsewhere and move them in).")
        if self.store is None:
            return
        for n, record in zip(scanned, records, strict=True):
            self.store.save(self.records[n], record)

    def line(self, manifest: Manifest, facts: list[BlockFacts]) -> str:
        """What the scan did in one line (and a column whose kind new files changed)."""
        if self.store is None:
            return f"scan: {'; '.join(self.recounted)}" if self.recounted else ""
        line = "; ".join([changes_line(self.src, self.last, self.scanned), *self.recounted])
        before = ((self.last or {}).get("manifest") or {}).get("columns") or {}
        fresh = {i for p in self.scanned for i in range(*p.blocks)}
        for name, column in manifest.columns.items():
            was = before.get(name) or {}
            if not was or (was.get("kind"), was.get("dtype")) == (column.kind, column.dtype):
                continue
            kinds = {f.get("kinds", {}).get(name) for i, f in enumerate(facts) if i not in fresh}
            where = next((self.src.blocks[i].describe() for i in sorted(fresh)
                          if facts[i].get("kinds", {}).get(name) not in kinds | {None}), None)
            line += (f"; column {name!r} is {column.kind} {column.dtype} now ({was.get('kind')} "
                     f"{was.get('dtype')} before){f', first in {where}' if where else ''}")
        return line

    def remember(self, manifest: Manifest) -> None:
        """Keep this scan: its files, the records it merged and its manifest."""
        if self.store is not None:
            self.store.remember(self.key, self.src, self.records, manifest.plain(), self.entries)


def _seen(files: list[FileInfo], src: Source) -> dict[str, FileInfo]:
    """``files`` as they are now, by path: a ``stat`` each where local, else the data listed again."""
    if any(protocol(f.path) != "file" for f in files):
        return relist(src.given, dict(src.options.storage_options))
    now = {}
    for f in files:
        try:
            st = os.stat(f.path)
        except OSError:
            continue
        now[f.path] = FileInfo(f.path, st.st_size, st.st_mtime)
    return now
