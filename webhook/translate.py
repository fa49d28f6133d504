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
* one claim per pod, one request per converted container; the legacy resource is removed from
  requests and limits; the pod's own ``resourceClaims`` are kept; idempotent.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kube.quantity import QuantityError, format_bytes, parse_bytes, parse_count
from slicer import catalog
from webhook import claims, patch
from webhook.claims import Alternative, ContainerRequest
from webhook.errors import Denied
from webhook.policy import (
    ALL_MODELS,
    MAX_ALTERNATIVES,
    WHOLE_GPU,
    NamespaceRules,
    Policy,
    is_known_profile,
    model_profile_set,
    model_profiles,
)
from webhook.targets import TargetDriver, target_driver

LEGACY_GPU = "nvidia.com/gpu"
LEGACY_MIG_PREFIX = "nvidia.com/mig-"
ANNOTATION_PROFILES = "gpu-slicer.io/profiles"
ANNOTATION_GPU_MEMORY = "gpu-slicer.io/gpu-memory"
ANNOTATION_CONTAINERS = "gpu-slicer.io/containers"
ANNOTATION_CONVERTED = "gpu-slicer.io/converted"
SKIP_LABEL = "gpu-slicer.io/skip"
CHANGE_ANNOTATION = "annotation"
"""The ``what`` of a change made because of an annotation rather than a legacy resource."""

MAX_COUNT = 2**31 - 1
MAX_CLAIM_DEVICES = 32
"""Kubernetes allocates at most this many devices to one claim (``AllocationResultsMaxSize``):
a bigger claim is accepted by the API but the scheduler can never allocate it."""
WARNING_LIMIT = 119
_KINDS = ("initContainers", "containers")


@dataclass(frozen=True)
class Conversion:
    """What the webhook does to one pod. An empty ``patch`` means "admit unchanged"."""

    patch: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    changes: list[tuple[str, str]] = field(default_factory=list)
    summary: str = "nothing to convert"
    requests: tuple[ContainerRequest, ...] = ()
    """The claim's requests with their alternatives in preference order, for tools that reason
    about the chains (the simulator's baselines) without re-reading the template."""

    @property
    def template_name(self) -> str | None:
        if not self.templates:
            return None
        return str(self.templates[0]["metadata"]["name"])


@dataclass(eq=False)
class _Container:
    kind: str
    index: int
    name: str
    body: dict[str, Any]
    legacy: dict[str, int] = field(default_factory=dict)
    """Legacy resources to convert, name -> count (zero counts and deferred names left out)."""
    deferred: list[str] = field(default_factory=list)

    @property
    def path(self) -> list[patch.Token]:
        return ["spec", self.kind, self.index]


def is_legacy_resource(name: str) -> bool:
    return name == LEGACY_GPU or (
        name.startswith(LEGACY_MIG_PREFIX) and len(name) > len(LEGACY_MIG_PREFIX)
    )


