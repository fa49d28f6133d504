"""Offline conversion of manifests: ``gpu-slicer convert`` for GitOps users.

The same translation the webhook applies at admission, applied to every pod template an object
embeds: a Pod, Kubernetes' workloads and the operators' kinds of :mod:`webhook.workloads`
(matched by API group and kind), document by document. The result is the objects, converted
where they ask for GPUs, followed by the ResourceClaimTemplates they need, de-duplicated.

One document never blocks the others: a document that cannot be converted (a denied pod
template, something that is not an object) is kept as it was and named in ``problems``; kinds
that are not in the table pass through, and those that ask for GPUs are named in ``warnings``,
since the git tree would then under-report what runs.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from gpu_slicer.core.identity import LEGACY_GPU, NamespaceMode
from gpu_slicer.kube import documents
from gpu_slicer.webhook.crd_schema import pruned_fields, schema_of
from gpu_slicer.webhook.errors import Denied, ManifestError
from gpu_slicer.webhook.extended import extended_class
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.quota import NO_QUOTA, NamespaceQuota, conversion_escape, read_quotas
from gpu_slicer.webhook.remembered import Remembered
from gpu_slicer.webhook.templates import ORIGIN_CONVERT, ORIGIN_LABEL
from gpu_slicer.webhook.translate import Conversion, audit_warnings, translate_pod
from gpu_slicer.webhook.workloads import (
    DEFAULT_TABLE,
    UNCHECKED,
    Step,
    Workload,
    WorkloadTable,
    expand,
    gpu_requests,
    group_of,
    show,
)
from gpu_slicer.webhook.workloads import lookup as node_at

_VENDOR = LEGACY_GPU[: LEGACY_GPU.index("/") + 1]

POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    w.kind: w.templates[0] for w in DEFAULT_TABLE if w.built_in and w.kind != "Pod"
}
"""Where Kubernetes' own workload kinds keep their pod template (a Pod is converted as itself)."""


@dataclass
class ConvertResult:
    """The objects (same order as the input, converted where they could be), the templates
    they need, notes, and the documents that could not be converted (kept as they were)."""

    objects: list[Any] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    changed: list[bool] = field(default_factory=list)
    """Per object: whether conversion changed it."""

    @property
    def items(self) -> list[Any]:
        return [*self.objects, *self.templates]


def load_documents(text: str, source: str | None = None) -> list[Any]:
    """Every non-empty document of a YAML (or JSON) stream; ``source`` names it in errors."""
    try:
        return documents.parse_all(text)
    except documents.DocumentError as exc:
        prefix = f"{source}: " if source else ""
        raise ManifestError([f"{prefix}{exc}"]) from exc


@dataclass(frozen=True)
class _Context:
    policy: Policy
    mode: NamespaceMode
    namespace: str | None
    native_extended: frozenset[str]
    table: WorkloadTable
    quotas: Mapping[str, NamespaceQuota]
    crds: Mapping[tuple[str, str], Any]
    gpu_free: bool = False
    """The objects' text names no GPU (``webhook.yaml_text.may_ask_for_gpus``): none of them
    can ask for one, so nothing is looked for outside the pod templates either."""
    remembered: Remembered | None = None


