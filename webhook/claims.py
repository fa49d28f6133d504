"""ResourceClaimTemplate specs built from what each container needs, and their content address.

One claim per pod. The translation decides its requests (one per container, or shared between
init and app containers: webhook.translate). A request with one alternative uses ``exactly``;
with several it uses ``firstAvailable`` (tried in order, at most 8). Devices that must share an
NVLink domain get a ``matchAttribute`` constraint naming the request, or, inside a
``firstAvailable`` chain, its NVLink subrequests alone (``<request>/<subrequest>``, which the v1
API accepts in ``constraints[].requests``), so the plain fallbacks stay unconstrained. A
container whose devices are split over several requests gets one constraint over all of them.

Templates are content-addressed: the name is ``gpu-slicer-`` plus a short hash of the canonical
JSON of the template's spec, so the same spec always maps to the same template in a namespace and
concurrent webhook replicas agree on it without coordination.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpu_slicer.core.identity import MANAGED_BY, MANAGED_BY_LABEL, RESOURCE_API
from gpu_slicer.webhook import cel
from gpu_slicer.webhook.targets import TargetDriver

CLAIM_NAME = "gpu-slicer"
"""The name of the pod's claim entry (``spec.resourceClaims[].name``)."""

TEMPLATE_PREFIX = "gpu-slicer-"
HASH_CHARS = 10
DNS_LABEL_MAX = 63
"""Kubernetes' limit on a label (RFC 1123), which request and subrequest names must be."""

_NOT_DNS = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class Alternative:
    """One way to satisfy a request: ``count`` whole GPUs, ``count`` slices of a profile, or
    ``count`` MIG instances that each span a whole GPU (``profile`` None, ``full_gpu`` set to
    the spanning profile of every GPU model in force)."""

    kind: Literal["gpu", "mig"]
    count: int
    profile: str | None = None
    min_memory_bytes: int | None = None
    """For memory-sized chains: also require this much device memory (see cel.profile_selector)."""
    nvlink: bool = False
    """All ``count`` devices must share the NVLink domain attribute."""
    full_gpu: tuple[str, ...] = ()
    """Kind ``mig`` without a profile: any of these profiles, each the whole of its GPU."""
    any_of: tuple[str, ...] = ()
    """Kind ``mig`` without a profile, a tier of a memory chain: any of these profiles with at
    least ``min_memory_bytes`` (at most one of them fits on each GPU model)."""

    @functools.cached_property
    def label(self) -> str:
        """Human form: ``2 x gpu (nvlink)``, ``1 x 1g.10gb``, ``1 x gpu as MIG 7g.80gb``."""
        if self.kind == "gpu":
            what = "gpu"
        elif self.any_of:
            what = f"one of {'|'.join(self.any_of)}"
        elif self.profile is None:
            what = f"gpu as MIG {'|'.join(self.full_gpu)}"
        else:
            what = self.profile
        return f"{self.count} x {what}{' (nvlink)' if self.nvlink else ''}"

    @functools.cached_property
    def base_name(self) -> str:
        """The subrequest name before de-duplication."""
        if self.any_of:
            return "mig-fit"
        if self.kind == "gpu" or self.profile is None:
            base = "gpu" if self.kind == "gpu" else "gpu-mig"
            return f"{base}-nvlink" if self.nvlink else base
        return dns_label(str(self.profile).replace("+", "-"), fallback="mig")


@dataclass(frozen=True)
class ContainerRequest:
    """One request of the pod's claim: the devices of one container, or of several containers
    that use them one after the other (an init container, then an app container)."""

    name: str
    alternatives: tuple[Alternative, ...]


NvlinkSet = tuple[str, ...]
"""Names of requests whose NVLink alternatives must all share one NVLink domain (the requests
that together hold one container's devices)."""


def dns_label(text: str, *, fallback: str = "x", max_len: int = DNS_LABEL_MAX) -> str:
    """Turn ``text`` into an RFC 1123 label (lower case, digits, ``-``; at most ``max_len``)."""
    label = _NOT_DNS.sub("-", text.lower()).strip("-")[:max_len].strip("-")
    return label or fallback


def unique_label(base: str, taken: set[str]) -> str:
    """``base``, or ``base-2``, ``base-3``... (shortened to stay a label) not in ``taken``."""
    candidate = base
    counter = 2
    while candidate in taken:
        suffix = f"-{counter}"
        candidate = base[: DNS_LABEL_MAX - len(suffix)].rstrip("-") + suffix
        counter += 1
    taken.add(candidate)
    return candidate


