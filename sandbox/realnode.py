"""A real node: the kubelet and containerd 2.x running containers, the GPU still simulated.

``gpu-slicer sandbox up --real-node NAME`` gives one node of the sandbox the real kubelet (built
from the control plane's Kubernetes module and release) and containerd (``sandbox/go/
containerd``), with runc and the CNI plugins of the machine. Its agent is the same ``gpu-slicer
agent run`` on the simulated backend; the kubelet registers it, calls NodePrepareResources, and
containerd injects the claim's CDI devices into real containers. The other nodes keep the
kubelet stand-in.

Both, and the node's agent, run in a private mount namespace (:mod:`sandbox.node_namespace`) with
fake NVIDIA device nodes and the node's folders bound where the chart's DaemonSet mounts them
(:data:`NODE_PATHS`): the kubelet's root ``/var/lib/kubelet`` (the agent's plugin and registration
sockets), the claims' CDI specs in ``/var/run/cdi``, the agent's checkpoint in
``/var/lib/gpu-slicer``. Settings this needs on a machine like the project's (cgroup v1, no systemd,
root without ``CAP_SYS_RESOURCE``): the kubelet's ``failCgroupV1: false``, ``cgroupDriver:
cgroupfs`` and a ``cgroupRoot`` of its own in every hierarchy; containerd's
``restrict_oom_score_adj``. Nothing is pulled: the pause image (compiled from the release's
``build/pause/linux/pause.c``) and a busybox image (``busybox:sandbox``) are written locally and
imported; every registry resolves to a closed local port. Pods get addresses on a bridge without a
gateway: no traffic leaves the machine. The kubelet runs without iptables on its PATH, so it leaves
the host's firewall alone.

Layout under ``nodes/<node>/``::

    kubelet/                 /var/lib/kubelet in the namespace (plugins_registry, plugins)
    cdi/                     /var/run/cdi in the namespace: the claims' CDI specs
    checkpoint/              /var/lib/gpu-slicer in the namespace: the agent's checkpoint
    containerd/              containerd's config, root, state and socket
    pod-logs/                the containers' logs (the kubelet's podLogsDir)
    cni/                     the CNI configuration and IP leases
    namespace/               the namespace's /dev copy and kernel-setting files
    etc-cdi/nvidia.yaml      the toolkit spec, with only device nodes and environment
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_slicer.core.gpuspec import parse_gpu_spec
from gpu_slicer.sandbox import binaries, node_host, oci_image
from gpu_slicer.sandbox.errors import BuildError, StartupError
from gpu_slicer.sandbox.node_namespace import (
    Bind,
    NamespaceSpec,
    enter_argv,
    holder_argv,
    nvidia_device_nodes,
)
from gpu_slicer.sandbox.process import Component, free_port
from gpu_slicer.slicer.simulated import capability_minor_range

PAUSE_IMAGE = "gpu-slicer.local/pause:{release}"
BUSYBOX_IMAGE = "docker.io/library/busybox:sandbox"
"""``image: busybox:sandbox`` in a pod on the real node (with any pull policy but Always)."""
KUBELET_ROOT = "/var/lib/kubelet"
CDI_DIR = "/var/run/cdi"
CHECKPOINT_DIR = "/var/lib/gpu-slicer"
NODE_PATHS = {"kubelet": KUBELET_ROOT, "cdi": CDI_DIR, "checkpoint": CHECKPOINT_DIR}
"""``nodes/<node>/<folder>`` -> where the node's processes see it: the chart's hostPaths
(deploy/base/agent-daemonset.yaml) and the kubelet's default root."""
CLOSED_REGISTRY = "http://127.0.0.1:9"
"""Where every image pull is sent: nothing listens, so a pull fails here and goes nowhere."""


@dataclass(frozen=True)
class Parts:
    """What the real node runs, built or found once."""

    kubelet: Path
    containerd_dir: Path
    images_dir: Path
    runc: Path
    cni_bin: Path
    release: str

    @property
    def pause_image(self) -> str:
        return PAUSE_IMAGE.format(release=self.release)


def ensure_parts(release: str, progress: binaries.Progress = print) -> Parts:
    """The kubelet, containerd and the two images, from the cache or built now."""
    runc = node_host.find_command("runc")
    cni = node_host.cni_bin_dir()
    if runc is None or cni is None:
        raise BuildError(f"runc and the CNI plugins are needed: {node_host.DEBIAN_PACKAGES}")
    kubelet = binaries.ensure_command("kubelet", release, progress=progress)
    containerd = binaries.ensure_containerd(progress=progress)
    images = ensure_images(release, progress)
    return Parts(kubelet, containerd, images, runc, cni, binaries.release_for(release))


def ensure_images(release_or_minor: str, progress: binaries.Progress = print) -> Path:
    """``pause.tar`` and ``busybox.tar`` (OCI archives) in a cache folder per release."""
    release = binaries.release_for(release_or_minor)

    def build(go: str, target: Path) -> None:
        started = time.monotonic()
        staging = target.parent / f".{target.name}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        progress(f"making the pause and busybox images for the real node ({release})")
        pause_root = staging / "pause-root"
        pause_root.mkdir()
        _compile_pause(go, release, pause_root / "pause")
        oci_image.write_archive(
            pause_root,
            oci_image.ImageSpec(PAUSE_IMAGE.format(release=release), entrypoint=["/pause"]),
            staging / "pause.tar",
        )
        busybox_root = staging / "busybox-root"
        _busybox_root(busybox_root)
        oci_image.write_archive(
            busybox_root,
            oci_image.ImageSpec(BUSYBOX_IMAGE, cmd=["sh"]),
            staging / "busybox.tar",
        )
        shutil.rmtree(pause_root)
        shutil.rmtree(busybox_root)
        binaries.install(go, staging, target, started, {"release": release})

    return binaries.build_once(binaries.cache_root() / "node-images" / release, build)


def _compile_pause(go: str, release: str, out: Path) -> None:
    """The kubelet module's own pause.c, compiled statically (what registry.k8s.io/pause is)."""
    done = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubernetes@{release}"],
        capture_output=True,
        text=True,
        cwd=binaries.KUBE_MODULE,
        check=False,
    )
    try:
        source = Path(json.loads(done.stdout)["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    except (ValueError, KeyError) as exc:
        raise BuildError(f"cannot find k8s.io/kubernetes@{release}: {done.stderr.strip()}") from exc
    gcc = node_host.find_command("gcc")
    if gcc is None:
        raise BuildError(f"gcc is needed to compile {source}")
    compiled = subprocess.run(
        [str(gcc), "-Os", "-static", "-Wall", "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if compiled.returncode != 0:
        raise BuildError(f"compiling {source} failed: {compiled.stderr.strip()[-1500:]}")


def _busybox_root(root: Path) -> None:
    busybox = node_host.static_busybox()
    if busybox is None:
        raise BuildError("a static busybox is needed (Debian: busybox-static)")
    (root / "bin").mkdir(parents=True)
    for folder in ("tmp", "etc", "proc", "sys", "dev"):
        (root / folder).mkdir()
    shutil.copy2(busybox, root / "bin" / "busybox")
    listed = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True)
    for applet in sorted(set(listed.stdout.split()) - {"busybox"}):
        (root / "bin" / applet).symlink_to("busybox")


# --- configuration (pure) ----------------------------------------------------------------------


def runtime_toolkit_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The toolkit's CDI spec with only environment and ``/dev/nvidia*`` device nodes (pure).

    Its hooks and driver-library mounts name files that exist only where the driver is
    installed; a real runtime fails a container whose CDI edits it cannot apply.
    """

    def edits_of(edits: dict[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        if edits.get("env"):
            kept["env"] = list(edits["env"])
        nodes = [n for n in edits.get("deviceNodes") or [] if n["path"].startswith("/dev/nvidia")]
        if nodes:
            kept["deviceNodes"] = nodes
        return kept

    devices = []
    for device in spec.get("devices") or []:
        edits = edits_of(device.get("containerEdits") or {})
        if edits:
            devices.append({"name": device["name"], "containerEdits": edits})
    result = {k: v for k, v in spec.items() if k not in ("devices", "containerEdits")}
    result["devices"] = devices
    result["containerEdits"] = edits_of(spec.get("containerEdits") or {})
    return result


def short_id(state_dir: Path, node: str) -> str:
    """Six hex digits naming this sandbox's node in machine-wide names (cgroup, bridge)."""
    return hashlib.sha256(f"{state_dir.resolve()}/{node}".encode()).hexdigest()[:6]


def containerd_config(
    *,
    root: Path,
    state: Path,
    address: Path,
    cdi_dirs: list[Path],
    cni_bin: Path,
    cni_conf: Path,
    runc: Path,
    pause_image: str,
    registry_dir: Path,
) -> str:
    """containerd 2.x's config.toml (version 3) for the real node (pure)."""

    def q(value: object) -> str:
        return json.dumps(str(value))

    def qlist(values: list[Path]) -> str:
        return "[" + ", ".join(q(v) for v in values) + "]"

    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    images = "plugins.'io.containerd.cri.v1.images'"
    return f"""version = 3
root = {q(root)}
state = {q(state)}

[grpc]
  address = {q(address)}

[ttrpc]
  address = {q(str(address) + ".ttrpc")}

[plugins.'io.containerd.internal.v1.opt']
  path = {q(root / "opt")}

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = {qlist(cdi_dirs)}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {q(runc)}
  SystemdCgroup = false

[{runtime}.cni]
  bin_dirs = {qlist([cni_bin])}
  conf_dir = {q(cni_conf)}

[{images}]
  snapshotter = "overlayfs"

[{images}.pinned_images]
  sandbox = {q(pause_image)}

[{images}.registry]
  config_path = {q(registry_dir)}
"""


def closed_registry_hosts() -> str:
    """``hosts.toml`` for every registry (``_default``): pulls go to a closed local port."""
    return (
        f'server = "{CLOSED_REGISTRY}"\n\n'
        f'[host."{CLOSED_REGISTRY}"]\n  capabilities = ["pull", "resolve"]\n'
    )


def cni_config(*, bridge: str, subnet: str, data_dir: Path) -> dict[str, Any]:
    """A bridge without a gateway or masquerading: pods reach each other, nothing else."""
    return {
        "cniVersion": "1.0.0",
        "name": "gpu-slicer-sandbox",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": False,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "dataDir": str(data_dir),
                },
            }
        ],
    }


