"""What ``gpu-slicer status`` shows, computed from API objects (pure: lists of dicts in, a typed
view out, no I/O).

Per node (a ``gpu-slicer.io`` pool) and GPU: the memory slices the GPU has (the ``memory-slice-<i>``
counters of its counter set ``gpu-<i>-counters``), the instances that ResourceClaims hold there
(the claims' ``status.allocation.devices.results`` for driver ``gpu-slicer.io``, placed with the
attributes the agent published: ``placementStart``, ``placementSize``, ``profile``), the pods that
hold them (``status.reservedFor``), and which memory slices are free. Per namespace: the
``gpu-slicer.io/migration`` label and how many pods the webhook converted.

Only the newest generation of each pool counts: while the agent republishes, slices of the
previous generation can still be listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import SliceSpec, parse_device_name
from gpu_slicer.core.errors import CatalogError, DeviceNameError
from gpu_slicer.core.identity import (
    CONVERTED_ANNOTATION,
    DRIVER,
    DRIVERS,
    GPU_TYPE,
    LEGACY_GPU,
    LEGACY_MIG_PREFIX,
    MIGRATION_LABEL,
    PLACEMENT_SIZE_ATTRIBUTE,
    PLACEMENT_START_ATTRIBUTE,
    PROFILE_ATTRIBUTE,
    TYPE_ATTRIBUTE,
    UNHEALTHY_TAINT,
    qualified,
)
from gpu_slicer.kube.quantity import parse_count
from gpu_slicer.slicer.demand import Advertised
from gpu_slicer.slicer.inventory import ADVERTISED_ANNOTATION
from gpu_slicer.slicer.scaling import partitionable_scales, quadratic_warning

Obj = dict[str, Any]


Mode = Literal["dynamic", "mig", "full", "static", "unknown"]
"""How the agent advertises the GPU: ``dynamic`` (the whole GPU and every MIG slice), ``mig``
(MIG slices only), ``full`` (the whole GPU only), ``static`` (only instances that exist, no
counters), ``unknown`` (the node publishes nothing for this GPU but a claim holds one of its
devices)."""


@dataclass(frozen=True, order=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Instance:
    """A device of one GPU that a ResourceClaim holds: a MIG slice or the whole GPU."""

    device: str
    profile: str | None
    """The MIG profile; None for the whole GPU."""
    start: int
    size: int
    """First memory slice and how many it covers."""
    claim: PodRef
    """The ResourceClaim (namespace, name)."""
    request: str
    pods: tuple[PodRef, ...]
    """The pods the claim is reserved for (none while it waits to be released)."""
    short_pods: tuple[str, ...] = ()
    """The same pods' names without the ReplicaSet hash (``infer-749bf8c799-dlqzb`` ->
    ``infer-dlqzb``), for the picture."""

    @property
    def whole(self) -> bool:
        return self.profile is None

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class Gpu:
    index: int
    product: str
    """The ``productName`` the agent published, e.g. ``NVIDIA A100-SXM4-80GB``."""
    mode: Mode
    memory_slices: int
    instances: tuple[Instance, ...]
    """Held devices, by first memory slice."""
    blocked: tuple[int, ...]
    """Memory slices no claim holds that cannot be allocated either: taken by a MIG instance
    gpu-slicer did not create (its counter is 0), or, in a static layout, in no advertised
    instance."""
    unhealthy: bool = False
    idle: tuple[tuple[str, int, int], ...] = ()
    """Static layout only: the advertised instances no claim holds, as (profile, start, size);
    the free memory slices can only be allocated as these."""

    @property
    def held(self) -> tuple[int, ...]:
        return tuple(
            sorted(
                {i for inst in self.instances for i in inst.slices if 0 <= i < self.memory_slices}
            )
        )

    @property
    def free(self) -> tuple[int, ...]:
        taken = set(self.held) | set(self.blocked)
        return tuple(i for i in range(self.memory_slices) if i not in taken)

    def owner(self, memory_slice: int) -> Instance | None:
        for inst in self.instances:
            if memory_slice in inst.slices:
                return inst
        return None


@dataclass(frozen=True)
class Node:
    name: str
    generation: int
    """The pool generation shown (-1: the node publishes no slices)."""
    gpus: tuple[Gpu, ...]
    advertised: Advertised | None = None
    """The profiles the node's agent advertises and why (None: its slices do not say: the
    static layout, or an agent before demand-driven advertising)."""

    @property
    def memory_slices(self) -> int:
        return sum(g.memory_slices for g in self.gpus)

    @property
    def free(self) -> int:
        return sum(len(g.free) for g in self.gpus)


@dataclass(frozen=True)
class NamespaceStatus:
    name: str
    migration: str
    """The ``gpu-slicer.io/migration`` label: ``enabled``, ``audit``, another value as written,
    or ``""`` when the label is absent (shown because converted pods remain)."""
    converted: int
    """Pods carrying the ``gpu-slicer.io/converted`` annotation."""
    holding: int
    """Of those, pods a gpu-slicer device is reserved for now."""
    legacy: int
    """Pods that still ask for ``nvidia.com/gpu`` or ``nvidia.com/mig-*`` (in ``audit``
    namespaces: what the webhook would convert)."""


@dataclass(frozen=True)
class ClusterStatus:
    nodes: tuple[Node, ...]
    namespaces: tuple[NamespaceStatus, ...]
    notes: tuple[str, ...] = field(default=())

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


# --- reading the objects ----------------------------------------------------------------------


def _attr(device: Obj, name: str) -> Any:
    """The value of a ``gpu-slicer.io`` attribute (qualified, or bare as 0.1 published it)."""
    attrs = device.get("attributes") or {}
    value = attrs.get(qualified(name), attrs.get(name))
    if not isinstance(value, dict):
        return None
    for kind in ("int", "string", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _int(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def newest_slices(slices: Iterable[Obj]) -> dict[str, tuple[int, list[Obj]]]:
    """pool name -> (generation, its slices of that generation), of gpu-slicer's driver; a
    node's pool under the earlier driver name (an agent not upgraded yet) while it has none
    under the current one."""
    pools: dict[str, tuple[int, list[Obj]]] = {}
    listed = list(slices)
    renamed = {
        str((obj.get("spec") or {}).get("pool", {}).get("name") or "")
        for obj in listed
        if (obj.get("spec") or {}).get("driver") == DRIVER
    }
    for obj in listed:
        spec = obj.get("spec") or {}
        driver = spec.get("driver")
        if driver not in DRIVERS:
            continue
        if driver != DRIVER and str((spec.get("pool") or {}).get("name") or "") in renamed:
            continue
        pool = spec.get("pool") or {}
        name = str(pool.get("name") or spec.get("nodeName") or "")
        if not name:
            continue
        generation = _int(pool.get("generation"), 0)
        current = pools.get(name)
        if current is None or generation > current[0]:
            pools[name] = (generation, [obj])
        elif generation == current[0]:
            current[1].append(obj)
    return pools


@dataclass
class _GpuFacts:
    """What one GPU's published devices and counter set say (while building the view)."""

    index: int
    product: str = ""
    devices: dict[str, Obj] = field(default_factory=dict)
    counter_set: str | None = None
    counters: dict[str, int] | None = None
    whole: bool = False
    mig: bool = False
    with_counters: bool = False
    unhealthy: bool = False


