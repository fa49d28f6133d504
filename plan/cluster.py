"""Reading the cluster for ``plan``: the policy in force, DeviceClasses that serve legacy names,
the GPU nodes, the namespaces, their workloads and quotas, and the operators' CRDs. Reads only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.identity import MIGRATION_LABEL, RESOURCE_API
from gpu_slicer.kube import documents
from gpu_slicer.kube.api import KubeApi, served
from gpu_slicer.kube.errors import KubeError, NotFound
from gpu_slicer.plan.errors import PlanInputError
from gpu_slicer.plan.verdicts import resource_count
from gpu_slicer.webhook.crd_schema import pruned_fields
from gpu_slicer.webhook.errors import PolicyError
from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.quota import NamespaceQuota, read_quotas
from gpu_slicer.webhook.workloads import DEFAULT_TABLE, WorkloadTable

Obj = dict[str, Any]

WORKLOAD_KINDS: tuple[tuple[str, str], ...] = tuple(
    (r.api_version, w.kind)
    for w in DEFAULT_TABLE
    if (w.templates or w.specs) and (r := served(w.group, w.kind)) is not None and r.namespaced
)
"""What ``plan`` lists: Kubernetes' workloads and Pods, then the operators' kinds of
:mod:`webhook.workloads` (a kind whose CRD is not installed is skipped)."""
POLICY_CONFIGMAP = "gpu-slicer-policy"


@dataclass
class GpuNode:
    name: str
    model: str
    gpus: int
    mig: dict[str, int]
    """MIG devices the node advertises today (``nvidia.com/mig-<profile>`` capacity)."""


def cluster_policy(api: KubeApi, namespace: str) -> tuple[Policy, Obj, str]:
    """The policy the installed webhook uses, its raw form, and where it came from."""
    try:
        config = api.get("v1", "ConfigMap", POLICY_CONFIGMAP, namespace)
    except NotFound:
        return Policy.default(), {}, "built-in default (no ConfigMap gpu-slicer-policy)"
    text = str((config.get("data") or {}).get("policy.yaml") or "")
    where = f"ConfigMap {namespace}/{POLICY_CONFIGMAP}"
    return _policy_from_text(text, where), _raw(text), where


def policy_file(path: str) -> tuple[Policy, Obj, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanInputError(f"--policy {path}: cannot read: {exc}") from exc
    return _policy_from_text(text, path), _raw(text), path


def _policy_from_text(text: str, where: str) -> Policy:
    try:
        return load_policy(text, source=where)
    except PolicyError as exc:
        raise PlanInputError(str(exc)) from exc


def _raw(text: str) -> Obj:
    data = documents.parse(text) if text.strip() else None
    return data if isinstance(data, dict) else {}


def native_extended_names(api: KubeApi) -> frozenset[str]:
    """Legacy names a DeviceClass serves through ``extendedResourceName`` (KEP-5004)."""
    try:
        classes = api.list(RESOURCE_API, "DeviceClass").items
    except KubeError:
        return frozenset()  # an apiserver without resource.k8s.io/v1 serves none
    return frozenset(
        str(c["spec"]["extendedResourceName"])
        for c in classes
        if (c.get("spec") or {}).get("extendedResourceName")
    )


def namespace_labels(api: KubeApi) -> dict[str, str]:
    """Every namespace and its gpu-slicer.io/migration label (``-`` when unset)."""
    labels: dict[str, str] = {}
    for namespace in api.list("v1", "Namespace").items:
        meta = namespace.get("metadata") or {}
        labels[str(meta.get("name"))] = str((meta.get("labels") or {}).get(MIGRATION_LABEL, "-"))
    return labels


def namespace_quota(api: KubeApi, namespace: str) -> NamespaceQuota:
    return read_quotas(api.list("v1", "ResourceQuota", namespace).items)


def workload_objects(api: KubeApi, namespace: str) -> Iterator[Obj]:
    """Every object of :data:`WORKLOAD_KINDS` in the namespace, its kind and apiVersion set."""
    for api_version, kind in WORKLOAD_KINDS:
        try:
            found = api.list(api_version, kind, namespace).items
        except NotFound:
            continue  # the operator's CRD is not installed
        for obj in found:
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version)
            yield obj


def crd_notes(api: KubeApi, kinds: set[tuple[str, str]], table: WorkloadTable) -> list[str]:
    """For each operator's kind planned: whether its installed CRD keeps a converted object's
    claim (webhook.crd_schema), so that its objects are converted in Git only where it does."""
    notes: list[str] = []
    for kind, group in sorted(kinds):
        workload = table.lookup({"apiVersion": f"{group}/v1", "kind": kind})
        resource = served(group, kind)
        if workload is None or workload.built_in or resource is None:
            continue
        name = f"{resource.plural}.{group}"
        try:
            crd = api.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        except KubeError as exc:
            notes.append(f"cannot read CRD {name} to check it keeps the claim: {exc}")
            continue
        pruned = pruned_fields(crd, workload)
        if pruned:
            notes.append(
                f"CRD {name} prunes {pruned[0]}: {kind} objects converted in Git would run "
                "without a GPU; leave them unconverted there (policy workloads: convert: "
                "false) or upgrade the CRD; the webhook converts their pods either way"
            )
        else:
            notes.append(f"CRD {name} keeps the claim: {kind} objects can be converted in Git")
    return notes


def gpu_nodes(api: KubeApi) -> tuple[list[GpuNode], list[str]]:
    """The cluster's GPU nodes with a known MIG-capable model, and why others were left out."""
    nodes: list[GpuNode] = []
    skipped: list[str] = []
    for node in api.list("v1", "Node").items:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        capacity = (node.get("status") or {}).get("capacity") or {}
        name = str(meta.get("name"))
        product = labels.get("nvidia.com/gpu.product")
        mig = {
            k[len("nvidia.com/mig-") :]: resource_count(v)
            for k, v in capacity.items()
            if k.startswith("nvidia.com/mig-") and resource_count(v) > 0
        }
        count = resource_count(
            labels.get("nvidia.com/gpu.count") or capacity.get("nvidia.com/gpu") or 0
        )
        if not product and not count and not mig:
            continue  # not a GPU node
        model = _model(str(product or ""))
        if model is None:
            skipped.append(
                f"{name}: GPU model {product or 'unknown'} (label "
                "nvidia.com/gpu.product) is not one gpu-slicer can slice"
            )
            continue
        if count < 1:
            skipped.append(f"{name}: no GPU count (label nvidia.com/gpu.count)")
            continue
        nodes.append(GpuNode(name, model.key, min(count, 64), mig))
    return nodes, skipped


def _model(product: str) -> gpu_model.GpuModel | None:
    """The catalog model of a GPU Feature Discovery product label (spaces written as dashes,
    and ``-MIG-<profile>`` appended under the single MIG strategy)."""
    product = re.sub(r"-MIG-.*$", "", product)

    def norm(text: str) -> str:
        return re.sub(r"[\s\-_]+", " ", text).strip().lower()

    wanted = norm(product)
    for model in catalog.MODELS:
        if any(norm(p) == wanted for p in model.product_names) or norm(model.key) == wanted:
            return model
    return None
