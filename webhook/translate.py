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
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from kube.quantity import QuantityError, format_bytes, parse_bytes, parse_count
from slicer import catalog
from slicer.identity import CONVERTED_ANNOTATION, LEGACY_GPU, LEGACY_MIG_PREFIX
from webhook import claims, patch, sharing
from webhook.claims import Alternative, ContainerRequest
from webhook.errors import Denied
from webhook.policy import (
    ALL_MODELS,
    MAX_ALTERNATIVES,
    WHOLE_GPU,
    NamespaceRules,
    Policy,
    Target,
    full_gpu_profiles,
    is_known_profile,
    model_profile_set,
    model_profiles,
)
from webhook.suggest import did_you_mean
from webhook.targets import TargetDriver, target_driver

ANNOTATION_PROFILES = "gpu-slicer.io/profiles"
ANNOTATION_GPU_MEMORY = "gpu-slicer.io/gpu-memory"
ANNOTATION_CONTAINERS = "gpu-slicer.io/containers"
SKIP_LABEL = "gpu-slicer.io/skip"
CHANGE_ANNOTATION = "annotation"
"""The ``what`` of a change made because of an annotation rather than a legacy resource."""

MAX_COUNT = 2**31 - 1
"""A legacy count above this (the largest int32) is refused as a mistake, not put in a claim."""
MAX_CLAIM_DEVICES = 32
"""Kubernetes allocates at most this many devices to one claim (``AllocationResultsMaxSize``):
a bigger claim is accepted by the API but the scheduler can never allocate it."""
MAX_CLAIM_REQUESTS = 32
"""The API's limit on ``devices.requests`` of one claim."""
WARNING_MAX_BYTES = 119
"""The apiserver refuses a warning of 120 characters or more; counted in UTF-8 bytes (never
fewer than characters) by the engine, which cuts every warning it returns to this."""
_KINDS = ("initContainers", "containers")


@dataclass(frozen=True)
class Conversion:
    """What the webhook does to one pod. An empty ``patch`` means "admit unchanged"."""

    patch: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    changes: list[tuple[str, str]] = field(default_factory=list)
    summary: str = "nothing to convert"
    deferred: tuple[tuple[str, str], ...] = ()
    """(container, legacy resource) left unconverted because a DeviceClass serves the resource
    and the policy defers to it (counted in metrics)."""
    requests: tuple[ContainerRequest, ...] = ()
    """The claim's requests with their alternatives in preference order, for tools that reason
    about the chains (the simulator's baselines) without re-reading the template."""

    @property
    def template_name(self) -> str | None:
        if not self.templates:
            return None
        return str(self.templates[0]["metadata"]["name"])


@dataclass(eq=False, slots=True)
class _Container:
    """A container of the pod being read: its raw body and the legacy requests found in it."""

    kind: str
    index: int
    name: str
    body: dict[str, Any]
    resources: dict[str, Any]
    """The body's ``resources`` ({} when it has none or they are not a map)."""
    legacy: dict[str, int] = field(default_factory=dict)
    """Legacy resources to convert, name -> count (zero counts and deferred names left out)."""
    deferred: list[str] = field(default_factory=list)

    @property
    def restart_always(self) -> bool:
        return self.body.get("restartPolicy") == "Always"

    def facts(self) -> _Facts:
        return _Facts(
            self.kind,
            self.index,
            self.name,
            self.restart_always,
            next(iter(self.legacy.items()), None),
            tuple(self.deferred),
        )


class _Facts(NamedTuple):
    """What the claim and its template depend on of one container (read once, hashable): the
    plan is derived from these alone, so pods that differ elsewhere share it."""

    kind: str
    position: int
    """Index in the pod's list of ``kind``."""
    name: str
    restart_always: bool
    legacy: tuple[str, int] | None
    """The legacy resource to convert and its count (a container converts at most one)."""
    deferred: tuple[str, ...]

    @property
    def long_running(self) -> bool:
        return _long_running(self.kind, self.restart_always)


