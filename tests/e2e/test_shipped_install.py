"""The sandbox's webhook and agents run from the package as a plain ``pip install`` installs it,
not from the test environment (``sandbox up --gpu-slicer``; see tests/support/e2e_sandbox)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.e2e_sandbox import Sandbox, shipped_command


def test_the_webhook_and_the_agents_run_from_the_install(sandbox: Sandbox) -> None:
    shipped = shipped_command()
    if not shipped:
        pytest.skip("no package index here: the components ran from the test environment")
    command = shipped[1]
    assert sandbox.ready["gpuSlicer"] == [command]
    components = [n for n in sandbox.ready["pids"] if n == "webhook" or n.startswith("agent-")]
    assert "webhook" in components and len(components) > 1
    for name in components:
        argv = Path(f"/proc/{sandbox.pid(name)}/cmdline").read_bytes().split(b"\0")
        # The console script's interpreter runs it: python <venv>/bin/gpu-slicer <command> ...
        assert command.encode() in argv, (name, argv[:3])
