"""Ports the sandbox picks for its components: free, and never one the kernel hands out."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpu_slicer.sandbox import process


def test_a_picked_port_is_free_and_below_the_ephemeral_range() -> None:
    low, _high = process.ephemeral_ports()
    if low - process.LOWEST_PICKED < 1000:
        pytest.skip("this machine's ephemeral range leaves no room below it")
    for _ in range(20):
        port = process.free_port()
        assert process.LOWEST_PICKED <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: binds


def test_a_port_in_use_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        with socket.socket() as probe:  # a port the kernel just found free (busy + 1 may not be)
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        picks = iter([busy, free])
        monkeypatch.setattr(process.random, "randrange", lambda _a, _b: next(picks))
        monkeypatch.setattr(process, "ephemeral_ports", lambda: (busy + 5000, 65535))
        monkeypatch.setattr(process, "LOWEST_PICKED", 1024)
        assert process.free_port() != busy


def test_without_the_kernels_file_the_iana_range_is_assumed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(process, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert process.ephemeral_ports() == (49152, 65535)
