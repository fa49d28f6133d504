"""The sandbox's certificates, service-account keys and kubeconfigs.

One CA signs the apiserver's serving certificate and every client certificate; users are
identified as the apiserver identifies them (CN = user, O = groups). The webhook and the agents
do not get certificates: they authenticate with ServiceAccount tokens, as in a cluster, so that
the RBAC and admission policies in ``deploy/`` apply to them exactly (see :mod:`sandbox.cluster`).
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_slicer.certs.issue import KeyPair, new_ca, new_leaf

_DAYS = 30


@dataclass(frozen=True)
class Pki:
    """Paths of the files the control plane reads."""

    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.folder / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.folder / "apiserver.key"

    @property
    def kubelet_client_cert(self) -> Path:
        """The apiserver's client certificate towards kubelets (logs, exec)."""
        return self.folder / "kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.folder / "kubelet-client.key"

    @property
    def sa_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.folder / "sa.pub"


def create(folder: Path) -> Pki:
    """A CA, the apiserver's serving certificate and the service-account signing key."""
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(folder)
    ca = new_ca(days=_DAYS, common_name="gpu-slicer-sandbox-ca")
    _write_pair(ca, pki.ca_cert, pki.ca_key)
    serving = new_leaf(ca, ["127.0.0.1", "localhost", "kubernetes.default.svc"], days=_DAYS)
    _write_pair(serving, pki.serving_cert, pki.serving_key)
    kubelet_client = _client_leaf(ca, "kube-apiserver-kubelet-client", ["system:masters"])
    _write_pair(kubelet_client, pki.kubelet_client_cert, pki.kubelet_client_key)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(
        pki.sa_key,
        sa.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    pki.sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def client_kubeconfig(
    pki: Pki,
    path: Path,
    *,
    server: str,
    user: str,
    groups: list[str],
    pair_files: Path | None = None,
) -> Path:
    """A kubeconfig that authenticates as ``user`` in ``groups`` by client certificate.

    With ``pair_files``, the certificate and key are also written to ``<stem>.crt`` and
    ``<stem>.key``, for clients that take files (the readiness checks).
    """
    ca = KeyPair(_load_cert(pki.ca_cert), _load_key(pki.ca_key))
    leaf = _client_leaf(ca, user, groups)
    if pair_files is not None:
        pair_files.parent.mkdir(parents=True, exist_ok=True)
        _write_pair(leaf, pair_files.with_suffix(".crt"), pair_files.with_suffix(".key"))
    credentials = {
        "client-certificate-data": _b64(leaf.cert_pem),
        "client-key-data": _b64(leaf.key_pem),
    }
    return _write_kubeconfig(pki, path, server=server, user=user, credentials=credentials)


def token_kubeconfig(pki: Pki, path: Path, *, server: str, user: str, token: str) -> Path:
    """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
    return _write_kubeconfig(pki, path, server=server, user=user, credentials={"token": token})


def _write_kubeconfig(
    pki: Pki, path: Path, *, server: str, user: str, credentials: dict[str, str]
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sandbox",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": _b64(pki.ca_cert.read_bytes()),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": user}}],
        "current-context": "sandbox",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
    return path


def _client_leaf(ca: KeyPair, common_name: str, groups: list[str]) -> KeyPair:
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    return KeyPair(builder.sign(ca.key, hashes.SHA256()), key)


def _write_pair(pair: KeyPair, cert: Path, key: Path) -> None:
    cert.write_bytes(pair.cert_pem)
    _write_private(key, pair.key_pem)


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def _load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
