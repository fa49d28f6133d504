"""A private CA and the webhook's serving certificate, made with ``cryptography``.

The apiserver calls the webhook at ``https://<service>.<namespace>.svc`` and trusts only the CA in
the webhook configuration's ``caBundle``. So the serving ("leaf") certificate names
``<service>.<namespace>.svc`` (and the ``.cluster.local`` form some clients use), is for server
authentication only, and is signed by a CA that exists for nothing else. Keys are ECDSA P-256:
small, fast to handshake, and accepted by every apiserver and Go TLS stack.

Everything here is pure except :func:`write_files`; the clock is a parameter so that tests and
``certs ensure`` can reason about renewal windows without sleeping.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_slicer.certs.errors import CertDataError, CertInputError
from gpu_slicer.certs.files import CERT_MODE, KEY_MODE, replace_files

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

CA_COMMON_NAME = "gpu-slicer-webhook-ca"
# Certificates start a little in the past: a node whose clock runs behind must not reject them.
CLOCK_SKEW = dt.timedelta(minutes=5)

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class Issued:
    """What ``certs issue`` makes: a CA and a serving certificate it signed."""

    ca: KeyPair
    serving: KeyPair


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def check_names(service: str, namespace: str) -> None:
    """Raises CertInputError unless both are names Kubernetes accepts for a Service/Namespace."""
    if not (len(service) <= 63 and _DNS_1035.match(service)):
        raise CertInputError(
            f"service {service!r} is not a valid Service name: use at most 63 lower-case letters,"
            " digits and '-', starting with a letter and ending with a letter or digit"
        )
    if not (len(namespace) <= 63 and _DNS_1123.match(namespace)):
        raise CertInputError(
            f"namespace {namespace!r} is not a valid namespace name: use at most 63 lower-case"
            " letters, digits and '-', starting and ending with a letter or digit"
        )


def serving_names(service: str, namespace: str) -> tuple[str, str]:
    """The DNS names the apiserver may use to reach the Service."""
    check_names(service, namespace)
    return (f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")


def _check_days(days: int, what: str) -> None:
    if days < 1:
        raise CertInputError(f"{what} must be at least 1 day, not {days}")


def host_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """Subject alternative names for ``hosts``: IP addresses as IPs, the rest as DNS names.

    Repeats are dropped, order is kept (the first name is the certificate's common name).
    """
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _common_name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    *,
    now: dt.datetime,
    not_after: dt.datetime,
) -> x509.CertificateBuilder:
    """What every certificate here starts from: names, key, a random serial, the validity."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
    )


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signature (ECDHE handshakes), plus certificate and CRL signing for a CA."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(
    *, days: int, now: dt.datetime | None = None, common_name: str = CA_COMMON_NAME
) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    _check_days(days, "--ca-days")
    now = now or utc_now()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpu-slicer"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder(name, name, key, now=now, not_after=now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def new_leaf(
    ca: KeyPair,
    hosts: Sequence[str],
    *,
    days: int,
    now: dt.datetime | None = None,
    client_auth: bool = False,
) -> KeyPair:
    """A server-auth leaf for ``hosts`` (DNS names or IPs), valid ``days`` but never past the CA.

    The first host is the common name. ``client_auth`` makes a client certificate instead (for
    the apiserver, when the webhook requires one: ``--client-ca``).
    """
    _check_days(days, "--days")
    now = now or utc_now()
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    if not_after <= now:
        raise CertInputError("the CA has expired; issue a new CA before a serving certificate")
    try:
        ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:  # a CA made elsewhere without one: derive it from its key
        authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key())
    cert = (
        _builder(_common_name(hosts[0]), ca.cert.subject, key, now=now, not_after=not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [
                    ExtendedKeyUsageOID.CLIENT_AUTH
                    if client_auth
                    else ExtendedKeyUsageOID.SERVER_AUTH
                ]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(host_names(hosts)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(authority, critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def new_serving_cert(
    ca: KeyPair,
    *,
    service: str,
    namespace: str,
    days: int,
    now: dt.datetime | None = None,
    extra_hosts: Sequence[str] = (),
) -> KeyPair:
    """A server-auth leaf for ``service.namespace.svc``, valid ``days`` but never past the CA.

    ``extra_hosts`` (DNS names or IPs) are for a webhook the apiserver reaches by URL rather
    than through the Service, e.g. one running outside the cluster.
    """
    _check_days(days, "--days")
    return new_leaf(ca, [*serving_names(service, namespace), *extra_hosts], days=days, now=now)


def self_signed(
    hosts: Sequence[str], *, common_name: str, days: int, now: dt.datetime | None = None
) -> KeyPair:
    """A server certificate for ``hosts`` that is its own CA.

    For ``webhook serve --dev`` and tests, where no CA is handed out: a client trusts the
    certificate itself (``--cacert``).
    """
    _check_days(days, "--days")
    now = now or utc_now()
    key = ec.generate_private_key(ec.SECP256R1())
    name = _common_name(common_name)
    cert = (
        _builder(name, name, key, now=now, not_after=now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(host_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def issue(
    *,
    service: str,
    namespace: str,
    days: int = 365,
    ca_days: int = 3650,
    now: dt.datetime | None = None,
    extra_hosts: Sequence[str] = (),
) -> Issued:
    """A new CA and a serving certificate for ``service.namespace.svc`` signed by it."""
    check_names(service, namespace)
    _check_days(days, "--days")
    _check_days(ca_days, "--ca-days")
    if ca_days < days:
        raise CertInputError(
            f"--ca-days ({ca_days}) is shorter than --days ({days}): the serving certificate"
            " cannot outlive its CA; raise --ca-days or lower --days"
        )
    now = now or utc_now()
    ca = new_ca(days=ca_days, now=now)
    for host in extra_hosts:
        check_host(host)
    serving = new_serving_cert(
        ca, service=service, namespace=namespace, days=days, now=now, extra_hosts=extra_hosts
    )
    return Issued(ca, serving)


_HOSTNAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_host(host: str) -> None:
    """An extra name must be an IP address or a lower-case DNS name."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if len(host) > 253 or not _HOSTNAME.match(host):
        raise CertInputError(
            f"--host {host!r} is neither an IP address nor a DNS name (lower-case letters,"
            " digits, '-' and '.')"
        )


def write_files(issued: Issued, out_dir: Path) -> list[Path]:
    """Writes ``ca.crt``, ``tls.crt`` and ``tls.key`` (0600) into ``out_dir`` as one change.

    The CA's private key is not written: nothing but this call ever signs with it.
    """
    return replace_files(
        Path(out_dir),
        {
            CA_FILE: (issued.ca.cert_pem, CERT_MODE),
            CERT_FILE: (issued.serving.cert_pem, CERT_MODE),
            KEY_FILE: (issued.serving.key_pem, KEY_MODE),
        },
    )


# ------------------------------------------------------------------ reading and checking
def load_certificate(pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertDataError(f"not a PEM certificate: {exc}") from exc


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle (a caBundle); an empty bundle gives ``[]``."""
    if not pem.strip():
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertDataError(f"not a PEM certificate bundle: {exc}") from exc


def load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertDataError(f"not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertDataError(f"expected an ECDSA key, found {type(key).__name__}")
    return key


def bundle_pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def key_matches(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return cert.public_key() == key.public_key()


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def is_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """True when ``ca``'s key signed ``cert`` (the issuer name must match too)."""
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def dns_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.DNSName))


def ip_addresses(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


def covers(cert: x509.Certificate, names: Sequence[str]) -> bool:
    return set(names) <= set(dns_names(cert))


def is_valid_at(cert: x509.Certificate, when: dt.datetime) -> bool:
    return cert.not_valid_before_utc <= when < cert.not_valid_after_utc


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 fingerprint, hex: how logs and results name a certificate."""
    return cert.fingerprint(hashes.SHA256()).hex()
