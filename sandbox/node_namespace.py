"""The real node's private mount namespace: fake NVIDIA device nodes, and a host left alone.

containerd and the kubelet of the real node run inside one mount namespace (``nsenter -t <holder
pid> -m``) that a small holder process creates (``unshare --mount --propagation private``) and
keeps alive (``python -m sandbox.node_namespace SPEC``). Inside it, and only there:

* ``/dev`` is a tmpfs copy of the host's ``/dev`` (its sub-mounts moved in), plus the NVIDIA
  device nodes a GPU node has (``/dev/nvidia<N>``, ``nvidiactl``, ``nvidia-uvm``,
  ``nvidia-uvm-tools``, ``nvidia-modeset``, ``nvidia-caps/nvidia-cap<M>``). They are character
  devices with the driver's numbers but no driver behind them: the CDI library can stat them and
  runc can create them in containers and allow them in the device cgroup, which is all the
  runtime does with a GPU; nothing opens them. The GPU itself stays simulated.
* ``/run``, ``/var/lib`` and ``/var/log`` are empty tmpfs: what the node keeps at fixed paths
  whatever its settings (containerd's shim sockets under ``/run/containerd/s``, the kubelet's
  ``/var/lib/kubelet/device-plugins`` and ``/var/log/containers``) lands there; the host's
  folders are neither read nor created. (Container logs go to the state folder: the kubelet's
  ``podLogsDir``.)
* the node's folders (the sandbox's ``nodes/<node>/...``) are bound where a GPU node has them and
  the chart's DaemonSet mounts them (``/var/lib/kubelet``, ``/var/run/cdi``,
  ``/var/lib/gpu-slicer``): the kubelet, containerd and the agent all run in here and use those
  paths, as on a node. A bind's target must lie in one of the empty tmpfs above, so making its
  mount point never creates a folder on the host.
* the kernel settings the kubelet writes at start (``vm.overcommit_memory``,
  ``kernel.panic``, ...) are regular files bound over their ``/proc/sys`` entries, holding the
  host's values: the kubelet reads and writes them as usual, the host keeps its own.

When the holder and everything that entered the namespace have exited, the kernel drops the
namespace and every mount in it.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

NVIDIA_MAJOR = 195
UVM_MAJOR = 508
CAPS_MAJOR = 237
"""The usual numbers on a node with NVIDIA's driver (the UVM and caps majors are dynamic)."""

SHADOWED = ("/run", "/var/lib", "/var/log")
"""Host folders replaced by an empty tmpfs inside the namespace."""

KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
"""What the kubelet's container manager sets at start (``setupKernelTunables``)."""


@dataclass(frozen=True)
class DeviceNode:
    path: str
    major: int
    minor: int