def _gpu_facts(pool_slices: Sequence[Obj]) -> dict[int, _GpuFacts]:
    counter_sets: dict[str, dict[str, int]] = {}
    facts: dict[int, _GpuFacts] = {}
    for obj in pool_slices:
        spec = obj.get("spec") or {}
        for counter_set in spec.get("sharedCounters") or []:
            counter_sets[str(counter_set.get("name"))] = {
                str(k): _count((v or {}).get("value"))
                for k, v in (counter_set.get("counters") or {}).items()
            }
        for device in spec.get("devices") or []:
            index = _int(_attr(device, "index"))
            if index < 0:
                continue
            gpu = facts.setdefault(index, _GpuFacts(index))
            gpu.devices[str(device.get("name"))] = device
            gpu.product = gpu.product or str(_attr(device, "productName") or "")
            if _attr(device, TYPE_ATTRIBUTE) == GPU_TYPE:
                gpu.whole = True
            else:
                gpu.mig = True
            for consumed in device.get("consumesCounters") or []:
                gpu.with_counters = True
                gpu.counter_set = gpu.counter_set or str(consumed.get("counterSet"))
            if any((t or {}).get("key") == UNHEALTHY_TAINT for t in device.get("taints") or []):
                gpu.unhealthy = True
    for gpu in facts.values():
        name = gpu.counter_set or f"gpu-{gpu.index}-counters"
        if name in counter_sets:
            gpu.counter_set, gpu.counters = name, counter_sets[name]
    return facts