def translate_pod(
    pod: dict[str, Any],
    *,
    namespace: str,
    policy: Policy,
    native_extended: frozenset[str] = frozenset(),
) -> Conversion:
    """Translate ``pod`` (raw JSON as received); raises Denied when it cannot be admitted."""
    if not isinstance(pod, dict):
        raise Denied("the object is not a Pod (expected a JSON object)")
    metadata = _dict(pod.get("metadata"))
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return Conversion(summary="no pod spec")
    if str(_dict(metadata.get("labels")).get(SKIP_LABEL, "")).lower() == "true":
        return Conversion(summary=f"skipped: label {SKIP_LABEL}=true")
    if _already_converted(spec):
        return Conversion(
            summary="already converted", warnings=_left_behind(spec, policy, native_extended)
        )

    target = target_driver(policy.target)
    rules = policy.for_namespace(namespace)
    annotations = _dict(metadata.get("annotations"))
    containers = _containers(spec)
    warnings: list[str] = []
    for container in containers:
        _read_legacy(container, policy, native_extended, warnings)

    chain = _annotation_chain(annotations, rules.gpu_models)
    targeted = _targeted(annotations, containers, chain is not None)

    requests: list[ContainerRequest] = []
    converted: list[tuple[_Container, str, ContainerRequest]] = []
    record: list[dict[str, Any]] = []
    taken: set[str] = set()
    for container in containers:
        is_targeted = container in targeted
        if container.deferred and is_targeted:
            # A DeviceClass already gives this container devices for its legacy request;
            # a claim on top would give it a second set.
            is_targeted = False
            warnings.append(
                _short(
                    f"{container.name}: left to the scheduler's DRA extended resources "
                    f"({', '.join(container.deferred)}); annotation not applied"
                )
            )
        if not is_targeted and not container.legacy:
            continue
        alternatives, what, via = _alternatives(
            container, is_targeted, chain, rules, target, warnings
        )
        request = ContainerRequest(
            name=claims.unique_label(claims.dns_label(container.name, fallback="container"), taken),
            alternatives=alternatives,
        )
        requests.append(request)
        converted.append((container, what, request))
        entry: dict[str, Any] = {"container": container.name, "request": request.name}
        if what in container.legacy:
            entry["from"] = {what: container.legacy[what]}
        if via:
            entry["via"] = via
        entry["to"] = [alt.label for alt in alternatives]
        record.append(entry)
    if not requests:
        return Conversion(warnings=warnings)
    if len(requests) > 32:
        raise Denied(f"{len(requests)} containers need GPUs; a claim holds at most 32 requests")
    devices = sum(min(alt.count for alt in r.alternatives) for r in requests)
    if devices > MAX_CLAIM_DEVICES:
        wanted = ", ".join(
            f"{r.name}: {min(alt.count for alt in r.alternatives)}" for r in requests
        )
        raise Denied(
            f"the pod needs {devices} devices ({wanted}); Kubernetes allocates at most "
            f"{MAX_CLAIM_DEVICES} devices to one claim, so it could never be scheduled"
        )

    spec_out = claims.template_spec(requests, target)
    name = _template_name(tuple(requests), target)
    template = claims.template_object(spec_out, namespace, name=name)
    ops: list[dict[str, Any]] = []
    changes: list[tuple[str, str]] = []
    for container, what, request in converted:
        resources = _dict(container.body.get("resources"))
        for section in ("requests", "limits"):
            values = _dict(resources.get(section))
            present = [r for r in container.legacy if r in values]
            if not present:
                continue
            if len(present) == len(values):
                # Only the legacy resource was there: drop the map rather than leave it empty.
                ops.append(patch.remove([*container.path, "resources", section]))
                continue
            ops.extend(patch.remove([*container.path, "resources", section, r]) for r in present)
        ops.append(
            patch.append(
                pod,
                [*container.path, "resources", "claims"],
                {"name": claims.CLAIM_NAME, "request": request.name},
            )
        )
        changes.append((container.name, what))
    ops.append(
        patch.append(
            pod,
            ["spec", "resourceClaims"],
            {"name": claims.CLAIM_NAME, "resourceClaimTemplateName": name},
        )
    )
    converted_value = claims.canonical_json(
        {"claim": claims.CLAIM_NAME, "template": name, "containers": record}
    )
    ops.append(
        patch.set_map_entry(pod, ["metadata", "annotations"], ANNOTATION_CONVERTED, converted_value)
    )
    summary = "converted " + ", ".join(f"{what} in {who}" for who, what in changes) + f" to {name}"
    return Conversion(
        patch=ops,
        templates=[template],
        warnings=warnings,
        changes=changes,
        summary=summary,
        requests=tuple(requests),
    )


def audit_warnings(conversion: Conversion) -> list[str]:
    """What audit mode returns: one warning per conversion it would have made, then the rest."""
    name = conversion.template_name
    out = [
        _short(f"gpu-slicer audit: would convert {what} in {container} to claim template {name}")
        for container, what in conversion.changes
    ]
    return out + [_short(w) for w in conversion.warnings]


