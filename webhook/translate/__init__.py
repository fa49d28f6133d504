"""Translation of a pod's legacy GPU requests into one DRA ResourceClaim: pure, no I/O.

Pod (raw JSON, as received), namespace and policy in; JSON Patch operations, the content-addressed
ResourceClaimTemplate(s) and warnings out, or :class:`~webhook.errors.Denied` with a message that
says what would be valid. The rules (docs/translation.md has the full text):

* per container and init container (native sidecars included; ephemeral containers never):
  ``nvidia.com/gpu: N`` -> N whole GPUs (NVLink-first chain for N > 1, per policy ``nvlink``), or
  the namespace's right-sized chain; ``nvidia.com/mig-<profile>: N`` -> N slices of that profile,
  then larger profiles when the policy's ``migFallback`` says so;
* annotations ``gpu-slicer.io/profiles`` (explicit chain) or ``gpu-slicer.io/gpu-memory`` (every
  profile with at least that much memory, smallest first) give the chain of the containers named
  by ``gpu-slicer.io/containers`` (default: those with legacy requests, else the first container);
* chains built from the catalog use only the profiles of the policy's ``gpuModels`` (the
  namespace's when it sets its own), and a profile none of those models offers is denied;
* whole-GPU chains end with the MIG instance that spans a GPU (policy ``fullGpuMig``), for nodes
  whose GPUs run in MIG mode;
* one claim per pod; containers that want the same devices share requests as the kubelet's
  device manager shares them (an init container passes its devices on; sidecars and app
  containers add up), every other container gets its own; the legacy resource is removed from
  requests and limits; the pod's own ``resourceClaims`` are kept; idempotent.

The steps, one module each: ``reading`` (the pod down to its GPU shape), ``chains`` (what each
container asks for), ``request_sharing`` (the kubelet's sharing of devices between containers),
``claim`` (the claim per shape, remembered) and ``writing`` (the patch against this pod);
``conversion`` holds what they return and the limits they check. What they remember is
described in :mod:`webhook.remembered`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson

from gpu_slicer.core.identity import CONVERTED_ANNOTATION
from gpu_slicer.webhook import claims, sharing
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.translate.claim import SHAPE_CACHE_TEXT_MAX, derive_for
from gpu_slicer.webhook.translate.conversion import (
    CHANGE_ANNOTATION,
    MAX_CLAIM_DEVICES,
    MAX_CLAIM_REQUESTS,
    MAX_COUNT,
    WARNING_MAX_BYTES,
    Conversion,
    dict_of,
    short,
)
from gpu_slicer.webhook.translate.reading import (
    ANNOTATION_CONTAINERS,
    ANNOTATION_GPU_MEMORY,
    ANNOTATION_PROFILES,
    ANNOTATIONS_READ,
    SKIP_LABEL,
    Shape,
    already_converted,
    is_legacy_resource,
    left_behind,
    read_containers,
)
from gpu_slicer.webhook.translate.request_sharing import device_ranges
from gpu_slicer.webhook.translate.writing import write

if TYPE_CHECKING:
    from gpu_slicer.webhook.remembered import Remembered

__all__ = [
    "ANNOTATIONS_READ",
    "ANNOTATION_CONTAINERS",
    "ANNOTATION_GPU_MEMORY",
    "ANNOTATION_PROFILES",
    "CHANGE_ANNOTATION",
    "MAX_CLAIM_DEVICES",
    "MAX_CLAIM_REQUESTS",
    "MAX_COUNT",
    "SHAPE_CACHE_TEXT_MAX",
    "SKIP_LABEL",
    "WARNING_MAX_BYTES",
    "Conversion",
    "audit_warnings",
    "converted_annotation",
    "device_ranges",
    "is_legacy_resource",
    "translate_pod",
]


def translate_pod(
    pod: dict[str, Any],
    *,
    namespace: str,
    policy: Policy,
    native_extended: frozenset[str] = frozenset(),
    remembered: Remembered | None = None,
) -> Conversion:
    """Translate ``pod`` (raw JSON as received); raises Denied when it cannot be admitted.

    Reads the pod into its shape, derives the claim from the shape, then writes the patch
    against this pod's own JSON. ``remembered``: the caller's store of claims per shape and
    patches per standing (replicas and pods of one workload kind ask alike; the webhook's
    engine keeps one); None: nothing is kept, every call computes afresh. Either way the
    answer is the same: what is kept is the result of a pure function."""
    if not isinstance(pod, dict):
        raise Denied("the object is not a Pod (expected a JSON object)")
    metadata = dict_of(pod.get("metadata"))
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return Conversion(summary="no pod spec")
    if str(dict_of(metadata.get("labels")).get(SKIP_LABEL, "")).lower() == "true":
        return Conversion(summary=f"skipped: label {SKIP_LABEL}=true")
    if already_converted(spec):
        return Conversion(
            summary="already converted", warnings=left_behind(spec, policy, native_extended)
        )
    shared = sharing.other_sharing(spec)
    if shared:
        note = short(sharing.left_alone_warning(shared))
        return Conversion(summary="left alone: another GPU sharing model", warnings=[note])

    warnings: list[str] = []
    containers = read_containers(spec, policy, native_extended, warnings)
    deferred = tuple([(c.name, r) for c in containers for r in c.deferred])
    annotations = dict_of(metadata.get("annotations"))
    asked = tuple([(k, annotations[k]) for k in ANNOTATIONS_READ if k in annotations])
    if not asked and not any(c.legacy for c in containers):
        # Nothing asks for devices (deferred names alone convert nothing): no shape to derive.
        return Conversion(warnings=warnings, deferred=deferred)
    shape = Shape(tuple([c.facts() for c in containers]), asked)
    derived, kept = derive_for(shape, policy.for_namespace(namespace), policy.target, remembered)
    warnings.extend(derived.warnings)
    if not derived.requests:
        return Conversion(warnings=warnings, deferred=deferred)
    spec_out = orjson.loads(derived.template_spec)
    template = claims.template_object(spec_out, namespace, name=derived.template_name)
    return write(
        pod, containers, derived, remembered if kept else None, template, warnings, deferred
    )


def audit_warnings(conversion: Conversion) -> list[str]:
    """What audit mode returns: one warning per conversion it would have made, then the rest."""
    name = conversion.template_name
    out = [
        short(f"gpu-slicer audit: would convert {what} in {container} to claim template {name}")
        for container, what in conversion.changes
    ]
    return out + [short(w) for w in conversion.warnings]


def converted_annotation(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The decoded ``gpu-slicer.io/converted`` record of a pod, if it has a valid one."""
    raw = dict_of(dict_of(pod.get("metadata")).get("annotations")).get(CONVERTED_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