def _count(value: Any) -> int:
    try:
        return parse_count(value)
    except (ValueError, TypeError, ArithmeticError):
        return 0


def _model(product: str) -> gpu_model.GpuModel | None:
    try:
        return catalog.model_by_product_name(product)
    except CatalogError:
        return None


def _memory_slices(gpu: _GpuFacts) -> int:
    if gpu.counters:
        counted = sum(1 for k in gpu.counters if k.startswith("memory-slice-"))
        if counted:
            return counted
    model = _model(gpu.product)
    if model is not None:
        return model.memory_slices
    ends = [
        _int(_attr(d, PLACEMENT_START_ATTRIBUTE), 0) + _int(_attr(d, PLACEMENT_SIZE_ATTRIBUTE), 1)
        for d in gpu.devices.values()
        if _attr(d, TYPE_ATTRIBUTE) != GPU_TYPE
    ]
    return max(ends, default=1)


def _mode(gpu: _GpuFacts) -> Mode:
    if not gpu.devices:
        return "unknown"
    if gpu.with_counters:
        return "dynamic" if gpu.whole else "mig"
    return "static" if gpu.mig else "full"


def _placement(
    device_name: str, published: Obj | None, product: str
) -> tuple[int, str | None, int, int] | None:
    """(gpu index, profile, start, size) of a device: from its published attributes, else from
    its name and the catalog; None for a name that is not gpu-slicer's. The whole GPU's size
    (0 here) is its memory-slice count, filled in by the caller."""
    if published is not None:
        index = _int(_attr(published, "index"))
        if _attr(published, TYPE_ATTRIBUTE) == GPU_TYPE:
            return index, None, 0, 0
        profile = _attr(published, PROFILE_ATTRIBUTE)
        start, size = (
            _int(_attr(published, PLACEMENT_START_ATTRIBUTE)),
            _int(_attr(published, PLACEMENT_SIZE_ATTRIBUTE)),
        )
        if profile and start >= 0 and size > 0:
            return index, str(profile), start, size
    try:
        spec = parse_device_name(device_name)
    except DeviceNameError:
        return None
    if not isinstance(spec, SliceSpec):
        return spec.gpu_index, None, 0, 0
    model = _model(product)
    size = 1
    if model is not None and model.has_profile(spec.profile):
        size = model.profile(spec.profile).memory_slices
    return spec.gpu_index, spec.profile, spec.start, size


def short_pod_name(pod: Obj | None, name: str) -> str:
    """The pod's name without its ReplicaSet's ``pod-template-hash`` part."""
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    template_hash = labels.get("pod-template-hash")
    if template_hash and f"-{template_hash}-" in name:
        return name.replace(f"-{template_hash}-", "-", 1)
    return name


@dataclass(frozen=True)
class _Held:
    node: str
    device: str
    claim: PodRef
    request: str
    pods: tuple[PodRef, ...]


def _held_devices(claims: Iterable[Obj]) -> list[_Held]:
    held: list[_Held] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        status = claim.get("status") or {}
        results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
        namespace = str(meta.get("namespace") or "")
        pods = tuple(
            PodRef(namespace, str(r.get("name")))
            for r in status.get("reservedFor") or []
            if (r or {}).get("resource") == "pods" and r.get("name")
        )
        ref = PodRef(namespace, str(meta.get("name") or ""))
        for result in results:
            if (result or {}).get("driver") not in DRIVERS:
                continue
            held.append(
                _Held(
                    str(result.get("pool") or ""),
                    str(result.get("device") or ""),
                    ref,
                    str(result.get("request") or ""),
                    pods,
                )
            )
    return held


