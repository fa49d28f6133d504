"""GPU quotas across the move to DRA: a converted pod must not escape its namespace's quota.

A ResourceQuota limits legacy GPUs as an extended resource (``requests.nvidia.com/gpu: 4``). A
converted pod no longer asks for ``nvidia.com/gpu``, so that line stops counting it; Kubernetes
counts DRA claims per DeviceClass instead, under ``<class>.deviceclass.resource.k8s.io/devices``,
and a ``firstAvailable`` request counts as its largest alternative in each class it names. So a
pod is converted in a namespace whose quotas limit its legacy resource only when every DeviceClass
its claim names is limited too; otherwise it is left unconverted (or denied, by policy
``quotaWithoutDeviceLimit``) with a message that says which quota line is missing.

:func:`device_counts` is how Kubernetes counts a claim; :func:`equivalent_limits` turns a
namespace's legacy GPU limits into the DRA entries that keep the same number of pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpu_slicer.kube.quantity import QuantityError, parse_count
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.translate import Conversion, is_legacy_resource, translate_pod

DEVICES_SUFFIX = ".deviceclass.resource.k8s.io/devices"
REQUESTS_PREFIX = "requests."


@dataclass(frozen=True)
class NamespaceQuota:
    """The GPU lines of a namespace's ResourceQuotas (the lowest hard limit of each)."""

    legacy: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Legacy resource (``nvidia.com/gpu``) -> hard limit."""
    devices: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """DeviceClass name -> hard limit on the devices claims of that class may hold."""

    @property
    def limits_gpus(self) -> bool:
        return bool(self.legacy or self.devices)


NO_QUOTA = NamespaceQuota()


def read_quotas(quotas: Iterable[Any]) -> NamespaceQuota:
    """The GPU lines of ResourceQuota objects (of one namespace); other lines are ignored."""
    legacy: dict[str, int] = {}
    devices: dict[str, int] = {}
    for quota in quotas:
        hard = ((quota or {}).get("spec") or {}).get("hard") if isinstance(quota, dict) else None
        if not isinstance(hard, dict):
            continue
        for key, value in hard.items():
            try:
                count = parse_count(value)
            except QuantityError:
                continue
            name = str(key)
            if name.endswith(DEVICES_SUFFIX):
                target, found = devices, name[: -len(DEVICES_SUFFIX)]
            elif is_legacy_resource(name.removeprefix(REQUESTS_PREFIX)):
                target, found = legacy, name.removeprefix(REQUESTS_PREFIX)
            else:
                continue
            target[found] = min(count, target.get(found, count))
    return NamespaceQuota(MappingProxyType(legacy), MappingProxyType(devices))


def device_counts(template: Mapping[str, Any]) -> dict[str, int]:
    """Devices a claim from ``template`` counts against each DeviceClass's quota: per request
    its ``exactly`` count, or per class the largest ``firstAvailable`` alternative."""
    totals: dict[str, int] = {}
    spec = ((template.get("spec") or {}).get("spec") or {}).get("devices") or {}
    for request in spec.get("requests") or []:
        options = request.get("firstAvailable") or [request.get("exactly") or {}]
        largest: dict[str, int] = {}
        for option in options:
            name = option.get("deviceClassName")
            if isinstance(name, str):
                largest[name] = max(largest.get(name, 0), int(option.get("count", 1)))
        for name, count in largest.items():
            totals[name] = totals.get(name, 0) + count
    return totals


def escape(
    converted: Iterable[str], templates: Iterable[Mapping[str, Any]], quota: NamespaceQuota
) -> str | None:
    """Why converting would let the pod escape the namespace's quota, or None.

    ``converted``: the legacy resources the conversion removes; ``templates``: the claim
    templates it names."""
    limited = sorted({r for r in converted if r in quota.legacy})
    if not limited:
        return None
    classes = sorted({c for t in templates for c in device_counts(t)})
    missing = [c for c in classes if c not in quota.devices]
    if not missing:
        return None
    lines = ", ".join(f"{REQUESTS_PREFIX}{r}: {quota.legacy[r]}" for r in limited)
    return (
        f"quota limits {lines} but not class {', '.join(missing)} devices; "
        "gpu-slicer plan prints the quota lines to add"
    )


def conversion_escape(conversion: Conversion, quota: NamespaceQuota) -> str | None:
    """:func:`escape` for what ``conversion`` removes and the templates it names."""
    if not conversion.changes or not quota.limits_gpus:
        return None
    return escape([what for _, what in conversion.changes], conversion.templates, quota)


def keeping_limits(quota: NamespaceQuota, namespace: str, policy: Policy) -> dict[str, int]:
    """The DRA quota lines that keep a namespace's legacy GPU limits.

    Each legacy resource's unit is translated as the webhook would in ``namespace``; each class
    its claim names gets limit x the devices one unit counts there, summed over the legacy
    resources that reach it. A whole GPU that may also be a spanning MIG instance counts on both
    classes, so N pods of one GPU fit and the N+1st does not, whichever alternative each got.
    Several ``nvidia.com/mig-<profile>`` limits add up on the MIG class: DRA quotas count a
    class's devices, not profiles."""
    out: dict[str, int] = {}
    for resource, limit in sorted(quota.legacy.items()):
        pod = {"spec": {"containers": [{"name": "main", "resources": {"limits": {resource: 1}}}]}}
        try:
            conversion = translate_pod(pod, namespace=namespace, policy=policy)
        except Denied:
            continue  # a profile none of the policy's GPU models offers: nothing converts to it
        for template in conversion.templates:
            for name, count in device_counts(template).items():
                key = name + DEVICES_SUFFIX
                out[key] = out.get(key, 0) + limit * count
    return dict(sorted(out.items()))