def _long_running(kind: str, restart_always: bool) -> bool:
    """Runs until the pod ends, so holds its devices: app containers, and sidecars (restartable
    init containers, which keep running beside the app containers)."""
    return kind == "containers" or (kind == "initContainers" and restart_always)


Builder = Callable[[int, bool], tuple[Alternative, ...]]
"""The chain of a kind of device for ``count`` devices; the flag says whether a container that
uses them wants several, which is when NVLink alternatives come first."""


@dataclass(eq=False)
class _Need:
    """What one converted container asks for: ``count`` devices of one kind (``key``)."""

    container: _Facts
    count: int
    what: str
    """The legacy resource converted, or "annotation"."""
    via: str | None
    key: tuple[Any, ...]
    """Containers with equal keys want the same devices, so they can pass them on."""
    build: Builder


class _Shape(NamedTuple):
    """Everything the claim, its template and the record depend on: the containers' facts and
    the gpu-slicer annotations (key, value), in a fixed order. Two pods of one shape get the
    same claim; only where the patch points (which maps and lists exist) differs per pod."""

    containers: tuple[_Facts, ...]
    annotations: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class _Derived:
    """The part of a conversion that follows from the pod's :class:`_Shape` alone. Shared
    between the pods of one shape: each conversion gets its own template, lists and operations
    (callers may change what they are given), never objects held here."""

    warnings: tuple[str, ...] = ()
    requests: tuple[ContainerRequest, ...] = ()
    """Empty: nothing to convert."""
    nvlink_sets: tuple[claims.NvlinkSet, ...] = ()
    uses: tuple[_Use, ...] = ()
    template_name: str = ""
    changes: tuple[tuple[str, str], ...] = ()
    record: str = ""
    """The value of the ``gpu-slicer.io/converted`` annotation."""
    summary: str = ""
    patches: dict[tuple[int, ...], bytes] = field(default_factory=dict, compare=False)
    """The patch (JSON) for each :func:`_layout` seen so far, at most LAYOUTS_KEPT."""


class _Use(NamedTuple):
    """A converted container: its place in the shape (which is its place among the pod's
    containers as read), its facts, and the claim's requests it references, in order."""

    place: int
    facts: _Facts
    names: tuple[str, ...]


ANNOTATIONS_READ = (ANNOTATION_PROFILES, ANNOTATION_GPU_MEMORY, ANNOTATION_CONTAINERS)
"""The annotations translation reads (the skip label and the pod's claims are checked first)."""
SHAPE_CACHE_TEXT_MAX = 4096
"""Shapes whose names and annotation values add up to more characters are derived every time,
never remembered: a pod of many containers with long names would pin its size per entry."""
_NAME = operator.attrgetter("name")


_VENDOR = LEGACY_GPU[: LEGACY_GPU.index("/") + 1]
"""``nvidia.com/``: what every legacy resource name starts with."""


