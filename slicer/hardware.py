"""MIG models built from what a GPU reports about itself, and how they differ from the catalog.

Why: memory per profile differs by model and by driver (an A100 80GB ``2g.20gb`` shows 19.50 GiB,
its ``7g.80gb`` 78.50-79.25 GiB depending on the driver), and new MIG-capable GPUs (GB200, B300,
RTX PRO 6000 Blackwell, ...) appear faster than any table. So on a real node the NVML backend reads
every GPU-instance profile (``nvmlDeviceGetGpuInstanceProfileInfo``: memory, multiprocessors,
engines, instance count, compute slices, name) and its placements
(``nvmlDeviceGetGpuInstancePossiblePlacements``) and hands them here as :class:`ProfileFacts`.
:func:`model_from_facts` turns them into the same :class:`core.gpu_model.GpuModel` the rest of the
agent uses (``source="nvml"``), and :func:`differences` says, in words, where the catalog
disagrees. Pure: data in, data out.

The counter totals of such a model (multiprocessors, engines, memory) are the largest sums any
set of instances the GPU can host reaches (:func:`budget_totals`), never less than what the
largest profile has: the counters then never refuse a set the GPU can host, and the OFA counter
keeps admitting one ``+me`` instance at most, as on catalog models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.devices import profile_token
from gpu_slicer.core.errors import DeviceNameError
from gpu_slicer.core.gpu_model import MIB, Engines, GpuModel, Profile

_CI = "NVML_COMPUTE_INSTANCE_PROFILE_"
_MIG_PREFIX = re.compile(r"^\s*MIG\s+", re.IGNORECASE)
_NAME_RE = re.compile(r"^\d+g\.\d+gb[-+.a-z]*$")


@dataclass(frozen=True)
class ProfileFacts:
    """One GPU-instance profile as NVML reports it on one GPU."""

    constant: str
    """The NVML constant it was read with, e.g. ``NVML_GPU_INSTANCE_PROFILE_1_SLICE``."""
    profile_id: int
    name: str
    """As NVML names it (``MIG 1g.10gb`` in the v2 struct) or empty when the struct has none."""
    slice_count: int
    """Compute slices."""
    instance_count: int
    multiprocessors: int
    engines: Engines
    memory_mib: int
    placements: tuple[tuple[int, int], ...]
    """``(start, size)`` in memory slices, every legal one."""


def profile_name(facts: ProfileFacts) -> str:
    """``MIG 1g.10gb`` -> ``1g.10gb``; without a name, ``<slices>g.<GB>gb`` from the figures."""
    name = _MIG_PREFIX.sub("", facts.name).strip()
    if name:
        return name
    suffix = "+me" if facts.constant.endswith("_REV1") else ""
    return f"{facts.slice_count}g.{round(facts.memory_mib / 1000)}gb{suffix}"


def model_key(product_name: str) -> str:
    """A model key for a GPU the catalog does not know: ``NVIDIA GB200`` -> ``GB200``."""
    text = re.sub(r"^NVIDIA\s+", "", product_name.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-") or "unknown"


def model_from_facts(
    facts: Sequence[ProfileFacts],
    *,
    key: str,
    product_name: str,
    architecture: str,
    cuda_compute_capability: str,
    memory_bytes: int,
    base: GpuModel | None = None,
) -> tuple[GpuModel | None, list[str]]:
    """The GPU's MIG model from its own profile facts, and the profiles left out (in words).

    ``base`` (the catalog's model, when it knows the GPU) supplies aliases, product names and
    PCI ids. Returns None for the model when no usable profile is left.
    """
    skipped: list[str] = []
    profiles: list[Profile] = []
    for f in sorted(facts, key=lambda f: (f.slice_count, f.memory_mib, f.profile_id)):
        name = profile_name(f)
        problem = _unusable(f, name)
        if problem:
            skipped.append(f"{key} profile {name!r} (id {f.profile_id}) left out: {problem}")
            continue
        size = f.placements[0][1]
        profiles.append(
            Profile(
                name=name,
                nvml_constant=f.constant,
                ci_nvml_constant=f"{_CI}{f.slice_count}_SLICE",
                typical_id=f.profile_id,
                memory_slices=size,
                compute_slices=f.slice_count,
                memory_bytes=f.memory_mib * MIB,
                multiprocessors=f.multiprocessors,
                engines=f.engines,
                max_count=f.instance_count,
                starts=tuple(sorted(s for s, _ in f.placements)),
            )
        )
    if not profiles:
        return None, skipped
    memory_slices = max(p.starts[-1] + p.memory_slices for p in profiles)
    compute_slices = max(p.compute_slices for p in profiles)
    draft = GpuModel(
        key=key,
        aliases=base.aliases if base else (),
        product_names=base.product_names if base else (product_name,),
        pci_device_ids=base.pci_device_ids if base else (),
        architecture=architecture,
        cuda_compute_capability=cuda_compute_capability,
        memory_bytes=memory_bytes,
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        multiprocessors=0,
        engines=Engines(0, 0, 0, 0, 0),
        profiles=tuple(profiles),
        confirmed=True,
        source="nvml",
    )
    sms, engines, memory = budget_totals(draft)
    return replace(
        draft, multiprocessors=sms, engines=engines, memory_bytes=max(memory_bytes, memory)
    ), skipped


def _unusable(f: ProfileFacts, name: str) -> str:
    if not _NAME_RE.match(name):
        return "its name is not <n>g.<m>gb[variant]"
    try:
        profile_token(name)
    except DeviceNameError:
        return "gpu-slicer has no device-name spelling for its variant"
    if not f.placements:
        return "NVML lists no placement for it"
    if len({size for _, size in f.placements}) != 1:
        return "its placements differ in size"
    if f.instance_count < 1 or f.slice_count < 1:
        return "NVML reports no instance or compute slice for it"
    return ""


def budget_totals(model: GpuModel) -> tuple[int, Engines, int]:
    """The largest multiprocessor, engine and memory sums of any set the GPU can host."""
    return _budget_totals(model.profiles, model.memory_slices, model.compute_slices)


@lru_cache(maxsize=64)
def _budget_totals(
    profiles: tuple[Profile, ...], memory_slices: int, compute_slices: int
) -> tuple[int, Engines, int]:
    model = GpuModel(
        key="budget",
        aliases=(),
        product_names=(),
        pci_device_ids=(),
        architecture="",
        cuda_compute_capability="",
        memory_bytes=0,
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        multiprocessors=0,
        engines=Engines(0, 0, 0, 0, 0),
        profiles=profiles,
        confirmed=True,
    )
    by_name = {p.name: p for p in profiles}
    placements = catalog.all_placements(model)
    best = [0] * 7

    def visit(chosen: list[Placement], after: int) -> None:
        totals = [0] * 7
        for name, _start in chosen:
            p = by_name[name]
            e = p.engines
            for i, v in enumerate(
                (p.multiprocessors, e.copy, e.decoders, e.encoders, e.jpeg, e.ofa, p.memory_bytes)
            ):
                totals[i] += v
        for i, v in enumerate(totals):
            best[i] = max(best[i], v)
        for k in range(after, len(placements)):
            candidate = [*chosen, placements[k]]
            if catalog.is_valid(model, candidate):
                visit(candidate, k + 1)

    visit([], 0)
    sms, copy, decoders, encoders, jpeg, ofa, memory = best
    return sms, Engines(copy, decoders, encoders, jpeg, ofa), memory


def differences(catalog_model: GpuModel, hardware: GpuModel) -> list[str]:
    """Where the GPU's own facts disagree with the catalog, one line per value."""
    found: list[str] = []
    where = catalog_model.key
    ours = {p.name: p for p in catalog_model.profiles}
    theirs = {p.name: p for p in hardware.profiles}
    for name in sorted(set(ours) - set(theirs)):
        found.append(f"{where} {name}: in the catalog, not reported by the GPU")
    for name in sorted(set(theirs) - set(ours)):
        found.append(f"{where} {name}: reported by the GPU, not in the catalog")
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a.memory_bytes != b.memory_bytes:
            found.append(
                f"{where} {name}: memory {a.memory_bytes / gpu_model.GIB:.2f} GiB in the "
                f"catalog, {b.memory_bytes / gpu_model.GIB:.2f} GiB on the GPU"
            )
        for label, x, y in (
            ("multiprocessors", a.multiprocessors, b.multiprocessors),
            ("engines", vars(a.engines), vars(b.engines)),
            ("starts", list(a.starts), list(b.starts)),
            ("size", a.memory_slices, b.memory_slices),
            ("instances", a.max_count, b.max_count),
            ("compute slices", a.compute_slices, b.compute_slices),
        ):
            if x != y:
                found.append(f"{where} {name}: {label} {x} in the catalog, {y} on the GPU")
    return found
