"""What gpu-slicer does with the Kubernetes API, as one small interface over plain dicts.

Objects are the JSON the apiserver speaks (``{"apiVersion": ..., "kind": ..., "metadata": ...}``)
rather than generated model classes: decoding into models and re-encoding drops fields the models
do not know, and the v1 ResourceClaim model has a confusing name in the Python client.

Resources are named by ``(apiVersion, kind)``; :data:`RESOURCES` maps each kind gpu-slicer uses to
its REST path segment and scope. Both implementations raise only ``kube.errors`` exceptions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Obj = dict[str, Any]
JsonPatch = list[Obj]
"""RFC 6902 operations (named so that ``KubeApi.list`` cannot shadow ``list`` in annotations)."""


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


RESOURCES: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (
        Resource("v1", "Pod", "pods", True),
        Resource("v1", "Namespace", "namespaces", False),
        Resource("v1", "Node", "nodes", False),
        Resource("v1", "Secret", "secrets", True),
        Resource("v1", "ConfigMap", "configmaps", True),
        Resource("events.k8s.io/v1", "Event", "events", True),
        Resource("resource.k8s.io/v1", "ResourceSlice", "resourceslices", False),
        Resource("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", True),
        Resource("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", True),
        Resource("resource.k8s.io/v1", "DeviceClass", "deviceclasses", False),
        Resource("coordination.k8s.io/v1", "Lease", "leases", True),
        # Workloads: read by `gpu-slicer plan` (the pod templates the webhook would see).
        Resource("apps/v1", "Deployment", "deployments", True),
        Resource("apps/v1", "StatefulSet", "statefulsets", True),
        Resource("apps/v1", "DaemonSet", "daemonsets", True),
        Resource("batch/v1", "Job", "jobs", True),
        Resource("batch/v1", "CronJob", "cronjobs", True),
        # Operators' workloads, also read by `plan` (webhook.workloads says where their pod
        # templates are); the versions each project serves today.
        *(
            Resource("kubeflow.org/v1", kind, kind.lower() + "s", True)
            for kind in ("PyTorchJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob", "Notebook")
        ),
        Resource("kubeflow.org/v2beta1", "MPIJob", "mpijobs", True),
        Resource("trainer.kubeflow.org/v1alpha1", "TrainingRuntime", "trainingruntimes", True),
        Resource(
            "trainer.kubeflow.org/v1alpha1",
            "ClusterTrainingRuntime",
            "clustertrainingruntimes",
            False,
        ),
        Resource("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs", True),
        Resource("ray.io/v1", "RayCluster", "rayclusters", True),
        Resource("ray.io/v1", "RayJob", "rayjobs", True),
        Resource("ray.io/v1", "RayService", "rayservices", True),
        Resource("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", True),
        Resource("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", True),
        Resource("serving.kserve.io/v1beta1", "InferenceService", "inferenceservices", True),
        Resource("batch.volcano.sh/v1alpha1", "Job", "jobs", True),
        Resource("argoproj.io/v1alpha1", "Workflow", "workflows", True),
        Resource("argoproj.io/v1alpha1", "WorkflowTemplate", "workflowtemplates", True),
        Resource("argoproj.io/v1alpha1", "CronWorkflow", "cronworkflows", True),
        Resource(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            False,
        ),
        Resource("v1", "ResourceQuota", "resourcequotas", True),
        Resource(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            False,
        ),
    )
}


def served(group: str, kind: str) -> Resource | None:
    """The resource gpu-slicer reads for ``kind`` of API ``group`` (any version), if any."""
    for resource in RESOURCES.values():
        if resource.group == group and resource.kind == kind:
            return resource
    return None


def resource_for(api_version: str, kind: str) -> Resource:
    try:
        return RESOURCES[(api_version, kind)]
    except KeyError:
        known = ", ".join(f"{k} ({v})" for v, k in RESOURCES)
        raise ValueError(
            f"gpu-slicer does not use {kind} in {api_version}; known: {known}"
        ) from None


@dataclass(frozen=True)
class ObjectList:
    items: list[Obj]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: Obj


PatchType = Literal["merge", "json", "strategic"]


@runtime_checkable
class KubeApi(Protocol):
    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj: ...

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList: ...

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[WatchEvent]:
        """Events after ``resource_version``; the iterator ends when ``timeout_s`` passes."""
        ...

    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj: ...

    def update(self, obj: Obj) -> Obj:
        """Replace; raises Conflict when ``metadata.resourceVersion`` is stale."""
        ...

    def apply(self, obj: Obj, *, field_manager: str, force: bool = False) -> Obj:
        """Server-side apply."""
        ...

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Obj | JsonPatch,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
    ) -> Obj: ...

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
    ) -> None:
        """Delete; with ``resource_version`` only if unchanged (Conflict otherwise)."""
        ...

    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the apiserver, e.g. (1, 35)."""
        ...


def event_for(
    regarding: Obj,
    *,
    reason: str,
    note: str,
    type_: Literal["Normal", "Warning"] = "Normal",
    reporting_controller: str,
    reporting_instance: str,
    action: str,
    event_time: str,
) -> Obj:
    """An ``events.k8s.io/v1`` Event about ``regarding``; create it with ``KubeApi.create``."""
    meta = regarding.get("metadata", {})
    namespace = meta.get("namespace") or "default"
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # The apiserver checks a generateName with only a trailing '-' masked: "node." is
        # refused, "node-" is not (the in-memory API did not know; the sandbox showed it).
        "metadata": {"generateName": f"{meta.get('name', 'object')}-", "namespace": namespace},
        "eventTime": event_time,
        "reportingController": reporting_controller,
        "reportingInstance": reporting_instance,
        "action": action,
        "reason": reason,
        "note": note[:1024],
        "type": type_,
        "regarding": {
            "apiVersion": regarding.get("apiVersion"),
            "kind": regarding.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
    }


def connect(kubeconfig: str | None, *, quiet_retries: bool = False) -> KubeApi:
    """The real API for a command, from ``kubeconfig`` (else KUBECONFIG, the in-cluster account,
    ~/.kube/config). The client is imported here, when a command runs, never at import: the
    CLI's parser is built in the webhook's gevent workers too, where ``ssl`` must not be
    imported before gevent patches it. ``quiet_retries``: urllib3's warning per retry of a
    refused connection is left out (the command's one line says it; DEBUG still shows them)."""
    import logging

    from gpu_slicer.kube.client import RealKubeApi

    if quiet_retries:
        retries = logging.getLogger("urllib3.connectionpool")
        if not retries.isEnabledFor(logging.DEBUG):
            retries.setLevel(logging.ERROR)
    return RealKubeApi.from_config(kubeconfig)