def convert_objects(
    objects: Iterable[Any],
    *,
    policy: Policy,
    mode: NamespaceMode = "enabled",
    namespace: str | None = None,
    native_extended: frozenset[str] = frozenset(),
    table: WorkloadTable | None = None,
    seen: set[tuple[str, str]] | None = None,
    quiet_non_objects: bool = False,
    quotas: Mapping[str, NamespaceQuota] | None = None,
    crds: Mapping[tuple[str, str], Any] | None = None,
    first: int = 1,
    gpu_free: bool = False,
    remembered: Remembered | None = None,
) -> ConvertResult:
    """Convert every object; a document that cannot be converted is kept and named.

    ``namespace`` stands in for objects that name none (as ``kubectl apply -n`` would); it also
    selects the policy's per-namespace rules. ``seen`` carries the templates already emitted
    across several calls (the files of a tree), so each is emitted once.
    ``quiet_non_objects``: documents that are not objects (a kustomize JSON 6902 patch is a
    list) are kept without a problem. ``quotas``: the GPU quota lines per namespace (default:
    from the ResourceQuotas among ``objects``): a pod that would escape them is left as the
    webhook leaves it. DeviceClasses among ``objects`` add the names they serve to
    ``native_extended`` (:func:`tree_extended`). ``crds``: CustomResourceDefinitions by
    (group, kind) (default: those among ``objects``): an operator's kind whose CRD would prune
    the claim is left alone (webhook.crd_schema). ``remembered``: the translation's stores, for
    a caller converting many files (default: one for this call). ``gpu_free``: the objects were
    read from text that names no GPU (``webhook.yaml_text.may_ask_for_gpus``).
    """
    objects = list(objects)
    context = _Context(
        policy,
        mode,
        namespace,
        native_extended | tree_extended(objects),
        table or policy_table(policy),
        tree_quotas(objects, namespace) if quotas is None else quotas,
        tree_crds(objects) if crds is None else crds,
        gpu_free,
        Remembered() if remembered is None else remembered,
    )
    result = ConvertResult()
    emitted = seen if seen is not None else set()
    for number, obj in enumerate(objects, start=first):
        if quiet_non_objects and not isinstance(obj, dict):
            result.objects.append(obj)
            result.changed.append(False)
            continue
        converted = _convert_document(obj, context, result, emitted, f"document {number}")
        result.objects.append(converted)
        result.changed.append(converted is not obj)
    return result


def tree_quotas(objects: Iterable[Any], namespace: str | None) -> dict[str, NamespaceQuota]:
    """The GPU lines of the ResourceQuotas among ``objects``, per namespace (``namespace``
    for those that name none)."""
    grouped: dict[str, list[Any]] = {}
    for obj in objects:
        if isinstance(obj, dict) and obj.get("kind") == "ResourceQuota":
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            ns = str((meta or {}).get("namespace") or namespace or "")
            grouped.setdefault(ns, []).append(obj)
    found = {ns: read_quotas(quotas) for ns, quotas in grouped.items()}
    return {ns: q for ns, q in found.items() if q.limits_gpus}


def tree_extended(objects: Iterable[Any]) -> frozenset[str]:
    """The extended resource names the DeviceClasses among ``objects`` serve (KEP-5004). The
    webhook reads the cluster's classes and, under the policy's ``nativeExtendedResources:
    defer``, leaves pods asking for such a name to the scheduler; ``convert`` reads the tree's
    (with ``--native-extended``) so that both agree."""
    names = set()
    for obj in objects:
        if (
            isinstance(obj, dict)
            and obj.get("kind") == "DeviceClass"
            and group_of(obj.get("apiVersion")) == "resource.k8s.io"
        ):
            found = extended_class(obj)
            if found is not None:
                names.add(found.resource)
    return frozenset(names)


def tree_crds(objects: Iterable[Any]) -> dict[tuple[str, str], Any]:
    """The CustomResourceDefinitions among ``objects``, by the (group, kind) they serve."""
    found: dict[tuple[str, str], Any] = {}
    for obj in objects:
        if isinstance(obj, dict) and obj.get("kind") == "CustomResourceDefinition":
            spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else None
            names = (spec or {}).get("names")
            if spec and isinstance(names, dict) and names.get("kind"):
                found[(str(spec.get("group", "")), str(names["kind"]))] = obj
    return found


def policy_table(policy: Policy) -> WorkloadTable:
    """The built-in and operators' kinds plus those the policy's ``workloads`` adds."""
    return WorkloadTable(policy.workloads) if policy.workloads else DEFAULT_TABLE


def _convert_document(
    obj: Any,
    context: _Context,
    result: ConvertResult,
    seen: set[tuple[str, str]],
    where: str,
) -> Any:
    """``obj`` converted, or ``obj`` itself (unchanged, or not convertible: then named)."""
    if isinstance(obj, dict) and obj.get("kind") == "List" and "items" in obj:
        if not isinstance(obj["items"], list):
            result.problems.append(
                f"{where} ({_describe(obj)}): items must be a list of objects, "
                f"not {yaml_type(obj['items'])}; left as it was"
            )
            return obj
        items = [
            _convert_document(item, context, result, seen, f"{where} item {i + 1}")
            for i, item in enumerate(obj["items"])
        ]
        if all(a is b for a, b in zip(items, obj["items"], strict=True)):
            return obj
        out = dict(obj)
        out["items"] = items
        return out
    label = _describe(obj)
    try:
        converted, templates, summary, warnings = _convert_object(obj, context)
    except Denied as exc:
        if context.mode == "audit":
            result.warnings.append(f"{label}: gpu-slicer audit: would deny: {exc.message}")
        else:
            result.problems.append(f"{where} ({label}): {exc.message}; left as it was")
        return obj
    result.warnings.extend(f"{label}: {w}" for w in warnings)
    if converted is obj:
        return obj
    result.summaries.append(f"{label}: {summary}")
    for template in templates:
        meta = template["metadata"]
        key = (str(meta.get("namespace", "")), str(meta["name"]))
        if key not in seen:
            seen.add(key)
            meta.setdefault("labels", {})[ORIGIN_LABEL] = ORIGIN_CONVERT
            result.templates.append(template)
    return converted


