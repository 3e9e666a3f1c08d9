"""The deployment's certificate script: a CA, the SuperLink's certificate with its SANs, the keys.

The certificates are checked with OpenSSL's own verifier through Python's ``ssl`` (a real TLS
handshake on loopback), independent of the ``cryptography`` code that made them.
"""

from __future__ import annotations

import socket
import ssl
import stat
import subprocess
import sys
import threading

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from privfed.errors import ConfigError
from privfed.flower.deploy import certs


def _handshake(directory, server_hostname: str, cafile=None) -> None:
    """One TLS handshake: a server with DIR/superlink.{crt,key} on 127.0.0.1, a client trusting ``cafile``."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(directory / certs.SERVER_CERT, directory / certs.SERVER_KEY)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        try:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        client_ctx = ssl.create_default_context(cafile=cafile)
        if cafile is None:  # the system's store only: what a node without the operator's CA has
            client_ctx = ssl.create_default_context()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
                tls.sendall(b"x")
    finally:
        listener.close()
        t.join(timeout=10)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs") / "deploy"
    written = certs.write_certificates(out, ["superlink.example.org", "10.20.0.1"], days=30)
    return out, written


def test_files_and_their_modes(made):
    out, written = made
    assert set(written) == {certs.CA_CERT, certs.CA_KEY, certs.SERVER_CERT, certs.SERVER_KEY}
    for name in (certs.CA_KEY, certs.SERVER_KEY):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    for name in (certs.CA_CERT, certs.SERVER_CERT):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name


def test_the_certificates_carry_what_tls_clients_check(made):
    out, _ = made
    ca = x509.load_pem_x509_certificate((out / certs.CA_CERT).read_bytes())
    srv = x509.load_pem_x509_certificate((out / certs.SERVER_CERT).read_bytes())
    srv.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert srv.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert (
        ExtendedKeyUsageOID.SERVER_AUTH in srv.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    sans = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"superlink.example.org", "localhost"}
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"10.20.0.1", "127.0.0.1"}
    days = (srv.not_valid_after_utc - srv.not_valid_before_utc).total_seconds() / 86400
    assert 30 < days < 30.01  # 30 days from five minutes ago


def test_a_client_with_the_ca_connects_to_every_name_in_the_certificate(made):
    out, _ = made
    for name in ("127.0.0.1", "localhost", "superlink.example.org", "10.20.0.1"):
        _handshake(out, name, cafile=out / certs.CA_CERT)


def test_a_client_without_the_ca_or_dialling_another_name_is_refused(made, tmp_path):
    out, _ = made
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(out, "127.0.0.1", cafile=None)
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|doesn't match"):
        _handshake(out, "other.example.org", cafile=out / certs.CA_CERT)
    other = certs.write_certificates(tmp_path / "other", ["127.0.0.1"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(out, "127.0.0.1", cafile=other[certs.CA_CERT])


def test_renew_keeps_the_ca_and_replaces_the_superlink_key(made, tmp_path):
    out, _ = made
    import shutil

    d = tmp_path / "renew"
    shutil.copytree(out, d)
    before = {n: (d / n).read_bytes() for n in (certs.CA_CERT, certs.CA_KEY, certs.SERVER_KEY)}
    certs.write_certificates(d, ["superlink.example.org"], renew=True)
    assert (d / certs.CA_CERT).read_bytes() == before[certs.CA_CERT]
    assert (d / certs.CA_KEY).read_bytes() == before[certs.CA_KEY]
    assert (d / certs.SERVER_KEY).read_bytes() != before[certs.SERVER_KEY]
    _handshake(d, "superlink.example.org", cafile=out / certs.CA_CERT)  # nodes keep their old ca.crt
    with pytest.raises(ConfigError, match="ca.crt is missing; make a CA without --renew"):
        certs.write_certificates(tmp_path / "empty", ["x.org"], renew=True)


@pytest.mark.parametrize(
    ("hosts", "days", "match"),
    [
        (["https://superlink.example.org:9093"], 30, "neither an IP address nor a DNS name"),
        (["bad_name!"], 30, "neither an IP address nor a DNS name"),
        ([""], 30, "neither an IP address nor a DNS name|no --host"),
        (["999.1.1.1"], 30, "'999.1.1.1' is not an IP address .* not a DNS name either"),
        (["10.0.0"], 30, "'10.0.0' is not an IP address"),
        (["superlink.example.123"], 30, "ending in a number, not a DNS name"),
        (["10.0.0.1"], 0, "--days 0"),
        (["10.0.0.1"], 99999, "--days 99999"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, hosts, days, match):
    with pytest.raises(ConfigError, match=match):
        certs.write_certificates(tmp_path / "c", hosts, days=days)
    assert not (tmp_path / "c" / certs.CA_KEY).exists()


def test_names_with_digits_that_are_dns_names_are_kept(tmp_path):
    # Only an all-digit last label marks a mistyped address; digits elsewhere are ordinary DNS labels.
    hosts = ["10.0.0.5.nip.io", "1password.example", "node-7.example.org.", "10.0.0.5"]
    certs.write_certificates(tmp_path / "c", hosts)
    srv = x509.load_pem_x509_certificate((tmp_path / "c" / certs.SERVER_CERT).read_bytes())
    san = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"10.0.0.5.nip.io", "1password.example", "node-7.example.org"} <= set(
        san.get_values_for_type(x509.DNSName)
    )
    assert "10.0.0.5" in {str(a) for a in san.get_values_for_type(x509.IPAddress)}


def test_an_existing_ca_is_never_overwritten(made):
    out, _ = made
    before = (out / certs.CA_KEY).read_bytes()
    with pytest.raises(ConfigError, match="already exists.*--renew"):
        certs.write_certificates(out, ["10.0.0.1"])
    assert (out / certs.CA_KEY).read_bytes() == before


def test_the_command_prints_one_line_and_exits_2_on_bad_input(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "privfed.flower.deploy.certs", str(tmp_path / "c"), "--host", "10.1.2.3"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "10.1.2.3, localhost, 127.0.0.1" in ok.stdout, ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "privfed.flower.deploy.certs", str(tmp_path / "c"), "--host", "10.1.2.3"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1


def test_an_unwritable_folder_is_one_line_too(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    assert certs.main([str(tmp_path / "a-file" / "certs"), "--host", "10.1.2.3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Not a directory" in err and err.count("\n") == 1
