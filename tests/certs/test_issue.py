"""`certs issue`: a CA and a serving certificate the apiserver (and any TLS client) accepts."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.certs.errors import CertDataError, CertInputError
from tests.support.certs_cases import NAMESPACE, NOW, SERVICE

HOST = f"{SERVICE}.{NAMESPACE}.svc"


@pytest.fixture(scope="module")
def issued() -> certs_issue.Issued:
    return certs_issue.issue(service=SERVICE, namespace=NAMESPACE, days=30, ca_days=365)


@pytest.fixture(scope="module")
def folder(issued: certs_issue.Issued, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    certs_issue.write_files(issued, out)
    return out


def test_the_serving_certificate_verifies_against_its_ca(issued: certs_issue.Issued) -> None:
    assert certs_issue.is_signed_by(issued.serving.cert, issued.ca.cert)
    issued.serving.cert.verify_directly_issued_by(issued.ca.cert)


def test_the_serving_certificate_does_not_verify_against_another_ca(
    issued: certs_issue.Issued,
) -> None:
    other = certs_issue.new_ca(days=10)
    assert not certs_issue.is_signed_by(issued.serving.cert, other.cert)


def test_the_serving_certificate_names_the_service_in_both_dns_forms(
    issued: certs_issue.Issued,
) -> None:
    assert certs_issue.dns_names(issued.serving.cert) == [HOST, f"{HOST}.cluster.local"]


def test_the_serving_certificate_is_for_server_authentication_only(
    issued: certs_issue.Issued,
) -> None:
    eku = issued.serving.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not certs_issue.is_ca(issued.serving.cert)


def test_both_keys_are_ecdsa_p256(issued: certs_issue.Issued) -> None:
    for pair in (issued.ca, issued.serving):
        public = pair.cert.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert isinstance(public.curve, ec.SECP256R1)


def test_the_ca_may_sign_leaves_but_no_intermediate_cas(issued: certs_issue.Issued) -> None:
    basic = issued.ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca and basic.path_length == 0
    usage = issued.ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign


def test_lifetimes_follow_the_requested_days_with_a_small_backdate() -> None:
    made = certs_issue.issue(service=SERVICE, namespace=NAMESPACE, days=10, ca_days=20, now=NOW)
    assert made.serving.cert.not_valid_after_utc == NOW + dt.timedelta(days=10)
    assert made.ca.cert.not_valid_after_utc == NOW + dt.timedelta(days=20)
    assert made.serving.cert.not_valid_before_utc == NOW - certs_issue.CLOCK_SKEW


def test_a_leaf_never_outlives_its_ca() -> None:
    ca = certs_issue.new_ca(days=5, now=NOW)
    leaf = certs_issue.new_serving_cert(ca, service=SERVICE, namespace=NAMESPACE, days=90, now=NOW)
    assert leaf.cert.not_valid_after_utc == ca.cert.not_valid_after_utc


@pytest.mark.parametrize(
    ("service", "namespace", "fragment"),
    [
        ("Webhook", NAMESPACE, "service 'Webhook'"),
        ("1webhook", NAMESPACE, "starting with a letter"),
        (SERVICE, "gpu_slicer", "namespace 'gpu_slicer'"),
        ("a" * 64, NAMESPACE, "at most 63"),
    ],
    ids=["upper-case service", "service starting with a digit", "underscore namespace", "long"],
)
def test_names_kubernetes_would_reject_are_refused(
    service: str, namespace: str, fragment: str
) -> None:
    with pytest.raises(CertInputError, match=fragment):
        certs_issue.issue(service=service, namespace=namespace)


def test_a_ca_shorter_lived_than_its_leaf_is_refused() -> None:
    with pytest.raises(CertInputError, match="cannot outlive its CA"):
        certs_issue.issue(service=SERVICE, namespace=NAMESPACE, days=30, ca_days=10)


def test_garbage_is_not_taken_for_a_certificate_or_key() -> None:
    with pytest.raises(CertDataError):
        certs_issue.load_certificate(b"not a certificate")
    with pytest.raises(CertDataError):
        certs_issue.load_key(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")


def test_the_files_are_written_with_the_key_readable_by_its_owner_only(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("..")) == [
        "ca.crt",
        "tls.crt",
        "tls.key",
    ]
    assert (folder / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (folder / "tls.crt").stat().st_mode & 0o777 == 0o644
    cert = certs_issue.load_certificate((folder / "tls.crt").read_bytes())
    key = certs_issue.load_key((folder / "tls.key").read_bytes())
    ca = certs_issue.load_certificate((folder / "ca.crt").read_bytes())
    assert certs_issue.key_matches(cert, key)
    assert certs_issue.is_signed_by(cert, ca)


def _serve_once(
    context: ssl.SSLContext, listener: socket.socket, errors: list[BaseException]
) -> None:
    try:
        conn, _ = listener.accept()
        with context.wrap_socket(conn, server_side=True) as tls:
            tls.sendall(tls.recv(64).upper())
    except (OSError, ssl.SSLError) as exc:  # the client refused us: recorded, not raised
        errors.append(exc)


def _handshake(folder: Path, client: ssl.SSLContext, hostname: str) -> bytes:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    errors: list[BaseException] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        thread = threading.Thread(target=_serve_once, args=(server, listener, errors), daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                with client.wrap_socket(raw, server_hostname=hostname) as tls:
                    tls.sendall(b"ping")
                    return tls.recv(64)
        finally:
            thread.join(timeout=10)


def test_a_client_that_trusts_only_the_ca_completes_a_real_handshake(folder: Path) -> None:
    client = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert _handshake(folder, client, HOST) == b"PING"


def test_a_client_asking_for_another_host_name_is_refused(folder: Path) -> None:
    client = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|doesn't match"):
        _handshake(folder, client, f"other.{NAMESPACE}.svc")


def test_a_client_trusting_another_ca_is_refused(folder: Path, tmp_path: Path) -> None:
    other = certs_issue.issue(service=SERVICE, namespace=NAMESPACE, days=1, ca_days=1)
    (tmp_path / "other-ca.crt").write_bytes(other.ca.cert_pem)
    client = ssl.create_default_context(cafile=str(tmp_path / "other-ca.crt"))
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(folder, client, HOST)
