"""Device orders, measured the way the scheduler uses them: first-fit over the list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import DeviceSpec, SliceSpec, parse_device_name
from gpu_slicer.slicer.inventory import GpuState, build_slices, plan_pool
from gpu_slicer.slicer.ordering import (
    DEVICE_ORDERS,
    Occupancy,
    OrderingError,
    RepublishLimiter,
    get_device_order,
)


def first_fit(view: Any, profile: str, taken: list[str]) -> str | None:
    """The scheduler's choice for one device of ``profile``: the first listed one that fits."""
    for name in view.order:
        spec = parse_device_name(name)
        if isinstance(spec, SliceSpec) and spec.profile == profile and name not in taken:
            if view.admits([*taken, name]):
                return str(name)
    return None


def still_possible(view: Any, taken: list[str], min_slices: int, model: gpu_model.GpuModel) -> int:
    """Devices of at least ``min_slices`` memory slices that could still be allocated."""
    count = 0
    for name in view.order:
        spec = parse_device_name(name)
        if isinstance(spec, SliceSpec) and model.profile(spec.profile).memory_slices >= min_slices:
            count += view.admits([*taken, name])
    return count


def test_every_registered_policy_only_reorders(
    make_states: Callable[..., list[GpuState]],
) -> None:
    states = make_states("H100-80GB:3,A30:1")
    names = None
    for policy in DEVICE_ORDERS:
        order = plan_pool(
            "n", states, device_order=policy, allocated=[SliceSpec(1, "2g.20gb", 2)]
        ).order
        assert len(set(order)) == len(order)
        if names is not None:
            assert set(order) == names
        names = set(order)


def test_an_unknown_policy_is_refused_with_the_known_names() -> None:
    with pytest.raises(OrderingError, match="name, anti-fragmentation, best-fit"):
        get_device_order("random")


def test_name_order_is_canonical_gpu_by_gpu(make_states: Callable[..., list[GpuState]]) -> None:
    order = plan_pool("n", make_states("H100-80GB:11"), device_order="name").order
    assert order[0] == "gpu-0" and order[1] == "gpu-0-mig-1g10gb-0"
    gpus = [parse_device_name(n).gpu_index for n in order]
    assert gpus == sorted(gpus)  # gpu-10 after gpu-9, not after gpu-1


def test_anti_fragmentation_puts_a_small_slice_where_it_destroys_least(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any]
) -> None:
    view = pool_view(
        build_slices("n", make_states("H100-80GB:1"), device_order="anti-fragmentation")
    )
    assert first_fit(view, "1g.10gb", []) == "gpu-0-mig-1g10gb-6"


@pytest.mark.parametrize("model_key", ["H100-80GB", "A100-40GB", "B200"])
def test_anti_fragmentation_keeps_more_large_placements_than_name_order(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any], model_key: str
) -> None:
    model = catalog.get_model(model_key)
    small = model.profiles[0].name
    left: dict[str, list[int]] = {}
    for policy in ("name", "anti-fragmentation"):
        view = pool_view(build_slices("n", make_states(f"{model_key}:1"), device_order=policy))
        taken: list[str] = []
        left[policy] = []
        for _ in range(3):
            choice = first_fit(view, small, taken)
            assert choice is not None
            taken.append(choice)
            left[policy].append(still_possible(view, taken, 4, model))
    assert all(a >= n for a, n in zip(left["anti-fragmentation"], left["name"], strict=True))
    assert left["anti-fragmentation"] != left["name"]


def test_best_fit_packs_onto_a_gpu_in_use_and_keeps_empty_gpus_whole(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any]
) -> None:
    states = make_states("H100-80GB:4")
    allocated: list[DeviceSpec] = [SliceSpec(3, "3g.40gb", 0)]
    best = pool_view(build_slices("n", states, device_order="best-fit", allocated=allocated))
    static = pool_view(
        build_slices("n", states, device_order="anti-fragmentation", allocated=allocated)
    )
    taken = [SliceSpec(3, "3g.40gb", 0).device_name]
    assert first_fit(best, "1g.10gb", taken) == "gpu-3-mig-1g10gb-6"
    assert first_fit(static, "1g.10gb", taken) == "gpu-0-mig-1g10gb-6"  # breaks an empty GPU


def test_best_fit_prefers_the_tightest_gpu_in_use(
    make_states: Callable[..., list[GpuState]],
) -> None:
    states = make_states(
        "H100-80GB:3", instances={2: [("1g.10gb", 6)]}, owned={2: [("1g.10gb", 6)]}
    )
    plan = plan_pool("n", states, device_order="best-fit", allocated=[SliceSpec(1, "4g.40gb", 0)])
    firsts = [n for n in plan.order if "1g10gb-" in n]
    gpus = list(dict.fromkeys(parse_device_name(n).gpu_index for n in firsts))
    assert gpus == [1, 2, 0]  # in use with 4 free, in use with 7 free, then the empty GPU


def test_occupancy_merges_instances_and_allocations() -> None:
    occ = Occupancy.of(
        {0: [("1g.10gb", 6)]}, [SliceSpec(0, "1g.10gb", 6), SliceSpec(1, "2g.20gb", 0)]
    )
    model = catalog.get_model("H100-80GB")
    assert occ.placements[0] == (("1g.10gb", 6),)
    assert occ.free_memory_slices(0, model) == 7 and occ.free_memory_slices(1, model) == 6
    assert occ.in_use(1) and not occ.in_use(2)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_republish_limiter_debounces_and_rate_limits_order_changes() -> None:
    clock = FakeClock()
    limiter = RepublishLimiter(min_interval_s=30, quiet_s=2, clock=clock)
    limiter.published("A")
    limiter.observe("A")
    assert limiter.due_in() is None
    clock.now = 5
    limiter.observe("B")
    assert limiter.due_in() == 25  # rate limit: 30 s after the last publish
    clock.now = 29
    limiter.observe("C")  # still changing: the quiet period starts again
    assert not limiter.due() and limiter.due_in() == 2
    clock.now = 31
    assert limiter.due()
    limiter.published("C")
    assert limiter.due_in() is None
    clock.now = 100
    limiter.observe("A")
    assert limiter.due_in() == 2