def _convert_object(
    obj: Any, context: _Context
) -> tuple[Any, list[dict[str, Any]], str, list[str]]:
    """(object converted or ``obj`` itself, its templates, a summary, warnings); raises Denied
    when one of its pod templates cannot be converted (the object is then kept whole)."""
    if not isinstance(obj, dict):
        raise Denied(
            f"a {yaml_type(obj)}, not a Kubernetes object (a mapping with apiVersion and kind)"
        )
    if "kind" in obj and not obj.get("apiVersion"):
        raise Denied(f"no apiVersion: which API group's {obj['kind']} is it?")
    workload = context.table.lookup(obj)
    if workload is None:
        return (
            obj,
            [],
            "",
            _left_alone(obj, "its kind is not one gpu-slicer knows", (), gpu_free=context.gpu_free),
        )
    why = _not_convertible(workload, context)
    if why is not None:
        return obj, [], "", _left_alone(obj, why, (), gpu_free=context.gpu_free)
    _check_metadata(obj.get("metadata"), "metadata")
    namespace = _namespace(obj, workload, context)
    if namespace is None:
        why = (
            f"a {workload.kind} is cluster-scoped and its pods run in the namespace of each "
            f"{workload.runs_in} that uses it, where their claim template must be: give -n "
            "NAMESPACE (once per namespace), or let the webhook convert the pods"
        )
        return obj, [], "", _left_alone(obj, why, (), gpu_free=context.gpu_free)
    found = _pod_paths(obj, workload)
    out: dict[str, Any] | None = None
    templates: list[dict[str, Any]] = []
    summaries: list[str] = []
    warnings: list[str] = []
    for steps, inline in found:
        place = show(steps)
        at = f" (at {place})" if place and not workload.built_in else ""
        node = node_at(obj, steps)
        pod = _pod_of(node, steps, inline, workload)
        try:
            conversion = translate_pod(
                pod,
                namespace=namespace,
                policy=context.policy,
                native_extended=context.native_extended,
                remembered=context.remembered,
            )
        except Denied as exc:
            raise Denied(f"{place + ': ' if at else ''}{exc.message}") from exc
        escaped = _quota_escape(conversion, namespace, context, place if at else "")
        if escaped is not None:
            warnings.append(f"{escaped}{at}")
            continue
        if context.mode == "audit":
            warnings += [f"{w}{at}" for w in audit_warnings(conversion)]
            continue
        warnings += [f"{w}{at}" for w in conversion.warnings]
        if not conversion.patch:
            continue
        out = out if out is not None else copy.deepcopy(obj)
        _apply(out, steps, inline, pod, conversion)
        templates += conversion.templates
        summaries.append(f"{conversion.summary}{at}")
    reason = workload.note or "the GPU requests are outside the pod templates gpu-slicer reads"
    warnings += _left_alone(
        out if out is not None else obj, reason, _covered(found), gpu_free=context.gpu_free
    )
    if out is None:
        return obj, [], "", warnings
    warnings += _converted_notes(workload, namespace, context)
    return out, templates, "; ".join(summaries), warnings


def _covered(found: list[tuple[tuple[Step, ...], bool]]) -> list[str]:
    """The container lists translation read, as paths: GPU requests anywhere else in the object
    are named (``_left_alone``)."""
    return [
        show((*steps, *(() if inline else ("spec",)), key))
        for steps, inline in found
        for key in ("initContainers", "containers")
    ]


