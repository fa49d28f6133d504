"""Certificate files change as one unit, so a reader never loads half of a rotation."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.certs.errors import CertFileError
from gpu_slicer.certs.files import DATA_LINK, KEY_MODE, replace_files, write_cert_file
from tests.support.certs_cases import NAMESPACE, SERVICE


def _versions(folder: Path) -> list[str]:
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name.startswith("..") and p.is_dir() and not p.is_symlink()
    )


def test_a_single_file_is_replaced_whole_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "tls.key"
    target.write_bytes(b"old")
    write_cert_file(target, b"new key", mode=KEY_MODE)
    assert target.read_bytes() == b"new key"
    assert target.stat().st_mode & 0o777 == KEY_MODE
    assert [p.name for p in tmp_path.iterdir()] == ["tls.key"]  # no temporary file left


def test_visible_names_go_through_one_data_link(tmp_path: Path) -> None:
    replace_files(tmp_path, {"a": (b"1", 0o644), "b": (b"2", 0o600)})
    assert os.readlink(tmp_path / "a") == f"{DATA_LINK}/a"
    assert os.readlink(tmp_path / DATA_LINK) == _versions(tmp_path)[0]
    assert (tmp_path / "b").read_bytes() == b"2"


def test_a_second_write_swaps_the_set_and_removes_the_old_version(tmp_path: Path) -> None:
    replace_files(tmp_path, {"a": (b"1", 0o644), "b": (b"1", 0o644)})
    first = _versions(tmp_path)
    replace_files(tmp_path, {"a": (b"2", 0o644), "b": (b"2", 0o644)})
    second = _versions(tmp_path)
    assert len(second) == 1 and second != first
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == b"2"


def test_regular_files_left_by_another_tool_are_replaced(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_bytes(b"stale")
    replace_files(tmp_path, {"tls.crt": (b"fresh", 0o644)})
    assert (tmp_path / "tls.crt").is_symlink()
    assert (tmp_path / "tls.crt").read_bytes() == b"fresh"


def test_names_with_folders_or_hidden_names_are_refused(tmp_path: Path) -> None:
    for bad in ("../x", ".hidden", ""):
        with pytest.raises(CertFileError):
            replace_files(tmp_path, {bad: (b"", 0o644)})


def test_an_unwritable_target_gives_a_cert_file_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(CertFileError, match="cannot write"):
        replace_files(blocker / "sub", {"a": (b"1", 0o644)})


def test_a_reader_always_sees_a_matching_pair_while_pairs_rotate(tmp_path: Path) -> None:
    pairs = []
    for _ in range(4):
        made = certs_issue.issue(service=SERVICE, namespace=NAMESPACE, days=1, ca_days=1)
        pairs.append((made.serving.cert_pem, made.serving.key_pem))
    replace_files(tmp_path, {"tls.crt": (pairs[0][0], 0o644), "tls.key": (pairs[0][1], 0o600)})
    stop = threading.Event()
    mismatches: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            # What a careful reader does: resolve the version once, read both files from it.
            try:
                version = tmp_path / os.readlink(tmp_path / DATA_LINK)
                cert_pem = (version / "tls.crt").read_bytes()
                key_pem = (version / "tls.key").read_bytes()
            except FileNotFoundError:
                continue  # that version was just removed; the next one is complete
            cert = certs_issue.load_certificate(cert_pem)
            if not certs_issue.key_matches(cert, certs_issue.load_key(key_pem)):
                mismatches.append(version.name)
            reads += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(60):
            cert_pem, key_pem = pairs[i % len(pairs)]
            replace_files(tmp_path, {"tls.crt": (cert_pem, 0o644), "tls.key": (key_pem, 0o600)})
    finally:
        stop.set()
        thread.join()
    assert reads > 0
    assert mismatches == []
