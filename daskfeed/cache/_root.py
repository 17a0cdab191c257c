"""The cache root: a directory daskfeed made or adopted, marked as its own, that only its user writes.

Everything daskfeed reads back from a cache root (scan records, cache entries, bucket sets) is
data, never code; still, a root others can write lets them plant what trainers read, swap an
entry for a link, or have daskfeed remove a folder. So before anything is read or written under
a root (on the trainer, and on each worker for the parse cache) :func:`own_root` checks it:

- the root itself, with ``lstat``: a directory owned by this user (on a worker: the user the
  worker runs as), writable by no one else; not a symbolic link, unless the link is the user's
  own (``~/.cache/daskfeed`` moved to a bigger disk) and what it points to passes the same checks;
- its marker, ``daskfeed-cache.json``: written when daskfeed creates the root, or adopts one
  holding only what daskfeed makes (a root of an older version); a root holding anything else
  is refused: daskfeed removes only what it made (:func:`is_ours`), under a marked root.

A root several users share is refused: each user needs a root of their own (a folder per user
in a team's scratch). The levels daskfeed creates under a root (entries, ``scans``,
``buckets``) are checked by :func:`own_dir` as they are used; one of the user's own that others
may write (made by an older daskfeed under a umask of 002) is made 0700 again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from typing import Any

from daskfeed.core import CacheError, write_file

MARKER = "daskfeed-cache.json"
MARKER_FORMAT = "daskfeed cache root"
# what daskfeed makes at a root: part entries (32 hex digits), the scans' and buckets' folders,
# entries being removed, its marker (and the marker's temporary names), its lock
_ENTRY = re.compile(r"[0-9a-f]{32}")
_OURS = re.compile(r"(?:[0-9a-f]{32}(?:\.removing-[0-9a-f-]+)?|scans|buckets|"
                   r"daskfeed-cache\.json(?:\.tmp-[0-9]+-[0-9a-f]{12})?|daskfeed-cache\.lock)")


def is_entry_name(name: str) -> bool:
    """Whether ``name`` is one daskfeed gives a part's entry (32 hex digits)."""
    return bool(_ENTRY.fullmatch(name))


def is_ours(name: str) -> bool:
    """Whether ``name``, directly under a root, is one daskfeed makes there."""
    return bool(_OURS.fullmatch(name))


def entry_meta(path: str) -> dict[str, Any] | None:
    """The ``meta.json`` of the cache entry ``path`` (None: not a daskfeed entry).

    An entry is a directory, not a link, named as daskfeed names them, whose ``meta.json`` is a
    daskfeed entry's (an identity and a format version): nothing else is ever removed.
    """
    if not is_entry_name(os.path.basename(path)) or os.path.islink(path) or not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "identity" in meta and "version" in meta else None


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _refuse(path: str, finding: str, hint: str) -> CacheError:
    return CacheError(f"Expected the cache directory {path} to be daskfeed's and yours alone. "
                      f"Received: {finding}.\nHint: {hint}.")


def _me() -> int:
    return os.getuid() if hasattr(os, "getuid") else -1


def _check(path: str, st: os.stat_result, what: str) -> None:
    """Refuse ``path`` (lstat'ed as ``st``) unless it is the user's own directory.

    Or the user's own link to one; in both cases writable by no one else.
    """
    me = _me()
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(path)
        if st.st_uid != me:
            raise _refuse(path, f"{what} is a symbolic link (to {target}) of {_who(st.st_uid)}",
                          f"give the directory itself (--cache {target}), if it is yours")
        st = os.stat(path)  # the user's own link: what it points to is checked instead
        what = f"{what} (a link to {target})"
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, f"{what} is not a directory", "give a new or empty directory")
    if me >= 0 and st.st_uid != me:
        raise _refuse(path, f"{what} belongs to {_who(st.st_uid)}, not to {_who(me)}",
                      "give a directory of your own (e.g. the default, ~/.cache/daskfeed; on a "
                      "team's scratch, a folder per user): what daskfeed reads there, others "
                      "could plant")
    if st.st_mode & 0o022:
        raise _refuse(path, f"{what} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                      "anyone in its group or on the machine could plant or swap what daskfeed "
                      "reads there", f"chmod go-w {path}")


def own_root(base: str, *, create: bool = True) -> bool:
    """Check the cache root ``base`` (create and mark it if missing); whether it exists.

    Parameters
    ----------
    base
        The root, absolute.
    create
        Create it where missing (False: a missing root is returned as such, e.g. to list it).

    Returns
    -------
    bool
        Whether the root exists now (checked and marked).

    Raises
    ------
    CacheError
        A link, not a directory, another user's, writable by others, or holding what daskfeed
        did not make and unmarked: with the path, the finding and the fix.
    """
    try:
        st = os.lstat(base)
    except FileNotFoundError:
        if not create:
            return False
        os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
        with contextlib.suppress(FileExistsError):  # (another worker or trainer made it first)
            os.mkdir(base, 0o700)
        st = os.lstat(base)
    _check(base, st, "it")
    marker = os.path.join(base, MARKER)
    try:
        mst = os.lstat(marker)
        with open(marker, encoding="utf-8") as f:
            body = json.load(f)
        if stat.S_ISREG(mst.st_mode) and isinstance(body, dict) and \
                body.get("format") == MARKER_FORMAT:
            return True
        found = f"its {MARKER} is not daskfeed's marker"
    except FileNotFoundError:
        foreign = sorted(name for name in os.listdir(base) if not is_ours(name))
        if not foreign:  # new, or made by an older daskfeed: adopted
            write_file(marker, json.dumps({"format": MARKER_FORMAT, "created": time.time()}),
                       perms=0o644)
            return True
        shown = ", ".join(repr(n) for n in foreign[:3]) + (
            f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else "")
        found = f"it holds files daskfeed did not make ({shown}) and no {MARKER}"
    except PermissionError as err:
        found = f"its {MARKER} cannot be read ({err.strerror})"
    except (OSError, ValueError):
        found = f"its {MARKER} is not daskfeed's marker (unreadable)"
    raise _refuse(base, found,
                  "daskfeed keeps its cache in a directory of its own and removes only what it "
                  f"made there: give a new or empty directory (e.g. --cache "
                  f"{os.path.join(base, 'daskfeed-cache')})")


def own_dir(path: str, *, create: bool = True) -> bool:
    """Check a level daskfeed makes under a checked root (create it 0700 if missing).

    A level of the user's own that others may write (made by an older daskfeed under a umask of
    002) is made 0700: it is daskfeed's, under a root only the user writes.

    Parameters
    ----------
    path
        The directory (``<root>/scans``, an entry, ...).
    create
        Create it where missing.

    Returns
    -------
    bool
        Whether it is there (False: missing and not created).

    Raises
    ------
    CacheError
        A link, not a directory, or another user's.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return False
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    what = f"{os.path.basename(path)!r}, made by daskfeed in a cache root,"
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, f"{what} is a symbolic link (to {os.path.realpath(path)})",
                      f"remove the link ({path}): daskfeed makes that folder itself")
    if stat.S_ISDIR(st.st_mode) and st.st_uid == _me() and st.st_mode & 0o077:
        os.chmod(path, 0o700)  # (lstat: not a link) ours, in a root only we write: ours alone
        st = os.lstat(path)
    _check(path, st, what)
    return True