def _is_legacy(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = (container or {}).get("resources") or {}
        for name, value in {
            **(resources.get("requests") or {}),
            **(resources.get("limits") or {}),
        }.items():
            legacy = name == LEGACY_GPU or (
                name.startswith(LEGACY_MIG_PREFIX) and len(name) > len(LEGACY_MIG_PREFIX)
            )
            if legacy and _count(value) > 0:
                return True
    return False


# --- the view -----------------------------------------------------------------------------------


_Placed = tuple[_Held, str | None, int, int]
"""A held device where it sits: (holder, profile or None for a whole GPU, start, size)."""


def _place_held(
    name: str, facts: dict[int, _GpuFacts], held: Sequence[_Held], notes: list[str]
) -> dict[int, list[_Placed]]:
    """Held devices by GPU, placed from their names: a claim may hold a device the node no
    longer publishes, and the view must still show what it occupies."""
    devices = {d: body for g in facts.values() for d, body in g.devices.items()}
    placed_here: dict[int, list[_Placed]] = {}
    for item in held:
        published = devices.get(item.device)
        guess = parse_device_name_index(item.device)
        gpu_facts = facts.get(guess) if guess is not None else None
        product = gpu_facts.product if gpu_facts else ""
        placed = _placement(item.device, published, product)
        if placed is None:
            notes.append(
                f"claim {item.claim} holds device {item.device} on {name}, which "
                "is not a gpu-slicer device name"
            )
            continue
        index, profile, start, size = placed
        if published is None:
            notes.append(
                f"claim {item.claim} holds device {item.device}, which {name} does not publish now"
            )
        facts.setdefault(index, _GpuFacts(index))
        placed_here.setdefault(index, []).append((item, profile, start, size))
    return placed_here


def _gpu_view(
    name: str,
    index: int,
    gpu: _GpuFacts,
    placed: Sequence[_Placed],
    by_ref: dict[PodRef, Obj],
    notes: list[str],
) -> Gpu:
    """One GPU's instances, blocked and idle slices: what an operator reads to see why a pod
    does not fit there."""
    count = _memory_slices(gpu)
    held_here = sorted(
        (
            Instance(
                device=item.device,
                profile=profile,
                start=start,
                size=count if profile is None else size,
                claim=item.claim,
                request=item.request,
                pods=item.pods,
                short_pods=tuple(short_pod_name(by_ref.get(p), p.name) for p in item.pods),
            )
            for item, profile, start, size in placed
        ),
        key=lambda i: (i.start, i.device),
    )
    _overlaps(name, index, held_here, notes)
    covered = {i for inst in held_here for i in inst.slices}
    mode = _mode(gpu)
    return Gpu(
        index=index,
        product=gpu.product,
        mode=mode,
        memory_slices=count,
        instances=tuple(held_here),
        blocked=_blocked(gpu, count, covered),
        unhealthy=gpu.unhealthy,
        idle=_idle(gpu, covered) if mode == "static" else (),
    )


def build_status(
    slices: Iterable[Obj],
    claims: Iterable[Obj],
    pods: Iterable[Obj],
    namespaces: Iterable[Obj],
    *,
    node: str | None = None,
) -> ClusterStatus:
    """The status of every ``gpu-slicer.io`` pool (or only ``node``'s) and every namespace that
    is labelled ``gpu-slicer.io/migration`` or still has converted pods."""
    pools = newest_slices(slices)
    pod_list = list(pods)
    by_ref = {
        PodRef(
            str((p.get("metadata") or {}).get("namespace") or ""),
            str((p.get("metadata") or {}).get("name") or ""),
        ): p
        for p in pod_list
    }
    held = _held_devices(claims)
    held_by_node: dict[str, list[_Held]] = {}
    for item in held:
        held_by_node.setdefault(item.node, []).append(item)
    notes: list[str] = []
    names = sorted({*pools, *(n for n in held_by_node if n)})
    if node is not None:
        names = [n for n in names if n == node]
    nodes: list[Node] = []
    for name in names:
        generation, pool_slices = pools.get(name, (-1, []))
        facts = _gpu_facts(pool_slices)
        placed_here = _place_held(name, facts, held_by_node.get(name, []), notes)
        gpus = [
            _gpu_view(name, index, facts[index], placed_here.get(index, []), by_ref, notes)
            for index in sorted(facts)
        ]
        nodes.append(Node(name, generation, tuple(gpus), _advertised(pool_slices)))
        if not pool_slices:
            notes.append(
                f"node {name} publishes no gpu-slicer ResourceSlices, but claims "
                "hold devices there (is its agent running?)"
            )
    return ClusterStatus(tuple(nodes), _namespaces(namespaces, pod_list, held), tuple(notes))


def _advertised(pool_slices: Sequence[Obj]) -> Advertised | None:
    for obj in pool_slices:
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ADVERTISED_ANNOTATION)
        if isinstance(text, str):
            return Advertised.parse(text)
    return None


