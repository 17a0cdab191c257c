"""The files a run started with, and what ``--resume`` does when the data grew since.

A fresh run keeps the identity of every file it trains on in ``<output>/files.json`` (a URL
without its credentials). A resumed
run continues on exactly those files: files added since (a day of new logs) join at the next
run, not this one, so the checkpoint's order of batches still holds; a file the run started
with that changed or went is refused, named. A run without ``files.json`` resumes on the data
as listed, checked by the checkpoint's fingerprint.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from daskfeed.core import CheckpointError, write_file

if TYPE_CHECKING:
    from daskfeed.reading import Source
    from daskfeed.training._options import DataSpec
    from daskfeed.training._run import Run

NAME = "files.json"
SHOWN = 5  # files named in a message


def keep_started(output: str, src: Source) -> None:
    """Keep the files a fresh run trains on (``<output>/files.json``; a dask DataFrame: none).

    Parameters
    ----------
    output
        The run's output directory (rank 0's).
    src
        Its training data.
    """
    if src.frame is not None:
        return
    body = {"given": src.given, "files": [[f.path, f.size, f.mtime, f.etag] for f in src.files]}
    write_file(os.path.join(output, NAME), json.dumps(body))


def resume_data(run: Run) -> DataSpec:
    """The data a resumed run trains on: the files it started with, as a list of paths.

    Returns ``run.data`` unchanged when the run kept no file list (or trains on a DataFrame).

    Raises
    ------
    CheckpointError
        When a file the run started with changed or went, naming them.
    """
    from daskfeed.reading import expand_paths, url_credentials, with_credentials  # (fsspec)

    try:
        with open(os.path.join(run.opts.output, NAME), encoding="utf-8") as f:
            started = json.load(f)
    except (OSError, ValueError):
        return run.data
    options = dict(run.opts.data.read.storage_options)
    now = {f.path: [f.path, f.size, f.mtime, f.etag] for f in expand_paths(run.data, options)}
    files = [tuple(row) for row in started["files"]]
    gone = [path for path, *_ in files if path not in now]
    changed = [path for path, *rest in files if path in now and now[path][1:] != list(rest)]
    if gone or changed:
        said = "; ".join(f"{what}: {', '.join(paths[:SHOWN])}"
                         f"{f' and {len(paths) - SHOWN} more' if len(paths) > SHOWN else ''}"
                         for what, paths in (("changed", changed), ("gone", gone)) if paths)
        raise CheckpointError(
            f"Expected the {len(files):,} files the run started with, unchanged, to resume it. "
            f"Received: {said}.\nHint: restore those files to resume, or train from scratch "
            "without --resume (files added since are fine: they join at the next run).")
    new = [p for p in now if p not in {path for path, *_ in files}]
    if new:
        run.echo(f"resuming on the {len(files):,} files the run started with; {len(new):,} "
                 "new file(s) matching the data join at the next run (without --resume)")
    # kept without the credentials of their URLs: those of the data as given now open them
    given = [run.data] if isinstance(run.data, (str, os.PathLike)) else run.data
    carried = url_credentials(given)
    return [with_credentials(path, carried) for path, *_ in files]
