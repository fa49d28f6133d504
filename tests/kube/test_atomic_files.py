"""A replaced file is whole or untouched: checkpoints, CDI specs and certificates rely on it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_slicer.kube import atomic_files


def test_the_new_content_replaces_the_old_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.json"
    target.write_bytes(b"old")
    atomic_files.write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_without_a_mode_the_file_is_private(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_files.write_atomically(target, b"{}", durable=False)
    assert target.stat().st_mode & 0o777 == 0o600


def test_durable_writes_fsync_the_file_and_then_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[bool] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    atomic_files.write_atomically(tmp_path / "a", b"1")
    atomic_files.write_atomically(tmp_path / "b", b"2", durable=False)
    assert synced == [False, True]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "tls.key"
    target.write_bytes(b"old")

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        atomic_files.write_atomically(target, b"new", mode=0o600)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["tls.key"]


def test_folders_get_their_mode_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        atomic_files.ensure_dir(tmp_path / "a" / "b", 0o750)
        shared = tmp_path / "shared"
        shared.mkdir(0o777)
        atomic_files.ensure_dir(shared, 0o755)
        own = tmp_path / "own"
        own.mkdir(0o777)
        atomic_files.ensure_dir(own, 0o750, own=True)
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o7777 for p in tmp_path.rglob("*")}
    assert modes == {"a": 0o750, "b": 0o750, "shared": 0o777, "own": 0o750}
