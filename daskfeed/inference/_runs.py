"""A finished run's record: ``OUTPUT/run.json`` ties together what one ``daskfeed train`` wrote.

A run writes its manifest as ``manifest.running.json`` while it trains and publishes it as
``manifest.json`` only beside the model it trained (:func:`publish_manifest`); then ``run.json``
(:func:`write_record`): the run's id and the SHA-256 of ``model.keras``, ``manifest.json``,
``history.json`` and ``serving/``'s files, written last. Readers (``predict``, ``export``,
serving) check ``model.keras`` and ``manifest.json`` against it (:func:`check_record`): a
manifest of another run beside the model (other vocabularies or statistics for the same
columns) is refused by name, never used to encode. A directory without ``run.json`` (an older
daskfeed's) is read as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from daskfeed.core import ManifestMismatchError, write_file

RECORD = "run.json"
RUNNING_MANIFEST = "manifest.running.json"  # the manifest of a run still training
FORMAT = "daskfeed run"
VERSION = 1
_TIED = ("model.keras", "manifest.json")  # what a reader checks
_CHUNK = 1 << 20


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _outputs(out: str) -> list[str]:
    """The files a run's record ties (relative to ``out``), those present."""
    names = [n for n in (*_TIED, "history.json") if os.path.isfile(os.path.join(out, n))]
    serving = os.path.join(out, "serving")
    for d, _, files in sorted(os.walk(serving)):
        names += sorted(os.path.relpath(os.path.join(d, n), out) for n in files)
    return names


def publish_manifest(out: str) -> None:
    """Make the running manifest the run's ``manifest.json`` (done beside its saved model)."""
    running = os.path.join(out, RUNNING_MANIFEST)
    if os.path.exists(running):
        os.replace(running, os.path.join(out, "manifest.json"))


def write_record(out: str, run_id: str) -> dict[str, Any]:
    """Write ``out/run.json``: the run's id and the digests of what it wrote (last of all).

    Returns
    -------
    dict
        The record.
    """
    record = {"format": FORMAT, "version": VERSION, "run_id": run_id, "finished": time.time(),
              "files": {n: _sha256(os.path.join(out, n)) for n in _outputs(out)}}
    write_file(os.path.join(out, RECORD), json.dumps(record, indent=1))
    return record


def check_record(directory: str) -> str | None:
    """Check that ``model.keras`` and ``manifest.json`` are the ones ``run.json`` ties.

    Returns
    -------
    str or None
        The run's id; None: no ``run.json`` (an older daskfeed's directory: not checked).

    Raises
    ------
    ManifestMismatchError
        A file is not the one the run wrote (another run's manifest beside the model: a run
        still going or cut short, or a file copied in), or the record is not daskfeed's.
    """
    path = os.path.join(directory, RECORD)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        files = record["files"]
        ok = record.get("format") == FORMAT and isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ManifestMismatchError(
            f"Expected {path} to be the record daskfeed train writes last (format {FORMAT!r}). "
            "Received: a file that is not one.\nHint: train again into this directory, or "
            "remove run.json if you know model.keras and manifest.json belong together.")
    changed = [n for n in _TIED if n in files and (
        not os.path.isfile(os.path.join(directory, n))
        or _sha256(os.path.join(directory, n)) != files[n])]
    if changed:
        running = os.path.exists(os.path.join(directory, RUNNING_MANIFEST))
        raise ManifestMismatchError(
            f"Expected model.keras and manifest.json of one run in {directory} (run "
            f"{record.get('run_id', '?')}, as its run.json records them). Received: "
            f"{' and '.join(changed)} changed since that run finished"
            + (" (a run is training there, or was cut short: its manifest.running.json is "
               "beside them)" if running else "")
            + ": its vocabularies and statistics may not be the model's.\nHint: let the run "
            "in that directory finish, or train again (--output); predict from a finished "
            "run's directory.")
    return str(record.get("run_id"))
