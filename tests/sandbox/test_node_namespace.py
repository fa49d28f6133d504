"""The real node's mount namespace: set up only where unshare made one, never on the host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_slicer.sandbox import node_host
from gpu_slicer.sandbox.node_namespace import (
    SHADOWED,
    Bind,
    NamespaceSpec,
    holder_argv,
    nvidia_device_nodes,
    shadowing,
)

ROOT = Path(__file__).resolve().parents[2]


NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or node_host.find_command("unshare") is None, reason="needs root and unshare"
)


def _inside(pid: int, script: str) -> subprocess.CompletedProcess[str]:
    """Run a shell script in the mount namespace the holder ``pid`` keeps."""
    return subprocess.run(
        ["nsenter", f"--target={pid}", "--mount", "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _spec(tmp_path: Path, binds: tuple[Bind, ...] = ()) -> Path:
    spec = NamespaceSpec(
        work_dir=str(tmp_path / "ns"),
        ready_file=str(tmp_path / "ready"),
        devices=nvidia_device_nodes(1, [3, 4]),
        binds=binds,
    )
    (tmp_path / "ns").mkdir()
    return spec.write(tmp_path / "spec.json")


def test_the_chart_paths_lie_in_the_shadowed_folders_and_the_host_s_etc_does_not() -> None:
    assert shadowing("/var/lib/kubelet", SHADOWED) == "/var/lib"
    assert shadowing("/var/lib/gpu-slicer", SHADOWED) == "/var/lib"
    assert shadowing("/run/cdi", SHADOWED) == "/run"
    assert shadowing("/etc/cdi", SHADOWED) is None
    assert shadowing("/var/library", SHADOWED) is None


def test_a_spec_with_binds_reads_back_as_written(tmp_path: Path) -> None:
    binds = (Bind(str(tmp_path / "kubelet"), "/var/lib/kubelet"),)
    assert NamespaceSpec.read(_spec(tmp_path, binds)).binds == binds


def test_the_holder_refuses_to_run_in_its_parents_mount_namespace(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gpu_slicer.sandbox.node_namespace", str(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing" in done.stderr
    assert not (tmp_path / "ready").exists()


@NEEDS_ROOT
def test_inside_the_namespace_the_device_nodes_exist_and_the_host_keeps_its_dev_and_sysctls(
    tmp_path: Path,
) -> None:
    mounts_before = Path("/proc/self/mountinfo").read_text()
    panic_before = Path("/proc/sys/kernel/panic").read_text()
    holder = subprocess.Popen(holder_argv(_spec(tmp_path)), cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"node namespace ready"
        inside = _inside(
            holder.pid,
            "stat -c '%n %t:%T' /dev/nvidia0 /dev/nvidia-caps/nvidia-cap4; "
            "echo 10 > /proc/sys/kernel/panic; cat /proc/sys/kernel/panic; ls /var/lib",
        )
        assert inside.returncode == 0, inside.stderr
        lines = inside.stdout.splitlines()
        assert lines[:3] == ["/dev/nvidia0 c3:0", "/dev/nvidia-caps/nvidia-cap4 ed:4", "10"]
        assert lines[3:] == []  # /var/lib is an empty tmpfs in there
        assert not Path("/dev/nvidia0").exists()
        assert Path("/proc/sys/kernel/panic").read_text() == panic_before
    finally:
        holder.terminate()
        holder.wait(10)
    assert Path("/proc/self/mountinfo").read_text() == mounts_before


@NEEDS_ROOT
def test_a_node_folder_is_seen_at_the_chart_s_path_inside_and_nowhere_new_on_the_host(
    tmp_path: Path,
) -> None:
    source = tmp_path / "cdi"
    source.mkdir()
    existed = Path("/run/cdi").exists()
    holder = subprocess.Popen(
        holder_argv(_spec(tmp_path, (Bind(str(source), "/var/run/cdi"),))),
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"node namespace ready"
        inside = _inside(holder.pid, "echo x > /var/run/cdi/spec.json")
        assert inside.returncode == 0, inside.stderr
        assert (source / "spec.json").read_text() == "x\n"
    finally:
        holder.terminate()
        holder.wait(10)
    assert Path("/run/cdi").exists() == existed


@NEEDS_ROOT
def test_a_bind_outside_the_shadowed_folders_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "cdi"
    source.mkdir()
    target = tmp_path / "host-folder"  # on the host: making it would change the host
    done = subprocess.run(
        holder_argv(_spec(tmp_path, (Bind(str(source), str(target)),))),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "not bound" in done.stderr
    assert not target.exists()
    assert not (tmp_path / "ready").exists()
