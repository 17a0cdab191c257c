"""Credentials in the data's URLs: kept out of every path daskfeed holds, used only to open files.

A URL given with credentials (``https://user:password@host/data/*.csv``, a presigned URL's
``?X-Amz-Signature=...``) is listed with them; the files it gives are known by their URLs without
them (:func:`~daskfeed.core._secrets.redact_url`): that is what a :class:`~daskfeed.reading._files.FileInfo`,
a block, the manifest, the scan's records, the cache and every message hold, and what their keys
are made of (a rotated password keeps the cache). The credentials travel beside the storage
options, which are never compared, printed nor written (:class:`~daskfeed.reading._tables.ReadOptions`),
under :data:`CARRIED`; where fsspec is called (listing, ``stat``, opening) they are put back
(:func:`fsspec_target`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from daskfeed.core import DataNotFoundError, redact_url, url_parts

# the storage option that carries the URLs' credentials (removed before fsspec sees the options)
CARRIED = "daskfeed_url_credentials"

# stores whose fsspec filesystem takes no credentials from the URL: userinfo there is read as
# part of the bucket's name (s3fs: "Invalid bucket name")
_NO_USERINFO = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})


def url_credentials(items: Iterable[object]) -> tuple[str, ...]:
    """What must travel to open the files of ``items``: their credentials, as URL parts.

    Parameters
    ----------
    items
        The paths and URLs as given (others, e.g. a DataFrame, are passed over).

    Returns
    -------
    tuple of str
        For a URL with userinfo, ``scheme://userinfo@host`` (every file of that host gets it);
        for one with a secret query parameter, the URL itself (that URL gets it). Empty when
        none has credentials (the usual case).
    """
    carried: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            continue
        url = os.fspath(item)
        scheme, userinfo, host, rest = url_parts(url)
        if userinfo:
            carried.append(f"{scheme}://{userinfo}@{host}")
        if redact_url(f"{scheme}://{host}{rest}") != f"{scheme}://{host}{rest}":
            carried.append(url)  # a secret query parameter
    return tuple(dict.fromkeys(carried))


def carry(storage_options: Sequence[tuple[str, Any]],
          items: Iterable[object]) -> tuple[tuple[str, Any], ...]:
    """The read options' storage options with the credentials of ``items`` added.

    Parameters
    ----------
    storage_options
        :attr:`~daskfeed.reading._tables.ReadOptions.storage_options`.
    items
        The paths and URLs as given.

    Returns
    -------
    tuple
        The same items, sorted, and :data:`CARRIED` holding what :func:`url_credentials` gives
        (with what it held); unchanged when the items carry no credentials.
    """
    found = url_credentials(items)
    if not found:
        return tuple(storage_options)
    options = dict(storage_options)
    options[CARRIED] = tuple(dict.fromkeys((*options.get(CARRIED, ()), *found)))
    return tuple(sorted(options.items()))


def with_credentials(path: str, carried: Iterable[str]) -> str:
    """``path`` (a URL as daskfeed keeps it) with the credentials ``carried`` for it.

    Parameters
    ----------
    path
        A path or URL without credentials (or with them: then as it is).
    carried
        What :func:`url_credentials` gave.

    Returns
    -------
    str
        The URL to open: the carried URL it is the redacted form of, else ``path`` with the
        userinfo carried for its host, else ``path``.
    """
    carried = tuple(carried)
    for url in carried:
        if redact_url(url) == path:
            return url
    scheme, userinfo, host, rest = url_parts(path)
    if not scheme or userinfo:
        return path
    for url in carried:
        s, info, h, r = url_parts(url)
        if info and not r and (s, h) == (scheme, host):
            return f"{scheme}://{info}@{host}{rest}"
    return path


def fsspec_target(path: str, storage_options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """What fsspec is called with for ``path``: the URL with its credentials, and fsspec's options.

    Parameters
    ----------
    path
        A path, glob or URL (as daskfeed keeps it, or as given).
    storage_options
        The storage options, perhaps carrying credentials (:data:`CARRIED`).

    Returns
    -------
    tuple of (str, dict)
        The URL to hand fsspec and the options without :data:`CARRIED`.

    Raises
    ------
    DataNotFoundError
        For credentials in the URL of an object store whose filesystem does not read them
        there (``s3://key:secret@bucket/...``), named without them.
    """
    options = dict(storage_options or {})
    carried = options.pop(CARRIED, ())
    target = with_credentials(path, carried) if carried else path
    scheme, userinfo, _, _ = url_parts(target)
    if userinfo and scheme.lower() in _NO_USERINFO:
        raise DataNotFoundError(
            f"Expected the bucket's name after {scheme}://, and credentials in the environment "
            f"or the storage options. Received: credentials in the URL {redact_url(target)!r}, "
            f"which the {scheme}:// filesystem reads as part of the bucket's name.\nHint: take "
            "them out of the URL and give them in the environment (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY or AWS_PROFILE for s3://), or in a JSON file only you can "
            "read: --storage-options @options.json (storage_options= in Python)."
        )
    return target, options
