"""Offline conversion of manifests: ``gpu-slicer convert`` for GitOps users.

The same translation the webhook applies at admission, applied to a Pod or to the pod template of
a workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job, CronJob,
PodTemplate), document by document. The result is the converted objects followed by the
ResourceClaimTemplates they need, de-duplicated. Objects without GPU requests pass through
unchanged, so a whole directory of manifests can be piped through.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonpatch
import yaml

from kube import documents
from webhook import patch
from webhook.errors import Denied, ManifestError
from webhook.policy import Policy
from webhook.translate import Conversion, audit_warnings, translate_pod

Mode = Literal["enabled", "audit"]

POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}
"""Where each workload kind keeps its pod template (a Pod is converted as itself)."""


@dataclass
class ConvertResult:
    """The converted objects (same order as the input), the templates they need, and notes."""

    objects: list[Any] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)

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


def convert_objects(
    objects: Iterable[Any],
    *,
    policy: Policy,
    mode: Mode = "enabled",
    namespace: str | None = None,
    native_extended: frozenset[str] = frozenset(),
) -> ConvertResult:
    """Convert every object; raises ManifestError listing every document that was denied.

    ``namespace`` stands in for objects that name none (as ``kubectl apply -n`` would); it also
    selects the policy's per-namespace rules.
    """
    result = ConvertResult()
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for number, obj in enumerate(objects, start=1):
        try:
            converted = _convert_any(obj, policy, mode, namespace, native_extended, result, seen)
        except Denied as exc:
            problems.append(f"document {number} ({_describe(obj)}): {exc.message}")
            continue
        result.objects.append(converted)
    if problems:
        raise ManifestError(problems)
    return result


def _convert_any(
    obj: Any,
    policy: Policy,
    mode: Mode,
    namespace: str | None,
    native_extended: frozenset[str],
    result: ConvertResult,
    seen: set[tuple[str, str]],
) -> Any:
    if not isinstance(obj, dict):
        raise Denied(
            f"a {_yaml_type(obj)}, not a Kubernetes object (a mapping with apiVersion and kind)"
        )
    kind = obj.get("kind")
    if kind == "List":
        if not isinstance(obj.get("items"), list):
            raise Denied(f"items must be a list of objects, not {_yaml_type(obj.get('items'))}")
        out = copy.deepcopy(obj)
        out["items"] = [
            _convert_any(item, policy, mode, namespace, native_extended, result, seen)
            for item in obj["items"]
        ]
        return out
    if kind == "Pod":
        path: tuple[str, ...] = ()
    elif isinstance(kind, str) and kind in POD_TEMPLATE_PATHS:
        path = POD_TEMPLATE_PATHS[kind]
    else:
        return obj
    template = _pod_template(obj, path)
    raw = obj.get("metadata")
    metadata: dict[str, Any] = raw if isinstance(raw, dict) else {}
    ns = str(metadata.get("namespace") or namespace or "")
    pod = {"metadata": template.get("metadata") or {}, "spec": template["spec"]}
    conversion = translate_pod(pod, namespace=ns, policy=policy, native_extended=native_extended)
    label = _describe(obj)
    if mode == "audit":
        result.warnings.extend(f"{label}: {w}" for w in audit_warnings(conversion))
        return obj
    result.warnings.extend(f"{label}: {w}" for w in conversion.warnings)
    if not conversion.patch:
        return obj
    result.summaries.append(f"{label}: {conversion.summary}")
    _collect_templates(conversion, result, seen)
    patched = jsonpatch.apply_patch(pod, conversion.patch)
    out = copy.deepcopy(obj)
    target = patch.lookup(out, path)
    target["metadata"] = patched["metadata"]
    target["spec"] = patched["spec"]
    return out


def _pod_template(obj: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The pod (template) at ``path`` of ``obj``, checked the way the API server would check
    it, so that a hand-written manifest gets a message rather than a crash."""
    _check_metadata(obj.get("metadata"), "metadata")
    template = patch.lookup(obj, path)
    where = ".".join(path) or "the Pod"
    if not isinstance(template, dict):
        raise Denied(f"{'.'.join(path)}: no pod template (a mapping with a spec)")
    if not isinstance(template.get("spec"), dict):
        raise Denied(
            f"{where + '.' if path else ''}spec: must be a mapping with containers, "
            f"not {_yaml_type(template.get('spec'))}"
        )
    if path:
        _check_metadata(template.get("metadata"), f"{where}.metadata")
    prefix = f"{where}.spec" if path else "spec"
    for key in ("initContainers", "containers"):
        _check_containers(template["spec"].get(key), f"{prefix}.{key}")
    return template


def _check_containers(listed: Any, where: str) -> None:
    """Raise Denied unless ``listed`` is absent or a list of containers with usable resources."""
    if listed is None:
        return
    if not isinstance(listed, list):
        raise Denied(f"{where}: must be a list of containers, not {_yaml_type(listed)}")
    for i, item in enumerate(listed):
        if not isinstance(item, dict):
            raise Denied(f"{where}[{i}]: must be a container (a mapping), not {_yaml_type(item)}")
        _check_resources(item.get("resources"), f"{where}[{i}].resources")


def _collect_templates(
    conversion: Conversion, result: ConvertResult, seen: set[tuple[str, str]]
) -> None:
    for template in conversion.templates:
        meta = template["metadata"]
        key = (str(meta.get("namespace", "")), str(meta["name"]))
        if key not in seen:
            seen.add(key)
            result.templates.append(template)


def _check_metadata(value: Any, where: str) -> None:
    """Raise Denied unless ``value`` is absent or a mapping whose name and namespace are text."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise Denied(f"{where}: must be a mapping, not {_yaml_type(value)}")
    for key in ("name", "generateName", "namespace"):
        if key in value and not isinstance(value[key], str):
            raise Denied(f"{where}.{key}: must be a string, not {_yaml_type(value[key])}")
    for key in ("labels", "annotations"):
        if value.get(key) is not None and not isinstance(value[key], dict):
            raise Denied(f"{where}.{key}: must be a mapping, not {_yaml_type(value[key])}")


def _check_resources(value: Any, where: str) -> None:
    """Raise Denied unless a container's resources (and its limits and requests) are mappings."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise Denied(f"{where}: must be a mapping, not {_yaml_type(value)}")
    for key in ("limits", "requests"):
        if value.get(key) is not None and not isinstance(value[key], dict):
            raise Denied(f"{where}.{key}: must be a mapping, not {_yaml_type(value[key])}")


def _yaml_type(value: Any) -> str:
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


def dump_yaml(items: Sequence[Any]) -> str:
    """One YAML stream, documents separated by ``---``, keys in their original order."""
    return yaml.safe_dump_all(
        items, sort_keys=False, default_flow_style=False, explicit_start=True, width=4096
    )


def dump_json_list(items: Sequence[Any]) -> str:
    """A ``v1`` List, as ``kubectl get -o json`` prints several objects."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}, indent=2) + "\n"