def _device_fields(target: TargetDriver, alt: Alternative) -> dict[str, Any]:
    if alt.kind == "gpu":
        return {
            "deviceClassName": target.gpu_class,
            "allocationMode": "ExactCount",
            "count": alt.count,
        }
    if alt.any_of:
        expression = cel.profiles_selector(target, alt.any_of, alt.min_memory_bytes)
    elif alt.profile is None:
        expression = cel.profiles_selector(target, alt.full_gpu, None)
    else:
        expression = cel.profile_selector(
            target, alt.profile, min_memory_bytes=alt.min_memory_bytes
        )
    return {
        "deviceClassName": target.mig_class,
        "allocationMode": "ExactCount",
        "count": alt.count,
        "selectors": [{"cel": {"expression": expression}}],
    }


def claim_spec(
    requests: Sequence[ContainerRequest],
    target: TargetDriver,
    nvlink_sets: Sequence[NvlinkSet] | None = None,
) -> dict[str, Any]:
    """The ResourceClaimSpec for the pod's claim.

    ``nvlink_sets`` groups the requests whose NVLink alternatives share one domain; None: each
    request with an NVLink alternative on its own.
    """
    device_requests: list[dict[str, Any]] = []
    nvlink_refs: dict[str, list[str]] = {}
    """Per request, what a constraint names for its NVLink alternatives."""
    for request in requests:
        alternatives = request.alternatives
        if len(alternatives) == 1:
            alt = alternatives[0]
            device_requests.append({"name": request.name, "exactly": _device_fields(target, alt)})
            if alt.nvlink:
                nvlink_refs[request.name] = [request.name]
            continue
        taken: set[str] = set()
        subrequests = []
        for alt in alternatives:
            sub_name = unique_label(alt.base_name, taken)
            subrequests.append({"name": sub_name, **_device_fields(target, alt)})
            if alt.nvlink:
                nvlink_refs.setdefault(request.name, []).append(f"{request.name}/{sub_name}")
        device_requests.append({"name": request.name, "firstAvailable": subrequests})
    devices: dict[str, Any] = {"requests": device_requests}
    if nvlink_sets is None:
        nvlink_sets = [(r.name,) for r in requests]
    constraints: list[dict[str, Any]] = []
    seen: set[tuple[str, ...]] = set()
    for names in nvlink_sets:
        refs = tuple(ref for name in names for ref in nvlink_refs.get(name, ()))
        if refs and target.nvlink_attribute and refs not in seen:
            seen.add(refs)
            constraints.append({"requests": list(refs), "matchAttribute": target.nvlink_attribute})
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}


def template_spec(
    requests: Sequence[ContainerRequest],
    target: TargetDriver,
    nvlink_sets: Sequence[NvlinkSet] | None = None,
) -> dict[str, Any]:
    """The ResourceClaimTemplate's ``spec``: ``{spec: <claim spec>}``."""
    return {"spec": claim_spec(requests, target, nvlink_sets)}


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)
"""What ``json.dumps(value, sort_keys=True, separators=(",", ":"))`` uses, built once: dumps
with options builds a new encoder on every call. ``encode`` keeps no state between calls."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, ASCII: the same value always gives the same text."""
    return _CANONICAL.encode(value)


def template_name(spec: dict[str, Any]) -> str:
    """``gpu-slicer-<hash>``: the same spec always gives the same name."""
    digest = hashlib.sha256(canonical_json(spec).encode()).hexdigest()
    return TEMPLATE_PREFIX + digest[:HASH_CHARS]


def template_object(
    spec: dict[str, Any], namespace: str, *, name: str | None = None
) -> dict[str, Any]:
    """The full ResourceClaimTemplate; ``namespace`` "" leaves it to ``kubectl apply -n``.

    ``name``, when given, must be ``template_name(spec)`` (a caller that already knows it saves
    hashing the spec again).
    """
    metadata: dict[str, Any] = {
        "name": template_name(spec) if name is None else name,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": spec,
    }


def profiles_of(requests: Iterable[ContainerRequest]) -> list[str]:
    """Every MIG profile the requests may use, in order of first appearance."""
    seen: dict[str, None] = {}
    for request in requests:
        for alt in request.alternatives:
            for profile in (alt.profile,) if alt.profile else alt.any_of or alt.full_gpu:
                seen.setdefault(profile, None)
    return list(seen)
