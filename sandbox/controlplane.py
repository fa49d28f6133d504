"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1.

The flags follow what the Kubernetes integration tests and ``hack/local-up-cluster.sh`` use:

* the apiserver serves TLS with the sandbox CA, authenticates client certificates and
  ServiceAccount tokens, authorizes with RBAC (and the Node authorizer, which costs nothing);
  ``ServiceAccount`` admission is off because no pod of the sandbox mounts a token (on with
  ``service_account_tokens``: the real node's agent pod mounts its projected token), and
  ``TaintNodesByCondition`` is off because no kubelet would ever clear the taint; with
  ``aggregator_routing`` it calls Services (the chart's webhook) by endpoint, not ClusterIP;
* the controller manager runs every default controller except node lifecycle (without a kubelet
  it would mark every node NotReady and evict its pods), each with its own ServiceAccount
  credentials, as kubeadm sets it up;
* the scheduler runs its default profile, whose DynamicResources plugin allocates claims.

DRA feature gates are the release's defaults, except what :func:`feature_gates` says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpu_slicer.sandbox import binaries
from gpu_slicer.sandbox.pki import Pki, client_kubeconfig
from gpu_slicer.sandbox.process import Component, free_port, https_ok, stop_all

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLER_MANAGER_QPS = 100.0
"""What docs/install-kubernetes.md recommends for clusters where many converted pods start at
once (see ``ControlPlane.controller_manager_qps``)."""


def feature_gates(*, partitionable: bool | None) -> dict[str, bool]:
    """Gates to set on every component; ``None`` keeps the release's default.

    DRAPartitionableDevices is alpha (off) up to 1.35 and beta (on) from 1.36; turning it off
    makes the apiserver drop counters, which the agent must notice and answer with its static
    layout.
    """
    return {} if partitionable is None else {"DRAPartitionableDevices": partitionable}


def _client_rate_flags(qps: float | None) -> list[str]:
    if qps is None:
        return []
    return [f"--kube-api-qps={qps:g}", f"--kube-api-burst={int(2 * qps)}"]


def _gates_flag(gates: dict[str, bool]) -> list[str]:
    if not gates:
        return []
    pairs = (f"{name}={str(value).lower()}" for name, value in sorted(gates.items()))
    return ["--feature-gates=" + ",".join(pairs)]


@dataclass
class ControlPlane:
    """The four processes, and where a client finds them."""

    bins: binaries.Binaries
    pki: Pki
    state_dir: Path
    apiserver_port: int
    gates: dict[str, bool] = field(default_factory=dict)
    controller_manager_qps: float | None = CONTROLLER_MANAGER_QPS
    """The controller manager's client rate (``--kube-api-qps``; burst twice that). Its claim
    controller creates every pod's ResourceClaim from its template through this client, so it
    caps how fast converted pods can start (Kubernetes' default, 20, gives about 11 pods/s);
    None keeps the release's default."""
    scheduler_qps: float | None = None
    """The scheduler's client rate (``clientConnection.qps``; burst twice that); None: the
    release's default (50)."""
    service_account_tokens: bool = False
    """``ServiceAccount`` admission on: pods get the projected token their in-cluster clients
    read (the chart's agent pod on the real node); off, no pod mounts one."""
    aggregator_routing: bool = False
    """``--enable-aggregator-routing``: the apiserver calls a Service by one of its endpoints
    (pod IP and port), for webhooks too, not by its ClusterIP, which nothing here routes (no
    kube-proxy); the chart's webhook pod on the real node's network is then reachable."""
    components: list[Component] = field(default_factory=list)
    scheduler_port: int = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    def start(self) -> None:
        """Starts etcd, the apiserver, then the controller manager and the scheduler."""
        etcd_port = self._start_etcd()
        self._start_apiserver(etcd_port)
        kcm = self._controller_manager()
        scheduler = self._scheduler()
        for component in (kcm, scheduler):
            component.start()
            self.components.append(component)

    def _start_etcd(self) -> int:
        """Starts etcd and waits until it serves: the apiserver fails without it. Returns its
        client port."""
        etcd_port = free_port()
        etcd = Component(
            "etcd",
            [
                str(self.bins.path("etcd")),
                "--data-dir",
                str(self.state_dir / "etcd"),
                "--listen-client-url",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-url",
                f"http://127.0.0.1:{free_port()}",
            ],
            log_dir=self.log_dir,
        )
        self._launch(etcd, lambda: "etcd ready" in etcd.log_tail(50), "a ready etcd", 60)
        return etcd_port

    def _start_apiserver(self, etcd_port: int) -> None:
        """Writes the admin kubeconfig and starts the apiserver, waiting for /readyz: the
        controller manager and the scheduler start only against a ready apiserver."""
        admin = self.state_dir / "pki" / "admin"
        client_kubeconfig(
            self.pki,
            self.admin_kubeconfig(),
            server=self.server,
            user="sandbox-admin",
            groups=["system:masters"],
            pair_files=admin,
        )
        apiserver = Component(
            "kube-apiserver", self._apiserver_args(etcd_port), log_dir=self.log_dir
        )
        self._launch(
            apiserver,
            lambda: https_ok(
                f"{self.server}/readyz",
                ca=self.pki.ca_cert,
                client_cert=(admin.with_suffix(".crt"), admin.with_suffix(".key")),
            ),
            "a ready /readyz",
            120,
        )

    def _controller_manager(self) -> Component:
        """The controller manager, not started: every default controller but node lifecycle,
        each with its own ServiceAccount credentials (see the module docstring)."""
        kcm_config = client_kubeconfig(
            self.pki,
            self.state_dir / "kubeconfigs" / "kube-controller-manager",
            server=self.server,
            user="system:kube-controller-manager",
            groups=[],
        )
        return Component(
            "kube-controller-manager",
            [
                str(self.bins.path("kube-controller-manager")),
                f"--kubeconfig={kcm_config}",
                f"--authentication-kubeconfig={kcm_config}",
                f"--authorization-kubeconfig={kcm_config}",
                "--leader-elect=false",
                "--controllers=*,-node-lifecycle-controller",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                *_client_rate_flags(self.controller_manager_qps),
                *_gates_flag(self.gates),
            ],
            log_dir=self.log_dir,
        )

    def _scheduler(self) -> Component:
        """The scheduler, not started, with its settings file written: the client rate is only
        settable through a KubeSchedulerConfiguration."""
        scheduler_config = client_kubeconfig(
            self.pki,
            self.state_dir / "kubeconfigs" / "kube-scheduler",
            server=self.server,
            user="system:kube-scheduler",
            groups=[],
        )
        settings = self.state_dir / "kube-scheduler.yaml"
        connection: dict[str, object] = {"kubeconfig": str(scheduler_config)}
        if self.scheduler_qps is not None:
            connection |= {"qps": self.scheduler_qps, "burst": int(2 * self.scheduler_qps)}
        settings.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": connection,
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self.scheduler_port = free_port()
        return Component(
            "kube-scheduler",
            [
                str(self.bins.path("kube-scheduler")),
                f"--config={settings}",
                f"--authentication-kubeconfig={scheduler_config}",
                f"--authorization-kubeconfig={scheduler_config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.scheduler_port}",
                *_gates_flag(self.gates),
            ],
            log_dir=self.log_dir,
        )

    def _apiserver_args(self, etcd_port: int) -> list[str]:
        minor = binaries.minor_of(self.bins.release)
        runtime = []
        if minor >= 36:
            runtime = ["--runtime-config=resource.k8s.io/v1beta2/devicetaintrules=true"]
        return [
            str(self.bins.path("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.state_dir / 'apiserver'}",
            f"--tls-cert-file={self.pki.serving_cert}",
            f"--tls-private-key-file={self.pki.serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            f"--kubelet-client-certificate={self.pki.kubelet_client_cert}",
            f"--kubelet-client-key={self.pki.kubelet_client_key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--endpoint-reconciler-type=none",
            "--disable-admission-plugins="
            + ("" if self.service_account_tokens else "ServiceAccount,")
            + "TaintNodesByCondition",
            "--allow-privileged=true",
            "--profiling=false",
            *(["--enable-aggregator-routing=true"] if self.aggregator_routing else []),
            *runtime,
            *_gates_flag(self.gates),
        ]

    def _launch(
        self, component: Component, ready: Callable[[], bool], what: str, timeout: float
    ) -> None:
        component.start()
        self.components.append(component)
        component.wait_ready(ready, timeout_s=timeout, what=what)

    def alive(self) -> list[str]:
        """Names of components that have exited (empty while all run)."""
        return [c.name for c in self.components if not c.alive()]

    def stop(self) -> None:
        """The controllers and the apiserver together, then etcd.

        kube-controller-manager can take 15 s to honour SIGTERM; nothing it holds outlives the
        sandbox, so it gets 5 s.
        """
        stop_all([c for c in self.components if c.name != "etcd"], timeout_s=5)
        stop_all([c for c in self.components if c.name == "etcd"])
