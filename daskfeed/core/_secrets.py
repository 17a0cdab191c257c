"""Secrets: credentials taken out of the URLs daskfeed keeps or shows, and found in options.

A URL may carry credentials: its userinfo (``https://user:password@host/...``,
``s3://key:secret@bucket/...``) and a few query parameters that are secrets by name (a presigned
URL's signature, a SAS token). :func:`redact_url` gives the URL without them; it is what every
record, file, key and message of daskfeed holds, so a secret is never written, printed, nor part
of a fingerprint (rotating it keeps the cache and the manifests). The credentials are used only
to open the files (:mod:`daskfeed.reading._files`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

REDACTED = "redacted"  # a secret query parameter's value as kept (no glob character: * ? [)

# query parameters whose value is a secret, by name (any case): AWS and GCS presigned URLs
# (their signature, credential scope and session token), Azure's SAS signature (``sig``) and
# the usual names of tokens and passwords. Kept short: other parameters are kept as given.
SECRET_PARAMETERS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",
    "x-goog-signature", "x-goog-credential",
    "sig", "signature", "token", "access_token", "password", "secret",
})

# storage options (fsspec's keyword arguments, at any depth) that hold credentials, by name
# (any case): s3fs's key/secret/token, boto's names, gcsfs's token (unless a method such as
# "anon"), adlfs's account_key/sas_token/client_secret/connection_string, HTTP headers
SECRET_OPTIONS = frozenset({
    "key", "secret", "token", "password", "passwd",
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "session_token",
    "security_token", "client_secret", "account_key", "sas_token", "credential", "credentials",
    "connection_string", "api_key", "authorization",
})
# values of ``token`` that name a way to find credentials (gcsfs), not credentials
_NOT_SECRET = frozenset({"anon", "google_default", "cache", "cloud", "browser"})

_QUERY = re.compile(r"(?<=[?&;#])([^=&;#?/]+)=([^&;#]*)")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def redact_url(url: str) -> str:
    """``url`` without credentials: no userinfo, and secret query parameters' values redacted.

    Parameters
    ----------
    url
        A URL (``scheme://...``); anything else (a local path) is returned as it is.

    Returns
    -------
    str
        ``s3://key:secret@bucket/a.csv`` -> ``s3://bucket/a.csv``;
        ``https://host/a.csv?X-Amz-Signature=abc&v=1`` -> ``https://host/a.csv?X-Amz-Signature=redacted&v=1``
        (the parameters named, in any case, ``X-Amz-Signature``, ``X-Amz-Credential``,
        ``X-Amz-Security-Token``, ``X-Goog-Signature``, ``X-Goog-Credential``, ``sig``,
        ``signature``, ``token``, ``access_token``, ``password`` or ``secret``). The same for every
        secret: a key made of it stays the same when the secret changes.

    Examples
    --------
    >>> redact_url("https://reader:pw@example.com:8443/data/a.csv?sig=abc&page=2")
    'https://example.com:8443/data/a.csv?sig=redacted&page=2'
    """
    scheme, _, host, rest = url_parts(url)
    if not scheme:
        return url
    if "=" in rest:
        rest = _QUERY.sub(_redact_parameter, rest)
    return f"{scheme}://{host}{rest}"


def url_parts(url: str) -> tuple[str, str, str, str]:
    """A URL's scheme, userinfo, host (with its port) and the rest (path, query, fragment).

    Parameters
    ----------
    url
        A URL; anything else (a local path) gives ``("", "", "", url)``.

    Returns
    -------
    tuple of str
        ``("https", "user:pw", "host:8443", "/a.csv?v=1")``; userinfo ``""`` when there is none.
        ``scheme://userinfo@host`` + rest is ``url`` again (without userinfo, no ``@``).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", "", url
    cut = _authority_end(rest)
    userinfo, at, host = rest[:cut].rpartition("@")
    return scheme, userinfo if at else "", host, rest[cut:]


def _authority_end(rest: str) -> int:
    """Where the authority (``[userinfo@]host[:port]``) of ``rest`` (a URL after ``://``) ends.

    At the first ``/``, ``?`` or ``#``, unless userinfo holds one unencoded (an AWS secret
    key often holds ``/``): ``key:se/cret@bucket/...`` ends after the host that follows its
    ``@``. A ``:`` followed by digits only is a port: ``host:8443/a@b.csv`` keeps its ``@``.
    """
    cut = min((at for at in (rest.find(end) for end in "/?#") if at >= 0), default=len(rest))
    if "@" in rest[:cut] or "@" not in rest:
        return cut
    user, colon, secret = rest[:cut].partition(":")
    if not (user and colon) or secret.isdigit():  # a host, or host:port: an "@" of the path
        return cut
    at = rest.find("@", cut)
    return at + 1 + _authority_end(rest[at + 1:])


def _redact_parameter(match: re.Match[str]) -> str:
    name = match.group(1)
    return f"{name}={REDACTED}" if name.lower() in SECRET_PARAMETERS else match.group(0)


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`): for messages of other libraries.

    Parameters
    ----------
    text
        A message (an error of fsspec, a store's client, aiohttp ...).

    Returns
    -------
    str
        The same text, its URLs without credentials.
    """
    if "://" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def secret_options(options: Mapping[str, Any] | None) -> list[str]:
    """The names of the storage options that hold credentials (nested ones dotted).

    Parameters
    ----------
    options
        fsspec's keyword arguments, as ``--storage-options`` gives them.

    Returns
    -------
    list of str
        E.g. ``["key", "secret", "client_kwargs.aws_session_token"]``: options named, in any
        case, ``key``, ``secret``, ``token``, ``password``, ``passwd``, ``aws_access_key_id``,
        ``aws_secret_access_key``, ``aws_session_token``, ``session_token``, ``security_token``,
        ``client_secret``, ``account_key``, ``sas_token``, ``credential``, ``credentials``,
        ``connection_string``, ``api_key`` or ``authorization`` (or holding ``secret`` /
        ``password``), with a value that is not empty (nor, for ``token``, a method such as
        ``"anon"``).
    """
    return list(_secret_names(options or {}, ""))


def _secret_names(options: Mapping[str, Any], prefix: str) -> Iterator[str]:
    for name, value in options.items():
        lower = str(name).lower()
        if isinstance(value, Mapping) and lower not in ("token", "credentials"):
            yield from _secret_names(value, f"{prefix}{name}.")
            continue
        named = lower in SECRET_OPTIONS or "secret" in lower or "password" in lower
        if named and value not in (None, "", False) and not (
                isinstance(value, str) and value.lower() in _NOT_SECRET):
            yield f"{prefix}{name}"