def nvidia_device_nodes(gpu_count: int, capability_minors: Iterable[int]) -> list[DeviceNode]:
    """The nodes NVIDIA's driver makes on a node with ``gpu_count`` GPUs (pure)."""
    nodes = [DeviceNode(f"/dev/nvidia{i}", NVIDIA_MAJOR, i) for i in range(gpu_count)]
    nodes += [
        DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
        DeviceNode("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
        DeviceNode("/dev/nvidia-uvm", UVM_MAJOR, 0),
        DeviceNode("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
    ]
    minors = sorted({1, 2, *capability_minors})  # 1 and 2: the config and monitor caps
    nodes += [DeviceNode(f"/dev/nvidia-caps/nvidia-cap{m}", CAPS_MAJOR, m) for m in minors]
    return nodes


@dataclass(frozen=True)
class Bind:
    """A host folder (``source``) seen at ``target`` inside the namespace."""

    source: str
    target: str


def shadowing(target: str, shadowed: Iterable[str]) -> str | None:
    """The shadowed folder ``target`` lies in, links followed (``/var/run`` is ``/run``), or
    ``None`` (pure but for reading the links)."""
    real = os.path.realpath(target)
    for folder in shadowed:
        root = os.path.realpath(folder)
        if real == root or real.startswith(root.rstrip("/") + "/"):
            return folder
    return None


@dataclass(frozen=True)
class NamespaceSpec:
    """What the holder sets up; written as JSON for ``python -m sandbox.node_namespace``."""

    work_dir: str
    """A folder of the sandbox's for the /dev copy and the kernel-setting files."""
    ready_file: str
    devices: list[DeviceNode]
    shadowed: tuple[str, ...] = SHADOWED
    sysctls: tuple[str, ...] = KUBELET_SYSCTLS
    binds: tuple[Bind, ...] = ()

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> NamespaceSpec:
        data = json.loads(path.read_text())
        return cls(
            work_dir=data["work_dir"],
            ready_file=data["ready_file"],
            devices=[DeviceNode(**d) for d in data["devices"]],
            shadowed=tuple(data["shadowed"]),
            sysctls=tuple(data["sysctls"]),
            binds=tuple(Bind(**b) for b in data.get("binds") or ()),
        )


def holder_argv(spec_file: Path) -> list[str]:
    """The command that creates the namespace and holds it until SIGTERM."""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        sys.executable,
        "-m",
        "gpu_slicer.sandbox.node_namespace",
        str(spec_file),
    ]


def enter_argv(holder_pid: int, argv: list[str]) -> list[str]:
    """``argv`` run inside the holder's mount namespace."""
    return ["nsenter", f"--target={holder_pid}", "--mount", "--", *argv]


# --- inside the namespace (the holder process) ---------------------------------------------


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _submounts(under: str) -> list[str]:
    """Mount points strictly below ``under``, outermost first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(under.rstrip("/") + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"))


def _copy_tree(source: Path, target: Path, skip: set[str]) -> None:
    """Directories, device nodes, links and small files of ``source`` (not its sub-mounts)."""
    for entry in os.scandir(source):
        path = Path(entry.path)
        dest = target / entry.name
        if str(path) in skip:
            dest.mkdir(exist_ok=True)
            continue
        info = os.lstat(path)
        mode = info.st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(path), dest)
        elif stat.S_ISDIR(mode):
            dest.mkdir(exist_ok=True)
            os.chmod(dest, stat.S_IMODE(mode))
            _copy_tree(path, dest, skip)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
            os.mknod(dest, mode, info.st_rdev)
        elif stat.S_ISREG(mode):
            dest.write_bytes(path.read_bytes())
            os.chmod(dest, stat.S_IMODE(mode))
        else:
            continue
        os.lchown(dest, info.st_uid, info.st_gid)


def _private_dev(work: Path, devices: list[DeviceNode]) -> None:
    copy = work / "dev"
    copy.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", str(copy))
    submounts = _submounts("/dev")
    _copy_tree(Path("/dev"), copy, set(submounts))
    for device in devices:
        dest = copy / device.path.removeprefix("/dev/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(dest, stat.S_IFCHR | 0o666, os.makedev(device.major, device.minor))
    for point in submounts:
        if point.count("/") == 2:  # /dev/x: its own mounts below move with it
            _mount("--move", point, str(copy / point.removeprefix("/dev/")))
    _mount("--move", str(copy), "/dev")


def _shadow_sysctls(work: Path, names: tuple[str, ...]) -> None:
    folder = work / "sysctl"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        live = Path("/proc/sys") / name
        if not live.exists():
            continue
        held = folder / name.replace("/", ".")
        held.write_text(live.read_text())
        _mount("--bind", str(held), str(live))


def set_up(spec: NamespaceSpec) -> None:
    """Everything the module docstring lists, in the current (private) mount namespace."""
    work = Path(spec.work_dir)
    _private_dev(work, spec.devices)
    for folder in spec.shadowed:
        if Path(folder).is_dir():
            _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", folder)
    for bind in spec.binds:
        if shadowing(bind.target, spec.shadowed) is None:
            raise OSError(f"{bind.target} is outside {', '.join(spec.shadowed)}: not bound")
        target = os.path.realpath(bind.target)
        os.makedirs(target, exist_ok=True)
        _mount("--bind", bind.source, target)
    _shadow_sysctls(work, spec.sysctls)


def in_private_namespace() -> bool:
    """True when this process's mount namespace is not its parent's: ``unshare`` made it.

    (Not PID 1's: a machine may run its users' commands in a mount namespace of their own.)
    """
    try:
        return os.readlink("/proc/self/ns/mnt") != os.readlink(f"/proc/{os.getppid()}/ns/mnt")
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if not in_private_namespace():
        # Everything below would change the host's /dev, /run, /var and kernel settings.
        print(
            "node namespace: refusing to set up outside a private mount namespace; "
            f"run it as: {' '.join(holder_argv(Path(argv[0] if argv else 'SPEC')))}",
            file=sys.stderr,
        )
        return 2
    spec = NamespaceSpec.read(Path(argv[0]))
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        set_up(spec)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        print(f"node namespace: setting up failed: {exc} {detail}".strip(), file=sys.stderr)
        return 1
    Path(spec.ready_file).write_text(f"{os.getpid()}\n")
    print("node namespace ready", flush=True)
    while not stop:
        signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