def parse_device_name_index(device: str) -> int | None:
    """The GPU index in a gpu-slicer device name, None if the name is not one."""
    try:
        return parse_device_name(device).gpu_index
    except DeviceNameError:
        return None


def _blocked(gpu: _GpuFacts, count: int, covered: set[int]) -> tuple[int, ...]:
    if gpu.counters is not None and gpu.with_counters:
        return tuple(
            i
            for i in range(count)
            if i not in covered and gpu.counters.get(f"memory-slice-{i}", 1) <= 0
        )
    if not gpu.devices or gpu.whole:
        return ()  # no counters: the whole GPU (full mode) covers every slice
    reachable: set[int] = set()
    for device in gpu.devices.values():
        start = _int(_attr(device, PLACEMENT_START_ATTRIBUTE))
        size = _int(_attr(device, PLACEMENT_SIZE_ATTRIBUTE), 1)
        if start >= 0:
            reachable.update(range(start, start + size))
    return tuple(i for i in range(count) if i not in covered and i not in reachable)


def _idle(gpu: _GpuFacts, covered: set[int]) -> tuple[tuple[str, int, int], ...]:
    idle = []
    for device in gpu.devices.values():
        profile = _attr(device, PROFILE_ATTRIBUTE)
        start = _int(_attr(device, PLACEMENT_START_ATTRIBUTE))
        size = _int(_attr(device, PLACEMENT_SIZE_ATTRIBUTE), 1)
        if profile and start >= 0 and not covered & set(range(start, start + size)):
            idle.append((str(profile), start, size))
    return tuple(sorted(idle, key=lambda i: i[1]))


def _overlaps(node: str, index: int, instances: Sequence[Instance], notes: list[str]) -> None:
    seen: dict[int, Instance] = {}
    for inst in instances:
        for i in inst.slices:
            other = seen.get(i)
            if other is not None:
                notes.append(
                    f"{node} gpu {index}: memory slice {i} is held twice "
                    f"({other.device} by {other.claim}, {inst.device} by {inst.claim})"
                )
                break
            seen[i] = inst


def _namespaces(
    namespaces: Iterable[Obj], pods: Sequence[Obj], held: Sequence[_Held]
) -> tuple[NamespaceStatus, ...]:
    labels: dict[str, str] = {}
    for namespace in namespaces:
        meta = namespace.get("metadata") or {}
        value = (meta.get("labels") or {}).get(MIGRATION_LABEL)
        labels[str(meta.get("name"))] = "" if value is None else str(value)
    holders = {p for h in held for p in h.pods}
    converted: dict[str, int] = {}
    holding: dict[str, int] = {}
    legacy: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if CONVERTED_ANNOTATION in (meta.get("annotations") or {}):
            converted[ns] = converted.get(ns, 0) + 1
            if PodRef(ns, name) in holders:
                holding[ns] = holding.get(ns, 0) + 1
        elif _is_legacy(pod):
            legacy[ns] = legacy.get(ns, 0) + 1
    shown = sorted({n for n, v in labels.items() if v} | set(converted))
    return tuple(
        NamespaceStatus(
            n, labels.get(n, ""), converted.get(n, 0), holding.get(n, 0), legacy.get(n, 0)
        )
        for n in shown
    )


def scaling_notes(version: tuple[int, int], slices: Sequence[Obj]) -> tuple[str, ...]:
    """A note when the cluster's release schedules partitionable devices at a cost that grows
    with the square of the nodes publishing counters (:mod:`slicer.scaling`), and some do."""
    if partitionable_scales(version):
        return ()
    nodes = {
        s["spec"].get("nodeName") or s["spec"]["pool"]["name"]
        for s in slices
        if s.get("spec", {}).get("sharedCounters")
    }
    if not nodes:
        return ()
    return (quadratic_warning(version, len(nodes)),)
