"""Remote: connecting to a running Dask scheduler (``tcp://``, ``tls://`` or a scheduler file).

Owns the TLS credentials (:func:`make_security`), the connection with its clear errors
(:func:`connect`), and what is said or refused about a scheduler on another host reached over
plain ``tcp://``: a warning, and no credentials in the storage options sent there
(:func:`refuse_plaintext_credentials`). Starting a LocalCluster stays in
:mod:`daskfeed.cluster._start`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dask.config

from daskfeed.core import ClusterError, config, refuse_setting, warn_user

if TYPE_CHECKING:
    from distributed import Client, Security

# schemes whose traffic is neither encrypted nor authenticated (wss:// and tls:// are TLS;
# inproc:// never leaves the process)
_PLAIN = frozenset({"tcp", "ws"})
# a storage option holds a credential when a word of its name is one of these (key, secret,
# aws_secret_access_key, sas_token, client_kwargs.auth, headers.Authorization, password, ...)
_SECRET_WORDS = frozenset({"key", "secret", "token", "password", "passwd", "pwd", "credential",
                           "credentials", "auth", "authorization", "cookie", "cookies", "sas"})
_SECRET_NAMES = frozenset({"connection_string", "connectionstring"})
# values that name a way to find credentials, not one (gcsfs' token="anon", "google_default" ...)
_NOT_SECRETS = frozenset({"anon", "google_default", "cloud", "browser", "cache"})


def make_security(
    tls_ca_file: str | None = None, tls_cert: str | None = None, tls_key: str | None = None
) -> Security | None:
    """A ``distributed.Security`` for ``tls://`` schedulers (``None`` when no file is given).

    Parameters
    ----------
    tls_ca_file
        The CA that signed the scheduler's and workers' certificates.
    tls_cert, tls_key
        This client's certificate and key (one PEM file may hold both).

    Returns
    -------
    distributed.Security or None
        Credentials that require encryption, or None when no file is given.

    Raises
    ------
    ClusterError
        For a file that does not exist, or a CA file without a certificate (or the reverse).
    """
    if not (tls_ca_file or tls_cert or tls_key):
        return None
    from distributed import Security

    for flag, path in (("--tls-ca-file", tls_ca_file), ("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path and not os.path.isfile(path):
            raise ClusterError(f"Expected a PEM file for {flag}. Received: {path!r} (no such file).")
    if not (tls_ca_file and tls_cert):
        raise ClusterError(
            "Expected both a CA file and a client certificate for TLS. Received: "
            f"tls_ca_file={tls_ca_file!r}, tls_cert={tls_cert!r}.\n"
            "Hint: pass --tls-ca-file ca.pem --tls-cert client.pem [--tls-key client.key]."
        )
    return Security(tls_ca_file=tls_ca_file, tls_client_cert=tls_cert, tls_client_key=tls_key,
                    require_encryption=True)


def plaintext_remote(address: str) -> str | None:
    """The scheme (``tcp``, ``ws``) when ``address`` is reached unencrypted on another host.

    An address on this machine (``localhost``, ``127.0.0.0/8``, ``::1``, a name that resolves
    only there) or over TLS (``tls://``, ``wss://``), or one that cannot be read, gives None.

    Parameters
    ----------
    address
        A scheduler's address (no scheme: ``tcp``).

    Returns
    -------
    str or None
        The unencrypted scheme, or None.
    """
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(str(address))
        host, _ = parse_host_port(loc, 8786)
    except (TypeError, ValueError):
        return None
    return scheme if host and scheme in _PLAIN and not _on_this_machine(host) else None


def _on_this_machine(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        pass
    else:
        return ip.is_loopback or ip.is_unspecified
    try:  # a name: on this machine only if every address it resolves to is
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(_on_this_machine(str(a)) for a in found)


def credential_names(options: Mapping[str, Any] | None, prefix: str = "") -> list[str]:
    """The names (dotted where nested) of the storage options that hold a credential.

    Parameters
    ----------
    options
        fsspec storage options (nested dicts too).
    prefix
        The dotted name of the dict ``options`` is (for nested ones).

    Returns
    -------
    list of str
        E.g. ``["key", "secret"]``, ``["client_kwargs.aws_secret_access_key"]``; values are
        never part of it.
    """
    found: list[str] = []
    for name, value in (options or {}).items():
        dotted = f"{prefix}{name}"
        words = set(re.split(r"[^a-z0-9]+", str(name).lower()))
        secret = bool(words & _SECRET_WORDS) or str(name).lower() in _SECRET_NAMES
        if secret and value not in (None, False, "", {}, ()) and not (
                isinstance(value, str) and value.lower() in _NOT_SECRETS):
            found.append(dotted)
        elif isinstance(value, Mapping):
            found += credential_names(value, dotted + ".")
    return found


def refuse_plaintext_credentials(address: str, storage_options: Mapping[str, Any] | None) -> None:
    """Refuse credentials in ``storage_options`` bound for a scheduler reached over plain tcp://.

    They travel with the tasks to the scheduler and the workers: over ``tcp://`` to another
    host, unencrypted, to anyone who can connect. ``daskfeed.allow-plaintext-credentials:
    true`` lets them (a network you trust).

    Parameters
    ----------
    address
        The scheduler's address (read from its file where it was given one).
    storage_options
        The fsspec storage options the tasks will carry.

    Raises
    ------
    SettingError
        Credentials for such a scheduler, not allowed by the config (a ``ValueError``).
    """
    names = credential_names(storage_options)
    scheme = plaintext_remote(address) if names else None
    if scheme is None or config.get_flag("allow-plaintext-credentials"):
        return
    refuse_setting(
        "Expected credentials in the storage options only for a scheduler reached over TLS "
        "(tls://) or on this machine: they travel with the tasks to the scheduler and workers.",
        f"{', '.join(names)} in the storage options, for the scheduler {address} on another host "
        f"over plain {scheme}:// (unencrypted: readable on the network, and anyone who can "
        "connect may read them)",
        "start the scheduler and workers with TLS (tls://, see deploy/README.md) and pass "
        "--tls-ca-file, --tls-cert and --tls-key; or leave the credentials out and let each "
        "worker find its own (AWS_ACCESS_KEY_ID ..., a profile, an instance or Pod role); or, "
        "on a network you trust, set daskfeed.allow-plaintext-credentials: true "
        "(DASK_DASKFEED__ALLOW_PLAINTEXT_CREDENTIALS=true).")


def connect(address: str, *, security: Security | None = None, timeout: str = "30s",
            storage_options: Mapping[str, Any] | None = None) -> Client:
    """Connect to a running scheduler (``tcp://``/``tls://`` address or scheduler-file path).

    A scheduler on another host reached over plain ``tcp://`` is warned of, in one line; the
    credentials of ``storage_options`` are refused for it before any connection, unless
    ``daskfeed.allow-plaintext-credentials: true`` (see ``docs/security.md``, "Remote clusters:
    yours to protect").

    Parameters
    ----------
    address
        The scheduler's address, or the path of the scheduler file it wrote.
    security
        TLS credentials (:func:`make_security`) for a ``tls://`` scheduler.
    timeout
        How long to try, e.g. ``"30s"``.
    storage_options
        The fsspec storage options the work on this scheduler will carry (checked only).

    Returns
    -------
    distributed.Client
        A client that is not the default one; the caller closes it.

    Raises
    ------
    ClusterError
        When the scheduler cannot be reached within ``timeout`` or refuses the connection
        (e.g. a ``tls://`` scheduler without TLS credentials).
    SettingError
        Credentials in ``storage_options`` for a scheduler on another host over plain ``tcp://``.
    """
    from distributed import Client

    kind = "scheduler file" if os.path.exists(address) else "scheduler"
    target = address
    if kind == "scheduler file":
        try:
            with open(address, encoding="utf-8") as f:
                target = json.load(f).get("address", address)
        except (OSError, ValueError):
            pass
    tls = str(target).startswith("tls://")
    if tls and security is None and not dask.config.get("distributed.comm.tls.ca-file", None):
        raise ClusterError(
            f"The scheduler at {target} speaks TLS; expected TLS credentials to connect. "
            "Received: no --tls-ca-file / --tls-cert / --tls-key.\n"
            "Hint: pass the CA file and a client certificate and key signed by that CA."
        )
    refuse_plaintext_credentials(target, storage_options)
    scheme = plaintext_remote(target)
    if scheme is not None:
        warn_user(f"the scheduler {target} is on another host over plain {scheme}://: traffic is "
                  "unencrypted and unauthenticated (anyone who can reach it can run code on its "
                  "workers). Hint: start it with TLS (tls://, see deploy/README.md) and pass "
                  "--tls-ca-file, --tls-cert and --tls-key (Python: security=distributed.Security(...)).")
    try:
        if kind == "scheduler file":
            return Client(scheduler_file=address, security=security, timeout=timeout,
                          set_as_default=False)
        return Client(address, security=security, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError, TypeError, ValueError) as err:
        how = ("Hint: check the CA file and that the client certificate is signed by it."
               if tls else
               "Hint: check the address and that 'dask scheduler' is running; for a tls:// "
               "scheduler pass --tls-ca-file, --tls-cert and --tls-key.")
        raise ClusterError(
            f"Cannot connect to the Dask {kind} {address} within {timeout}.\n"
            f"Received: {type(err).__name__}: {str(err).strip()[:500]}\n{how}"
        ) from err
