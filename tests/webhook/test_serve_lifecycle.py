"""`gpu-slicer webhook serve` as a process: a port in use is one line naming --bind, and --dev
removes its runtime folder (with the dev key) when it stops."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.server_fixtures import ROOT, free_port


def _env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPU_SLICER_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env["TMPDIR"] = str(tmp)  # where --dev makes its runtime folder
    env["GPU_SLICER_LOG_LEVEL"] = "INFO"
    return env


def test_a_port_in_use_exits_2_with_one_line_naming_bind(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpu_slicer.cli.main",
                "webhook",
                "serve",
                "--dev",
                "--bind",
                f"127.0.0.1:{port}",
            ],
            cwd=ROOT,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert f"--bind 127.0.0.1:{port}" in result.stderr and "already in use" in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made: not even the runtime folder


def test_dev_mode_removes_its_runtime_folder_and_key_on_exit(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_slicer.cli.main",
            "webhook",
            "serve",
            "--dev",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
        ],
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        folders: list[Path] = []
        while not folders or not (folders[0] / "dev-tls.key").exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "serve --dev never wrote its key"
            folders = [p for p in tmp_path.iterdir() if p.name.startswith("gpu-slicer-webhook-")]
            time.sleep(0.1)
        while True:  # serving: the master has bound the port
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert any(
        json.loads(line).get("cert", "").startswith(str(folders[0]))
        for line in err.splitlines()
        if line.startswith("{")
    )
    assert not folders[0].exists()
    assert list(tmp_path.iterdir()) == []
