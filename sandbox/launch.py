"""``gpu-slicer sandbox up`` as a child process, for the end-to-end tests and the benchmarks.

They run the command as a user does; this is the one place that starts it, waits for its
``ready`` file and stops it (SIGTERM, which takes everything down; SIGKILL to the group if that
hangs). Its output goes to ``<state dir>.out`` beside the folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_slicer.sandbox.errors import StartupError

ROOT = Path(__file__).resolve().parents[1]


def output_of(folder: Path) -> Path:
    return folder.parent / f"{folder.name}.out"


def launch(
    folder: Path, nodes: Mapping[str, str], *extra: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Starts the sandbox in ``folder`` with ``nodes`` (name -> GPU spec) and flags ``extra``."""
    argv = [
        sys.executable,
        "-m",
        "gpu_slicer.cli.main",
        "sandbox",
        "up",
        "--state-dir",
        str(folder),
    ]
    for name, gpus in nodes.items():
        argv += ["--node", f"{name}={gpus}"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(output_of(folder), "wb") as out:
        return subprocess.Popen(
            [*argv, *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            start_new_session=True,
        )


def wait_ready(
    folder: Path, process: subprocess.Popen[bytes], timeout_s: float = 180
) -> dict[str, Any]:
    """The ``ready`` record, once written; StartupError (with the output's tail) otherwise."""
    deadline = time.monotonic() + timeout_s
    while not (folder / "ready").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            tail = output_of(folder).read_text(errors="replace")[-3000:]
            raise StartupError(f"sandbox up did not become ready:\n{tail}")
        time.sleep(0.2)
    ready: dict[str, Any] = json.loads((folder / "ready").read_text())
    return ready


def stop(process: subprocess.Popen[bytes], timeout_s: float = 90) -> int:
    """SIGTERM and wait; returns the exit code (0: everything stopped cleanly)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode
