"""``gpu-slicer sandbox up``: the whole system on one machine, with simulated GPUs.

Real: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (built from the Kubernetes
Go modules), the gpu-slicer webhook (``gpu-slicer webhook serve`` under gunicorn with TLS) and
one agent per node (``gpu-slicer agent run``), with the RBAC, admission policies and
DeviceClasses of ``deploy/``, and the reference CDI library. Stood in: the kubelet
(:mod:`sandbox.kubelet`, one per node, except the ``--real-node``, which gets the real kubelet and
containerd: :mod:`sandbox.realnode`) and the GPUs (the agent's simulated backend, whose state is
kept in ``<state>/nodes/<node>/gpus.json``).

Layout of the state folder::

    kubeconfig                 admin credentials (export KUBECONFIG=...)
    ready                      written once everything is up (JSON: endpoints, pids, paths)
    logs/<component>.log       one log per process; kubelet stand-ins log to logs/kubelet.log
    paused/<component>         present: that component is stopped and not restarted
    reboot/<node>              present: the real node reboots (removed once it is up again)
    nodes/<node>/{gpus.json,checkpoint,cdi,plugins,plugins_registry,runtime}

Agents and the webhook are restarted when they exit (as a DaemonSet or Deployment would), unless
``paused/<name>`` exists; a control-plane process that exits ends the sandbox.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_slicer.sandbox import binaries, chart_pods, node_gpus, pki
from gpu_slicer.sandbox.cluster import (
    AGENT_SA,
    APPLIED_KINDS,
    NAMESPACE,
    WEBHOOK_SA,
    ClusterSetup,
    api_client,
    deploy_objects,
    webhook_configuration,
)
from gpu_slicer.sandbox.controlplane import ControlPlane, feature_gates
from gpu_slicer.sandbox.errors import StartupError, UsageError
from gpu_slicer.sandbox.kubelet import KubeletStandIn
from gpu_slicer.sandbox.nodes import DEPLOY_DIR, NodeSpec
from gpu_slicer.sandbox.process import Component, check_port_free, free_port, https_ok, stop_all
from gpu_slicer.sandbox.realnode import Parts, RealNode, runtime_toolkit_spec
from gpu_slicer.slicer.plugin import dra_socket
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.simulated_store import PersistedBackend

log = logging.getLogger(__name__)

TOOLKIT_CDI_SPEC = Path(__file__).with_name("toolkit-cdi.yaml")

MARKER = ".gpu-slicer-sandbox"
HEALTH_FROM_MINOR = 36
"""The first release whose kubelet calls the drivers' resource-health service by default."""
SOCKET_LIMIT = 107
"""Bytes in a unix socket path (sun_path is 108 with the terminating NUL)."""


@dataclass
class Settings:
    state_dir: Path
    nodes: list[NodeSpec]
    k8s_version: str = binaries.DEFAULT_MINOR
    kube_bin: Path | None = None
    apiserver_port: int = 0
    webhook_port: int = 0
    webhook_policy: Path | None = None
    deploy_dir: Path = DEPLOY_DIR
    partitionable: bool | None = None
    extended_resources: bool = False
    static_layout: Path | None = None
    """Passed to every agent: what it advertises when partitionable devices are unavailable."""
    install: str = "kustomize"
    """How gpu-slicer's cluster objects get in: deploy/base's files, or the Helm chart."""
    gpu_slicer: Path | None = None
    """The ``gpu-slicer`` command the webhook, the agents and ``certs issue`` run as (an install
    of the package, :mod:`sandbox.install`); None: this interpreter with this tree's code."""
    real_node: str | None = None
    """The node that gets the real kubelet and containerd (:mod:`sandbox.realnode`)."""
    agent_pod: bool = False
    """The real node runs the chart's agent DaemonSet from the project's image
    (:mod:`sandbox.image`) instead of the agent process; needs ``real_node`` and the chart
    (``install="helm"``)."""
    webhook_pod: bool = False
    """The real node runs the chart's webhook Deployment from the image on its network, called
    by the apiserver through the Service's endpoint, instead of the webhook process; needs
    ``real_node`` and the chart."""
    extra_images: tuple[Path, ...] = ()
    """More image archives imported into the real node (an earlier release's image, which an
    upgrade test installs with that release's chart: :mod:`sandbox.releases`)."""


