"""What the real node needs from the machine, and what it must give back.

:func:`preflight` says why this machine cannot run containers (not root, no cgroups, a missing
tool), before anything is built. The rest are the host-side changes the node cannot avoid and
undoes: its cgroup folders (the kubelet's ``cgroupRoot`` must exist in every cgroup v1
hierarchy), the bridge the CNI plugin makes for pods, and the processes containerd leaves
running outside its own process group (runc shims, containers), found by the node's cgroups
and containerd socket, and ended by pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
CNI_PLUGINS = ("bridge", "host-local", "loopback")
COMMANDS = ("unshare", "nsenter", "mount", "ip", "runc", "gcc")
DEBIAN_PACKAGES = "runc containernetworking-plugins busybox-static gcc libc6-dev"
CGROUP_FS = Path("/sys/fs/cgroup")
BUSYBOX_PATHS = (Path("/bin/busybox"), Path("/usr/bin/busybox"))


def find_command(name: str) -> Path | None:
    """``name`` on the PATH or in the sbin folders a non-login shell may lack."""
    found = shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")
    return Path(found) if found else None


def cni_bin_dir() -> Path | None:
    return next((d for d in CNI_BIN_DIRS if all((d / p).is_file() for p in CNI_PLUGINS)), None)


def static_busybox() -> Path | None:
    """Debian's busybox-static (a dynamic busybox cannot be an image on its own)."""
    return next((p for p in BUSYBOX_PATHS if p.is_file() and is_static_elf(p.read_bytes())), None)


def is_static_elf(data: bytes) -> bool:
    """True for a 64-bit little-endian ELF without a program interpreter (pure)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    size = int.from_bytes(data[0x36:0x38], "little")
    count = int.from_bytes(data[0x38:0x3A], "little")
    for i in range(count):
        start = phoff + i * size
        if int.from_bytes(data[start : start + 4], "little") == 3:  # PT_INTERP
            return False
    return True


def cgroup_mounts() -> tuple[list[Path], list[Path]]:
    """Mount points of the cgroup v1 hierarchies and of cgroup v2."""
    v1: list[Path] = []
    v2: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        point = Path(left.split()[4])
        if fstype == "cgroup":
            v1.append(point)
        elif fstype == "cgroup2":
            v2.append(point)
    return v1, v2


def cgroup_hierarchies() -> list[Path]:
    """Where the kubelet's cgroupRoot must exist: every v1 hierarchy, or the v2 mount."""
    v1, v2 = cgroup_mounts()
    if v1:
        return v1  # hybrid: the v2 mount beside v1 controllers holds none of them
    return [p for p in v2 if p == CGROUP_FS]


def every_cgroup_mount() -> list[Path]:
    """Every place a cgroup of the node may appear (runc also mirrors into hybrid's v2)."""
    v1, v2 = cgroup_mounts()
    return v1 + v2


def preflight(state_dir: Path) -> list[str]:
    """Why this machine cannot run a real node here; empty when it can."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("it needs root (mounts, device nodes, cgroups)")
    if not Path("/proc/self/mountinfo").exists():
        return problems + ["it needs Linux"]
    if not cgroup_hierarchies():
        problems.append(f"no cgroup file system is mounted at {CGROUP_FS}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append("the kernel has no overlay file system (containerd's snapshotter)")
    missing = [c for c in COMMANDS if find_command(c) is None]
    if missing:
        problems.append(f"missing commands: {', '.join(missing)}")
    if cni_bin_dir() is None:
        problems.append(
            f"no CNI plugins ({', '.join(CNI_PLUGINS)}) in {' or '.join(map(str, CNI_BIN_DIRS))}"
        )
    if static_busybox() is None:
        problems.append("no static busybox (/bin/busybox from busybox-static)")
    if node_ip() is None:
        problems.append("no non-loopback IPv4 address for the node (the kubelet refuses loopback)")
    resolved = state_dir.resolve()
    for shadowed in ("/run", "/var/lib", "/var/log"):
        if resolved.is_relative_to(shadowed):
            problems.append(
                f"--state-dir {state_dir} is under {shadowed}, which the node's mount namespace "
                "replaces; choose a folder elsewhere (for example under /tmp)"
            )
    return problems


def node_ip() -> str | None:
    """The first global IPv4 address of the machine (the node's InternalIP)."""
    ip = find_command("ip")
    if ip is None:
        return None
    done = subprocess.run(
        [str(ip), "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in done.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


def path_without(path: str, commands: Iterable[str]) -> str:
    """``path`` without the folders that hold any of ``commands``."""
    names = list(commands)
    kept = [d for d in path.split(os.pathsep) if d and not any(Path(d, n).exists() for n in names)]
    return os.pathsep.join(kept)


# --- cgroups ---------------------------------------------------------------------------------


def create_cgroup_root(name: str) -> list[Path]:
    """``/<name>`` in every hierarchy (cpuset's with its parent's CPUs and memory nodes)."""
    created = []
    for hierarchy in cgroup_hierarchies():
        folder = hierarchy / name
        folder.mkdir(exist_ok=True)
        created.append(folder)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent_value = hierarchy / knob
            if parent_value.exists() and (folder / knob).exists():
                (folder / knob).write_text(parent_value.read_text())
    return created


def cgroup_pids(name: str) -> set[int]:
    """Every process in ``/<name>`` or below, in any hierarchy."""
    pids: set[int] = set()
    for hierarchy in every_cgroup_mount():
        root = hierarchy / name
        if not root.is_dir():
            continue
        for folder, _dirs, files in os.walk(root):
            if "cgroup.procs" in files:
                try:
                    text = Path(folder, "cgroup.procs").read_text()
                except OSError:
                    continue
                pids |= {int(p) for p in text.split()}
    return pids


def remove_cgroup_root(name: str, timeout_s: float = 15) -> list[str]:
    """Kills what is left in ``/<name>`` and removes its folders, deepest first; returns the
    folders that would not go."""
    deadline = time.monotonic() + timeout_s
    while True:
        kill_pids(cgroup_pids(name))
        left: list[str] = []
        for hierarchy in every_cgroup_mount():
            root = hierarchy / name
            if not root.is_dir():
                continue
            for folder, _dirs, _files in os.walk(root, topdown=False):
                try:
                    os.rmdir(folder)
                except OSError:
                    left.append(folder)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# --- processes and links ---------------------------------------------------------------------


def kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def processes_naming(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (a path only this sandbox uses)."""
    needle = text.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def delete_link(name: str) -> bool:
    """Deletes network interface ``name`` if it exists; True if it did."""
    if not Path("/sys/class/net", name).exists():
        return False
    ip = find_command("ip") or Path("ip")
    subprocess.run([str(ip), "link", "delete", name], capture_output=True, check=False)
    return True
