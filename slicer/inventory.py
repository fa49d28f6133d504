"""Inventory to ResourceSlices: what the node agent advertises, as plain Kubernetes objects.

Input is plain data: the node's GPUs (``GpuInfo``), the MIG instances on each, which of them the
agent created, each GPU's mode and taints, and (for dynamic ordering) what is allocated. Output is
the list of ResourceSlice objects of the node's pool. No I/O: the publisher writes them.

Per GPU and mode:

* ``dynamic``: the whole GPU and every legal MIG placement, all consuming the GPU's counter set
  (see :mod:`slicer.counters`), so the scheduler never allocates two devices the GPU cannot host
  together; the agent creates the instance when the kubelet prepares the claim.
* ``mig``: every legal MIG placement (no whole GPU).
* ``full``: the whole GPU only, without counters.

Instances the agent created are advertised as the device of their placement (a claim holds it;
the scheduler already accounts for it). Instances it did not create (foreign: made by hand or by
mig-parted) are not in any claim, so every device that cannot coexist with them is left out and
their share is taken off the counter set.

The static layout (no counters, for apiservers without partitionable devices) advertises only
what exists: a GPU with MIG off as the whole GPU, otherwise its complete instances that the agent
created or that the configured :class:`slicer.layout.StaticLayout` names.

Slices are laid out by server version (docs/resourceslices.md): from 1.35 counter sets live in
slices of their own (at most 8 per slice) and devices in others (at most 64 per slice when they
consume counters or carry taints, else 128); 1.34 requires a device and the counter set it
consumes in the same slice, so whole GPUs are packed together within that version's limits.
Slice names end in zero-padded sequence numbers, so sorting by name keeps the policy's order.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.devices import DeviceSpec, DeviceTaint, MigInstance, Mode, SliceSpec, WholeGpu
from gpu_slicer.core.gpu_model import GpuModel, Profile
from gpu_slicer.core.identity import (
    DRIVER,
    GPU_TYPE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MEMORY_CAPACITY,
    MIG_TYPE,
    NVLINK_DOMAIN_ATTRIBUTE,
    PLACEMENT_SIZE_ATTRIBUTE,
    PLACEMENT_START_ATTRIBUTE,
    PROFILE_ATTRIBUTE,
    RESOURCE_API,
    TYPE_ATTRIBUTE,
    qualified,
)
from gpu_slicer.slicer.backend import GpuInfo, model_of
from gpu_slicer.slicer.counters import (
    Consumption,
    CounterSet,
    counter_set_name,
    counter_values,
    format_quantity,
    profile_consumption,
    render_counters,
    whole_gpu_consumption,
)
from gpu_slicer.slicer.device_attributes import DeviceAttributes, device_body
from gpu_slicer.slicer.errors import SlicerError
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.slicer.ordering import Candidate, DeviceOrder, Occupancy, get_device_order
from gpu_slicer.slicer.profile_filter import ProfileChoice

Obj = dict[str, Any]

LAYOUT_LABEL = "gpu-slicer.io/layout"
ADVERTISED_ANNOTATION = "gpu-slicer.io/advertised-profiles"
"""On each slice of a partitionable pool whose profiles were chosen: which, and why
(``1g.10gb=asked,3g.40gb=floor``, or the admin's ``--profiles`` text). ``gpu-slicer status`` shows
it; it is as of the pool's last write (a change of reason alone is not worth a write)."""

SliceSplit = Literal["combined", "split"]

KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37", "1.38")
"""Kubernetes server versions whose slice splits and limits this module knows (1.38: its beta, as
the sandbox runs it); newer ones are treated like the newest."""


class InventoryError(SlicerError, ValueError):
    """The inventory cannot be turned into slices (for example an unsupported server version)."""


# --- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuState:
    """One GPU as the agent sees it: facts, mode, instances, ownership, health."""

    info: GpuInfo
    mode: Mode = "dynamic"
    instances: tuple[MigInstance, ...] = ()
    owned: frozenset[SliceSpec] = frozenset()
    """Specs of the instances the agent created (from its checkpoint)."""
    taints: tuple[DeviceTaint, ...] = ()
    held_elsewhere: frozenset[DeviceSpec] = frozenset()
    """Devices that claims allocated under an earlier driver name hold (an older release's
    pool). The scheduler does not count them against this pool, so they block what overlaps
    them as foreign instances do, whether their instance exists yet or not."""

    @property
    def index(self) -> int:
        return self.info.index

    @property
    def model(self) -> GpuModel | None:
        """The GPU's own MIG facts where the backend read them, else the catalog's model."""
        return model_of(self.info)

    @property
    def foreign(self) -> tuple[MigInstance, ...]:
        return tuple(i for i in self.instances if i.spec not in self.owned)

    def taken(self) -> list[tuple[str, int, range]]:
        """``(profile, start, memory slices)`` of every placement this pool cannot offer: the
        foreign instances and the devices held under an earlier driver name, prepared or not (a
        whole GPU held so takes all its memory, under no profile)."""
        taken = [(i.profile, i.start, i.memory_slices) for i in self.foreign]
        listed = {i.spec for i in self.foreign}
        model = self.model
        for spec in self.held_elsewhere:
            if isinstance(spec, WholeGpu):
                taken.append(("", 0, range(model.memory_slices if model else 0)))
            elif spec not in listed and model is not None and model.has_profile(spec.profile):
                size = model.profile(spec.profile).memory_slices
                taken.append((spec.profile, spec.start, range(spec.start, spec.start + size)))
        return taken

    @property
    def whole_held_elsewhere(self) -> bool:
        return any(isinstance(s, WholeGpu) for s in self.held_elsewhere)


def default_mode(model: GpuModel | None) -> Mode:
    """Hopper and newer toggle MIG without a reset: dynamic. Ampere: MIG slices only. A GPU
    without MIG facts: whole only."""
    if model is None:
        return "full"
    return "dynamic" if model.supports_dynamic_mig else "mig"


def effective_mode(requested: Mode, model: GpuModel | None) -> Mode:
    """``dynamic`` needs MIG mode changes without a GPU reset; Ampere falls back to ``mig``."""
    if model is None:
        return "full"
    if requested == "dynamic" and not model.supports_dynamic_mig:
        return "mig"
    return requested


# --- devices ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvertisedDevice:
    """A device entry of a ResourceSlice, with what the packer and policies need to know."""

    candidate: Candidate
    counter_set: str | None
    consumption: Mapping[str, int]
    body: Obj

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def gpu_index(self) -> int:
        return self.candidate.gpu_index

    @property
    def uses_limit_64(self) -> bool:
        """Devices with counters or taints lower the per-slice device limit to 64."""
        return bool(self.consumption) or bool(self.body.get("taints"))


@dataclass(frozen=True)
class GpuAdvert:
    """What one GPU contributes to the pool."""

    gpu_index: int
    counter_set: CounterSet | None
    devices: tuple[AdvertisedDevice, ...]
    ruled_out: tuple[str, ...] = ()
    """Devices left out because the claims allocated on the GPU already take counters they
    need (:func:`beside_claims`)."""


_NUMERIC = re.compile(r"^\d+$")


@functools.lru_cache(maxsize=256)
def semver(text: str) -> str | None:
    """``9.0`` -> ``9.0.0``, ``535.104.05`` -> ``535.104.5``: DRA version attributes are semver.

    Returns None for text that is not dotted numbers, so that the attribute is left out rather
    than rejected by the apiserver.
    """
    parts = text.strip().split(".")
    if not parts or len(parts) > 3 or not all(_NUMERIC.match(p) for p in parts):
        return None
    numbers = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(numbers)


def _string(value: str) -> Obj:
    return {"string": value[:64]}


def _attributes(info: GpuInfo, spec: DeviceSpec, profile: Profile | None) -> Obj:
    """Qualified with the contract's domain (:func:`core.identity.qualified`), so that they
    do not depend on the driver's name."""
    attrs: Obj = {_TYPE: _string(GPU_TYPE if profile is None else MIG_TYPE)}
    if profile is not None and isinstance(spec, SliceSpec):
        attrs[_PROFILE] = _string(profile.name)
        attrs[_PARENT_UUID] = _string(info.uuid)
        attrs[_PLACEMENT_START] = {"int": spec.start}
        attrs[_PLACEMENT_SIZE] = {"int": profile.memory_slices}
    else:
        attrs[_UUID] = _string(info.uuid)
    attrs[_PRODUCT_NAME] = _string(info.product_name)
    if info.brand:
        attrs[_BRAND] = _string(info.brand)
    attrs[_INDEX] = {"int": info.index}
    attrs[_ARCHITECTURE] = _string(info.architecture)
    for name, raw in (
        (_COMPUTE_CAPABILITY, info.cuda_compute_capability),
        (_DRIVER_VERSION, info.driver_version),
        (_CUDA_DRIVER_VERSION, info.cuda_driver_version),
    ):
        version = semver(raw)
        if version is not None:
            attrs[name] = {"version": version}
    if info.nvlink_domain:
        attrs[_NVLINK_DOMAIN] = _string(info.nvlink_domain)
    if info.pcie_root:
        attrs["resource.kubernetes.io/pcieRoot"] = _string(info.pcie_root)
    if info.pci_bus_id:
        attrs["resource.kubernetes.io/pciBusID"] = _string(info.pci_bus_id)
    return attrs


_TYPE, _PROFILE, _PLACEMENT_START, _PLACEMENT_SIZE, _NVLINK_DOMAIN = map(
    qualified,
    (
        TYPE_ATTRIBUTE,
        PROFILE_ATTRIBUTE,
        PLACEMENT_START_ATTRIBUTE,
        PLACEMENT_SIZE_ATTRIBUTE,
        NVLINK_DOMAIN_ATTRIBUTE,
    ),
)
_PARENT_UUID, _UUID, _PRODUCT_NAME, _BRAND, _INDEX, _ARCHITECTURE = map(
    qualified, ("parentUUID", "uuid", "productName", "brand", "index", "architecture")
)
_COMPUTE_CAPABILITY, _DRIVER_VERSION, _CUDA_DRIVER_VERSION = map(
    qualified, ("cudaComputeCapability", "driverVersion", "cudaDriverVersion")
)
_MEMORY = qualified(MEMORY_CAPACITY)
_ENGINE_CAPACITIES = tuple(
    map(
        qualified,
        ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines"),
    )
)


def _device(
    state: GpuState,
    spec: DeviceSpec,
    model: GpuModel | None,
    profile: Profile | None,
    consumption: Consumption,
    counter_set: str | None,
) -> AdvertisedDevice:
    info = state.info
    engines: gpu_model.Engines | None
    if profile is None:
        memory = info.memory_bytes or (model.memory_bytes if model else 0)
        sms = model.multiprocessors if model else None
        engines = model.engines if model else None
    else:
        memory, sms, engines = profile.memory_bytes, profile.multiprocessors, profile.engines
    capacity: Obj = {_MEMORY: {"value": format_quantity(memory, binary=True)}}
    if sms is not None:
        capacity[_ENGINE_CAPACITIES[0]] = {"value": str(sms)}
    if engines is not None:
        # NVIDIA's DRA driver's capacity names, so that selectors carry over.
        for name, value in zip(
            _ENGINE_CAPACITIES[1:],
            (engines.copy, engines.decoders, engines.encoders, engines.jpeg, engines.ofa),
            strict=True,
        ):
            capacity[name] = {"value": str(value)}
    body: Obj = {
        "name": spec.device_name,
        "attributes": _attributes(info, spec, profile),
        "capacity": capacity,
    }
    if consumption and counter_set is not None:
        body["consumesCounters"] = [
            {"counterSet": counter_set, "counters": render_counters(consumption)}
        ]
    if state.taints:
        body["taints"] = [t.render() for t in state.taints]
    if model is None:
        # Only a whole GPU of a model outside the catalog gets here; a placeholder model keeps
        # policies working (they only look at the profile, which is None).
        model = _UNKNOWN
    return AdvertisedDevice(Candidate(spec, model, profile), counter_set, consumption, body)


_UNKNOWN = gpu_model.whole_only_model("unknown")


def advertise_gpu(
    state: GpuState,
    *,
    static: bool = False,
    static_layout: StaticLayout | None = None,
    profiles: ProfileChoice | None = None,
    keep: frozenset[DeviceSpec] = frozenset(),
) -> GpuAdvert:
    """The counter set and devices of one GPU (before ordering and packing); ``profiles``
    leaves out the MIG profiles the admin did not list (partitionable layout only), except
    the agent's own instances and the devices in ``keep`` (allocated): a claim holds them, and
    the scheduler counts their counters only while they are listed."""
    model = state.model
    mode = effective_mode(state.mode, model)
    if static:
        return _advertise_static(state, model, mode, static_layout or StaticLayout())
    taken = state.taken()
    if mode == "full" or model is None:
        whole = _device(state, WholeGpu(state.index), model, None, {}, None)
        return GpuAdvert(state.index, None, () if taken else (whole,))

    known: list[tuple[Profile, int]] = []
    blocked: set[int] = set()
    for profile_name, start, memory_slices in taken:
        if model.has_profile(profile_name):
            known.append((model.profile(profile_name), start))
        blocked.update(memory_slices)
    values = counter_values(model, known)
    for memory_slice in blocked:  # an instance of a profile we do not know still holds memory
        values[f"memory-slice-{memory_slice}"] = 0
    set_name = counter_set_name(state.index)
    counters = CounterSet(set_name, values)
    foreign_placements: list[Placement] = [(p.name, s) for p, s in known]

    devices: list[AdvertisedDevice] = []
    if mode == "dynamic" and not taken:
        devices.append(
            _device(
                state, WholeGpu(state.index), model, None, whole_gpu_consumption(model), set_name
            )
        )
    for profile in model.profiles:
        listed = profiles is None or profiles.allows(profile.name)
        for start in profile.starts:
            if blocked.intersection(profile.covers(start)):
                continue
            if not listed and not _held(SliceSpec(state.index, profile.name, start), state, keep):
                continue
            if foreign_placements and not catalog.is_valid(
                model, [*foreign_placements, (profile.name, start)]
            ):
                continue
            spec = SliceSpec(state.index, profile.name, start)
            devices.append(
                _device(
                    state,
                    spec,
                    model,
                    profile,
                    profile_consumption(model, profile, start),
                    set_name,
                )
            )
    return GpuAdvert(state.index, counters, tuple(devices))


def beside_claims(advert: GpuAdvert, allocated: frozenset[DeviceSpec]) -> GpuAdvert:
    """``advert`` less the devices the allocator can no longer pick on this GPU.

    While a claim holds a device, every device whose counters the held ones leave short (the
    whole GPU beside a slice, the placements overlapping it, every slice beside the whole GPU)
    cannot be allocated: the scheduler would walk past each of them, for every DRA pod of every
    driver on every node it filters, only to reject it. Leaving them out changes no allocation
    (the allocator never picks a device its counters refuse), and they come back as soon as the
    holder is deallocated. The held devices themselves always stay: the scheduler counts their
    counters only while they are listed. (:func:`plan_pool` orders the devices before it leaves
    any out, so those listed keep the places they would have.)
    """
    if advert.counter_set is None:
        return advert
    held = [d for d in advert.devices if d.candidate.spec in allocated]
    if not held:
        return advert
    left = dict(advert.counter_set.values)
    for device in held:
        for name, amount in device.consumption.items():
            left[name] = left.get(name, 0) - amount
    kept: list[AdvertisedDevice] = []
    ruled_out: list[str] = []
    for device in advert.devices:
        if device.candidate.spec in allocated or all(
            left.get(name, 0) >= amount for name, amount in device.consumption.items()
        ):
            kept.append(device)
        else:
            ruled_out.append(device.name)
    return replace(advert, devices=tuple(kept), ruled_out=tuple(ruled_out))


def _held(spec: SliceSpec, state: GpuState, keep: frozenset[DeviceSpec]) -> bool:
    return spec in state.owned or spec in keep


def _advertise_static(
    state: GpuState, model: GpuModel | None, mode: Mode, layout: StaticLayout
) -> GpuAdvert:
    if state.whole_held_elsewhere:
        return GpuAdvert(state.index, None, ())
    if not state.instances and (mode == "full" or not state.info.mig_enabled or model is None):
        return GpuAdvert(
            state.index, None, (_device(state, WholeGpu(state.index), model, None, {}, None),)
        )
    if model is None:
        return GpuAdvert(state.index, None, ())
    wanted = set(layout.for_gpu(state.index) or ())
    devices: list[AdvertisedDevice] = []
    for inst in sorted(state.instances, key=lambda i: (i.start, i.profile)):
        if inst.uuid is None or not model.has_profile(inst.profile):
            continue  # half-made: not usable until cleanup or creation finishes
        if inst.spec not in state.owned and (inst.profile, inst.start) not in wanted:
            continue
        if inst.spec in state.held_elsewhere:
            continue  # a claim of the earlier driver name holds it; this pool must not offer it
        profile = model.profile(inst.profile)
        devices.append(_device(state, inst.spec, model, profile, {}, None))
    return GpuAdvert(state.index, None, tuple(devices))


def occupancy(gpus: Sequence[GpuState], allocated: Sequence[DeviceSpec] = ()) -> Occupancy:
    """What is in use on the node, for dynamic ordering: instances plus allocated devices."""
    return Occupancy.of(
        {g.index: [(i.profile, i.start) for i in g.instances] for g in gpus}, allocated
    )


# --- split and limits ------------------------------------------------------------------------


def slice_split(server_version: tuple[int, int]) -> SliceSplit:
    """1.34 needs devices next to their counter sets; 1.35 and later forbid it."""
    if server_version < (1, 34):
        raise InventoryError(
            f"Kubernetes {server_version[0]}.{server_version[1]} has no resource.k8s.io/v1; "
            "gpu-slicer needs 1.34 or later"
        )
    return "combined" if server_version < (1, 35) else "split"


@dataclass(frozen=True)
class SliceLimits:
    """Validation limits of a ResourceSlice that the OpenAPI schemas do not encode."""

    devices: int = 128
    devices_with_counters_or_taints: int = 64
    counter_sets: int = 8
    counters_per_set: int = 32
    counters_per_slice: int | None = None
    """1.34: at most 32 counters across all sets of a slice."""
    consumption_entries_per_device: int = 2
    counters_consumed_per_device: int | None = None
    """1.34: at most 32 counters consumed by one device."""
    counters_consumed_per_slice: int | None = None
    """1.34: at most 1024 counters consumed by all devices of a slice."""
    attributes_and_capacities: int = 32
    taints_per_device: int = 16
    exclusive: bool = True
    """1.35+: a slice holds devices or counter sets, never both."""


def limits_for(server_version: tuple[int, int]) -> SliceLimits:
    if slice_split(server_version) == "combined":
        return SliceLimits(
            counters_per_slice=32,
            counters_consumed_per_device=32,
            counters_consumed_per_slice=1024,
            taints_per_device=4,
            exclusive=False,
        )
    return SliceLimits()


def _device_limit(limits: SliceLimits, devices: Iterable[AdvertisedDevice]) -> int:
    if any(d.uses_limit_64 for d in devices):
        return limits.devices_with_counters_or_taints
    return limits.devices


def _pack_split(
    adverts: Sequence[GpuAdvert], ordered: Sequence[AdvertisedDevice], limits: SliceLimits
) -> list[tuple[list[CounterSet], list[AdvertisedDevice]]]:
    sets = [a.counter_set for a in sorted(adverts, key=lambda a: a.gpu_index) if a.counter_set]
    slices: list[tuple[list[CounterSet], list[AdvertisedDevice]]] = [
        (sets[i : i + limits.counter_sets], []) for i in range(0, len(sets), limits.counter_sets)
    ]
    chunk: list[AdvertisedDevice] = []
    for device in ordered:
        if chunk and len(chunk) + 1 > _device_limit(limits, [*chunk, device]):
            slices.append(([], chunk))
            chunk = []
        chunk.append(device)
    if chunk:
        slices.append(([], chunk))
    return slices


def _pack_combined(
    adverts: Sequence[GpuAdvert], ordered: Sequence[AdvertisedDevice], limits: SliceLimits
) -> list[tuple[list[CounterSet], list[AdvertisedDevice]]]:
    """Whole GPUs per slice, in the order their first device appears, within 1.34's limits."""
    by_gpu = {a.gpu_index: a for a in adverts}
    gpu_order: list[int] = []
    for device in ordered:
        if device.gpu_index not in gpu_order:
            gpu_order.append(device.gpu_index)
    gpu_order += sorted(g for g, a in by_gpu.items() if g not in gpu_order and a.counter_set)

    groups: list[list[int]] = []
    totals = {"sets": 0, "counters": 0, "consumed": 0}
    members: list[AdvertisedDevice] = []
    for gpu in gpu_order:
        advert = by_gpu[gpu]
        sets = 1 if advert.counter_set else 0
        counters = advert.counter_set.size if advert.counter_set else 0
        consumed = sum(len(d.consumption) for d in advert.devices)
        fits = bool(groups) and (
            totals["sets"] + sets <= limits.counter_sets
            and totals["counters"] + counters <= (limits.counters_per_slice or 1 << 30)
            and totals["consumed"] + consumed <= (limits.counters_consumed_per_slice or 1 << 30)
            and len(members) + len(advert.devices)
            <= _device_limit(limits, [*members, *advert.devices])
        )
        if not fits:
            groups.append([])
            totals = {"sets": 0, "counters": 0, "consumed": 0}
            members = []
        groups[-1].append(gpu)
        totals["sets"] += sets
        totals["counters"] += counters
        totals["consumed"] += consumed
        members.extend(advert.devices)

    slices: list[tuple[list[CounterSet], list[AdvertisedDevice]]] = []
    for group in groups:
        members_set = set(group)
        sets_in = [s for g in group if (s := by_gpu[g].counter_set) is not None]
        devices = [d for d in ordered if d.gpu_index in members_set]
        if sets_in or devices:
            slices.append((sets_in, devices))
    return slices


def slice_name(node: str, seq: int, width: int) -> str:
    """``<node>-gpu-slicer.io-007``. Slice names are cluster-wide, so a node name too long for
    the suffix is shortened and made unique again with a hash of the full name."""
    suffix = f"-{DRIVER}-{seq:0{width}d}"
    if len(node) + len(suffix) <= 253:
        return node + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    return node[: 253 - len(suffix) - 9].rstrip("-.") + "-" + digest + suffix


@dataclass(frozen=True)
class PoolPlan:
    """The slices of a pool plus what was decided on the way (for logs, metrics and tests)."""

    slices: list[Obj]
    split: SliceSplit
    """Devices and counter sets in one slice (1.34) or apart (1.35 and later)."""
    static: bool
    device_order: str
    order: tuple[str, ...]
    """Device names in the device order's order."""
    ruled_out: frozenset[str] = frozenset()
    """Devices left out only because allocated devices beside them take their counters
    (:func:`beside_claims`): leaving them out can wait, listing them again cannot."""


def plan_pool(
    node: str,
    gpus: Sequence[GpuState],
    *,
    server_version: tuple[int, int] = (1, 36),
    generation: int = 1,
    device_order: DeviceOrder | str = "name",
    allocated: Sequence[DeviceSpec] = (),
    static: bool = False,
    static_layout: StaticLayout | None = None,
    profiles: ProfileChoice | None = None,
    attributes: DeviceAttributes = "full",
) -> PoolPlan:
    """Build the ResourceSlices of ``node``'s pool: advertise, order, pack, render (each device
    with the ``attributes`` the agent's ``--attributes`` chose)."""
    split = slice_split(server_version)
    limits = limits_for(server_version)
    order = get_device_order(device_order) if isinstance(device_order, str) else device_order
    keep = frozenset(allocated)
    adverts = [
        advertise_gpu(
            g,
            static=static,
            static_layout=static_layout,
            profiles=profiles,
            keep=keep,
        )
        for g in gpus
    ]
    by_name = {d.name: d for a in adverts for d in a.devices}
    # The order of every device, then those the allocations rule out left out: the devices
    # listed keep the places they would have, so the scheduler decides as with all of them.
    ordered_candidates = order.order(
        [d.candidate for d in by_name.values()], occupancy(gpus, allocated)
    )
    adverts = [beside_claims(a, keep) for a in adverts]
    listed = {d.name for a in adverts for d in a.devices}
    ordered = [by_name[c.name] for c in ordered_candidates if c.name in listed]
    packer = _pack_combined if split == "combined" else _pack_split
    packed = packer(adverts, ordered, limits)
    width = max(3, len(str(max(len(packed) - 1, 0))))
    labels = {MANAGED_BY_LABEL: MANAGED_BY, LAYOUT_LABEL: "static" if static else "partitionable"}
    slices: list[Obj] = []
    annotations = {} if static or profiles is None else {ADVERTISED_ANNOTATION: profiles.text()}
    for seq, (sets, devices) in enumerate(packed):
        spec: Obj = {
            "driver": DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(packed)},
            "nodeName": node,
        }
        if sets:
            spec["sharedCounters"] = [
                {"name": s.name, "counters": render_counters(s.values)} for s in sets
            ]
        if devices:
            spec["devices"] = [device_body(d.body, attributes) for d in devices]
        slices.append(
            {
                "apiVersion": RESOURCE_API,
                "kind": "ResourceSlice",
                "metadata": {
                    "name": slice_name(node, seq, width),
                    "labels": dict(labels),
                    **({"annotations": dict(annotations)} if annotations else {}),
                },
                "spec": spec,
            }
        )
    return PoolPlan(
        slices,
        split,
        static,
        order.name,
        tuple(d.name for d in ordered),
        frozenset(name for a in adverts for name in a.ruled_out),
    )


