"""One agent per node: the checkpoint folder's lock refuses a second agent, which touches nothing,
and a waiting agent (a rolling update) takes over when the first exits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_slicer.slicer import agent_lock
from gpu_slicer.slicer.agent_lock import AgentLockHeld
from tests.support.agent_fixtures import simulated_agent_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))  # unix socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_second_lock_on_the_folder_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = agent_lock.acquire(tmp_path)
    with pytest.raises(AgentLockHeld, match=f"pid {os.getpid()} on ") as refused:
        agent_lock.acquire(tmp_path)
    assert "--lock-wait" in str(refused.value)
    first.release()
    agent_lock.acquire(tmp_path).release()


def test_a_waiting_agent_gets_the_lock_once_the_holder_lets_go(tmp_path: Path) -> None:
    first = agent_lock.acquire(tmp_path)
    seen: list[str] = []
    timer = threading.Timer(0.3, first.release)
    timer.start()
    second = agent_lock.acquire(tmp_path, wait_s=60, on_wait=seen.append)
    timer.join()
    assert len(seen) == 1 and seen[0].startswith(f"pid {os.getpid()} on ")
    assert agent_lock.holder_of(tmp_path / agent_lock.LOCK_FILE).startswith(f"pid {os.getpid()}")
    second.release()


def _agent(folder: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_slicer.cli.main",
            *simulated_agent_args(folder),
            "--metrics-bind",
            "",
            "--reconcile-interval",
            "0.5",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_serving(proc: subprocess.Popen[str], folder: Path) -> None:
    deadline = time.monotonic() + 60
    while not (folder / "reg" / "z.gpu-slicer.io-reg.sock").exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the agent never created its socket"
        time.sleep(0.1)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its inode and mtime: what a second agent must not touch."""
    found = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        found[str(path.relative_to(folder))] = (st.st_ino, st.st_mtime_ns)
    return found


def test_a_second_agent_on_the_same_folders_exits_2_and_touches_nothing(
    short_dir: Path,
) -> None:
    first = _agent(short_dir)
    try:
        _wait_serving(first, short_dir)
        time.sleep(1.0)  # a few reconcile passes: the checkpoint and slices are written
        before = _snapshot(short_dir)
        second = _agent(short_dir)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        assert f"pid {first.pid} on " in err and err.count("\n") == 1
        assert _snapshot(short_dir) == before
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 0


def test_an_agent_given_lock_wait_takes_over_when_the_first_exits(short_dir: Path) -> None:
    first = _agent(short_dir)
    second: subprocess.Popen[str] | None = None
    try:
        _wait_serving(first, short_dir)
        second = _agent(short_dir, "--lock-wait", "120")
        time.sleep(1.0)
        assert second.poll() is None  # waiting, not refused
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
        assert first.returncode == 0
        _wait_serving(second, short_dir)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=60)
    assert second.returncode == 0


def test_lock_wait_has_an_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_slicer.cli.main import build_parser
    from gpu_slicer.slicer.cli import agent_settings

    monkeypatch.setenv("GPU_SLICER_LOCK_WAIT", "45")
    assert agent_settings(build_parser().parse_args(["agent", "run"])).lock_wait == 45.0
    monkeypatch.delenv("GPU_SLICER_LOCK_WAIT")
    assert agent_settings(build_parser().parse_args(["agent", "run"])).lock_wait == 0.0
