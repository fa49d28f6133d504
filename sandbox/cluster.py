"""What the sandbox puts into its fresh cluster: nodes, gpu-slicer's objects, credentials.

gpu-slicer's own objects come from ``deploy/base`` as an admin would apply them: the
namespace, the ServiceAccounts, the ClusterRoles, bindings and admission policies, and the
DeviceClasses. The webhook and the agents then authenticate with tokens of those
ServiceAccounts, so a permission missing from ``deploy/`` fails in the sandbox as it would in a
cluster. Each agent's token is bound to a Pod on its node (as a DaemonSet pod's projected token
is), which gives it the ``authentication.kubernetes.io/node-name`` claim the agent's admission
policy checks.

This module plays the cluster admin and the kubelet's node registration, so it talks to the API
with the official client directly rather than through gpu-slicer's ``kube.api`` seam.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from gpu_slicer.sandbox.errors import StartupError, UsageError

NAMESPACE = "gpu-slicer"
WEBHOOK_SA = "gpu-slicer-webhook"
AGENT_SA = "gpu-slicer-agent"
FIELD_MANAGER = "gpu-slicer-sandbox"

# The kinds of deploy/base the sandbox applies; the workloads (Deployment, DaemonSet, Service,
# ...) are replaced by local processes.
APPLIED_KINDS = frozenset(
    {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
    }
)

Obj = dict[str, Any]


def api_client(kubeconfig: Path) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(
        config_file=str(kubeconfig),  # type: ignore[no-untyped-call]
        client_configuration=configuration,
    )
    return k8s.ApiClient(configuration)


def serialize(client: k8s.ApiClient, value: Any) -> Obj:
    """A client model (or dict) as the plain JSON the apiserver speaks."""
    data: Obj = client.sanitize_for_serialization(value)  # type: ignore[no-untyped-call]
    return data


def deploy_objects(deploy_dir: Path, *, extended_resources: bool = False) -> list[Obj]:
    """The objects of ``deploy/base`` (and the extended-resource DeviceClasses) in file order."""
    base = deploy_dir / "base"
    kustomization = base / "kustomization.yaml"
    if not kustomization.is_file():
        raise UsageError(
            f"--deploy-dir {deploy_dir}: no base/kustomization.yaml (point it at "
            "the deploy/ folder of a gpu-slicer checkout)"
        )
    files = [base / name for name in yaml.safe_load(kustomization.read_text())["resources"]]
    if extended_resources:
        component = deploy_dir / "components" / "extended-resources"
        files += [
            component / name
            for name in sorted(
                p.name for p in component.glob("*.yaml") if p.name != "kustomization.yaml"
            )
        ]
    objects: list[Obj] = []
    for path in files:
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def webhook_configuration(objects: Iterable[Obj], *, url: str, ca_bundle: bytes) -> Obj:
    """deploy/'s MutatingWebhookConfiguration, pointed at ``url`` instead of the Service."""
    for obj in objects:
        if obj.get("kind") == "MutatingWebhookConfiguration":
            config = copy.deepcopy(obj)
            for webhook in config["webhooks"]:
                webhook["clientConfig"] = {
                    "url": url,
                    "caBundle": base64.b64encode(ca_bundle).decode(),
                }
            return config
    raise UsageError("deploy/base has no MutatingWebhookConfiguration")