def build_slices(node: str, gpus: Sequence[GpuState], **options: Any) -> list[Obj]:
    """:func:`plan_pool`, just the slices."""
    return plan_pool(node, gpus, **options).slices


# --- checking --------------------------------------------------------------------------------


def check_limits(slices: Sequence[Obj], server_version: tuple[int, int]) -> list[str]:
    """Every way ``slices`` (one pool) break the apiserver's limits or the pool's consistency."""
    limits = limits_for(server_version)
    combined = slice_split(server_version) == "combined"
    problems = _pool_problems(slices)
    pool_sets: dict[str, set[str]] = {}
    device_names: set[str] = set()
    for s in slices:
        problems += _slice_problems(s, limits, combined, pool_sets, device_names)
    problems += _consumption_problems(slices, pool_sets)
    return problems


def _pool_problems(slices: Sequence[Obj]) -> list[str]:
    """The slices must agree on the pool they make up, or the scheduler ignores the pool."""
    problems: list[str] = []
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    if len(generations) > 1:
        problems.append(f"slices disagree on the pool generation: {sorted(generations)}")
    if slices and counts != {len(slices)}:
        problems.append(f"resourceSliceCount {sorted(counts)} but {len(slices)} slices")
    return problems


def _slice_problems(
    s: Obj,
    limits: SliceLimits,
    combined: bool,
    pool_sets: dict[str, set[str]],
    device_names: set[str],
) -> list[str]:
    """One slice against the per-slice limits; records its counter sets in ``pool_sets`` and
    its devices in ``device_names``, which the pool-wide checks read."""
    name = s["metadata"]["name"]
    spec = s["spec"]
    sets = spec.get("sharedCounters") or []
    devices = spec.get("devices") or []
    problems: list[str] = []
    if limits.exclusive and sets and devices:
        problems.append(f"{name}: holds both devices and counter sets")
    if len(sets) > limits.counter_sets:
        problems.append(f"{name}: {len(sets)} counter sets > {limits.counter_sets}")
    total = 0
    slice_sets: dict[str, set[str]] = {}
    for cs in sets:
        n = len(cs["counters"])
        total += n
        if n > limits.counters_per_set:
            problems.append(f"{name}: set {cs['name']} has {n} counters")
        if cs["name"] in pool_sets:
            problems.append(f"{name}: counter set {cs['name']} defined twice in the pool")
        pool_sets[cs["name"]] = set(cs["counters"])
        slice_sets[cs["name"]] = set(cs["counters"])
    if limits.counters_per_slice is not None and total > limits.counters_per_slice:
        problems.append(f"{name}: {total} counters > {limits.counters_per_slice}")
    heavy = any(d.get("consumesCounters") or d.get("taints") for d in devices)
    cap = limits.devices_with_counters_or_taints if heavy else limits.devices
    if len(devices) > cap:
        problems.append(f"{name}: {len(devices)} devices > {cap}")
    # In the combined split a device may only consume the counter sets of its own slice.
    visible = slice_sets if combined else None
    consumed_in_slice = 0
    for d in devices:
        consumed_in_slice += _device_problems(name, d, limits, visible, device_names, problems)
    if (
        limits.counters_consumed_per_slice is not None
        and consumed_in_slice > limits.counters_consumed_per_slice
    ):
        problems.append(f"{name}: {consumed_in_slice} counter consumptions in one slice")
    return problems