def check_state_dir(folder: Path, nodes: list[NodeSpec], real_node: str | None = None) -> None:
    """A folder the sandbox may use: new, empty, or an old sandbox's (which it clears)."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--state-dir {folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MARKER).exists():
        raise UsageError(
            f"--state-dir {folder} is not empty and not a sandbox's folder; "
            "choose a new or empty folder"
        )
    root = folder.resolve() / "nodes"
    sockets = [dra_socket(root / n.name / "plugins") for n in nodes]
    if real_node is not None:  # its agent's sockets are at /var/lib/kubelet in its namespace
        sockets.append(root / real_node / "containerd" / "containerd.sock.ttrpc")
    sock = max(sockets, key=lambda path: len(str(path).encode()))
    if len(str(sock).encode()) > SOCKET_LIMIT:
        raise UsageError(
            f"--state-dir {folder}: the agents' socket paths would be "
            f"{len(str(sock).encode())} bytes, over the kernel's limit of "
            f"{SOCKET_LIMIT}; choose a shorter folder"
        )
    lock = folder / "sandbox.pid"
    if lock.exists():
        pid = lock.read_text().strip()
        if pid.isdigit() and _running(int(pid)):
            raise UsageError(f"--state-dir {folder} is in use by a running sandbox (pid {pid})")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Sandbox:
    """Brings everything up, supervises it, and takes it all down again."""

    def __init__(self, settings: Settings, *, progress: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.dir = settings.state_dir
        self.progress = progress
        self.control_plane: ControlPlane | None = None
        self.webhook: Component | None = None
        self.agents: dict[str, Component] = {}
        self.kubelets: dict[str, KubeletStandIn] = {}
        self.real_nodes: dict[str, RealNode] = {}
        self.node_parts: Parts | None = None
        self.agent_image: Path | None = None
        """The image's OCI archive, imported into the real node (``agent_pod``,
        ``webhook_pod``)."""
        self._clients: list[k8s.ApiClient] = []
        self.bins: binaries.Binaries | None = None
        self.helm: Path | None = None
        self._ports = (0, 0)
        self._objects: list[dict[str, Any]] = []
        self._owns_dir = False

    # --- up ------------------------------------------------------------------------------

    def check(self) -> None:
        """Every usage problem, found before anything is built, started or written."""
        settings = self.settings
        if settings.agent_pod:
            chart_pods.check_agent_pod(settings)
        if settings.webhook_pod:
            chart_pods.check_webhook_pod(settings)
        if settings.real_node is not None:
            check_real_node(settings.real_node, settings.nodes, self.dir)
        elif settings.extra_images:
            raise UsageError("--import-image needs --real-node NAME (the node that runs images)")
        for archive in settings.extra_images:
            if not archive.is_file():
                raise UsageError(f"--import-image {archive}: no such file")
        check_state_dir(self.dir, settings.nodes, settings.real_node)
        self._ports = (
            check_port_free(settings.apiserver_port, "--apiserver-port"),
            check_port_free(settings.webhook_port, "--webhook-port"),
        )
        for flag, path in (
            ("--webhook-policy", settings.webhook_policy),
            ("--static-layout", settings.static_layout),
        ):
            if path is not None and not path.is_file():
                raise UsageError(f"{flag} {path}: no such file")
        if settings.static_layout is not None:
            node_gpus.check_layout(settings.static_layout, settings.nodes)
        self._objects = deploy_objects(
            settings.deploy_dir, extended_resources=settings.extended_resources
        )

    def up(self) -> dict[str, Any]:
        """Starts everything (after :meth:`check`); returns what it wrote to ``ready``."""
        settings = self.settings
        apiserver_port, webhook_port = self._ports
        objects = self._objects
        self.bins = binaries.ensure(
            settings.k8s_version, kube_bin=settings.kube_bin, progress=self.progress
        )
        if settings.install == "helm":
            from gpu_slicer.sandbox.helm import helm_binary

            self.helm = helm_binary()
        if settings.real_node is not None:
            from gpu_slicer.sandbox.realnode import ensure_parts

            self.node_parts = ensure_parts(settings.k8s_version, progress=self.progress)
        if settings.agent_pod or settings.webhook_pod:
            from gpu_slicer.sandbox import image

            self.agent_image = image.ensure(progress=self.progress)
        self._fresh_state_dir()
        started = time.monotonic()
        credentials = pki.create(self.dir / "pki")
        self.control_plane = ControlPlane(
            self.bins,
            credentials,
            self.dir,
            apiserver_port,
            gates=feature_gates(partitionable=settings.partitionable),
            service_account_tokens=settings.agent_pod or settings.webhook_pod,
            aggregator_routing=settings.webhook_pod,
        )
        self.progress(f"starting etcd and Kubernetes {self.bins.release} control plane")
        self.control_plane.start()
        admin = ClusterSetup(self.control_plane.admin_kubeconfig())
        try:
            admin.wait_for_api()
            url = f"https://127.0.0.1:{webhook_port}/mutate-pods"
            ca_bundle = self._issue_webhook_tls()
            if settings.install == "helm":
                admin.apply(o for o in objects if o.get("kind") == "Namespace")
                if settings.webhook_pod:
                    admin.apply([chart_pods.webhook_tls_secret(self.dir / "webhook-tls")])
                self._helm_install(url, ca_bundle, webhook_port)
            else:
                admin.apply(o for o in objects if o.get("kind") in APPLIED_KINDS)
            if not settings.webhook_pod:
                self._start_webhook(admin, credentials, webhook_port)
            if settings.install != "helm":
                admin.apply([webhook_configuration(objects, url=url, ca_bundle=ca_bundle)])
            for node in settings.nodes:
                self._start_node(admin, credentials, node)
        finally:
            admin.close()
        # The agent pod: its image unpacked and Python started in a container first.
        self._wait_nodes_ready(240 if settings.agent_pod or settings.webhook_pod else 90)
        if settings.webhook_pod:
            chart_pods.wait_webhook_pod(self.control_plane.admin_kubeconfig(), 240)
        ready = self._ready_record(webhook_port, time.monotonic() - started)
        (self.dir / "ready").write_text(json.dumps(ready, indent=2) + "\n")
        return ready

    def _fresh_state_dir(self) -> None:
        if self.dir.exists():
            for child in self.dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._owns_dir = True
        (self.dir / MARKER).write_text("")
        (self.dir / "sandbox.pid").write_text(f"{os.getpid()}\n")
        (self.dir / "paused").mkdir()
        (self.dir / "reboot").mkdir()

    def _gpu_slicer(self, *args: str) -> list[str]:
        if self.settings.gpu_slicer is not None:
            return [str(self.settings.gpu_slicer), *args]
        return [sys.executable, "-m", "gpu_slicer.cli.main", *args]

    def _issue_webhook_tls(self) -> bytes:
        """The webhook's serving certificate, by ``gpu-slicer certs issue``; returns the CA."""
        tls = self.dir / "webhook-tls"
        issued = subprocess.run(
            self._gpu_slicer(
                "certs",
                "issue",
                "--service",
                "gpu-slicer-webhook",
                "--namespace",
                "gpu-slicer",
                "--out",
                str(tls),
                "--host",
                "127.0.0.1",
            ),
            capture_output=True,
            text=True,
        )
        if issued.returncode != 0:
            raise StartupError(f"gpu-slicer certs issue failed: {issued.stderr.strip()}")
        return (tls / "ca.crt").read_bytes()

    def _helm_install(self, url: str, ca_bundle: bytes, webhook_port: int) -> None:
        """The chart instead of deploy/base: RBAC, policies, DeviceClasses, the webhook
        configuration pointing at the local webhook; its workloads stay off (they run here)
        unless ``agent_pod``/``webhook_pod`` put them on the real node."""
        assert self.control_plane is not None and self.helm is not None
        chart = self.settings.deploy_dir / "helm" / "gpu-slicer"
        self.progress(f"helm install gpu-slicer {chart}")
        values: dict[str, Any] = {
            "certificates": {"mode": "external"},
            "webhook": {
                "enabled": False,
                "url": url,
                "caBundle": base64.b64encode(ca_bundle).decode(),
            },
            "agent": {"enabled": False},
            "networkPolicies": {"enabled": False},
            # Its Job needs a node that runs the image: only the chart's pods' real node.
            "uninstallCheck": {"enabled": False},
        }
        if self.settings.agent_pod or self.settings.webhook_pod:
            values |= chart_pods.image_values()
        if self.settings.agent_pod:
            values |= chart_pods.agent_pod_values(
                self._real_node_spec(), self.dir, self.control_plane.apiserver_port
            )
        if self.settings.agent_pod or self.settings.webhook_pod:
            values["uninstallCheck"] = chart_pods.uninstall_check_values(
                self.control_plane.apiserver_port, self._real_node_spec().name
            )
        if self.settings.webhook_pod:
            values["webhook"] = chart_pods.webhook_pod_values(
                ca_bundle,
                webhook_port,
                self.control_plane.apiserver_port,
                self._real_node_spec().name,
            )
        values_file = self.dir / "helm-values.yaml"
        values_file.write_text(yaml.safe_dump(values, sort_keys=False))
        command = [
            str(self.helm),
            "install",
            "gpu-slicer",
            str(chart),
            "--namespace",
            "gpu-slicer",
            "--kubeconfig",
            str(self.control_plane.admin_kubeconfig()),
            "--values",
            str(values_file),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise StartupError(f"helm install failed: {result.stderr.strip()[-2000:]}")

    def _real_node_spec(self) -> NodeSpec:
        return next(n for n in self.settings.nodes if n.name == self.settings.real_node)

    def _start_webhook(self, admin: ClusterSetup, credentials: pki.Pki, port: int) -> None:
        assert self.control_plane is not None
        tls = self.dir / "webhook-tls"
        kubeconfig = pki.token_kubeconfig(
            credentials,
            self.dir / "kubeconfigs" / "webhook",
            server=self.control_plane.server,
            user=WEBHOOK_SA,
            token=admin.token(WEBHOOK_SA),
        )
        argv = self._gpu_slicer(
            "webhook",
            "serve",
            "--bind",
            f"127.0.0.1:{port}",
            "--tls-cert",
            str(tls / "tls.crt"),
            "--tls-key",
            str(tls / "tls.key"),
            "--kubeconfig",
            str(kubeconfig),
            "--workers",
            "2",
        )
        if self.settings.webhook_policy is not None:
            argv += ["--policy", str(self.settings.webhook_policy)]
        self.webhook = Component("webhook", argv, log_dir=self.dir / "logs")
        self.webhook.start()
        self.progress(f"starting the gpu-slicer webhook on https://127.0.0.1:{port}")
        self.webhook.wait_ready(
            lambda: https_ok(f"https://127.0.0.1:{port}/readyz", ca=tls / "ca.crt"),
            timeout_s=60,
            what="a ready /readyz",
        )

    def _start_node(self, admin: ClusterSetup, credentials: pki.Pki, node: NodeSpec) -> None:
        assert self.control_plane is not None and self.bins is not None
        real = node.name == self.settings.real_node
        self.progress(f"adding {'real ' if real else ''}node {node.name} with GPUs {node.gpus}")
        folder = self.dir / "nodes" / node.name
        for sub in ("checkpoint", "cdi", "plugins", "plugins_registry", "runtime", "etc-cdi"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        toolkit = folder / "etc-cdi" / "nvidia.yaml"
        registry_dir, plugins_dir = folder / "plugins_registry", folder / "plugins"
        checkpoint_dir, cdi_dir = folder / "checkpoint", folder / "cdi"
        real_node: RealNode | None = None
        if real:
            spec = yaml.safe_load(TOOLKIT_CDI_SPEC.read_text())
            toolkit.write_text(yaml.safe_dump(runtime_toolkit_spec(spec), sort_keys=False))
            real_node = self._start_real_node(admin, credentials, node, folder / "etc-cdi")
            # The agent's folders where the chart mounts them, inside the node's namespace.
            if self.settings.agent_pod:
                return  # the chart's DaemonSet runs its agent (chart_pods.agent_pod_values)
            registry_dir, plugins_dir = real_node.registry_dir, real_node.plugins_dir
            checkpoint_dir, cdi_dir = real_node.checkpoint_dir, real_node.cdi_dir
        else:
            admin.create_node(node.name, node_gpus.gpu_feature_labels(node.gpus))
            shutil.copyfile(TOOLKIT_CDI_SPEC, toolkit)
        if self.settings.static_layout is not None:
            node_gpus.make_layout(node, folder / "gpus.json", self.settings.static_layout)
        pod = admin.agent_pod(node.name, runnable=real)
        agent_config = pki.token_kubeconfig(
            credentials,
            self.dir / "kubeconfigs" / f"agent-{node.name}",
            server=self.control_plane.server,
            user=AGENT_SA,
            token=admin.token(AGENT_SA, bound_pod=pod),
        )
        argv = self._gpu_slicer(
            "agent",
            "run",
            "--node",
            node.name,
            "--backend",
            "simulated",
            "--simulate-gpus",
            node.gpus,
            "--simulate-state",
            str(folder / "gpus.json"),
            "--kubeconfig",
            str(agent_config),
            "--checkpoint-dir",
            str(checkpoint_dir),
            "--cdi-dir",
            str(cdi_dir),
            "--plugins-dir",
            str(plugins_dir),
            "--registry-dir",
            str(registry_dir),
            "--metrics-bind",
            f"127.0.0.1:{free_port()}",
            "--reconcile-interval",
            "5",
            "--toolkit-cdi-spec",
            str(toolkit),
        )
        if self.settings.static_layout is not None:
            argv += ["--static-layout", str(self.settings.static_layout)]
        if real_node is not None:
            argv = real_node.inside(argv)
        agent = Component(f"agent-{node.name}", argv, log_dir=self.dir / "logs")
        agent.start()
        self.agents[node.name] = agent
        if real_node is not None:
            return
        kubelet_config = self._node_kubeconfig(credentials, node.name)
        client = api_client(kubelet_config)
        self._clients.append(client)
        kubelet = KubeletStandIn(
            node.name,
            api=client,
            registry_dir=folder / "plugins_registry",
            cdi_dirs=[folder / "etc-cdi", folder / "cdi"],
            cdi_inject=self.bins.path("cdi-inject"),
            runtime_dir=folder / "runtime",
            on_error=self._kubelet_error(node.name),
            # The kubelet watches resource health from 1.36 (ResourceHealthStatus, beta).
            watch_health=binaries.minor_of(self.bins.release) >= HEALTH_FROM_MINOR,
        )
        kubelet.start()
        self.kubelets[node.name] = kubelet

    def _node_kubeconfig(self, credentials: pki.Pki, name: str) -> Path:
        """A kubelet's credentials: ``system:node:<name>``, so the Node authorizer applies."""
        assert self.control_plane is not None
        return pki.client_kubeconfig(
            credentials,
            self.dir / "kubeconfigs" / f"kubelet-{name}",
            server=self.control_plane.server,
            user=f"system:node:{name}",
            groups=["system:nodes"],
        )

    def _start_real_node(
        self, admin: ClusterSetup, credentials: pki.Pki, node: NodeSpec, toolkit_cdi_dir: Path
    ) -> RealNode:
        """containerd and the kubelet, which registers the Node itself (before the agent, whose
        ResourceSlices belong to the Node)."""
        assert self.control_plane is not None and self.node_parts is not None
        kubeconfig = self._node_kubeconfig(credentials, node.name)
        labels = node_gpus.gpu_feature_labels(node.gpus)
        if self.settings.agent_pod:  # the chart's agent nodeSelector (docs/migration-guide.md)
            labels["gpu-slicer.io/agent"] = "enabled"
        real_node = RealNode(
            node.name,
            node.gpus,
            state_dir=self.dir,
            parts=self.node_parts,
            kubeconfig=kubeconfig,
            client_ca=credentials.ca_cert,
            gates=self.control_plane.gates,
            labels=labels,
            images=(
                *((self.agent_image,) if self.agent_image is not None else ()),
                *self.settings.extra_images,
            ),
            progress=self.progress,
        )
        self.real_nodes[node.name] = real_node
        real_node.start(toolkit_cdi_dir)
        admin.wait_for_node(node.name)
        return real_node

    def _kubelet_error(self, node: str) -> Callable[[str], None]:
        return lambda message: self.progress(f"kubelet {node}: {message}")

    def _wait_nodes_ready(self, timeout_s: float = 90) -> None:
        """Until each node's agent is registered with its kubelet and has published slices."""
        assert self.control_plane is not None
        admin = api_client(self.control_plane.admin_kubeconfig())
        resource = k8s.ResourceV1Api(admin)
        deadline = time.monotonic() + timeout_s
        try:
            for name in self.real_nodes:
                self._wait_real_node(admin, name, deadline)
            for name, kubelet in self.kubelets.items():
                agent = self.agents[name]

                def registered(k: KubeletStandIn = kubelet) -> bool:
                    return k.registrar.get("gpu-slicer.io") is not None

                def published(n: str = name) -> bool:
                    return bool(
                        resource.list_resource_slice(field_selector=f"spec.nodeName={n}").items
                    )

                agent.wait_ready(
                    registered,
                    timeout_s=max(1, deadline - time.monotonic()),
                    what="registration with the kubelet stand-in",
                )
                agent.wait_ready(
                    published, timeout_s=max(1, deadline - time.monotonic()), what="ResourceSlices"
                )
        finally:
            admin.close()  # type: ignore[no-untyped-call]

    def _wait_real_node(self, admin: k8s.ApiClient, name: str, deadline: float) -> None:
        """Until the kubelet reports its Node Ready, has registered the agent, and the agent has
        published its ResourceSlices."""
        real_node, agent = self.real_nodes[name], self.agents.get(name)
        core, resource = k8s.CoreV1Api(admin), k8s.ResourceV1Api(admin)
        assert real_node.kubelet is not None
        kubelet = real_node.kubelet

        def node_ready() -> bool:
            status = core.read_node(name).status
            conditions = (status.conditions if status else None) or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        def agent_log() -> str:
            if agent is not None:
                return agent.log_tail(400)
            pods = core.list_namespaced_pod(
                NAMESPACE,
                label_selector=chart_pods.AGENT_POD_SELECTOR,
                field_selector=f"spec.nodeName={name}",
            ).items
            names = [str(p.metadata.name) for p in pods if p.metadata is not None]
            try:
                return "".join(str(core.read_namespaced_pod_log(n, NAMESPACE)) for n in names)
            except ApiException:  # its container not started yet
                return ""

        def registered() -> bool:
            return "registered with the kubelet" in agent_log()

        def published() -> bool:
            return bool(resource.list_resource_slice(field_selector=f"spec.nodeName={name}").items)

        def remaining() -> float:
            return max(1.0, deadline - time.monotonic())

        kubelet.wait_ready(node_ready, timeout_s=remaining(), what="a Ready Node")
        waiter = kubelet if agent is None else agent  # the agent pod lives while its kubelet does
        waiter.wait_ready(registered, timeout_s=remaining(), what="the agent's registration")
        waiter.wait_ready(published, timeout_s=remaining(), what="the agent's ResourceSlices")

    def _ready_record(self, webhook_port: int, seconds: float) -> dict[str, Any]:
        assert self.control_plane is not None and self.bins is not None
        return {
            "kubeconfig": str(self.control_plane.admin_kubeconfig().resolve()),
            "server": self.control_plane.server,
            "kubernetes": self.bins.release,
            "gpuSlicer": self._gpu_slicer(),
            "webhook": f"https://127.0.0.1:{webhook_port}",
            "startSeconds": round(seconds, 1),
            "pids": {c.name: c.pid for c in self._components()},
            "nodes": {
                name: {
                    "gpus": next(n.gpus for n in self.settings.nodes if n.name == name),
                    "gpuState": str(self._gpu_state(name).resolve()),
                    "runtime": str((self.dir / "nodes" / name / "runtime").resolve()),
                    "cdi": str((self.dir / "nodes" / name / "cdi").resolve()),
                    **self._real_node_record(name),
                }
                for name in (n.name for n in self.settings.nodes)
            },
        }

    def _gpu_state(self, name: str) -> Path:
        folder = self.dir / "nodes" / name
        if self.settings.agent_pod and name == self.settings.real_node:
            return folder / "checkpoint" / Path(chart_pods.AGENT_POD_GPU_STATE).name
        return folder / "gpus.json"

    def _real_node_record(self, name: str) -> dict[str, Any]:
        real_node = self.real_nodes.get(name)
        if real_node is None:
            return {"kubelet": "stand-in"}
        return {
            "kubelet": "real",
            "containerdAddress": str(real_node.address),
            "kubeletLog": str(self.dir.resolve() / "logs" / f"kubelet-{name}.log"),
            "podLogs": str(real_node.pod_logs.resolve()),
            "cgroupRoot": f"/{real_node.cgroup_root}",
        }

    def _components(self) -> list[Component]:
        listed = list(self.control_plane.components) if self.control_plane else []
        if self.webhook is not None:
            listed.append(self.webhook)
        for real_node in self.real_nodes.values():
            listed += real_node.components()
        return listed + list(self.agents.values())

    # --- running -------------------------------------------------------------------------

    def supervise(self, stop: threading.Event) -> None:
        """Until ``stop``: restart exited agents and webhook, honour ``paused/``."""
        assert self.control_plane is not None
        while not stop.wait(0.5):
            dead = self.control_plane.alive()
            dead += [c.name for n in self.real_nodes.values() if (c := n.holder) and not c.alive()]
            if dead:
                raise StartupError(f"{', '.join(dead)} exited; see {self.dir / 'logs'}")
            for name in self.real_nodes:
                if (self.dir / "reboot" / name).exists():
                    self._reboot(name)
            supervised = [c for n in self.real_nodes.values() for c in n.supervised()]
            for component in [self.webhook, *self.agents.values(), *supervised]:
                if component is None:
                    continue
                paused = (self.dir / "paused" / component.name).exists()
                if paused and component.alive():
                    self.progress(f"{component.name} paused")
                    component.stop()
                elif not paused and not component.alive():
                    component.restarts += 1
                    self.progress(
                        f"{component.name} exited (code {component.exit_code()}); "
                        f"restarting (restart {component.restarts})"
                    )
                    component.start()
                    self._record_pids()

    def _reboot(self, name: str) -> None:
        """Reboots the real node ``name`` (its agent too, when it runs beside the node: it is
        started again by the loop), then takes the request away."""
        agent = self.agents.get(name)
        if agent is not None:
            stop_all([agent])
        real_node = self.real_nodes[name]
        state = self._gpu_state(name)
        real_node.reboot(
            lambda: PersistedBackend(
                SimulatedBackend(real_node.gpus, node_name=name), state
            ).reboot()
        )
        self._record_pids()
        (self.dir / "reboot" / name).unlink()
        self.progress(f"real node {name}: up again after its reboot")

    def _record_pids(self) -> None:
        path = self.dir / "ready"
        if path.exists():
            ready = json.loads(path.read_text())
            ready["pids"] = {c.name: c.pid for c in self._components()}
            temp = path.with_suffix(".tmp")
            temp.write_text(json.dumps(ready, indent=2) + "\n")
            temp.replace(path)

    # --- down ----------------------------------------------------------------------------

    def down(self) -> None:
        """Stops everything this sandbox started; leaves no process or socket behind."""
        for kubelet in self.kubelets.values():
            kubelet.stop()
        for real_node in self.real_nodes.values():
            real_node.stop()
        stop_all(list(self.agents.values()))
        # A stopping webhook keeps the apiserver's idle connections open for one more review
        # (webhook.worker.DRAIN_S); stopping the apiserver meanwhile closes them at once.
        if self.webhook is not None:
            self.webhook.terminate()
        if self.control_plane is not None:
            self.control_plane.stop()
        if self.webhook is not None:
            self.webhook.stop()
        for client in self._clients:
            client.close()  # type: ignore[no-untyped-call]
        if not self._owns_dir:
            return
        for sock in self.dir.glob("nodes/*/**/*.sock"):
            sock.unlink(missing_ok=True)
        for name in ("ready", "sandbox.pid"):
            (self.dir / name).unlink(missing_ok=True)


def check_real_node(name: str, nodes: list[NodeSpec], state_dir: Path) -> None:
    """``--real-node`` names a node, and this machine can run containers."""
    from gpu_slicer.sandbox.node_host import DEBIAN_PACKAGES, preflight

    if name not in {n.name for n in nodes}:
        raise UsageError(
            f"--real-node {name}: no such --node (nodes: {', '.join(n.name for n in nodes)})"
        )
    problems = preflight(state_dir)
    if problems:
        raise UsageError(
            f"--real-node {name}: this machine cannot run containers: {'; '.join(problems)} "
            f"(Debian packages: {DEBIAN_PACKAGES})"
        )
