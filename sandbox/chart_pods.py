"""The chart's workloads as pods on the real node (``--agent-pod``, ``--webhook-pod``).

They run from the project's image, imported into the node's containerd and never pulled, the
way a cluster without kube-proxy runs them: on the node's network, with the apiserver's address
given to their in-cluster clients (``k8sServiceHost``), since the sandbox has nothing behind
the ``kubernetes`` Service's ClusterIP; the apiserver reaches the webhook's Service by its
endpoint (``--enable-aggregator-routing``). This module holds the chart values that say so,
the checks of the flags, and the wait for the webhook pod.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s

from gpu_slicer.sandbox.cluster import NAMESPACE, api_client
from gpu_slicer.sandbox.errors import StartupError, UsageError
from gpu_slicer.sandbox.nodes import NodeSpec
from gpu_slicer.sandbox.process import free_port
from gpu_slicer.sandbox.realnode import CHECKPOINT_DIR

if TYPE_CHECKING:
    from gpu_slicer.sandbox.sandbox import Settings

AGENT_POD_GPU_STATE = f"{CHECKPOINT_DIR}/gpus.json"
"""The agent pod's simulated GPUs (``--simulate-state``): in its checkpoint hostPath."""
AGENT_POD_SELECTOR = "app.kubernetes.io/name=gpu-slicer,app.kubernetes.io/component=agent"
WEBHOOK_POD_SELECTOR = "app.kubernetes.io/name=gpu-slicer,app.kubernetes.io/component=webhook"
WEBHOOK_TLS_SECRET = "gpu-slicer-webhook-tls"
WEBHOOK_ENDPOINTS_SELECTOR = "kubernetes.io/service-name=gpu-slicer-webhook"
"""The webhook Service's EndpointSlices: what the apiserver calls."""


def check_agent_pod(settings: Settings) -> None:
    """``--agent-pod`` runs the chart's DaemonSet on the real node: both are needed."""
    if settings.real_node is None or settings.install != "helm":
        raise UsageError("--agent-pod needs --real-node NAME and --install helm")
    if settings.static_layout is not None:
        raise UsageError("--agent-pod: the agent pod cannot read --static-layout's file")


def check_webhook_pod(settings: Settings) -> None:
    """``--webhook-pod`` runs the chart's Deployment on the real node: both are needed."""
    if settings.real_node is None or settings.install != "helm":
        raise UsageError("--webhook-pod needs --real-node NAME and --install helm")
    if settings.webhook_policy is not None:
        raise UsageError(
            "--webhook-pod: the webhook pod reads the chart's policy value, not --webhook-policy"
        )


def image_values() -> dict[str, Any]:
    """The project's image, imported into the real node: never pulled."""
    from gpu_slicer.sandbox import image

    repository, tag = image.image_name().rsplit(":", 1)
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}}


def agent_pod_values(node: NodeSpec, state_dir: Path, apiserver_port: int) -> dict[str, Any]:
    """The chart's agent on the real node: on the node's network with the apiserver's address
    (127.0.0.1 here), the simulated backend with the node's GPUs, its state in the checkpoint
    folder."""
    return {
        "agent": {
            "enabled": True,
            "backend": "simulated",
            "hostNetwork": True,
            "k8sServiceHost": "127.0.0.1",
            "k8sServicePort": str(apiserver_port),
            "metricsPort": free_port(),
            "toolkitCdiDir": str((state_dir / "nodes" / node.name / "etc-cdi").resolve()),
            "extraArgs": [
                f"--simulate-gpus={node.gpus}",
                f"--simulate-state={AGENT_POD_GPU_STATE}",
                "--reconcile-interval=5",
            ],
        },
    }


def webhook_pod_values(
    ca_bundle: bytes, port: int, apiserver_port: int, node: str
) -> dict[str, Any]:
    """The chart's webhook on the real node: one replica on the node's network at ``port``
    (the apiserver, routing to the Service's endpoint, calls the node's address), the
    apiserver's address for its client, the sandbox's certificate (mode external,
    :func:`webhook_tls_secret`)."""
    return {
        "enabled": True,
        "replicas": 1,
        "caBundle": base64.b64encode(ca_bundle).decode(),
        "port": port,
        "hostNetwork": True,
        "k8sServiceHost": "127.0.0.1",
        "k8sServicePort": str(apiserver_port),
        "nodeSelector": {"kubernetes.io/hostname": node},
    }


def uninstall_check_values(apiserver_port: int, node: str) -> dict[str, Any]:
    """The chart's pre-delete check (``gpu-slicer uninstall-check``) on the real node, on its
    network with the apiserver's address; it waits 10 s (the chart's default: 60) before it
    refuses, so a refused ``helm uninstall`` comes back soon."""
    return {
        "enabled": True,
        "waitSeconds": 10,
        "hostNetwork": True,
        "k8sServiceHost": "127.0.0.1",
        "k8sServicePort": str(apiserver_port),
        "nodeSelector": {"kubernetes.io/hostname": node},
    }


def webhook_tls_secret(tls: Path) -> dict[str, Any]:
    """The certificate ``certs issue`` wrote to ``tls``, for the Service's DNS name the
    apiserver checks, as the chart's external mode expects it."""
    data = {
        key: base64.b64encode((tls / key).read_bytes()).decode()
        for key in ("tls.crt", "tls.key", "ca.crt")
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": WEBHOOK_TLS_SECRET, "namespace": NAMESPACE},
        "type": "kubernetes.io/tls",
        "data": data,
    }


def wait_webhook_pod(kubeconfig: Path, timeout_s: float) -> None:
    """Until the webhook pod is Ready and listed as its Service's endpoint: the apiserver
    calls nothing else."""
    admin = api_client(kubeconfig)
    core, discovery = k8s.CoreV1Api(admin), k8s.DiscoveryV1Api(admin)

    def ready() -> bool:
        slices = discovery.list_namespaced_endpoint_slice(
            NAMESPACE, label_selector=WEBHOOK_ENDPOINTS_SELECTOR
        ).items
        return any(
            e.conditions is not None and e.conditions.ready
            for s in slices
            for e in (s.endpoints or [])
        )

    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            if time.monotonic() > deadline:
                pods = core.list_namespaced_pod(
                    NAMESPACE, label_selector=WEBHOOK_POD_SELECTOR
                ).items
                serialize = admin.sanitize_for_serialization
                states = [json.dumps(serialize(p.status)) for p in pods]  # type: ignore[no-untyped-call]
                raise StartupError(
                    f"the webhook pod is not a ready endpoint after {timeout_s:.0f} s: "
                    + ("; ".join(states) or "no pod")
                )
            time.sleep(1)
    finally:
        admin.close()  # type: ignore[no-untyped-call]
