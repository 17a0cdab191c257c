"""Remote: connecting to a running Dask scheduler (``tcp://``, ``tls://`` or a scheduler file).

Owns the TLS credentials (:func:`make_security`) and the connection with its clear errors
(:func:`connect`); starting a LocalCluster stays in :mod:`daskfeed.cluster._start`.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import dask.config

from daskfeed.core import ClusterError

if TYPE_CHECKING:
    from distributed import Client, Security

__all__ = ["connect", "make_security"]


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


def connect(address: str, *, security: Security | None = None, timeout: str = "30s") -> Client:
    """Connect to a running scheduler (``tcp://``/``tls://`` address or scheduler-file path).

    Parameters
    ----------
    address
        The scheduler's address, or the path of the scheduler file it wrote.
    security
        TLS credentials (:func:`make_security`) for a ``tls://`` scheduler.
    timeout
        How long to try, e.g. ``"30s"``.

    Returns
    -------
    distributed.Client
        A client that is not the default one; the caller closes it.

    Raises
    ------
    ClusterError
        When the scheduler cannot be reached within ``timeout`` or refuses the connection
        (e.g. a ``tls://`` scheduler without TLS credentials).
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
