"""ReloadingSSLContext: cached until the files change, tolerant of a half-written pair."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_slicer.certs.issue import self_signed
from gpu_slicer.certs.reload import ReloadingSSLContext


def _pair(common_name: str) -> tuple[bytes, bytes]:
    pair = self_signed([common_name], common_name=common_name, days=1)
    return pair.cert_pem, pair.key_pem


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, data: bytes, *, mtime_ns: int) -> None:
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = _pair("first")
    _write(tmp_path / "tls.crt", cert, mtime_ns=1_000_000_000)
    _write(tmp_path / "tls.key", key, mtime_ns=1_000_000_000)
    return tmp_path / "tls.crt", tmp_path / "tls.key"


def _counting_factory(calls: list[Path]) -> Callable[[Path, Path], ssl.SSLContext]:
    from gpu_slicer.certs.reload import server_context

    def factory(cert: Path, key: Path) -> ssl.SSLContext:
        calls.append(cert)
        return server_context(cert, key)

    return factory


def test_the_context_is_built_once_while_the_files_do_not_change(files: tuple[Path, Path]) -> None:
    calls: list[Path] = []
    clock = Clock()
    reloading = ReloadingSSLContext(
        *files, check_interval_s=1.0, factory=_counting_factory(calls), clock=clock
    )
    first = reloading.context()
    for _ in range(5):
        clock.now += 2.0
        assert reloading.context() is first
    assert len(calls) == 1


def test_changed_files_give_a_new_context_after_the_check_interval(
    files: tuple[Path, Path],
) -> None:
    clock = Clock()
    reloading = ReloadingSSLContext(*files, check_interval_s=1.0, clock=clock)
    first = reloading.context()
    cert, key = _pair("second")
    _write(files[0], cert, mtime_ns=2_000_000_000)
    _write(files[1], key, mtime_ns=2_000_000_000)
    clock.now += 0.5
    assert reloading.context() is first, "checked more often than the interval"
    clock.now += 1.0
    second = reloading.context()
    assert second is not first
    assert reloading.reloads == 1


def test_a_half_written_pair_keeps_the_previous_context_until_it_is_complete(
    files: tuple[Path, Path],
) -> None:
    clock = Clock()
    reloading = ReloadingSSLContext(*files, check_interval_s=1.0, clock=clock)
    first = reloading.context()
    cert, key = _pair("second")
    _write(files[0], cert, mtime_ns=2_000_000_000)  # the key still belongs to the old cert
    clock.now += 2.0
    assert reloading.context() is first
    assert reloading.failures == 1
    _write(files[1], key[: len(key) // 2], mtime_ns=2_000_000_000)  # key truncated mid-write
    clock.now += 2.0
    assert reloading.context() is first
    _write(files[1], key, mtime_ns=3_000_000_000)
    clock.now += 2.0
    assert reloading.context() is not first
    assert reloading.reloads == 1


def test_a_missing_file_at_first_load_is_an_error(tmp_path: Path) -> None:
    reloading = ReloadingSSLContext(tmp_path / "no.crt", tmp_path / "no.key")
    with pytest.raises(OSError):
        reloading.context()


def test_a_swapped_symlink_like_a_secret_volume_is_noticed(tmp_path: Path) -> None:
    for version in ("v1", "v2"):
        (tmp_path / version).mkdir()
        cert, key = _pair(version)
        (tmp_path / version / "tls.crt").write_bytes(cert)
        (tmp_path / version / "tls.key").write_bytes(key)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "tls.crt").symlink_to("..data/tls.crt")
    (tmp_path / "tls.key").symlink_to("..data/tls.key")
    clock = Clock()
    reloading = ReloadingSSLContext(
        tmp_path / "tls.crt", tmp_path / "tls.key", check_interval_s=1.0, clock=clock
    )
    first = reloading.context()
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    clock.now += 2.0
    assert reloading.context() is not first


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """A TLS handshake over in-memory buffers; the cipher agreed, or the SSLError's reason."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(to_server, to_client, server_side=True)
    c = client.wrap_bio(to_client, to_server, server_hostname="first")
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError as exc:
                    return f"refused: {exc.reason}"
        if all(done.values()):
            cipher = c.cipher()
            return cipher[0] if cipher else ""
    return "no progress"


def _client(files: tuple[Path, Path], ciphers: str | None = None) -> ssl.SSLContext:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(cafile=str(files[0]))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    if ciphers:
        client.set_ciphers(ciphers)
    return client


def test_tls_1_2_offers_only_aead_suites(files: tuple[Path, Path]) -> None:
    from gpu_slicer.certs.reload import server_context

    server = server_context(*files)
    assert "-GCM-" in _handshake(server, _client(files, "ECDHE+AESGCM"))
    assert _handshake(
        server, _client(files, "ECDHE+AES+SHA1:ECDHE+AES+SHA256:-AESGCM:-CHACHA20")
    ).startswith("refused")
    offered = {c["name"] for c in server.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert offered and all(c["aead"] for c in server.get_ciphers() if c["name"] in offered)


def test_with_a_client_ca_only_clients_with_its_certificates_get_in(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    from gpu_slicer.certs.issue import new_ca, new_leaf
    from gpu_slicer.certs.reload import server_context

    ca = new_ca(days=1, common_name="apiserver client CA")
    (tmp_path / "client-ca.crt").write_bytes(ca.cert_pem)
    server_only = new_leaf(ca, ["kube-apiserver"], days=1)
    leaf = new_leaf(ca, ["kube-apiserver"], days=1, client_auth=True)
    (tmp_path / "client.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "client.key").write_bytes(leaf.key_pem)
    server = server_context(*files, client_ca=tmp_path / "client-ca.crt")
    anonymous = _client(files)
    assert _handshake(server, anonymous).startswith("refused")
    trusted = _client(files)
    trusted.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    assert not _handshake(server, trusted).startswith("refused")
    wrong_use = _client(files)  # signed by the CA, but a serving certificate
    (tmp_path / "w.crt").write_bytes(server_only.cert_pem)
    (tmp_path / "w.key").write_bytes(server_only.key_pem)
    wrong_use.load_cert_chain(tmp_path / "w.crt", tmp_path / "w.key")
    assert _handshake(server, wrong_use).startswith("refused")
    stranger = _client(files)
    pair = self_signed(["kube-apiserver"], common_name="stranger", days=1)
    (tmp_path / "s.crt").write_bytes(pair.cert_pem)
    (tmp_path / "s.key").write_bytes(pair.key_pem)
    stranger.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
    assert _handshake(server, stranger).startswith("refused")