def kubelet_config(
    *,
    cgroup_root: str,
    runtime_endpoint: Path,
    node_ip: str,
    port: int,
    healthz_port: int,
    client_ca: Path,
    pod_logs: Path,
    volume_plugins: Path,
    gates: dict[str, bool],
) -> dict[str, Any]:
    """The KubeletConfiguration for this machine (pure)."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_root}",
        "containerRuntimeEndpoint": f"unix://{runtime_endpoint}",
        "address": node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(pod_logs),
        "volumePluginDir": str(volume_plugins),
        "syncFrequency": "10s",
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A shared test machine's disk and memory must not evict the sandbox's pods.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        "clusterDomain": "cluster.local",
        "containerLogMaxSize": "1Mi",
    }
    if gates:
        config["featureGates"] = dict(gates)
    return config


# --- the node ----------------------------------------------------------------------------------


class RealNode:
    """One node's namespace holder, containerd and kubelet; :meth:`stop` undoes everything."""

    def __init__(
        self,
        name: str,
        gpus: str,
        *,
        state_dir: Path,
        parts: Parts,
        kubeconfig: Path,
        client_ca: Path,
        gates: dict[str, bool],
        labels: dict[str, str],
        images: tuple[Path, ...] = (),
        progress: binaries.Progress = print,
    ) -> None:
        self.name = name
        self.gpus = gpus
        self.state_dir = state_dir.resolve()  # containerd and the kubelet want absolute paths
        self.folder = self.state_dir / "nodes" / name
        self.parts = parts
        self.kubeconfig = kubeconfig
        self.client_ca = client_ca
        self.gates = gates
        self.labels = labels
        self.images = images
        """Image archives imported besides the pause and busybox images (the agent's)."""
        self.progress = progress
        self.id = short_id(state_dir, name)
        self.cgroup_root = f"gpu-slicer-{name}-{self.id}"[:60]
        self.bridge = f"gsl{self.id}"
        self.subnet = f"10.{200 + int(self.id[:2], 16) % 50}.{int(self.id[2:4], 16)}.0/24"
        self.holder: Component | None = None
        self.containerd: Component | None = None
        self.kubelet: Component | None = None
        self._cgroups_made = False
        self._toolkit_cdi_dir: Path | None = None
        self.healthz_port = 0

    # paths inside the namespace, for the agent (its hostPaths in the chart)
    @property
    def registry_dir(self) -> Path:
        return Path(KUBELET_ROOT) / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return Path(KUBELET_ROOT) / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return Path(CDI_DIR)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(CHECKPOINT_DIR)

    @property
    def pod_logs(self) -> Path:
        return self.folder / "pod-logs"

    @property
    def address(self) -> Path:
        return self.folder / "containerd" / "containerd.sock"

    @property
    def ctr(self) -> Path:
        return self.parts.containerd_dir / "ctr"

    def components(self) -> list[Component]:
        return [c for c in (self.holder, self.containerd, self.kubelet) if c is not None]

    def supervised(self) -> list[Component]:
        """What the sandbox restarts when it exits (as systemd would on a node)."""
        return [c for c in (self.containerd, self.kubelet) if c is not None]

    def start(self, toolkit_cdi_dir: Path) -> None:
        """The namespace, containerd (with the images imported), then the kubelet. containerd
        reads CDI specs from ``toolkit_cdi_dir`` (the toolkit's, on the host) and
        :data:`CDI_DIR` (the agent's)."""
        for sub in (
            *NODE_PATHS,
            "kubelet/plugins_registry",
            "kubelet/plugins",
            "pod-logs",
            "cni/net.d",
        ):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self._toolkit_cdi_dir = toolkit_cdi_dir
        self.progress(f"real node {self.name}: cgroup /{self.cgroup_root}, containerd, kubelet")
        self._clear_leftovers()  # of a sandbox in this folder that was killed, not stopped
        node_host.create_cgroup_root(self.cgroup_root)
        self._cgroups_made = True
        self._start_namespace()
        self._start_containerd([toolkit_cdi_dir, self.cdi_dir])
        for archive in ("pause.tar", "busybox.tar"):
            oci_image.import_archive(self.ctr, self.address, self.parts.images_dir / archive)
        for path in self.images:
            oci_image.import_archive(self.ctr, self.address, path)
        self._start_kubelet()

    def _start_namespace(self) -> None:
        work = self.folder / "namespace"
        work.mkdir(parents=True, exist_ok=True)
        ready = work / "ready"
        ready.unlink(missing_ok=True)
        gpu_count = len(parse_gpu_spec(self.gpus))
        minors = [m for g in range(gpu_count) for m in capability_minor_range(g)]
        spec = NamespaceSpec(
            work_dir=str(work),
            ready_file=str(ready),
            devices=nvidia_device_nodes(gpu_count, minors),
            binds=tuple(Bind(str(self.folder / sub), path) for sub, path in NODE_PATHS.items()),
        )
        self.holder = Component(
            f"namespace-{self.name}",
            holder_argv(spec.write(work / "spec.json")),
            log_dir=self.state_dir / "logs",
        )
        self.holder.start()
        self.holder.wait_ready(ready.exists, timeout_s=30, what="its mount namespace")

    def inside(self, argv: list[str]) -> list[str]:
        """``argv`` run in the node's namespace (the agent's, like containerd's and the
        kubelet's)."""
        assert self.holder is not None and self.holder.pid is not None
        return enter_argv(self.holder.pid, argv)

    def _start_containerd(self, cdi_dirs: list[Path]) -> None:
        folder = self.folder / "containerd"
        registry = folder / "certs.d" / "_default"
        registry.mkdir(parents=True, exist_ok=True)
        (registry / "hosts.toml").write_text(closed_registry_hosts())
        (self.folder / "cni" / "net.d" / "10-gpu-slicer.conflist").write_text(
            json.dumps(
                cni_config(
                    bridge=self.bridge, subnet=self.subnet, data_dir=self.folder / "cni" / "ipam"
                ),
                indent=2,
            )
        )
        config = folder / "config.toml"
        config.write_text(
            containerd_config(
                root=folder / "root",
                state=folder / "state",
                address=self.address,
                cdi_dirs=cdi_dirs,
                cni_bin=self.parts.cni_bin,
                cni_conf=self.folder / "cni" / "net.d",
                runc=self.parts.runc,
                pause_image=self.parts.pause_image,
                registry_dir=folder / "certs.d",
            )
        )
        binary = self.parts.containerd_dir / "containerd"
        path = f"{self.parts.containerd_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        self.containerd = Component(
            f"containerd-{self.name}",
            self.inside([str(binary), "--config", str(config)]),
            log_dir=self.state_dir / "logs",
            env={"PATH": path},
        )
        self.containerd.start()
        self.containerd.wait_ready(self._containerd_answers, timeout_s=60, what="its socket")

    def _containerd_answers(self) -> bool:
        if not self.address.exists():
            return False
        done = subprocess.run(
            [str(self.ctr), "--address", str(self.address), "version"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return done.returncode == 0

    def _start_kubelet(self) -> None:
        ip = node_host.node_ip()
        if ip is None:
            raise StartupError("the real node needs a non-loopback IPv4 address")
        self.healthz_port = free_port()
        config = self.folder / "kubelet.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(
                    cgroup_root=self.cgroup_root,
                    runtime_endpoint=self.address,
                    node_ip=ip,
                    port=free_port(),
                    healthz_port=self.healthz_port,
                    client_ca=self.client_ca,
                    pod_logs=self.pod_logs,
                    volume_plugins=self.folder / "volume-plugins",
                    gates=self.gates,
                ),
                sort_keys=False,
            )
        )
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        argv = [
            str(self.parts.kubelet),
            f"--config={config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={KUBELET_ROOT}",
            f"--cert-dir={self.folder / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={ip}",
            f"--node-labels={labels}",
            "--v=2",
        ]
        # Without iptables on its PATH the kubelet skips the chains it would add to the
        # host's firewall (KUBE-FIREWALL, the hint chain), as on a host with nftables only.
        path = node_host.path_without(os.environ.get("PATH", ""), ("iptables", "ip6tables"))
        self.kubelet = Component(
            f"kubelet-{self.name}",
            self.inside(argv),
            log_dir=self.state_dir / "logs",
            env={"PATH": path},
        )
        self.kubelet.start()
        self.kubelet.wait_ready(self._healthy, timeout_s=120, what="a healthy /healthz")

    def _healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.healthz_port}/healthz", timeout=2
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        """The kubelet, containerd, their containers and shims, the namespace, then the
        cgroups and the pods' bridge: the host as it was."""
        from gpu_slicer.sandbox.process import stop_all

        if self.kubelet is not None:
            stop_all([self.kubelet], timeout_s=10)
        if self.containerd is not None:
            stop_all([self.containerd], timeout_s=10)
        if self.holder is not None:
            self.holder.terminate()  # the namespace goes once its last process has
        if self._cgroups_made:
            self._clear_leftovers()
        if self.holder is not None:
            stop_all([self.holder], timeout_s=5)

    def reboot(self, reset_gpus: Callable[[], None]) -> None:
        """The node reboots: every process of it ends (the kubelet, containerd, the containers,
        the namespace that is its machine), what lives in ``/run`` is gone (containerd's state,
        the claims' CDI specs in ``/var/run/cdi``), ``reset_gpus`` empties the GPUs and gives
        them a new boot id, and the node starts again as at boot. What is kept is what a disk
        keeps: the kubelet's root, containerd's root (images, container records), the agent's
        checkpoint, the CNI leases."""
        assert self._toolkit_cdi_dir is not None, "reboot of a node that never started"
        self.progress(f"real node {self.name}: rebooting")
        self.stop()
        shutil.rmtree(self.folder / "containerd" / "state", ignore_errors=True)
        for spec in (self.folder / "cdi").iterdir():  # the node's /var/run/cdi
            spec.unlink()
        reset_gpus()
        self.start(self._toolkit_cdi_dir)

    def _clear_leftovers(self) -> None:
        """Containers (the processes in the node's cgroups) and runc shims (named by their
        containerd socket) live outside containerd's process group; then the cgroups and
        the pods' bridge."""
        node_host.kill_pids(node_host.cgroup_pids(self.cgroup_root))
        node_host.kill_pids(node_host.processes_naming(str(self.address)))
        left = node_host.remove_cgroup_root(self.cgroup_root)
        if left:
            self.progress(f"real node {self.name}: cgroups left behind: {', '.join(left)}")
        node_host.delete_link(self.bridge)