def _converted_notes(workload: Workload, namespace: str, context: _Context) -> list[str]:
    """What the user of a converted operator's object must know: where a cluster-scoped kind's
    templates went, and that its CRD must keep the claim."""
    notes = []
    if workload.runs_in:
        notes.append(
            f"cluster-scoped: its claim templates are written for namespace {namespace} only; "
            f"for {workload.runs_in}s in other namespaces, convert again with -n"
        )
    if not workload.built_in and workload.key not in context.crds and workload.checked != "policy":
        notes.append(
            f"its CRD must keep the claim ({workload.checked}: checked); gpu-slicer plan "
            "checks the cluster's"
        )
    return notes


def _namespace(obj: dict[str, Any], workload: Workload, context: _Context) -> str | None:
    """The namespace the object's pods run in ("" when none is named); None for a
    cluster-scoped kind when ``convert`` was given no namespace (its pods run in the namespace
    of whatever uses it, ``workload.runs_in``)."""
    if workload.runs_in:
        return context.namespace or None
    raw = obj.get("metadata")
    metadata: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return str(metadata.get("namespace") or context.namespace or "")


def _not_convertible(workload: Workload, context: _Context) -> str | None:
    """Why an object of ``workload``'s kind is left alone: a kind not checked to keep the claim
    (or left alone by the policy), or a CRD of the tree that would prune it."""
    if not context.table.convertible(workload):
        return workload.note or UNCHECKED
    crd = context.crds.get(workload.key)
    if crd is not None and not workload.built_in:
        if schema_of(crd) is None:
            return (
                "its CustomResourceDefinition in this tree has no storage version with a "
                "schema (spec.versions[].storage, .schema.openAPIV3Schema): whether it keeps "
                "the claim cannot be told"
            )
        pruned = pruned_fields(crd, workload)
        if pruned:
            return f"its CustomResourceDefinition in this tree would prune {pruned[0]}"
    return None


def _quota_escape(
    conversion: Conversion, namespace: str, context: _Context, place: str
) -> str | None:
    """The note for a pod that would escape its namespace's GPU quota (webhook.quota), or
    None; raises Denied when the policy denies such pods."""
    quota = context.quotas.get(namespace, NO_QUOTA)
    escaped = conversion_escape(conversion, quota)
    if escaped is None:
        return None
    if context.policy.quota_without_device_limit == "deny":
        raise Denied(f"{place + ': ' if place else ''}{escaped}")
    if context.mode == "audit":
        return f"gpu-slicer audit: would not convert: {escaped}"
    return f"not converted: {escaped}"


def _pod_paths(obj: dict[str, Any], workload: Workload) -> list[tuple[tuple[Step, ...], bool]]:
    """The concrete paths of ``obj``'s pod templates (False) and inline pod specs (True)."""
    found: list[tuple[tuple[Step, ...], bool]] = []
    for path in workload.templates:
        found += [(steps, False) for steps in expand(obj, path)]
    for path in workload.specs:
        found += [(steps, True) for steps in expand(obj, path)]
    if workload.built_in and not found:
        where = ".".join(workload.templates[0])
        raise Denied(f"{where}: no pod template (a mapping with a spec)")
    return found


def _pod_of(
    node: dict[str, Any], steps: tuple[Step, ...], inline: bool, workload: Workload
) -> dict[str, Any]:
    """The pod that translation reads for the template (or inline spec) at ``steps``."""
    if inline:
        for key in ("initContainers", "containers"):
            _check_containers(node.get(key), f"{show(steps)}.{key}")
        return {"metadata": {}, "spec": node}
    template = _pod_template(node, steps, workload.built_in)
    return {"metadata": template.get("metadata") or {}, "spec": template["spec"]}


def _apply(
    out: dict[str, Any],
    steps: tuple[Step, ...],
    inline: bool,
    pod: dict[str, Any],
    conversion: Conversion,
) -> None:
    """Writes the converted pod back into ``out`` (a copy) at ``steps``."""
    patched = jsonpatch.apply_patch(pod, conversion.patch)
    target = node_at(out, steps)
    if inline:
        target.clear()
        target.update(patched["spec"])
        return
    if patched["metadata"] or "metadata" in target:
        target["metadata"] = patched["metadata"]
    target["spec"] = patched["spec"]


def _left_alone(
    obj: Any, reason: str, covered: Sequence[str], *, gpu_free: bool = False
) -> list[str]:
    """A warning per GPU request ``obj`` still has outside the container lists translation
    read (``covered``), whatever its kind; none when its text named no GPU (``gpu_free``)."""
    out: list[str] = []
    if gpu_free or not _may_name_gpus(obj):
        return out
    for place, resource in gpu_requests(obj):
        if any(place == c or place.startswith((f"{c}.", f"{c}[")) for c in covered):
            continue
        out.append(f"left alone: asks for {resource} at {place}: {reason}")
    return out


def _may_name_gpus(obj: Any) -> bool:
    """Whether ``obj`` may hold a GPU resource name (every one starts with ``nvidia.com/``,
    webhook.workloads.is_gpu_resource), told from its JSON, written in C: a walk of every
    object in Python (:func:`webhook.workloads.gpu_requests`) costs several times more, and
    nearly every object of a tree has none. True when it cannot be written as JSON."""
    try:
        return _VENDOR in json.dumps(obj, default=str)
    except (TypeError, ValueError, RecursionError):
        return True


def _pod_template(template: Any, steps: tuple[Step, ...], built_in: bool) -> dict[str, Any]:
    """The pod (template) at ``steps``, checked the way the API server would check it, so
    that a hand-written manifest gets a message rather than a crash."""
    where = show(steps) or "the Pod"
    if not isinstance(template, dict):
        raise Denied(f"{where}: no pod template (a mapping with a spec)")
    if not isinstance(template.get("spec"), dict):
        if not built_in and "spec" not in template:
            raise Denied(f"{where}: no pod template (a mapping with a spec)")
        raise Denied(
            f"{where + '.' if steps else ''}spec: must be a mapping with containers, "
            f"not {yaml_type(template.get('spec'))}"
        )
    if steps:
        _check_metadata(template.get("metadata"), f"{where}.metadata")
    prefix = f"{where}.spec" if steps else "spec"
    for key in ("initContainers", "containers"):
        _check_containers(template["spec"].get(key), f"{prefix}.{key}")
    return template


def _check_containers(listed: Any, where: str) -> None:
    """Raise Denied unless ``listed`` is absent or a list of containers with usable resources."""
    if listed is None:
        return
    if not isinstance(listed, list):
        raise Denied(f"{where}: must be a list of containers, not {yaml_type(listed)}")
    for i, item in enumerate(listed):
        if not isinstance(item, dict):
            raise Denied(f"{where}[{i}]: must be a container (a mapping), not {yaml_type(item)}")
        _check_resources(item.get("resources"), f"{where}[{i}].resources")


def _check_metadata(value: Any, where: str) -> None:
    """Raise Denied unless ``value`` is absent or a mapping whose name and namespace are text."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise Denied(f"{where}: must be a mapping, not {yaml_type(value)}")
    for key in ("name", "generateName", "namespace"):
        if key in value and not isinstance(value[key], str):
            raise Denied(f"{where}.{key}: must be a string, not {yaml_type(value[key])}")
    for key in ("labels", "annotations"):
        if value.get(key) is not None and not isinstance(value[key], dict):
            raise Denied(f"{where}.{key}: must be a mapping, not {yaml_type(value[key])}")


def _check_resources(value: Any, where: str) -> None:
    """Raise Denied unless a container's resources (and its limits and requests) are mappings."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise Denied(f"{where}: must be a mapping, not {yaml_type(value)}")
    for key in ("limits", "requests"):
        if value.get(key) is not None and not isinstance(value[key], dict):
            raise Denied(f"{where}.{key}: must be a mapping, not {yaml_type(value[key])}")


def yaml_type(value: Any) -> str:
    """How a YAML reader would call ``value``'s type."""
    if value is None:
        return "missing value"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, str):
        return f"string {value!r}"
    return f"{'boolean' if isinstance(value, bool) else 'number'} {value!r}"


def _describe(obj: Any) -> str:
    if not isinstance(obj, dict):
        return type(obj).__name__
    raw = obj.get("metadata")
    meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    ns = meta.get("namespace")
    return f"{obj.get('kind', '<no kind>')} {f'{ns}/' if ns else ''}{name}"


def dump_json_list(items: Sequence[Any]) -> str:
    """A ``v1`` List, as ``kubectl get -o json`` prints several objects."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}, indent=2) + "\n"