class ClusterSetup:
    """Admin actions on the sandbox's cluster."""

    def __init__(self, kubeconfig: Path) -> None:
        self.client = api_client(kubeconfig)
        self.core = k8s.CoreV1Api(self.client)
        self._dynamic: DynamicClient | None = None

    @property
    def dynamic(self) -> DynamicClient:
        if self._dynamic is None:
            self._dynamic = DynamicClient(self.client)  # type: ignore[no-untyped-call]
        return self._dynamic

    def wait_for_api(self, timeout_s: float = 60) -> None:
        """Until the default namespace and the RBAC bootstrap roles exist."""
        deadline = time.monotonic() + timeout_s
        rbac = k8s.RbacAuthorizationV1Api(self.client)
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace("default")
                rbac.read_cluster_role("system:kube-scheduler")
                return
            except ApiException:
                time.sleep(0.3)
        raise StartupError("the apiserver did not finish bootstrapping in time")

    def apply(self, objects: Iterable[Obj]) -> None:
        """Server-side apply, retried while discovery catches up with new API groups."""
        for obj in objects:
            self._apply_one(obj)

    def _apply_one(self, obj: Obj) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                resource = self.dynamic.resources.get(
                    api_version=obj["apiVersion"], kind=obj["kind"]
                )
                resource_ns = obj["metadata"].get("namespace") if resource.namespaced else None
                self.dynamic.server_side_apply(  # type: ignore[no-untyped-call]
                    resource,
                    body=obj,
                    namespace=resource_ns,
                    field_manager=FIELD_MANAGER,
                    force_conflicts=True,
                )
                return
            except ApiException as exc:
                if time.monotonic() > deadline:
                    raise StartupError(
                        f"cannot apply {obj['kind']} {obj['metadata']['name']}: "
                        f"{exc.status} {exc.reason}: {exc.body}"
                    ) from exc
                time.sleep(0.5)

    def create_node(self, name: str, labels: dict[str, str]) -> None:
        """A Node that is Ready and schedulable, as a kubelet would register it."""
        node = k8s.V1Node(
            metadata=k8s.V1ObjectMeta(
                name=name,
                labels={
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **labels,
                },
            )
        )
        self.core.create_node(node)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
        status = {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "gpu-slicer sandbox kubelet stand-in",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "kubeletVersion": "v1.36.0-sandbox",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "sandbox://0",
                    "kernelVersion": "",
                    "osImage": "gpu-slicer sandbox",
                    "machineID": name,
                    "systemUUID": name,
                    "bootID": name,
                },
            }
        }
        self.core.patch_node_status(name, status)

    def wait_for_node(self, name: str, timeout_s: float = 120) -> None:
        """Until a kubelet has registered Node ``name``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.core.read_node(name)
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            time.sleep(0.5)
        raise StartupError(f"the kubelet of node {name} did not register it in {timeout_s:.0f} s")

    def agent_pod(self, node: str, *, runnable: bool = False) -> Obj:
        """The Pod an agent's token is bound to: it stands for the DaemonSet's pod on ``node``.

        On a real node (``runnable``) its kubelet runs it: a local busybox that sleeps, never
        pulled, while the agent itself runs beside the node as on the other nodes.
        """
        container: Obj = {"name": "agent", "image": "gpu-slicer:sandbox"}
        if runnable:
            container = {
                "name": "agent",
                "image": "busybox:sandbox",
                "imagePullPolicy": "Never",
                "command": ["sleep", "2147483647"],
            }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"gpu-slicer-agent-{node}",
                "namespace": NAMESPACE,
                "labels": {
                    "app.kubernetes.io/name": "gpu-slicer",
                    "app.kubernetes.io/component": "agent",
                },
            },
            "spec": {
                "nodeName": node,
                "serviceAccountName": AGENT_SA,
                "automountServiceAccountToken": False,
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [container],
            },
        }
        return serialize(self.client, self.core.create_namespaced_pod(NAMESPACE, pod))  # type: ignore[arg-type]

    def token(
        self, service_account: str, *, bound_pod: Obj | None = None, seconds: int = 7 * 24 * 3600
    ) -> str:
        """A ServiceAccount token; bound to ``bound_pod`` it carries the pod's node name."""
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if bound_pod is not None:
            spec["boundObjectRef"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": bound_pod["metadata"]["name"],
                "uid": bound_pod["metadata"]["uid"],
            }
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        response = self.core.create_namespaced_service_account_token(
            service_account,
            NAMESPACE,
            body,  # type: ignore[arg-type]
        )
        if response.status is None:
            raise StartupError(f"the apiserver issued no token for {service_account}")
        return str(response.status.token)

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]
