"""``gpu-slicer plan``: what enabling gpu-slicer in a namespace would do, before enabling it.

It reads the cluster (never writes): the namespaces' workloads and bare pods, the webhook's
policy (ConfigMap ``gpu-slicer-policy``, or ``--policy``), DeviceClasses that serve legacy names
(KEP-5004) and the GPU nodes. Each pod template goes through the webhook's own translation
(:func:`webhook.translate.translate_pod`), so the verdicts are the webhook's. Then the simulator
runs the converted workloads on the cluster's GPU nodes twice, as today (whole GPUs and the MIG
layout the nodes advertise) and with gpu-slicer, and reports who gets a GPU in each.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube import documents
from kube.api import KubeApi, served
from kube.errors import KubeError, NotFound
from slicer import catalog
from slicer.identity import MIGRATION_LABEL, RESOURCE_API
from slicer.scaling import partitionable_scales, quadratic_warning
from webhook.convert import policy_table
from webhook.crd_schema import pruned_fields
from webhook.errors import Denied, PolicyError
from webhook.policy import Policy, load_policy
from webhook.quota import (
    DEVICES_SUFFIX,
    NO_QUOTA,
    NamespaceQuota,
    conversion_escape,
    keeping_limits,
    read_quotas,
)
from webhook.translate import is_legacy_resource, translate_pod
from webhook.workloads import DEFAULT_TABLE, Workload, WorkloadTable, expand, lookup, show

Obj = dict[str, Any]

WORKLOAD_KINDS: tuple[tuple[str, str], ...] = tuple(
    (r.api_version, w.kind)
    for w in DEFAULT_TABLE
    if (w.templates or w.specs) and (r := served(w.group, w.kind)) is not None and r.namespaced
)
"""What ``plan`` lists: Kubernetes' workloads and Pods, then the operators' kinds of
:mod:`webhook.workloads` (a kind whose CRD is not installed is skipped)."""
POLICY_CONFIGMAP = "gpu-slicer-policy"
HORIZON = "2h"
"""How long the simulated pods run: long enough that none ends, so the report compares who
gets a GPU at all, not who gets one sooner."""
TODAY, AFTER = "static-current", "gpu-slicer-best-fit"
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class PlanInputError(ValueError):
    """Bad input to ``plan`` (exit 2): a flag, the policy file, or the cluster's policy."""


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
class GpuNode:
    name: str
    model: str
    gpus: int
    mig: dict[str, int]
    """MIG devices the node advertises today (``nvidia.com/mig-<profile>`` capacity)."""


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


# --- reading the cluster ----------------------------------------------------------------------


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
    from kube import documents

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
            if is_legacy_resource(str(name)) and _int(value) > 0:
                totals[str(name)] = totals.get(str(name), 0) + _int(value)
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
    elif conversion.summary != "nothing to convert":
        plan.detail = conversion.summary  # skipped by label, already converted
    elif conversion.warnings:
        plan.detail = "; ".join(conversion.warnings)  # e.g. left to a DeviceClass (KEP-5004)
    else:
        plan.detail = "no GPU requests" if not (plan.legacy or annotations) else "unchanged"
    return plan


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
            k[len("nvidia.com/mig-") :]: _int(v)
            for k, v in capacity.items()
            if k.startswith("nvidia.com/mig-") and _int(v) > 0
        }
        count = _int(labels.get("nvidia.com/gpu.count") or capacity.get("nvidia.com/gpu") or 0)
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


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _model(product: str) -> catalog.GpuModel | None:
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


# --- the simulation ---------------------------------------------------------------------------


