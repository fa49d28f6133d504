"""The webhook's verdict on each workload's pod templates: convert, deny or leave, and why.

Pure: each pod template goes through the webhook's own translation
(:func:`webhook.translate.translate_pod`) with the policy and the namespace's quota, so the
verdicts are the webhook's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.quota import (
    DEVICES_SUFFIX,
    NO_QUOTA,
    NamespaceQuota,
    conversion_escape,
    keeping_limits,
)
from gpu_slicer.webhook.translate import is_legacy_resource, translate_pod
from gpu_slicer.webhook.workloads import (
    DEFAULT_TABLE,
    Workload,
    WorkloadTable,
    expand,
    lookup,
    show,
)

if TYPE_CHECKING:
    from gpu_slicer.plan.cluster import GpuNode

Obj = dict[str, Any]


@dataclass
class WorkloadPlan:
    """The webhook's verdict on one workload's pod template."""

    namespace: str
    kind: str
    name: str
    replicas: int
    legacy: dict[str, int]
    """Legacy GPU resources per pod (summed over containers), what it asks for today."""
    outcome: str
    """convert, deny or leave."""
    detail: str
    becomes: list[str] = field(default_factory=list)
    """Per converted container: its alternatives in preference order."""
    warnings: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    template: str = ""
    """Where the pod template is in an operator's object (``spec.tasks[1].template``)."""
    api_group: str = ""
    claim_specs: list[Obj] = field(default_factory=list)
    """The specs of the claim templates the webhook would write (what the agents read as the
    cluster asking for profiles)."""

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}" + (f" {self.template}" if self.template else "")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}" + (
            f"/{self.template}" if self.template else ""
        )

    def as_json(self) -> Obj:
        return {
            "namespace": self.namespace,
            "kind": self.kind,
            "name": self.name,
            "template": self.template,
            "replicas": self.replicas,
            "requests": self.legacy,
            "outcome": self.outcome,
            "detail": self.detail,
            "becomes": self.becomes,
            "warnings": self.warnings,
        }


@dataclass
class Plan:
    namespaces: dict[str, str]
    """namespace -> its gpu-slicer.io/migration label today (``-`` when unset)."""
    policy_source: str
    workloads: list[WorkloadPlan]
    nodes: list[GpuNode]
    skipped_nodes: list[str]
    simulation: Obj | None
    notes: list[str] = field(default_factory=list)
    quotas: dict[str, Obj] = field(default_factory=dict)
    """namespace -> its GPU quota lines today and the DRA lines that keep them."""

    def as_json(self) -> Obj:
        return {
            "namespaces": [{"name": n, "migrationLabel": m} for n, m in self.namespaces.items()],
            "policy": self.policy_source,
            "workloads": [w.as_json() for w in self.workloads],
            "gpuNodes": [
                {"name": n.name, "model": n.model, "gpus": n.gpus, "mig": n.mig} for n in self.nodes
            ],
            "skippedNodes": self.skipped_nodes,
            "simulation": self.simulation,
            "notes": self.notes,
            "quotas": self.quotas,
        }


def resource_count(value: Any) -> int:
    """A count as the device plugin's resources and labels write it; anything else is 0."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def quota_lines(quota: NamespaceQuota, namespace: str, policy: Policy) -> Obj | None:
    """A namespace's GPU quota lines today and the DRA lines that keep them (None: no limit)."""
    if not quota.limits_gpus:
        return None
    return {
        "legacy": {f"requests.{k}": v for k, v in quota.legacy.items()},
        "devices": {k + DEVICES_SUFFIX: v for k, v in quota.devices.items()},
        "keepWith": keeping_limits(quota, namespace, policy),
    }


def plan_namespace(
    objects: Iterable[Obj],
    namespace: str,
    policy: Policy,
    native: frozenset[str],
    gpu_nodes: int,
    table: WorkloadTable,
    quota: NamespaceQuota,
) -> list[WorkloadPlan]:
    """The verdicts on a namespace's objects that ask for GPUs or would change; objects a
    controller made are left to their owner's template."""
    workloads: list[WorkloadPlan] = []
    for obj in objects:
        if _owned(obj, table):
            continue  # made by a controller whose own object is planned
        workloads += [
            item
            for item in plan_workload(obj, namespace, policy, native, gpu_nodes, table, quota)
            if item.legacy or item.annotations or item.outcome != "leave"
        ]
    return workloads