def _is_vendor_key(key: object) -> bool:
    return isinstance(key, str) and key.startswith(_VENDOR)


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
    """Translate ``pod`` (raw JSON as received); raises Denied when it cannot be admitted.

    Reads the pod into its :class:`_Shape`, derives the claim from the shape (remembered per
    shape: replicas and pods of one workload kind ask alike), then writes the patch against
    this pod's own JSON."""
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
    shared = sharing.other_sharing(spec)
    if shared:
        note = _short(sharing.left_alone_warning(shared))
        return Conversion(summary="left alone: another GPU sharing model", warnings=[note])

    warnings: list[str] = []
    containers = _read_containers(spec, policy, native_extended, warnings)
    deferred = tuple([(c.name, r) for c in containers for r in c.deferred])
    annotations = _dict(metadata.get("annotations"))
    asked = tuple([(k, annotations[k]) for k in ANNOTATIONS_READ if k in annotations])
    if not asked and not any(c.legacy for c in containers):
        # Nothing asks for devices (deferred names alone convert nothing): no shape to derive.
        return Conversion(warnings=warnings, deferred=deferred)
    shape = _Shape(tuple([c.facts() for c in containers]), asked)
    derived = _derive_for(shape, policy.for_namespace(namespace), policy.target)
    warnings.extend(derived.warnings)
    if not derived.requests:
        return Conversion(warnings=warnings, deferred=deferred)
    spec_out = claims.template_spec(
        derived.requests, target_driver(policy.target), derived.nvlink_sets
    )
    template = claims.template_object(spec_out, namespace, name=derived.template_name)
    return _write(pod, containers, derived, template, warnings, deferred)


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
    raw = _dict(_dict(pod.get("metadata")).get("annotations")).get(CONVERTED_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- translate_pod's steps: reading the containers -------------------------------------------


def _read_containers(
    spec: dict[str, Any], policy: Policy, native_extended: frozenset[str], warnings: list[str]
) -> list[_Container]:
    """The pod's containers with their legacy requests read; refuses a pod with more running
    containers asking for GPUs than a claim has requests, without reading the rest."""
    containers = _containers(spec)
    running = 0
    for container in containers:
        _read_legacy(container, policy, native_extended, warnings)
        if container.legacy and _long_running(container.kind, container.restart_always):
            # App containers and sidecars run side by side, so each needs devices (and so a
            # request) of its own.
            running += 1
            if running > MAX_CLAIM_REQUESTS:
                raise Denied(
                    f"more than {MAX_CLAIM_REQUESTS} app containers and sidecars ask for GPUs "
                    f"(the {running}th is {container.name!r}); each needs a request of its own "
                    f"and a claim holds at most {MAX_CLAIM_REQUESTS} requests"
                )
    return containers


# --- translate_pod's steps: the claim, from the shape ----------------------------------------


def _derive_for(shape: _Shape, rules: NamespaceRules, target: Target) -> _Derived:
    """:func:`_derive`, remembered unless the shape is too large to keep, or holds an
    annotation value that is not text (a pod read from YAML may have any)."""
    size = sum(map(len, map(_NAME, shape.containers)))
    for _key, value in shape.annotations:
        size += len(value) if isinstance(value, str) else SHAPE_CACHE_TEXT_MAX + 1
    if size > SHAPE_CACHE_TEXT_MAX:
        return _derive(shape, rules, target)
    return _derive_cached(shape, rules, target)


def _derive(shape: _Shape, rules: NamespaceRules, target: Target) -> _Derived:
    """The claim a pod of this shape gets, pure in its arguments; raises Denied."""
    driver = target_driver(target)
    warnings: list[str] = []
    needs = _needs(shape, rules, driver, warnings)
    if not needs:
        return _Derived(warnings=tuple(warnings))
    plan = _plan(needs)
    _check_claim_size(plan.requests)
    name = claims.template_name(claims.template_spec(plan.requests, driver, plan.nvlink_sets))
    uses = tuple(
        _Use(shape.containers.index(n.container), n.container, plan.uses[id(n)]) for n in needs
    )
    changes = tuple((need.container.name, need.what) for need in needs)
    record = claims.canonical_json(
        {
            "claim": claims.CLAIM_NAME,
            "template": name,
            "containers": [_record_entry(need, plan.uses[id(need)]) for need in needs],
        }
    )
    summary = "converted " + ", ".join(f"{what} in {who}" for who, what in changes) + f" to {name}"
    return _Derived(
        warnings=tuple(warnings),
        requests=plan.requests,
        nvlink_sets=plan.nvlink_sets,
        uses=uses,
        template_name=name,
        changes=changes,
        record=record,
        summary=summary,
    )


_derive_cached = functools.lru_cache(maxsize=1024)(_derive)


def _needs(
    shape: _Shape, rules: NamespaceRules, target: TargetDriver, warnings: list[str]
) -> list[_Need]:
    """What each container that gets devices asks for, in pod order."""
    annotations = dict(shape.annotations)
    containers = shape.containers
    chain = _annotation_chain(annotations, rules.gpu_models)
    targeted = _targeted(annotations, containers, chain is not None)
    needs: list[_Need] = []
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
        needs.append(_need(container, is_targeted, chain, rules, target, warnings))
    return needs


def _check_claim_size(requests: Sequence[ContainerRequest]) -> None:
    """Refuses a claim the API would refuse, or one the scheduler could never allocate."""
    if len(requests) > MAX_CLAIM_REQUESTS:
        raise Denied(
            f"the pod needs {len(requests)} requests in its claim ("
            f"{', '.join(r.name for r in requests[: MAX_CLAIM_REQUESTS + 1])}...); a claim holds "
            f"at most {MAX_CLAIM_REQUESTS}"
        )
    devices = sum(r.alternatives[0].count for r in requests)
    if devices > MAX_CLAIM_DEVICES:
        wanted = ", ".join(f"{r.name}: {r.alternatives[0].count}" for r in requests)
        raise Denied(
            f"the pod needs {devices} devices ({wanted}); Kubernetes allocates at most "
            f"{MAX_CLAIM_DEVICES} devices to one claim, so it could never be scheduled"
        )


def _record_entry(need: _Need, names: Sequence[str]) -> dict[str, Any]:
    """The container's line in ``gpu-slicer.io/converted``."""
    container = need.container
    entry: dict[str, Any] = {"container": container.name}
    if len(names) == 1:
        entry["request"] = names[0]
    else:
        entry["requests"] = list(names)
    if container.legacy is not None and need.what == container.legacy[0]:
        entry["from"] = {need.what: container.legacy[1]}
    if need.via:
        entry["via"] = need.via
    entry["to"] = [alt.label for alt in need.build(need.count, need.count > 1)]
    return entry


# --- translate_pod's steps: the patch, against this pod --------------------------------------


def _write(
    pod: dict[str, Any],
    containers: Sequence[_Container],
    derived: _Derived,
    template: dict[str, Any],
    warnings: list[str],
    deferred: tuple[tuple[str, str], ...],
) -> Conversion:
    """The patch that points this pod's containers at the derived claim's requests.

    The operations depend on the shape and on where the pod's maps and lists stand
    (:func:`_layout`), nothing else: pods of one shape and layout get the same patch, so it is
    written once and each further pod gets a fresh copy decoded from its JSON."""
    layout = _layout(pod, containers, derived)
    known = derived.patches.get(layout)
    if known is not None:
        ops: list[dict[str, Any]] = orjson.loads(known)
    else:
        ops = _patch(derived, layout)
        if len(derived.patches) < LAYOUTS_KEPT:
            derived.patches[layout] = orjson.dumps(ops)
    return Conversion(
        patch=ops,
        templates=[template],
        warnings=warnings,
        changes=list(derived.changes),
        summary=derived.summary,
        deferred=deferred,
        requests=derived.requests,
    )


LAYOUTS_KEPT = 16
"""Patches remembered per shape; pods of one workload share one layout, a few at most."""
_ABSENT, _ONLY, _AMONG = 0, 1, 2
"""Where a converted container's legacy resource is in one of its resources sections."""


def _layout(
    pod: dict[str, Any], containers: Sequence[_Container], derived: _Derived
) -> tuple[int, ...]:
    """Where this pod stands for each operation: per converted container, its legacy
    resource in requests and in limits (absent, the only entry, among others) and the
    ``patch.list_state`` of its ``resources.claims``; then the list state of
    ``spec.resourceClaims`` and the ``patch.map_state`` of ``metadata.annotations``."""
    layout: list[int] = []
    for use in derived.uses:
        container = containers[use.place]
        legacy = use.facts.legacy
        for section in ("requests", "limits"):
            values = _dict(container.resources.get(section))
            if legacy is None or legacy[0] not in values:
                layout.append(_ABSENT)
            else:
                layout.append(_ONLY if len(values) == 1 else _AMONG)
        layout.append(patch.list_state(container.body, _CLAIMS))
    layout.append(patch.list_state(pod, _POD_CLAIMS))
    layout.append(patch.map_state(pod, _ANNOTATIONS))
    return tuple(layout)


_CLAIMS = ("resources", "claims")
_POD_CLAIMS = ("spec", "resourceClaims")
_ANNOTATIONS = ("metadata", "annotations")


def _patch(derived: _Derived, layout: tuple[int, ...]) -> list[dict[str, Any]]:
    """The operations for a pod of ``derived``'s shape that stands as ``layout`` says: drop
    each converted container's legacy resource, reference the claim's requests, add the
    claim and the ``gpu-slicer.io/converted`` record."""
    ops: list[dict[str, Any]] = []
    states = iter(layout)
    for use in derived.uses:
        path: list[patch.Token] = ["spec", use.facts.kind, use.facts.position]
        for section in ("requests", "limits"):
            state = next(states)
            if state == _ONLY:
                # Only the legacy resource was there: drop the map rather than leave it empty.
                ops.append(patch.remove([*path, "resources", section]))
            elif state == _AMONG and use.facts.legacy is not None:
                ops.append(patch.remove([*path, "resources", section, use.facts.legacy[0]]))
        refs = [{"name": claims.CLAIM_NAME, "request": n} for n in use.names]
        ops.extend(patch.list_ops(next(states), _CLAIMS, refs, at=path))
    entry = {"name": claims.CLAIM_NAME, "resourceClaimTemplateName": derived.template_name}
    ops.extend(patch.list_ops(next(states), _POD_CLAIMS, [entry]))
    ops.append(patch.map_entry_op(next(states), _ANNOTATIONS, CONVERTED_ANNOTATION, derived.record))
    return ops


# --- reading the pod ------------------------------------------------------------------------


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _short(text: str) -> str:
    return text if len(text) <= WARNING_MAX_BYTES else text[: WARNING_MAX_BYTES - 3] + "..."


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
                name = body.get("name", "")
                resources = body.get("resources")
                found.append(
                    _Container(
                        kind,
                        index,
                        name if isinstance(name, str) else str(name),
                        body,
                        resources if isinstance(resources, dict) else {},
                    )
                )
    return found


def _read_legacy(
    container: _Container, policy: Policy, native_extended: frozenset[str], warnings: list[str]
) -> None:
    resources = container.resources
    requests = _dict(resources.get("requests"))
    limits = _dict(resources.get("limits"))
    # The vendor prefix first: most keys are cpu and memory, and this keeps them cheap.
    names = [n for n in limits if _is_vendor_key(n) and is_legacy_resource(n)]
    names += [
        n for n in requests if _is_vendor_key(n) and is_legacy_resource(n) and n not in limits
    ]
    for resource in names:
        count: int | None = None
        for section, values in (("limits", limits), ("requests", requests)):
            if resource not in values:
                continue
            try:
                value = parse_count(values[resource])
            except QuantityError as exc:
                raise Denied(f"container {container.name!r}: {section}[{resource}]: {exc}") from exc
            if count is not None and value != count:
                raise Denied(
                    f"container {container.name!r}: {resource} is {value} in requests "
                    f"but {count} in limits; extended resources need them equal"
                )
            count = value
        if not count:  # zero: nothing asked (None cannot be: the name came from a section)
            continue
        if count > MAX_COUNT:
            raise Denied(f"container {container.name!r}: {resource}: {count} is too many devices")
        if policy.native_extended_resources == "defer" and resource in native_extended:
            container.deferred.append(resource)
            warnings.append(
                _short(
                    f"{resource} in {container.name} not converted: a DeviceClass serves it "
                    "(KEP-5004; policy nativeExtendedResources: defer)"
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
    annotations: dict[str, Any], containers: Sequence[_Facts], has_chain: bool
) -> list[_Facts]:
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


_Entry = tuple[str | tuple[str, ...], int | None]
"""A chain entry: a profile or ``gpu`` (or, last in a memory chain, any of several profiles)
and the minimum memory in bytes, or None."""


@dataclass(frozen=True)
class _Chain:
    source: str
    entries: tuple[_Entry, ...]


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


def _valid_chain_entries(models: tuple[str, ...]) -> str:
    return f"valid: {WHOLE_GPU} (a whole GPU), " + ", ".join(model_profiles(models))


def _models_note(models: tuple[str, ...]) -> str:
    """Where the valid names come from, when the policy narrows the catalog."""
    return "" if models == ALL_MODELS else f" (policy gpuModels: {', '.join(models)})"


def _suggest(names: Sequence[str], models: tuple[str, ...], *, whole_gpu: bool = False) -> str:
    """The valid names nearest to mistyped ones, rather than the list of every profile."""
    valid = ((WHOLE_GPU,) if whole_gpu else ()) + model_profiles(models)
    where = "`gpu-slicer catalog`" + (
        "" if models == ALL_MODELS else f" (models: {', '.join(models)})"
    )
    return did_you_mean(names, valid, where=where)


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
            f"{_suggest(unknown, models, whole_gpu=True)}"
        )
    if len(set(names)) != len(names):
        raise Denied(f"annotation {ANNOTATION_PROFILES}: {str(raw)!r} lists a profile twice")
    return names


def _memory_chain(raw: Any, models: tuple[str, ...]) -> tuple[_Entry, ...]:
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
def _memory_entries(wanted: int, models: tuple[str, ...]) -> tuple[_Entry, ...] | None:
    """The memory chain for ``wanted`` bytes on ``models`` (None: none of their profiles has
    that much); depends only on the static catalog, so it is computed once per size and model
    set. Only the policy's models count.

    The chain is in tiers: the first entry is every model's smallest fitting profile, the second
    every model's second smallest, and so on (:func:`_tiers`). On a node of one GPU model the
    alternatives are thus exactly that model's fitting profiles, smallest first, as if the chain
    named only them, while the scheduler tries as few alternatives as the model needs: a chain
    that named every model's profiles one by one made an A100 node reject seven alternatives
    (each a CEL evaluation over every device) before reaching its own profile. On a node with
    several GPU models, a tier takes whichever model's slice comes first in the agent's device
    order.

    Every entry also selects on the memory capacity the node publishes (which the agent reads
    from NVML), not only on the profile name: a profile's memory differs by driver and model, so
    the catalog's figure only picks the candidates and the device's own capacity decides."""
    found = catalog.profiles_with_memory(wanted, _gpu_models(models))
    if not found:
        return None
    return tuple(
        (names[0] if len(names) == 1 else names, wanted)
        for names in _tiers(found)[:MAX_ALTERNATIVES]
    )


def _tiers(found: list[tuple[catalog.GpuModel, catalog.Profile]]) -> list[tuple[str, ...]]:
    """Profile names in tiers: a name's tier is one more than the longest run of smaller
    fitting profiles before it on any model, so each model's profiles fall in strictly
    increasing tiers and a tier holds at most one fitting profile of each model. Two models
    that order the same names oppositely (none in the catalog) would make that impossible:
    every name then gets a tier of its own, in memory order."""
    order = list(dict.fromkeys(profile.name for _model, profile in found))
    by_model: dict[str, list[str]] = {}
    for model, profile in found:
        by_model.setdefault(model.key, []).append(profile.name)
    tier = dict.fromkeys(order, 1)
    for _round in range(len(order)):
        changed = False
        for names in by_model.values():
            for smaller, larger in zip(names, names[1:], strict=False):
                if tier[larger] <= tier[smaller]:
                    tier[larger] = tier[smaller] + 1
                    changed = True
        if not changed:
            tiers: dict[int, list[str]] = {}
            for name in order:
                tiers.setdefault(tier[name], []).append(name)
            return [tuple(tiers[t]) for t in sorted(tiers)]
    return [(name,) for name in order]


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


def _need(
    container: _Facts,
    targeted: bool,
    chain: _Chain | None,
    rules: NamespaceRules,
    target: TargetDriver,
    warnings: list[str],
) -> _Need:
    """What one container asks for: its count, the kind of device (and its chain), what is
    converted (a legacy resource name or "annotation") and the annotation or policy that chose
    the chain, if one did."""
    legacy_name, legacy_count = container.legacy or (None, 1)
    if targeted and chain is not None:
        return _chain_need(
            container, legacy_count, legacy_name or CHANGE_ANNOTATION, chain.source, chain.entries
        )
    if legacy_name is None or legacy_name == LEGACY_GPU:
        # Named by gpu-slicer.io/containers without any chain: what nvidia.com/gpu: 1 means here.
        what, via = (
            (legacy_name, None) if legacy_name else (CHANGE_ANNOTATION, ANNOTATION_CONTAINERS)
        )
        if rules.gpu is not None:
            entries = tuple((n, None) for n in rules.gpu)
            return _chain_need(container, legacy_count, what, via, entries)
        if legacy_count > 1 and rules.nvlink != "none" and target.nvlink_attribute is None:
            warnings.append(
                _short(
                    f"{container.name}: {legacy_count} GPUs without an NVLink constraint: target "
                    f"{target.name} publishes no NVLink attribute"
                )
            )
        full = full_gpu_profiles(rules.gpu_models) if rules.full_gpu_mig else ()
        build = functools.partial(
            _gpu_chain, rules.nvlink, target.nvlink_attribute is not None, full
        )
        return _Need(container, legacy_count, what, via, ("gpu",), build)
    models = rules.gpu_models
    profile = _profile_of_resource(legacy_name[len(LEGACY_MIG_PREFIX) :], models)
    if profile not in model_profile_set(models):
        raise Denied(
            f"container {container.name!r}: {legacy_name}: no GPU model offers MIG profile "
            f"{profile!r}{_models_note(models)}; {_suggest([profile], models)}"
        )
    fallbacks = rules.mig_fallback.fallbacks_for(profile)
    if fallbacks is None:
        larger = rules.mig_fallback.mode == "larger"
        fallbacks = _larger_profiles(profile, models) if larger else ()
    names = [profile, *(f for f in fallbacks if f != profile)][:MAX_ALTERNATIVES]
    via = "policy migFallback" if len(names) > 1 else None
    entries = tuple((n, None) for n in names)
    return _chain_need(container, legacy_count, legacy_name, via, entries)


def _chain_need(
    container: _Facts,
    count: int,
    what: str,
    via: str | None,
    entries: tuple[_Entry, ...],
) -> _Need:
    """A need whose chain is a fixed list of profiles (or ``gpu``)."""
    return _Need(
        container, count, what, via, ("chain", entries), functools.partial(_chain, entries)
    )


@functools.lru_cache(maxsize=1024)
def _chain(entries: tuple[_Entry, ...], count: int, _several: bool) -> tuple[Alternative, ...]:
    """A fixed chain for ``count`` devices (NVLink does not apply to it)."""
    return tuple(_entry(p, count, memory) for p, memory in entries)


@functools.lru_cache(maxsize=1024)
def _gpu_chain(
    nvlink: str, has_nvlink: bool, full: tuple[str, ...], count: int, several: bool
) -> tuple[Alternative, ...]:
    """Whole GPUs, then (``full``) MIG instances that span a GPU, for nodes in MIG mode.

    When a container wants several devices and the target publishes NVLink domains, policy
    ``nvlink`` prefer puts an NVLink-constrained twin before each (``gpu-nvlink, gpu,
    gpu-mig-nvlink, gpu-mig``), strict keeps only the twins.
    """
    plain = [_whole_gpus(count, False)] + ([_full_gpu_migs(count, full, False)] if full else [])
    if not several or nvlink == "none" or not has_nvlink:
        return tuple(plain)
    linked = [_whole_gpus(count, True)] + ([_full_gpu_migs(count, full, True)] if full else [])
    if nvlink == "strict":
        return tuple(linked)
    return tuple(alt for pair in zip(linked, plain, strict=True) for alt in pair)


@functools.lru_cache(maxsize=256)
def _full_gpu_migs(count: int, full: tuple[str, ...], nvlink: bool) -> Alternative:
    return Alternative(kind="mig", count=count, nvlink=nvlink, full_gpu=full)


# --- init containers and sidecars ------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    requests: tuple[ContainerRequest, ...]
    uses: dict[int, tuple[str, ...]]
    """id of each need -> the names of the requests its container references, in order."""
    nvlink_sets: tuple[claims.NvlinkSet, ...]


def layout(members: Sequence[tuple[bool, int]]) -> tuple[int, list[tuple[int, int]]]:
    """Where each container's devices lie on a line of ``total`` devices of one kind.

    ``members`` are (runs until the pod ends, count) in start order: init containers (plain or
    sidecar) in declaration order, then app containers. The kubelet reserves, per resource,
    ``max(max over plain init i of (count_i + sidecars declared before i), sidecars + apps)``;
    this is that total, and the ranges realise it:

    * sidecars and app containers all run at once: they get consecutive, disjoint ranges;
    * a plain init container runs beside the sidecars declared before it and nothing else, so it
      starts right after them (or at a later boundary of another container's range when its
      end falls on one too, so that fewer requests are needed) and reuses what follows.
    """
    ranges: list[tuple[int, int] | None] = []
    position = 0
    pending: list[tuple[int, int, int]] = []
    """Plain init containers: (index, sidecars before it, count)."""
    for index, (runs, count) in enumerate(members):
        if runs:
            ranges.append((position, position + count))
            position += count
        else:
            ranges.append(None)
            pending.append((index, position, count))
    total = max([position, *(before + count for _i, before, count in pending)])
    edges = sorted({0, total, *(e for r in ranges if r for e in r)})
    for index, before, count in pending:
        start = next(
            (e for e in edges if e >= before and e + count <= total and e + count in edges),
            before,
        )
        ranges[index] = (start, start + count)
    return total, [r for r in ranges if r is not None]


def _plan(needs: Sequence[_Need]) -> _Plan:
    """The claim's requests: containers that want the same kind of device share them as the
    kubelet's device manager would (see :func:`layout`); every other container gets its own."""
    groups: dict[tuple[Any, ...], list[_Need]] = {}
    for need in needs:
        groups.setdefault(need.key, []).append(need)
    order = {id(n): i for i, n in enumerate(needs)}
    segments: list[tuple[int, int, list[_Need], _Need, int]] = []
    """(owner's position in the pod, start, members covering it, owner, size)."""
    for members in groups.values():
        if len(members) == 1 and members[0].count > 0:
            # Nothing to share: what layout would give, one request for the whole count.
            only = members[0]
            segments.append((order[id(only)], 0, members, only, only.count))
            continue
        _total, ranges = layout([(m.container.long_running, m.count) for m in members])
        edges = sorted({e for r in ranges for e in r})
        for start, end in zip(edges, edges[1:], strict=False):
            covering = [m for m, (a, b) in zip(members, ranges, strict=True) if a <= start < b]
            if not covering:
                continue
            owner = next((m for m in covering if m.container.long_running), covering[0])
            segments.append((order[id(owner)], start, covering, owner, end - start))
    segments.sort(key=lambda s: (s[0], s[1]))
    taken: set[str] = set()
    requests: list[ContainerRequest] = []
    placed: dict[int, list[tuple[int, str]]] = {id(n): [] for n in needs}
    for _pos, start, covering, owner, size in segments:
        name = claims.unique_label(
            claims.dns_label(owner.container.name, fallback="container"), taken
        )
        several = any(m.count > 1 for m in covering)
        requests.append(ContainerRequest(name=name, alternatives=owner.build(size, several)))
        for member in covering:
            placed[id(member)].append((start, name))
    # A container lists its requests in the order its devices lie on the line.
    uses = {k: [name for _start, name in sorted(v)] for k, v in placed.items()}
    nvlink_sets = tuple(dict.fromkeys(tuple(uses[id(n)]) for n in needs if n.count > 1))
    return _Plan(
        requests=tuple(requests),
        uses={k: tuple(v) for k, v in uses.items()},
        nvlink_sets=nvlink_sets,
    )


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
def _entry(name: str | tuple[str, ...], count: int, min_memory: int | None) -> Alternative:
    """One alternative; cached, as Alternatives are immutable and replicas ask for the same."""
    if isinstance(name, tuple):
        return Alternative(kind="mig", count=count, any_of=name, min_memory_bytes=min_memory)
    if name == WHOLE_GPU:
        return _whole_gpus(count, False)
    return Alternative(kind="mig", count=count, profile=name, min_memory_bytes=min_memory)


@functools.lru_cache(maxsize=256)
def _whole_gpus(count: int, nvlink: bool) -> Alternative:
    return Alternative(kind="gpu", count=count, nvlink=nvlink)
