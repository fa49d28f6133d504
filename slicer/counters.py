"""The shared-counter model that lets the scheduler hand out MIG slices without overlap.

Every GPU gets one counter set, ``gpu-<i>-counters``: one counter per memory slice (value 1) and
one per budget (multiprocessors, copy engines, decoders, encoders, JPEG and OFA engines, memory
bytes) that can refuse something the memory slices allow (:func:`binding_counters`). A MIG
device consumes the memory slices it covers and its profile's share of those budgets; the whole
GPU consumes everything. The scheduler allocates a set of devices only when, per counter, the
consumptions add up to at most the counter's value.

Why that is exactly the catalog's validity (checked exhaustively for every model in the tests,
argued in docs/resourceslices.md): memory-slice counters forbid overlap; every legal set of
placements already respects the per-profile instance limits and, on the catalog's geometries,
the compute-slice budget; the OFA counter has a value of 1 and every ``+me`` profile takes the
OFA engine, so at most one ``+me`` instance fits; the other budgets never bind a legal set, so
they are not published: each counter a device consumes costs the scheduler time on every node
it filters, for every pod.

Instances the agent did not create are already on the GPU and not in any claim, so their share
is taken off the counter set (:func:`counter_values` with ``foreign``): the scheduler then
admits exactly the sets that can join them.

Pure: data in, data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from gpu_slicer.core.gpu_model import GpuModel, Profile
from gpu_slicer.kube.quantity import format_bytes

ENGINE_COUNTERS: tuple[str, ...] = (
    "multiprocessors",
    "copy-engines",
    "decoders",
    "encoders",
    "jpeg-engines",
    "ofa-engines",
    "memory",
)
"""The budget counters of every counter set, after the ``memory-slice-<i>`` counters."""

Consumption = dict[str, int]
"""Counter name -> amount; absent means zero."""


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-counters"


def memory_slice_counter(memory_slice: int) -> str:
    return f"memory-slice-{memory_slice}"


BUDGETS_TRIED: tuple[str, ...] = (
    "ofa-engines",
    *(name for name in ENGINE_COUNTERS if name != "ofa-engines"),
)
"""The order in which :func:`binding_counters` adds budgets: the OFA engine first, because
every ``+me`` profile takes it and it has a value of 1, so it alone keeps ``+me`` instances to
one (and then the JPEG engine and the decoders, which bind only through ``+me`` sets, do not)."""


@cache
def binding_counters(model: GpuModel) -> tuple[str, ...]:
    """The counters published for ``model``, in order: every memory slice, and the budgets without
    which the counters would admit a set of non-overlapping placements that takes more of a
    budget than the GPU has.

    Budgets are added one at a time (:data:`BUDGETS_TRIED`) while some set that respects the
    memory slices and the budgets added so far exceeds one; a budget no such set exceeds never
    refuses anything the others admit, so leaving it out changes no allocation. Publishing it
    would cost the scheduler's allocator, which checks every counter each device consumes on
    every node it filters, for every pod (docs/resourceslices.md has the measurement).
    """
    totals = gpu_totals(model)
    kept: list[str] = []
    while True:
        peaks = _peak_budgets(model, totals, kept)
        exceeded = [n for n in BUDGETS_TRIED if n not in kept and peaks[n] > totals[n]]
        if not exceeded:
            break
        kept.append(exceeded[0])
    return tuple(
        [memory_slice_counter(i) for i in range(model.memory_slices)]
        + [name for name in ENGINE_COUNTERS if name in kept]
    )


def _peak_budgets(model: GpuModel, totals: Consumption, kept: list[str]) -> Consumption:
    """Per budget, the most that any set of non-overlapping placements of ``model`` within the
    ``kept`` budgets takes together."""
    placements = [
        (sum(1 << i for i in profile.covers(start)), _profile_budgets(profile))
        for profile in model.profiles
        for start in profile.starts
    ]
    peaks: Consumption = dict.fromkeys(ENGINE_COUNTERS, 0)
    used: Consumption = dict.fromkeys(ENGINE_COUNTERS, 0)

    def extend(first: int, occupied: int) -> None:
        for name in ENGINE_COUNTERS:
            peaks[name] = max(peaks[name], used[name])
        for index in range(first, len(placements)):
            mask, budgets = placements[index]
            if occupied & mask or any(used[k] + budgets[k] > totals[k] for k in kept):
                continue
            for name, amount in budgets.items():
                used[name] += amount
            extend(index + 1, occupied | mask)
            for name, amount in budgets.items():
                used[name] -= amount

    extend(0, 0)
    return peaks


def _budgets(
    multiprocessors: int, copy: int, decoders: int, encoders: int, jpeg: int, ofa: int, memory: int
) -> Consumption:
    return {
        "multiprocessors": multiprocessors,
        "copy-engines": copy,
        "decoders": decoders,
        "encoders": encoders,
        "jpeg-engines": jpeg,
        "ofa-engines": ofa,
        "memory": memory,
    }


def gpu_totals(model: GpuModel) -> Consumption:
    """What a whole, empty GPU of ``model`` offers: the counter set's full values."""
    totals = {memory_slice_counter(i): 1 for i in range(model.memory_slices)}
    e = model.engines
    totals.update(
        _budgets(
            model.multiprocessors,
            e.copy,
            e.decoders,
            e.encoders,
            e.jpeg,
            e.ofa,
            model.memory_bytes,
        )
    )
    return totals


