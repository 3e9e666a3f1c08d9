"""The operator's certificate authority and the SuperLink's TLS certificate.

Run once, on the operator's machine::

    python -m privfed.flower.deploy.certs DIR --host superlink.example.org [--host 10.0.0.5 ...]

writes ``DIR/ca.crt`` (the CA certificate: public, give it to every SuperNode and to whoever runs
``flwr``), ``DIR/ca.key`` (the CA's private key, mode 0600: keep it offline, it can certify any
server), ``DIR/superlink.crt`` and ``DIR/superlink.key`` (mode 0600: the SuperLink machine only).
Start the SuperLink with ``--ssl-ca-certfile DIR/ca.crt --ssl-certfile DIR/superlink.crt
--ssl-keyfile DIR/superlink.key`` and every SuperNode with ``--root-certificates DIR/ca.crt``.

The SuperLink's certificate names every address a client dials (``--host``: a DNS name or an IP
address, as SuperNodes give it in ``--superlink HOST:PORT``) and always ``localhost`` and
``127.0.0.1``: Flower 1.41's SuperLink starts its own SuperExec, which connects to the SuperLink's
Runtime API on the loopback address (the bind address ``0.0.0.0`` becomes ``127.0.0.1``) and checks
the certificate against the same CA.  ``--renew`` issues a fresh SuperLink key and certificate from
the CA already in ``DIR`` (nodes keep their ``ca.crt``).

Keys are ECDSA P-256 from OS entropy (``cryptography``); certificates are X.509 v3 with the
extensions TLS clients check (CA: basic constraints ``CA:TRUE, pathlen:0``, key usage keyCertSign;
server: ``CA:FALSE``, digitalSignature, extended key usage serverAuth, the SANs).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from privfed.errors import ConfigError, PrivfedError

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "LOOPBACK_NAMES",
    "SERVER_CERT",
    "SERVER_KEY",
    "issue_server_certificate",
    "main",
    "make_ca",
    "write_certificates",
]

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "superlink.crt", "superlink.key"
#: Names every SuperLink certificate carries: its SuperExec dials the Runtime API on loopback.
LOOPBACK_NAMES = ("localhost", "127.0.0.1")
MAX_DAYS = 3650
_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ConfigError(f"--days {days!r} must be a whole number of days in 1..{MAX_DAYS}")
    now = datetime.datetime.now(datetime.UTC)
    # A few minutes back: a node whose clock runs slightly behind still accepts a fresh certificate.
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def _san(host: str) -> x509.GeneralName:
    """One SubjectAlternativeName entry: an IP address or a DNS name (ConfigError naming the host otherwise)."""
    text = str(host).strip()
    try:
        return x509.IPAddress(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    # A name whose last label is all digits is no DNS name (RFC 3696, section 2): "999.1.1.1" or "10.0.0"
    # is a mistyped IP address, which no resolver would ever give the SuperLink.
    if labels[-1].isdigit():
        raise ConfigError(
            f"--host {host!r} is not an IP address (four numbers 0..255 without leading zeros or a trailing dot, "
            "e.g. 10.0.0.5) and, ending in a number, not a DNS name either: give the address SuperNodes dial in "
            "--superlink"
        )
    if text and len(text) <= 253 and all(_DNS_LABEL.match(lab) for lab in labels):
        return x509.DNSName(text.rstrip(".").lower())
    raise ConfigError(
        f"--host {host!r} is neither an IP address nor a DNS name; give the address SuperNodes dial in "
        "--superlink HOST:PORT, without a scheme or a port (e.g. --host superlink.example.org --host 10.0.0.5)"
    )


def make_ca(common_name: str = "privfed deployment CA", days: int = MAX_DAYS):
    """A fresh self-signed CA: (private key, certificate)."""
    not_before, not_after = _validity(days)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_server_certificate(ca_key, ca_cert, hosts: Sequence[str], days: int = 365):
    """A fresh key and a serverAuth certificate signed by the CA, valid for ``hosts`` and loopback."""
    sans: list[x509.GeneralName] = []
    for h in [*hosts, *LOOPBACK_NAMES]:
        entry = _san(h)
        if entry not in sans:
            sans.append(entry)
    if len(sans) == len(LOOPBACK_NAMES) and not [h for h in hosts if str(h).strip()]:
        raise ConfigError(
            "no --host given: name the address (DNS name or IP) SuperNodes dial to reach the SuperLink"
        )
    not_before, not_after = _validity(days)
    not_after = min(not_after, ca_cert.not_valid_after_utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(str(hosts[0]).strip()))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_file(path: Path, data: bytes, *, private: bool) -> Path:
    """Write ``data`` atomically; a private file is created with mode 0600 (never readable by others).

    The temporary file has a random name and is created new (``mkstemp``: mode 0600, never through a link,
    never one a killed run left), then renamed into place; a failure removes it.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".privfed-tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if not private:
                os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _load_ca(directory: Path):
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if key_path.is_file() and not cert_path.exists():  # ca.key is written first: a run stopped between them
        raise ConfigError(
            f"{key_path} has no {CA_CERT} beside it: a run that made this CA was stopped before writing it; no "
            "certificate was issued from it, so remove the folder and make a new CA without --renew"
        )
    for p in (cert_path, key_path):
        if not p.is_file():
            raise ConfigError(
                f"--renew needs the CA in {directory}: {p} is missing; make a CA without --renew"
            )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except TypeError:  # a key kept encrypted (offline): cryptography asks for its password
        raise ConfigError(
            f"{key_path} is encrypted: move it to {CA_KEY}.enc, write its decrypted key as {key_path} (openssl pkey "
            f"-in {CA_KEY}.enc -out {CA_KEY}), renew, then delete the decrypted {CA_KEY} and move {CA_KEY}.enc back"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{cert_path} / {key_path} are not a PEM certificate and key: {exc}") from None
    if key.public_key() != cert.public_key():
        raise ConfigError(f"{key_path} is not the key of {cert_path}; restore the CA's matching pair")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:  # its certificates would fail every node's check
        raise ConfigError(
            f"{cert_path} is not a CA certificate (no CA:TRUE); give the folder of the CA privfed made"
        )
    if cert.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
        raise ConfigError(
            f"the CA in {cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; make a new CA (without --renew) "
            "in an empty folder and give every node its ca.crt"
        )
    return key, cert


def write_certificates(
    directory: str | os.PathLike, hosts: Sequence[str], *, days: int = 365, renew: bool = False
) -> dict[str, Path]:
    """Make (or, with ``renew``, reuse) the CA in ``directory`` and issue the SuperLink's certificate.

    Refuses to overwrite an existing CA or SuperLink key (a new CA would orphan every node's
    ``ca.crt``); ``renew`` keeps the CA and replaces only the SuperLink's key and certificate.
    Returns the paths written, by file name.
    """
    if not str(directory).strip():  # it would mean the working folder
        raise ConfigError("DIR is empty: name the folder the CA and the SuperLink's certificate go to")
    out = Path(directory).expanduser()
    if renew:
        ca_key, ca_cert = _load_ca(out)
    else:
        clash = [out / n for n in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY) if (out / n).exists()]
        if clash:
            raise ConfigError(
                f"{clash[0]} already exists: a new CA would invalidate every certificate the old one issued; "
                "give an empty directory, or --renew to issue a new SuperLink certificate from this CA"
            )
        ca_key, ca_cert = make_ca()
    key, cert = issue_server_certificate(ca_key, ca_cert, hosts, days)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    files = [(SERVER_KEY, _key_pem(key), True), (SERVER_CERT, _cert_pem(cert), False)]
    if not renew:
        files = [(CA_KEY, _key_pem(ca_key), True), (CA_CERT, _cert_pem(ca_cert), False), *files]
    try:
        for name, data, private in files:
            written[name] = write_file(out / name, data, private=private)
    except BaseException:
        if not renew:  # a new CA written in part is no CA: nothing of it is left (a renewal keeps the CA)
            for path in written.values():
                with contextlib.suppress(OSError):
                    path.unlink()
        raise
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m privfed.flower.deploy.certs",
        description="Make the deployment's CA and the SuperLink's TLS certificate (see docs/flower.md).",
    )
    p.add_argument("directory", help="where ca.crt, ca.key, superlink.crt and superlink.key are written")
    p.add_argument(
        "--host",
        action="append",
        required=True,
        help="an address SuperNodes and flwr dial (DNS name or IP; repeat for each); "
        "localhost and 127.0.0.1 are always added for the SuperLink's own SuperExec",
    )
    p.add_argument(
        "--days", type=int, default=365, help="validity of the SuperLink certificate (default 365)"
    )
    p.add_argument(
        "--renew", action="store_true", help="reuse the CA in DIRECTORY; replace the SuperLink's key"
    )
    a = p.parse_args(argv)
    try:
        written = write_certificates(a.directory, a.host, days=a.days, renew=a.renew)
    except PrivfedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a folder that cannot be made or read
        print(
            f"error: {exc.filename}: {exc.strerror or exc}; give a folder this user can write",
            file=sys.stderr,
        )
        return 2
    cert = x509.load_pem_x509_certificate(written[SERVER_CERT].read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    shown = ", ".join(str(getattr(n, "value", n)) for n in names)
    print(
        f"wrote {', '.join(str(p) for p in written.values())}; the SuperLink certificate is valid for {shown} "
        f"until {cert.not_valid_after_utc:%Y-%m-%d}. Keep {Path(a.directory) / CA_KEY} offline."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