def _templates(obj: Obj, workload: Workload) -> list[tuple[str, Obj, Obj]]:
    """(where, pod template, the mapping that holds it) for each pod template of ``obj``."""
    found: list[tuple[str, Obj, Obj]] = []
    for path in workload.templates:
        for steps in expand(obj, path):
            template = lookup(obj, steps)
            if isinstance(template.get("spec"), dict):
                parent = lookup(obj, steps[:-1]) if steps else obj
                found.append((show(steps), template, parent))
    for path in workload.specs:
        for steps in expand(obj, path):
            spec = lookup(obj, steps)
            found.append((show(steps), {"metadata": {}, "spec": spec}, spec))
    return found


def _replicas(obj: Obj, holder: Obj, workload: Workload, gpu_nodes: int) -> int:
    """Pods one template makes at once: Kubernetes' workloads by their own rules, operators'
    templates by the ``replicas`` beside them (1 when there is none)."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if not workload.built_in:
        value = holder.get("replicas", 1)
    elif kind in ("Deployment", "StatefulSet"):
        value = spec.get("replicas", 1)
    elif kind == "Job":
        value = spec.get("parallelism", 1)
    elif kind == "CronJob":
        value = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("parallelism", 1)
    elif kind == "DaemonSet":
        value = gpu_nodes  # at most one per GPU node that its selector admits
    else:
        value = 1
    return value if isinstance(value, int) and value >= 0 else 1


def _legacy(template: Obj) -> dict[str, int]:
    """Legacy GPU resources one pod asks for: its containers' limits (else requests), summed."""
    totals: dict[str, int] = {}
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = (container or {}).get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, value in asked.items():
            if is_legacy_resource(str(name)) and resource_count(value) > 0:
                totals[str(name)] = totals.get(str(name), 0) + resource_count(value)
    return totals


def _owned(obj: Obj, kinds: WorkloadTable) -> bool:
    """Made by a controller whose object ``plan`` reads (its template is planned instead): a
    CronJob's Job, a JobSet's Jobs, a LeaderWorkerSet's StatefulSets, any workload's Pods."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if not isinstance(owner, dict):
            continue
        if obj.get("kind") == "Pod" or kinds.lookup(owner) is not None:
            return True
    return False


def plan_workload(
    obj: Obj,
    namespace: str,
    policy: Policy,
    native: frozenset[str],
    gpu_nodes: int,
    table: WorkloadTable = DEFAULT_TABLE,
    quota: NamespaceQuota = NO_QUOTA,
) -> list[WorkloadPlan]:
    """The webhook's verdict on each pod template of ``obj`` (none for other kinds)."""
    workload = table.lookup(obj)
    if workload is None:
        return []
    plans = []
    for where, template, holder in _templates(obj, workload):
        plan = _plan_template(obj, template, namespace, policy, native, quota)
        plan.replicas = _replicas(obj, holder, workload, gpu_nodes)
        plan.template = "" if workload.built_in else where
        plan.api_group = workload.group
        plans.append(plan)
    return plans


def _plan_template(
    obj: Obj,
    template: Obj,
    namespace: str,
    policy: Policy,
    native: frozenset[str],
    quota: NamespaceQuota,
) -> WorkloadPlan:
    meta = obj.get("metadata") or {}
    pod = {"metadata": template.get("metadata") or {}, "spec": template["spec"]}
    annotations = {
        str(k): str(v)
        for k, v in ((pod["metadata"].get("annotations") or {}).items())
        if str(k).startswith("gpu-slicer.io/")
    }
    plan = WorkloadPlan(
        namespace=namespace,
        kind=str(obj["kind"]),
        name=str(meta.get("name")),
        replicas=1,
        legacy=_legacy(pod),
        outcome="leave",
        detail="",
        annotations=annotations,
    )
    try:
        conversion = translate_pod(pod, namespace=namespace, policy=policy, native_extended=native)
    except Denied as exc:
        plan.outcome, plan.detail = "deny", exc.message
        return plan
    plan.warnings = list(conversion.warnings)
    escaped = conversion_escape(conversion, quota)
    if conversion.patch and escaped is not None:
        deny = policy.quota_without_device_limit == "deny"
        plan.outcome, plan.detail = ("deny" if deny else "leave"), escaped
    elif conversion.patch:
        plan.outcome, plan.detail = "convert", conversion.summary
        plan.becomes = [
            " | ".join(alt.label for alt in r.alternatives) for r in conversion.requests
        ]
        plan.claim_specs = [t["spec"]["spec"] for t in conversion.templates]
    elif conversion.summary != "nothing to convert":
        plan.detail = conversion.summary  # skipped by label, already converted
    elif conversion.warnings:
        plan.detail = "; ".join(conversion.warnings)  # e.g. left to a DeviceClass (KEP-5004)
    else:
        plan.detail = "no GPU requests" if not (plan.legacy or annotations) else "unchanged"
    return plan