def _layout_of(node: GpuNode) -> list[str] | str:
    """Today's layout per GPU: the advertised MIG devices spread evenly, else a whole GPU."""
    if not node.mig:
        return "whole"
    per_gpu: list[str] = []
    for profile, count in sorted(node.mig.items()):
        per_gpu += [profile] * (count // node.gpus)
    return per_gpu or "whole"


def _sim_name(text: str) -> str:
    """A simulated pod's name: lower-case letters, digits and '-'."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def simulate(plan: Plan, raw_policy: Obj, kubernetes: tuple[int, int]) -> Obj | None:
    """Today against gpu-slicer for the converted workloads on the cluster's GPU nodes."""
    from sim.compare import compare
    from sim.errors import SimError
    from sim.scenario import parse_scenario

    converted = [w for w in plan.workloads if w.outcome == "convert" and w.replicas > 0]
    if not plan.nodes or not converted:
        return None
    minor = min(max(kubernetes[1], 34), 39)
    pods = []
    for w in converted:
        body: Obj = {
            "name": _sim_name(f"{w.namespace}-{w.kind}-{w.name}-{w.template}"),
            "workload": w.key,
            "namespace": w.namespace,
            "at": "0s",
            "duration": HORIZON,
            "count": w.replicas,
        }
        if w.legacy:
            body["resources"] = w.legacy
        if w.annotations:
            body["annotations"] = w.annotations
        pods.append(body)
    data: Obj = {
        "name": "plan",
        "description": "the converted workloads on the cluster's GPU nodes",
        "end": HORIZON,
        "sample": "1m",
        "kubernetes": f"1.{minor}",
        "nodes": [{"name": n.name, "gpus": f"{n.model}:{n.gpus}"} for n in plan.nodes],
        "namespaces": dict.fromkeys(plan.namespaces, "enabled"),
        "policy": raw_policy,
        "layouts": {
            "current": {
                "default": "whole",
                "overrides": {n.name: _layout_of(n) for n in plan.nodes},
            }
        },
        "pods": pods,
    }
    try:
        scenario = parse_scenario(data, source="plan")
        comparison = compare(scenario, [TODAY, AFTER], through_api=False)
    except SimError as exc:
        plan.notes.append(f"the simulation could not run: {exc}")
        return None
    today, after = comparison.results
    workloads = {}
    for w in converted:
        key = w.key
        workloads[key] = {
            "pods": w.replicas,
            "runningToday": today.served_by_workload.get(key, (0, 0))[0],
            "runningWithGpuSlicer": after.served_by_workload.get(key, (0, 0))[0],
        }
    return {
        "gpus": scenario.gpu_count,
        "today": {
            "strategy": "device plugin: whole GPUs and the MIG devices nodes advertise",
            "running": today.served,
            "pending": today.pending,
            "memorySlicesHeld": round(today.utilization_mean, 4),
        },
        "withGpuSlicer": {
            "strategy": "gpu-slicer, MIG slices made on demand (best-fit order)",
            "running": after.served,
            "pending": after.pending,
            "memorySlicesHeld": round(after.utilization_mean, 4),
        },
        "workloads": workloads,
    }


# --- the command ------------------------------------------------------------------------------


def build_plan(
    api: KubeApi, namespaces: Sequence[str], *, policy_path: str | None, release_namespace: str
) -> Plan:
    """Reads the cluster and plans every workload of ``namespaces`` (all that have GPU
    workloads when empty)."""
    if policy_path:
        policy, raw, source = policy_file(policy_path)
    else:
        policy, raw, source = cluster_policy(api, release_namespace)
    native = native_extended_names(api)
    nodes, skipped = gpu_nodes(api)
    labels: dict[str, str] = {}
    for namespace in api.list("v1", "Namespace").items:
        meta = namespace.get("metadata") or {}
        labels[str(meta.get("name"))] = str((meta.get("labels") or {}).get(MIGRATION_LABEL, "-"))
    wanted = list(namespaces) or sorted(
        n for n in labels if n not in ("kube-system", release_namespace)
    )
    missing = [n for n in wanted if n not in labels]
    if missing:
        raise PlanInputError(f"namespace {missing[0]} does not exist in the cluster")
    workloads: list[WorkloadPlan] = []
    kinds = policy_table(policy)
    quotas: dict[str, Obj] = {}
    for ns in wanted:
        quota = read_quotas(api.list("v1", "ResourceQuota", ns).items)
        if quota.limits_gpus:
            quotas[ns] = {
                "legacy": {f"requests.{k}": v for k, v in quota.legacy.items()},
                "devices": {k + DEVICES_SUFFIX: v for k, v in quota.devices.items()},
                "keepWith": keeping_limits(quota, ns, policy),
            }
        for api_version, kind in WORKLOAD_KINDS:
            try:
                found = api.list(api_version, kind, ns).items
            except NotFound:
                continue  # the operator's CRD is not installed
            for obj in found:
                obj.setdefault("kind", kind)
                obj.setdefault("apiVersion", api_version)
                if _owned(obj, kinds):
                    continue  # made by a controller whose own object is planned
                workloads += [
                    item
                    for item in plan_workload(obj, ns, policy, native, len(nodes), kinds, quota)
                    if item.legacy or item.annotations or item.outcome != "leave"
                ]
    shown = {
        ns: labels[ns] for ns in wanted if namespaces or any(w.namespace == ns for w in workloads)
    }
    plan = Plan(shown, source, workloads, nodes, skipped, None, quotas=quotas)
    plan.notes += crd_notes(api, {(w.kind, w.api_group) for w in workloads}, kinds)
    version = api.server_version()
    plan.simulation = simulate(plan, raw, version)
    if nodes and not partitionable_scales(version):
        plan.notes.append(quadratic_warning(version, len(nodes)))
    if any(w.kind == "DaemonSet" for w in workloads):
        plan.notes.append(
            "DaemonSets count one pod per GPU node; their node selectors are not applied"
        )
    return plan


def table(plan: Plan) -> str:
    out = io.StringIO()
    out.write(f"policy: {plan.policy_source}\n")
    if not plan.workloads:
        out.write(
            "no workload in "
            + (", ".join(plan.namespaces) or "the cluster")
            + " asks for GPUs: nothing would change\n"
        )
    for ns, label in plan.namespaces.items():
        items = [w for w in plan.workloads if w.namespace == ns]
        out.write(f"\nnamespace {ns} ({MIGRATION_LABEL}: {label})\n")
        _write_quota(out, plan.quotas.get(ns))
        if not items:
            out.write("  no GPU workloads\n")
            continue
        rows: list[tuple[str, ...]] = [
            ("WORKLOAD", "PODS", "ASKS TODAY", "VERDICT", "BECOMES / WHY")
        ]
        for w in items:
            asks = ", ".join(f"{k}: {v}" for k, v in w.legacy.items()) or "annotations"
            why = "; ".join(w.becomes) if w.outcome == "convert" else w.detail
            rows.append((w.label, str(w.replicas), asks, w.outcome, why))
        out.write(_columns(rows, indent="  "))
        for w in items:
            for warning in w.warnings:
                out.write(f"  warning: {w.label}: {warning}\n")
    out.write("\n")
    if plan.nodes:
        gpus = sum(n.gpus for n in plan.nodes)
        out.write(
            f"GPU nodes: {len(plan.nodes)} ({gpus} GPUs): "
            + ", ".join(f"{n.name} {n.model}x{n.gpus}" for n in plan.nodes)
            + "\n"
        )
    else:
        out.write("GPU nodes: none with a GPU model gpu-slicer can slice\n")
    for skipped in plan.skipped_nodes:
        out.write(f"  skipped {skipped}\n")
    sim = plan.simulation
    if sim is not None:
        out.write(
            "\nthe converted workloads on these nodes (simulated, every pod at once, "
            "none ending):\n"
        )
        rows = [("WORKLOAD", "PODS", "RUNNING TODAY", "WITH GPU-SLICER")]
        for key, w in sim["workloads"].items():
            rows.append(
                (key, str(w["pods"]), str(w["runningToday"]), str(w["runningWithGpuSlicer"]))
            )
        rows.append(
            (
                "total",
                str(sim["today"]["running"] + sim["today"]["pending"]),
                str(sim["today"]["running"]),
                str(sim["withGpuSlicer"]["running"]),
            )
        )
        out.write(_columns(rows, indent="  "))
        out.write(
            f"  today: {sim['today']['strategy']}\n  with gpu-slicer: "
            f"{sim['withGpuSlicer']['strategy']}\n"
        )
    for note in plan.notes:
        out.write(f"note: {note}\n")
    out.write(
        "\nnothing was changed; label a namespace gpu-slicer.io/migration=audit to see "
        "the webhook's warnings on real admissions first\n"
    )
    return out.getvalue()


def _write_quota(out: io.StringIO, quota: Obj | None) -> None:
    """A namespace's GPU quota lines, and the DRA lines that keep them once pods convert."""
    if not quota:
        return
    today = ", ".join(f"{k}: {v}" for k, v in {**quota["legacy"], **quota["devices"]}.items())
    out.write(f"  GPU quota: {today}\n")
    missing = {k: v for k, v in quota["keepWith"].items() if k not in quota["devices"]}
    if quota["legacy"] and missing:
        out.write("  converted pods would escape it; add to the namespace's ResourceQuota:\n")
        for key, value in missing.items():
            out.write(f"    {key}: {value}\n")


def _columns(rows: list[tuple[str, ...]], *, indent: str) -> str:
    """Left-aligned columns two spaces apart, as wide as their widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _default_api(kubeconfig: str | None) -> KubeApi:
    from kube.client import RealKubeApi

    return RealKubeApi.from_config(kubeconfig)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``plan``."""
    p = subparsers.add_parser(
        "plan",
        help="what enabling gpu-slicer in a namespace would do (reads the cluster only)",
        description=(
            "Reads the namespaces' Deployments, StatefulSets, DaemonSets, Jobs, CronJobs, bare "
            "Pods and operators' workloads (PyTorchJob, RayCluster, JobSet, LeaderWorkerSet, "
            "InferenceService, Volcano Job, ...), runs the webhook's translation on their pod "
            "templates with the installed policy, and reports per workload what it becomes, "
            "what would be denied and why, and what is left alone. Then it simulates the "
            "converted workloads on the cluster's GPU nodes as today and with gpu-slicer. "
            "Nothing is changed."
        ),
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: in-cluster account, then ~/.kube/config)",
    )
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="a namespace to plan (repeat for more; default: every namespace with GPU workloads)",
    )
    p.add_argument(
        "--policy",
        metavar="FILE",
        help="a policy file (default: the installed webhook's ConfigMap "
        "gpu-slicer-policy, else the built-in policy)",
    )
    p.add_argument(
        "--release-namespace",
        default="gpu-slicer",
        metavar="NS",
        help="where gpu-slicer is installed (default: gpu-slicer)",
    )
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=run_plan)


def run_plan(
    args: argparse.Namespace, *, api_factory: Callable[[str | None], KubeApi] = _default_api
) -> int:
    prefix = "gpu-slicer plan"
    for ns in [*args.namespace, args.release_namespace]:
        if not _NAMESPACE.fullmatch(ns):
            print(
                f"{prefix}: {ns!r} is not a namespace name (lowercase letters, digits, '-')",
                file=sys.stderr,
            )
            return 2
    for flag, path in (("--kubeconfig", args.kubeconfig), ("--policy", args.policy)):
        problem = documents.file_problem(flag, path)
        if problem:
            print(f"{prefix}: {problem}", file=sys.stderr)
            return 2
    try:
        api = api_factory(args.kubeconfig)
    except KubeError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 1
    try:
        plan = build_plan(
            api, args.namespace, policy_path=args.policy, release_namespace=args.release_namespace
        )
    except PlanInputError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except KubeError as exc:
        print(f"{prefix}: reading the cluster failed: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        json.dump(plan.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(table(plan))
    return 0
