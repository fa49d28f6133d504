"""Which DeviceClasses claim which extended resources (KEP-5004), and what the webhook does.

A DeviceClass with ``spec.extendedResourceName: nvidia.com/gpu`` makes the kube-scheduler serve
unchanged ``nvidia.com/gpu`` requests from that class's devices. NVIDIA's DRA driver installs
one (``gpu.nvidia.com``), so on a cluster that runs it the webhook's default policy
(``nativeExtendedResources: defer``) leaves ``nvidia.com/gpu`` pods to the scheduler: they get
NVIDIA's whole GPUs, not gpu-slicer's chains. That is right when it is meant (gpu-slicer for MIG,
NVIDIA's driver for whole GPUs) and a silent surprise when not, so this module says it: at
start-up, on every policy reload and whenever the DeviceClasses change, one log line per claimed
name says which class serves it (the scheduler picks the newest class, then the first by name,
when several claim one name) and whether the webhook defers or converts; ``/metrics`` carries the
same as ``gpu_slicer_webhook_extended_resource_classes``.

:func:`extended_class`, :func:`serving` and :func:`report` are pure; :class:`Reporter` logs and
sets the gauge.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.targets import GPU_SLICER, NVIDIA
from gpu_slicer.webhook.translate import is_legacy_resource

if TYPE_CHECKING:
    from gpu_slicer.webhook.metrics import Metrics

log = logging.getLogger(__name__)

Handling = Literal["defer", "convert", "not-a-gpu-resource"]

_DRIVER_OF_CLASS = {
    **{c: "gpu-slicer" for c in (GPU_SLICER.gpu_class, GPU_SLICER.mig_class)},
    **{c: "NVIDIA's DRA driver" for c in (NVIDIA.gpu_class, NVIDIA.mig_class)},
}


@dataclass(frozen=True)
class ExtendedClass:
    """One DeviceClass that claims an extended resource name."""

    device_class: str
    resource: str
    created: str = ""
    """``metadata.creationTimestamp`` (RFC 3339, so it sorts as text); "" when unknown."""


def extended_class(device_class: Mapping[str, Any]) -> ExtendedClass | None:
    """The claim a DeviceClass object makes, or None when it names no extended resource."""
    spec = device_class.get("spec")
    name = spec.get("extendedResourceName") if isinstance(spec, dict) else None
    if not isinstance(name, str) or not name:
        return None
    metadata = device_class.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    created = metadata.get("creationTimestamp")
    return ExtendedClass(
        device_class=str(metadata.get("name") or ""),
        resource=name,
        created=created if isinstance(created, str) else "",
    )


def serving(classes: Iterable[ExtendedClass]) -> dict[str, tuple[ExtendedClass, ...]]:
    """Per extended resource name, its classes in the order the scheduler prefers them: the one
    created last first, classes created at the same time by name (the API's documented rule for
    ``extendedResourceName`` collisions)."""
    by_name: dict[str, list[ExtendedClass]] = {}
    for item in classes:
        by_name.setdefault(item.resource, []).append(item)
    out: dict[str, tuple[ExtendedClass, ...]] = {}
    for name in sorted(by_name):
        items = sorted(by_name[name], key=lambda c: c.device_class)
        items.sort(key=lambda c: c.created, reverse=True)  # stable: names stay in order
        out[name] = tuple(items)
    return out


@dataclass(frozen=True)
class Line:
    """What happens to pods asking for one claimed extended resource."""

    resource: str
    device_class: str
    shadowed: tuple[str, ...]
    handling: Handling
    surprising: bool
    """Pods the policy means gpu-slicer to convert go to another driver's class instead."""

    @property
    def message(self) -> str:
        driver = _DRIVER_OF_CLASS.get(self.device_class)
        served = f"DeviceClass {self.device_class}" + (f" ({driver})" if driver else "")
        also = (
            f"; also claimed by {', '.join(self.shadowed)}, which the scheduler does not use"
            if self.shadowed
            else ""
        )
        if self.handling == "not-a-gpu-resource":
            what = "not a GPU resource gpu-slicer converts"
        elif self.handling == "defer":
            what = (
                "nativeExtendedResources=defer: the webhook leaves pods asking for it "
                "unchanged and the scheduler allocates them from that class"
            )
        else:
            what = "nativeExtendedResources=convert: the webhook converts pods asking for it"
        return f"{self.resource} is served by {served}{also}; {what}"


def report(policy: Policy, classes: Iterable[ExtendedClass]) -> list[Line]:
    """One line per claimed extended resource name, in name order."""
    target = GPU_SLICER if policy.target == GPU_SLICER.name else NVIDIA
    own = {target.gpu_class, target.mig_class}
    lines = []
    for name, items in serving(classes).items():
        winner = items[0]
        handling: Handling
        if not is_legacy_resource(name):
            handling = "not-a-gpu-resource"
        else:
            handling = policy.native_extended_resources
        lines.append(
            Line(
                resource=name,
                device_class=winner.device_class,
                shadowed=tuple(c.device_class for c in items[1:]),
                handling=handling,
                surprising=handling == "defer" and winner.device_class not in own,
            )
        )
    return lines


class Reporter:
    """Logs the report when it changes (or when told to) and keeps the gauge current."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics
        self._last: list[Line] | None = None
        self._series: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def update(
        self, policy: Policy, classes: Iterable[ExtendedClass], *, reason: str, force: bool = False
    ) -> list[Line]:
        lines = report(policy, classes)
        with self._lock:
            if lines == self._last and not force:
                return lines
            self._last = lines
            self._set_gauge(lines)
        if not lines:
            log.info(
                "no DeviceClass claims an extended resource: the webhook converts every legacy "
                "GPU request in the namespaces that opt in",
                extra={"reason": reason, "policy": policy.describe()},
            )
        for line in lines:
            level = logging.WARNING if line.surprising else logging.INFO
            log.log(
                level,
                line.message,
                extra={
                    "reason": reason,
                    "resource": line.resource,
                    "device_class": line.device_class,
                    "handling": line.handling,
                    "target": policy.target,
                },
            )
        return lines

    def _set_gauge(self, lines: list[Line]) -> None:
        if self._metrics is None:
            return
        gauge = self._metrics.extended_classes
        now = {(line.resource, line.device_class, line.handling) for line in lines}
        for gone in self._series - now:
            gauge.labels(*gone).set(0)
        for series in now:
            gauge.labels(*series).set(1)
        self._series |= now
