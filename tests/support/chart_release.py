"""The chart's release on a real-node sandbox, as the day-two tests read and drive it: helm
and kubectl against the sandbox, the chart's pods and their logs, and what the agent leaves on
the node (its claims' CDI files and checkpoint entries)."""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_slicer.core.identity import DRIVERS
from gpu_slicer.sandbox.helm import helm_binary
from tests.support.e2e_sandbox import Obj, Sandbox

RELEASE_NAMESPACE = "gpu-slicer"


def helm(box: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    """``helm`` on the release's namespace of the sandbox's cluster."""
    return subprocess.run(
        [
            str(helm_binary()),
            *args,
            "--namespace",
            RELEASE_NAMESPACE,
            "--kubeconfig",
            str(box.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_kubectl(
    box: Sandbox, binary: Path, *args: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``kubectl`` (the ``kubectl`` fixture's ``binary``) against the sandbox's cluster, as its
    admin runs it; the test reads the outcome."""
    return subprocess.run(
        [str(binary), "--kubeconfig", str(box.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def release_pods(box: Sandbox, component: str) -> list[Obj]:
    listed = box.core.list_namespaced_pod(
        RELEASE_NAMESPACE, label_selector=f"app.kubernetes.io/component={component}"
    ).items
    return [box.obj(p) for p in listed]


def pod_log(box: Sandbox, pod: Obj) -> str:
    return str(box.core.read_namespaced_pod_log(pod["metadata"]["name"], RELEASE_NAMESPACE))


def cdi_claims(box: Sandbox, node: str) -> list[str]:
    """The claims' CDI files the agent wrote on the node (its own spec files only)."""
    return sorted(
        p.name for p in (box.dir / "nodes" / node / "cdi").glob("k8s.gpu-slicer.io-claim_*")
    )


def checkpoint_claims(box: Sandbox, node: str) -> dict[str, Any]:
    path = box.dir / "nodes" / node / "checkpoint" / "checkpoint.json"
    claims: dict[str, Any] = json.loads(path.read_text())["data"]["claims"]  # the envelope
    return claims


def driver_claims(box: Sandbox) -> list[str]:
    """Claims in every namespace with a device of gpu-slicer's driver (either name) allocated."""
    return sorted(
        f"{c.metadata.namespace}/{c.metadata.name}"
        for c in box.resource.list_resource_claim_for_all_namespaces().items
        if c.status
        and c.status.allocation
        and any(r.driver in DRIVERS for r in c.status.allocation.devices.results)
    )


def started(box: Sandbox, namespace: str, name: str) -> tuple[str, int, str]:
    """A pod's container id, restart count and phase: unchanged while it is undisturbed."""
    pod = box.pod(namespace, name)
    [status] = pod["status"]["containerStatuses"]
    return status["containerID"], status["restartCount"], pod["status"]["phase"]


@dataclass
class AdmissionCount:
    """Pods sent for admission (server-side dry run, so nothing is created) while the release
    changes, the way workloads keep arriving during a rollout: how many the webhook converted,
    and every failure with the apiserver's message."""

    box: Sandbox
    namespace: str
    limits: dict[str, str]
    converted: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> AdmissionCount:
        self._thread = threading.Thread(target=self._send, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)

    def _send(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"admission-{number}"},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": self.limits},
                        }
                    ]
                },
            }
            try:
                made = self.box.core.create_namespaced_pod(self.namespace, pod, dry_run="All")
            except ApiException as exc:
                self.failures.append(f"{exc.status}: {exc.body or exc.reason}")
            else:
                if made.spec.resource_claims:
                    self.converted += 1
                else:
                    self.failures.append(f"{pod['metadata']['name']} admitted unconverted")
            self._stop.wait(0.1)