def converted_annotation(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The decoded ``gpu-slicer.io/converted`` record of a pod, if it has a valid one."""
    raw = _dict(_dict(pod.get("metadata")).get("annotations")).get(ANNOTATION_CONVERTED)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- reading the pod ------------------------------------------------------------------------


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _short(text: str) -> str:
    return text if len(text) <= WARNING_LIMIT else text[: WARNING_LIMIT - 3] + "..."


def _already_converted(spec: dict[str, Any]) -> bool:
    entries = spec.get("resourceClaims")
    return isinstance(entries, list) and any(
        isinstance(e, dict) and e.get("name") == claims.CLAIM_NAME for e in entries
    )


def _left_behind(
    spec: dict[str, Any], policy: Policy, native_extended: frozenset[str]
) -> list[str]:
    """Warnings for legacy GPU requests an already-converted pod still has.

    A pod gpu-slicer converted has none left; one that still has some got its ``gpu-slicer``
    claim entry from another tool, or the container from a webhook that ran after the
    conversion. It is admitted as it is, but silently keeping the legacy request would hide why
    the pod runs (or waits) the legacy way.
    """
    warnings: list[str] = []
    for container in _containers(spec):
        try:
            _read_legacy(container, policy, native_extended, [])
        except Denied:
            continue
        for resource in container.legacy:
            warnings.append(
                _short(
                    f"{container.name}: {resource} not converted: the pod already has a "
                    f"resourceClaims entry named {claims.CLAIM_NAME}"
                )
            )
    return warnings


def _containers(spec: dict[str, Any]) -> list[_Container]:
    """Init containers (native sidecars included) and containers; never ephemeral containers."""
    found: list[_Container] = []
    for kind in _KINDS:
        items = spec.get(kind)
        if not isinstance(items, list):
            continue
        for index, body in enumerate(items):
            if isinstance(body, dict):
                found.append(
                    _Container(kind=kind, index=index, name=str(body.get("name", "")), body=body)
                )
    return found


def _read_legacy(
    container: _Container, policy: Policy, native_extended: frozenset[str], warnings: list[str]
) -> None:
    resources = _dict(container.body.get("resources"))
    requests = _dict(resources.get("requests"))
    limits = _dict(resources.get("limits"))
    names = [
        n
        for n in dict.fromkeys([*limits, *requests])
        if isinstance(n, str) and is_legacy_resource(n)
    ]
    for resource in names:
        counts = {}
        for section, values in (("limits", limits), ("requests", requests)):
            if resource in values:
                try:
                    counts[section] = parse_count(values[resource])
                except QuantityError as exc:
                    raise Denied(
                        f"container {container.name!r}: {section}[{resource}]: {exc}"
                    ) from exc
        if len(set(counts.values())) > 1:
            raise Denied(
                f"container {container.name!r}: {resource} is {counts['requests']} in requests "
                f"but {counts['limits']} in limits; extended resources need them equal"
            )
        count = next(iter(counts.values()))
        if count == 0:
            continue
        if count > MAX_COUNT:
            raise Denied(f"container {container.name!r}: {resource}: {count} is too many devices")
        if policy.native_extended_resources == "defer" and resource in native_extended:
            container.deferred.append(resource)
            warnings.append(
                _short(
                    f"{resource} in {container.name} left to the scheduler: a DeviceClass "
                    "serves it (nativeExtendedResources: defer)"
                )
            )
            continue
        container.legacy[resource] = count
    if len(container.legacy) > 1:
        raise Denied(
            f"container {container.name!r} asks for {', '.join(sorted(container.legacy))}; "
            "gpu-slicer converts one GPU resource per container: keep one of them"
        )


def _targeted(
    annotations: dict[str, Any], containers: Sequence[_Container], has_chain: bool
) -> list[_Container]:
    """Containers the annotations apply to (identity list; empty when no annotation asks)."""
    raw = annotations.get(ANNOTATION_CONTAINERS)
    by_name = {c.name: c for c in containers}
    if raw is not None:
        names = [n.strip() for n in str(raw).split(",")]
        if not all(names):
            raise Denied(
                f"annotation {ANNOTATION_CONTAINERS}: {str(raw)!r} has an empty name; "
                f"give a comma-separated list of: {', '.join(by_name) or '(no containers)'}"
            )
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise Denied(
                f"annotation {ANNOTATION_CONTAINERS}: no container named "
                f"{', '.join(repr(n) for n in unknown)}; the pod has: "
                f"{', '.join(by_name) or '(no containers)'}"
            )
        return [by_name[n] for n in dict.fromkeys(names)]
    if not has_chain:
        return []
    with_legacy = [c for c in containers if c.legacy]
    if with_legacy:
        return with_legacy
    first = [c for c in containers if c.kind == "containers"]
    return first[:1]


# --- chains -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Chain:
    source: str
    entries: tuple[tuple[str, int | None], ...]
    """(profile or "gpu", minimum memory in bytes or None)."""


def _annotation_chain(annotations: dict[str, Any], models: tuple[str, ...]) -> _Chain | None:
    profiles = annotations.get(ANNOTATION_PROFILES)
    memory = annotations.get(ANNOTATION_GPU_MEMORY)
    if profiles is not None and memory is not None:
        raise Denied(
            f"annotations {ANNOTATION_PROFILES} and {ANNOTATION_GPU_MEMORY} both given; "
            "use one: an explicit chain or a memory size"
        )
    if profiles is not None:
        chain = tuple((p, None) for p in _parse_profiles(profiles, models))
        return _Chain(ANNOTATION_PROFILES, chain)
    if memory is not None:
        return _Chain(ANNOTATION_GPU_MEMORY, _memory_chain(memory, models))
    return None


@functools.lru_cache(maxsize=1024)
def _template_name(requests: tuple[ContainerRequest, ...], target: TargetDriver) -> str:
    """``claims.template_name`` of the spec these requests make, a pure function of them.

    Replicas of a workload make equal requests: their spec is hashed once, not once per pod.
    """
    return claims.template_name(claims.template_spec(requests, target))


def _valid_chain_entries(models: tuple[str, ...]) -> str:
    return f"valid: {WHOLE_GPU} (a whole GPU), " + ", ".join(model_profiles(models))


def _models_note(models: tuple[str, ...]) -> str:
    """Where the valid names come from, when the policy narrows the catalog."""
    return "" if models == ALL_MODELS else f" (policy gpuModels: {', '.join(models)})"


def _not_offered(names: Sequence[str], models: tuple[str, ...]) -> str:
    """``unknown profile 'x'`` or, for a catalog profile the models lack, says so."""
    quoted = ", ".join(repr(n) for n in names)
    if models == ALL_MODELS or not all(is_known_profile(n) for n in names):
        return f"unknown profile {quoted}"
    return f"profile {quoted} is not offered by the cluster's GPU models{_models_note(models)}"


@functools.cache
def _gpu_models(models: tuple[str, ...]) -> tuple[catalog.GpuModel, ...]:
    return tuple(m for m in catalog.MODELS if m.key in models)


def _parse_profiles(raw: Any, models: tuple[str, ...]) -> list[str]:
    names = [n.strip() for n in str(raw).split(",")]
    if not all(names):
        raise Denied(
            f"annotation {ANNOTATION_PROFILES}: {str(raw)!r} has an empty entry; "
            f"{_valid_chain_entries(models)}"
        )
    if len(names) > MAX_ALTERNATIVES:
        raise Denied(
            f"annotation {ANNOTATION_PROFILES}: {len(names)} profiles; at most "
            f"{MAX_ALTERNATIVES} alternatives are allowed"
        )
    offered = model_profile_set(models)
    unknown = [n for n in names if n != WHOLE_GPU and n not in offered]
    if unknown:
        raise Denied(
            f"annotation {ANNOTATION_PROFILES}: {_not_offered(unknown, models)}; "
            f"{_valid_chain_entries(models)}"
        )
    if len(set(names)) != len(names):
        raise Denied(f"annotation {ANNOTATION_PROFILES}: {str(raw)!r} lists a profile twice")
    return names


def _memory_chain(raw: Any, models: tuple[str, ...]) -> tuple[tuple[str, int | None], ...]:
    try:
        wanted = parse_bytes(raw)
    except QuantityError as exc:
        raise Denied(
            f"annotation {ANNOTATION_GPU_MEMORY}: {exc}; give a size such as 12Gi or 40G"
        ) from exc
    entries = _memory_entries(wanted, models)
    if entries is None:
        model, largest = max(
            ((m, p) for m in _gpu_models(models) for p in m.profiles),
            key=lambda mp: mp[1].memory_bytes,
        )
        raise Denied(
            f"annotation {ANNOTATION_GPU_MEMORY}: no MIG profile has {raw} of memory; the largest "
            f"is {largest.name} ({format_bytes(largest.memory_bytes)}) on {model.key}"
            f"{_models_note(models)}"
        )
    return entries


@functools.lru_cache(maxsize=256)
def _memory_entries(
    wanted: int, models: tuple[str, ...]
) -> tuple[tuple[str, int | None], ...] | None:
    """The memory chain for ``wanted`` bytes on ``models`` (None: none of their profiles has
    that much); depends only on the static catalog, so it is computed once per size and model
    set. Only the policy's models count: profiles of other GPUs would use up the 8 entries."""
    in_force = _gpu_models(models)
    found = catalog.profiles_with_memory(wanted, in_force)
    if not found:
        return None
    entries: dict[str, int | None] = {}
    for _model, profile in found:
        if profile.name in entries:
            continue
        smaller_twin = any(
            p.name == profile.name and p.memory_bytes < wanted
            for m in in_force
            for p in m.profiles
        )
        entries[profile.name] = wanted if smaller_twin else None
        if len(entries) == MAX_ALTERNATIVES:
            break
    return tuple(entries.items())


@functools.cache
def _larger_profiles(name: str, models: tuple[str, ...]) -> tuple[str, ...]:
    """Profiles bigger than ``name`` on those of ``models`` that offer it, smallest first
    (cached: it depends only on the static catalog, and callers pass catalog profile names)."""
    found: list[tuple[int, int, str]] = []
    for model in _gpu_models(models):
        if not model.has_profile(name):
            continue
        base = model.profile(name)
        for profile in model.profiles:
            if profile.media_exclusive or profile.name == name:
                continue
            bigger = (profile.memory_bytes, profile.compute_slices) > (
                base.memory_bytes,
                base.compute_slices,
            )
            if bigger and profile.memory_bytes >= base.memory_bytes:
                found.append((profile.memory_bytes, profile.compute_slices, profile.name))
    return tuple(dict.fromkeys(n for _m, _c, n in sorted(found)))


def _alternatives(
    container: _Container,
    targeted: bool,
    chain: _Chain | None,
    rules: NamespaceRules,
    target: TargetDriver,
    warnings: list[str],
) -> tuple[tuple[Alternative, ...], str, str | None]:
    """The alternatives of one container, what is converted (a legacy resource name or
    "annotation") and the annotation that chose the chain, if one did."""
    legacy_name, legacy_count = next(iter(container.legacy.items()), (None, 1))
    if targeted and chain is not None:
        alts = tuple(_entry(p, legacy_count, memory) for p, memory in chain.entries)
        return alts, legacy_name or CHANGE_ANNOTATION, chain.source
    if legacy_name is None:
        # Named by gpu-slicer.io/containers without any chain: what nvidia.com/gpu: 1 means here.
        alts = _gpu_alternatives(1, rules, target, container, warnings)
        return alts, CHANGE_ANNOTATION, ANNOTATION_CONTAINERS
    if legacy_name == LEGACY_GPU:
        alts = _gpu_alternatives(legacy_count, rules, target, container, warnings)
        return alts, legacy_name, None
    models = rules.gpu_models
    profile = _profile_of_resource(legacy_name[len(LEGACY_MIG_PREFIX) :], models)
    if profile not in model_profile_set(models):
        raise Denied(
            f"container {container.name!r}: {legacy_name}: no GPU model offers MIG profile "
            f"{profile!r}{_models_note(models)}; valid profiles: "
            f"{', '.join(model_profiles(models))}"
        )
    fallbacks = rules.mig_fallback.fallbacks_for(profile)
    if fallbacks is None:
        larger = rules.mig_fallback.mode == "larger"
        fallbacks = _larger_profiles(profile, models) if larger else ()
    names = [profile, *(f for f in fallbacks if f != profile)][:MAX_ALTERNATIVES]
    via = "policy migFallback" if len(names) > 1 else None
    return tuple(_entry(n, legacy_count, None) for n in names), legacy_name, via


def _profile_of_resource(token: str, models: tuple[str, ...]) -> str:
    """The MIG profile a ``nvidia.com/mig-<token>`` resource stands for.

    A resource name cannot hold ``+``, so the NVIDIA device plugin advertises ``1g.10gb+me`` as
    ``nvidia.com/mig-1g.10gb.me``: the dots after ``<g>g.<mem>gb`` were ``+``. A token that
    is a profile name as it is (or matches none either way) is returned unchanged.
    """
    offered = model_profile_set(models)
    if token in offered:
        return token
    parts = token.split(".")
    if len(parts) > 2:
        spelled = ".".join(parts[:2]) + "".join(f"+{p}" for p in parts[2:])
        if spelled in offered:
            return spelled
    return token


@functools.lru_cache(maxsize=1024)
def _entry(name: str, count: int, min_memory: int | None) -> Alternative:
    """One alternative; cached, as Alternatives are immutable and replicas ask for the same."""
    if name == WHOLE_GPU:
        return _whole_gpus(count, False)
    return Alternative(kind="mig", count=count, profile=name, min_memory_bytes=min_memory)


@functools.lru_cache(maxsize=256)
def _whole_gpus(count: int, nvlink: bool) -> Alternative:
    return Alternative(kind="gpu", count=count, nvlink=nvlink)


def _gpu_alternatives(
    count: int,
    rules: NamespaceRules,
    target: TargetDriver,
    container: _Container,
    warnings: list[str],
) -> tuple[Alternative, ...]:
    if rules.gpu is not None:
        return tuple(_entry(n, count, None) for n in rules.gpu)
    if count == 1 or rules.nvlink == "none":
        return (_whole_gpus(count, False),)
    if target.nvlink_attribute is None:
        warnings.append(
            _short(
                f"{container.name}: {count} GPUs without an NVLink constraint: target "
                f"{target.name} publishes no NVLink attribute"
            )
        )
        return (_whole_gpus(count, False),)
    nvlink = _whole_gpus(count, True)
    if rules.nvlink == "strict":
        return (nvlink,)
    return (nvlink, _whole_gpus(count, False))