def whole_gpu_consumption(model: GpuModel) -> Consumption:
    """The whole GPU takes every counter in full, so it excludes every MIG device and vice versa."""
    totals = gpu_totals(model)
    return {name: totals[name] for name in binding_counters(model) if totals[name]}


def _profile_budgets(profile: Profile) -> Consumption:
    e = profile.engines
    return _budgets(
        profile.multiprocessors, e.copy, e.decoders, e.encoders, e.jpeg, e.ofa, profile.memory_bytes
    )


def profile_consumption(model: GpuModel, profile: Profile, start: int) -> Consumption:
    """What one instance of ``profile`` at ``start`` takes of the published counters; zero
    amounts are left out."""
    used = {memory_slice_counter(i): 1 for i in profile.covers(start)}
    used.update(_profile_budgets(profile))
    return {name: used[name] for name in binding_counters(model) if used.get(name)}


def counter_values(model: GpuModel, foreign: Iterable[tuple[Profile, int]] = ()) -> Consumption:
    """The counter set to publish: the GPU's totals less what ``foreign`` instances hold.

    Values never go below zero: a foreign set the catalog calls invalid (which NVML would not
    have let anyone create) still yields a publishable set, just an exhausted one.
    """
    totals = gpu_totals(model)
    values = {name: totals[name] for name in binding_counters(model)}
    for profile, start in foreign:
        for name, amount in profile_consumption(model, profile, start).items():
            values[name] = max(0, values[name] - amount)
    return values


@dataclass(frozen=True)
class CounterSet:
    """One GPU's counter set, ready to be rendered into a ResourceSlice."""

    name: str
    values: Mapping[str, int]

    @property
    def size(self) -> int:
        return len(self.values)


def format_quantity(value: int, *, binary: bool = False) -> str:
    """Render an integer as the apiserver's canonical Quantity string.

    Byte amounts use the largest binary suffix that keeps the number whole (``143771Mi``), as the
    apiserver would print them back, so that a read-back compares equal to what was written.
    """
    if not binary or value == 0:
        return str(value)
    return format_bytes(value)


def render_counters(values: Mapping[str, int]) -> dict[str, dict[str, str]]:
    """``{"memory-slice-0": {"value": "1"}, "memory": {"value": "143771Mi"}, ...}``."""
    return {
        name: {"value": format_quantity(amount, binary=name == "memory")}
        for name, amount in values.items()
    }
