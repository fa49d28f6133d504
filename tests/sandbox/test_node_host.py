"""The real node's host-side changes: its cgroup root made in every hierarchy and removed again
with whatever still runs in it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from gpu_slicer.sandbox import node_host


@pytest.mark.skipif(
    os.geteuid() != 0 or not node_host.cgroup_hierarchies(), reason="needs root and cgroups"
)
def test_the_cgroup_root_is_made_everywhere_and_removed_with_what_runs_in_it() -> None:
    name = f"gpu-slicer-test-{os.getpid()}"
    made = node_host.create_cgroup_root(name)
    child = subprocess.Popen(["sleep", "600"])
    try:
        assert made == [h / name for h in node_host.cgroup_hierarchies()]
        for folder in made:
            if (folder / "cpuset.cpus").exists():
                assert (folder / "cpuset.cpus").read_text() == (
                    folder.parent / "cpuset.cpus"
                ).read_text()
        # A process deep below the root, as a container under kubepods/<qos>/pod<uid> is.
        hierarchy = next(h for h in made if not (h / "cpuset.cpus").exists())
        leaf = hierarchy / "kubepods" / "pod"
        leaf.mkdir(parents=True)
        (leaf / "cgroup.procs").write_text(str(child.pid))
        assert node_host.cgroup_pids(name) == {child.pid}
    finally:
        left = node_host.remove_cgroup_root(name)
        if child.poll() is None:
            child.kill()
    assert left == []
    assert child.wait(10) == -signal.SIGKILL
    assert not any((h / name).exists() for h in node_host.every_cgroup_mount())


def test_preflight_names_what_the_machine_lacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(node_host.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(node_host, "CNI_BIN_DIRS", (tmp_path / "cni",))
    monkeypatch.setattr(node_host, "COMMANDS", ("gpu-slicer-no-such-command",))
    problems = node_host.preflight(tmp_path / "sb")
    assert problems[:1] == ["it needs root (mounts, device nodes, cgroups)"]
    assert "missing commands: gpu-slicer-no-such-command" in problems
    assert any(p.startswith("no CNI plugins (bridge, host-local, loopback)") for p in problems)
