"""Reading the pod: its containers, the legacy GPU requests in them and the gpu-slicer
annotations, down to the :class:`Shape` the claim is derived from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpu_slicer.core.identity import LEGACY_GPU, LEGACY_MIG_PREFIX
from gpu_slicer.kube.quantity import QuantityError, parse_count
from gpu_slicer.webhook import claims
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.translate.conversion import MAX_CLAIM_REQUESTS, MAX_COUNT, dict_of, short

ANNOTATION_PROFILES = "gpu-slicer.io/profiles"
ANNOTATION_GPU_MEMORY = "gpu-slicer.io/gpu-memory"
ANNOTATION_CONTAINERS = "gpu-slicer.io/containers"
SKIP_LABEL = "gpu-slicer.io/skip"
ANNOTATIONS_READ = (ANNOTATION_PROFILES, ANNOTATION_GPU_MEMORY, ANNOTATION_CONTAINERS)
"""The annotations translation reads (the skip label and the pod's claims are checked first)."""
_KINDS = ("initContainers", "containers")


@dataclass(eq=False, slots=True)
class Container:
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

    def facts(self) -> Facts:
        return Facts(
            self.kind,
            self.index,
            self.name,
            self.restart_always,
            next(iter(self.legacy.items()), None),
            tuple(self.deferred),
        )


class Facts(NamedTuple):
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
        return long_running(self.kind, self.restart_always)


def long_running(kind: str, restart_always: bool) -> bool:
    """Runs until the pod ends, so holds its devices: app containers, and sidecars (restartable
    init containers, which keep running beside the app containers)."""
    return kind == "containers" or (kind == "initContainers" and restart_always)


class Shape(NamedTuple):
    """Everything the claim, its template and the record depend on: the containers' facts and
    the gpu-slicer annotations (key, value), in a fixed order. Two pods of one shape get the
    same claim; only where the patch points (which maps and lists exist) differs per pod."""

    containers: tuple[Facts, ...]
    annotations: tuple[tuple[str, Any], ...]


_VENDOR = LEGACY_GPU[: LEGACY_GPU.index("/") + 1]
"""``nvidia.com/``: what every legacy resource name starts with."""


def _is_vendor_key(key: object) -> bool:
    return isinstance(key, str) and key.startswith(_VENDOR)


def is_legacy_resource(name: str) -> bool:
    return name == LEGACY_GPU or (
        name.startswith(LEGACY_MIG_PREFIX) and len(name) > len(LEGACY_MIG_PREFIX)
    )


def read_containers(
    spec: dict[str, Any], policy: Policy, native_extended: frozenset[str], warnings: list[str]
) -> list[Container]:
    """The pod's containers with their legacy requests read; refuses a pod with more running
    containers asking for GPUs than a claim has requests, without reading the rest."""
    containers = containers_of(spec)
    running = 0
    for container in containers:
        read_legacy(container, policy, native_extended, warnings)
        if container.legacy and long_running(container.kind, container.restart_always):
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


def already_converted(spec: dict[str, Any]) -> bool:
    entries = spec.get("resourceClaims")
    return isinstance(entries, list) and any(
        isinstance(e, dict) and e.get("name") == claims.CLAIM_NAME for e in entries
    )


def left_behind(spec: dict[str, Any], policy: Policy, native_extended: frozenset[str]) -> list[str]:
    """Warnings for legacy GPU requests an already-converted pod still has.

    A pod gpu-slicer converted has none left; one that still has some got its ``gpu-slicer``
    claim entry from another tool, or the container from a webhook that ran after the
    conversion. It is admitted as it is, but silently keeping the legacy request would hide why
    the pod runs (or waits) the legacy way.
    """
    warnings: list[str] = []
    for container in containers_of(spec):
        try:
            read_legacy(container, policy, native_extended, [])
        except Denied:
            continue
        for resource in container.legacy:
            warnings.append(
                short(
                    f"{container.name}: {resource} not converted: the pod already has a "
                    f"resourceClaims entry named {claims.CLAIM_NAME}"
                )
            )
    return warnings


def containers_of(spec: dict[str, Any]) -> list[Container]:
    """Init containers (native sidecars included) and containers; never ephemeral containers."""
    found: list[Container] = []
    for kind in _KINDS:
        items = spec.get(kind)
        if not isinstance(items, list):
            continue
        for index, body in enumerate(items):
            if isinstance(body, dict):
                name = body.get("name", "")
                resources = body.get("resources")
                found.append(
                    Container(
                        kind,
                        index,
                        name if isinstance(name, str) else str(name),
                        body,
                        resources if isinstance(resources, dict) else {},
                    )
                )
    return found


def read_legacy(
    container: Container, policy: Policy, native_extended: frozenset[str], warnings: list[str]
) -> None:
    """Fills ``container.legacy`` and ``deferred`` from its requests and limits; raises Denied
    for a count that is not one, differs between the two, or a second GPU resource."""
    resources = container.resources
    requests = dict_of(resources.get("requests"))
    limits = dict_of(resources.get("limits"))
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
                short(
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


def targeted(
    annotations: dict[str, Any], containers: Sequence[Facts], has_chain: bool
) -> list[Facts]:
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
