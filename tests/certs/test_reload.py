"""ReloadingSSLContext: cached until the files change, tolerant of a half-written pair."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from certs.issue import self_signed
from certs.reload import ReloadingSSLContext


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
    from certs.reload import server_context

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