def _device_problems(
    name: str,
    d: Obj,
    limits: SliceLimits,
    visible: dict[str, set[str]] | None,
    device_names: set[str],
    problems: list[str],
) -> int:
    """Appends what is wrong with device ``d`` of slice ``name`` to ``problems``; returns how
    many counters it consumes, which the slice's own limit adds up."""
    dn = d["name"]
    if dn in device_names:
        problems.append(f"{name}: device {dn} listed twice in the pool")
    device_names.add(dn)
    if len(dn) > 63:
        problems.append(f"{name}: device name {dn} longer than 63")
    attrs = d.get("attributes", {})
    if len(attrs) + len(d.get("capacity", {})) > limits.attributes_and_capacities:
        problems.append(f"{name}: {dn} has too many attributes and capacities")
    for key, value in attrs.items():
        if len(value.get("string", "")) > 64:
            problems.append(f"{name}: {dn} attribute {key} longer than 64")
    if len(d.get("taints", [])) > limits.taints_per_device:
        problems.append(f"{name}: {dn} has more than {limits.taints_per_device} taints")
    entries = d.get("consumesCounters") or []
    if len(entries) > limits.consumption_entries_per_device:
        problems.append(f"{name}: {dn} has {len(entries)} consumesCounters entries")
    consumed = sum(len(e["counters"]) for e in entries)
    if (
        limits.counters_consumed_per_device is not None
        and consumed > limits.counters_consumed_per_device
    ):
        problems.append(f"{name}: {dn} consumes {consumed} counters")
    for e in entries:
        if visible is not None and e["counterSet"] not in visible:
            problems.append(f"{name}: {dn} uses {e['counterSet']} from another slice")
    return consumed


def _consumption_problems(slices: Sequence[Obj], pool_sets: dict[str, set[str]]) -> list[str]:
    """Every counter a device consumes must be defined by some counter set of the pool."""
    problems: list[str] = []
    for s in slices:
        for d in s["spec"].get("devices") or []:
            for e in d.get("consumesCounters") or []:
                known = pool_sets.get(e["counterSet"])
                if known is None:
                    problems.append(f"{d['name']} consumes unknown set {e['counterSet']}")
                elif not set(e["counters"]) <= known:
                    missing = sorted(set(e["counters"]) - known)
                    problems.append(f"{d['name']} consumes unknown counters {missing}")
    return problems
