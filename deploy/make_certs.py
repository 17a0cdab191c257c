"""Certificates for a Dask cluster that speaks TLS: a CA, scheduler/worker and trainer certificates.

One certificate for the scheduler and workers, one for the trainers, signed by a private CA:

    python deploy/make_certs.py deploy/tls             # or: --days 90

writes, into a new (or empty) directory it makes private (0700):

    ca.pem                  the CA's certificate: every process is given it (not secret)
    ca.key                  the CA's key: keep it OFF the cluster; whoever holds it can make
                            certificates the cluster admits (needed only to make more)
    node.pem, node.key      the scheduler's and the workers' certificate and key
    client.pem, client.key  the trainers' (daskfeed's client) certificate and key

Keys are written 0600. Dask checks a peer's certificate against the CA only (no host names):
any certificate this CA signed is admitted in any role, so hand each key only to the processes
that need it. Needs the ``cryptography`` package (a dependency of daskfeed). How the files are
given to ``dask scheduler``, ``dask worker`` and ``daskfeed train``: deploy/README.md, "TLS".
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

FILES = ("ca.pem", "ca.key", "node.pem", "node.key", "client.pem", "client.key")


def _key():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key, issuer_key, issuer_name, days: int, *, ca: bool):  # type: ignore[no-untyped-def]
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer_name if issuer_name is not None else name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None),
                              critical=True))
    if not ca:  # one certificate both accepts connections and makes them (workers do both)
        builder = builder.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)  # never over a file
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make(directory: str, days: int = 365) -> dict[str, str]:
    """Write the CA, node and client certificates and keys into ``directory``; their paths.

    Raises
    ------
    FileExistsError
        When ``directory`` already holds one of the files (nothing is overwritten).
    """
    from cryptography.hazmat.primitives import serialization

    os.makedirs(directory, mode=0o700, exist_ok=True)
    there = [f for f in FILES if os.path.exists(os.path.join(directory, f))]
    if there:
        raise FileExistsError(f"Expected a new or empty directory for the certificates. Received: "
                              f"{directory} holding {', '.join(there)}.\nHint: give another "
                              "directory, or remove those files to make new ones.")
    os.chmod(directory, 0o700)
    ca_key = _key()
    ca = _cert("daskfeed cluster CA", ca_key, ca_key, None, days, ca=True)
    made = {"ca": (ca_key, ca)}
    for stem in ("node", "client"):
        key = _key()
        made[stem] = (key, _cert(f"daskfeed {stem}", key, ca_key, ca.subject, days, ca=False))
    for stem, (key, cert) in made.items():
        _write(os.path.join(directory, f"{stem}.pem"),
               cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(os.path.join(directory, f"{stem}.key"),
               key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()), 0o600)
    return {f: os.path.join(directory, f) for f in FILES}


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python deploy/make_certs.py DIRECTORY [--days N]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="where the files go (made 0700; must not hold them)")
    parser.add_argument("--days", type=int, default=365, help="validity (default: 365)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error(f"expected --days of 1 or more. Received: {args.days}")
    try:
        paths = make(args.directory, args.days)
    except FileExistsError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    except ImportError as err:
        print(f"Error: Expected the cryptography package. Received: {err}.\nHint: pip install "
              "cryptography (daskfeed depends on it).", file=sys.stderr)
        return 1
    for name in FILES:
        print(paths[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
