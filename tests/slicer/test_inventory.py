"""Inventory -> ResourceSlices: schemas, limits, counter soundness and completeness, modes."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any, cast

import pytest
from kubernetes.utils import quantity

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import DeviceTaint, SliceSpec, WholeGpu, parse_device_name
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.core.identity import DRIVER
from gpu_slicer.slicer.counters import binding_counters
from gpu_slicer.slicer.inventory import (
    GpuState,
    InventoryError,
    build_slices,
    check_limits,
    default_mode,
    limits_for,
    plan_pool,
    semver,
)
from gpu_slicer.slicer.layout import StaticLayout

VERSIONS = ("1.34", "1.35", "1.36", "1.37")
MODEL_KEYS = [m.key for m in catalog.MODELS]


def vt(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


# --- schemas and limits ----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "spec,mode",
    [("H200-141GB:2", "dynamic"), ("A100-80GB:1,A30:1", "mig"), ("B200:1", "full")],
)
def test_every_slice_validates_strictly_against_the_schema_of_each_version(
    make_states: Callable[..., list[GpuState]],
    validate: Callable[[dict[str, Any], str], None],
    version: str,
    spec: str,
    mode: str,
) -> None:
    states = make_states(
        spec, mode=mode, instances={0: [("1g.18gb", 0)]} if "H200" in spec else None
    )
    states[-1] = GpuState(
        states[-1].info,
        states[-1].mode,
        states[-1].instances,
        states[-1].owned,
        (DeviceTaint("gpu-slicer.io/unhealthy", "xid-79"),),
    )
    slices = build_slices("node-a", states, server_version=vt(version), device_order="best-fit")
    assert slices
    for obj in slices:
        validate(obj, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_static_layout_slices_validate_strictly(
    make_states: Callable[..., list[GpuState]],
    validate: Callable[[dict[str, Any], str], None],
    version: str,
) -> None:
    states = make_states(
        "H100-80GB:2",
        instances={0: [("3g.40gb", 0), ("1g.10gb", 6)]},
        owned={0: [("3g.40gb", 0), ("1g.10gb", 6)]},
    )
    slices = build_slices("node-a", states, server_version=vt(version), static=True)
    assert {d["name"] for s in slices for d in s["spec"].get("devices", [])} == {
        "gpu-0-mig-3g40gb-0",
        "gpu-0-mig-1g10gb-6",
        "gpu-1",
    }
    for obj in slices:
        validate(obj, version)


def test_versions_from_1_35_share_one_set_of_limits() -> None:
    # So the split layout checked on 1.35 below is the one 1.36 and 1.37 get.
    assert limits_for((1, 35)) == limits_for((1, 36)) == limits_for((1, 37))
    assert limits_for((1, 34)) != limits_for((1, 35))


@pytest.mark.parametrize("version", ["1.34", "1.35"])
@pytest.mark.parametrize("model_key", MODEL_KEYS)
def test_limits_hold_for_one_to_sixteen_gpus_of_every_model(
    make_states: Callable[..., list[GpuState]], model_key: str, version: str
) -> None:
    states16 = make_states(f"{model_key}:16")
    for count in range(1, 17):
        plan = plan_pool(
            "node-a",
            states16[:count],
            server_version=vt(version),
            device_order="anti-fragmentation",
            generation=7,
        )
        assert check_limits(plan.slices, vt(version)) == [], count
        listed = [d["name"] for s in plan.slices for d in s["spec"].get("devices", [])]
        assert sorted(listed) == sorted(plan.order)
        sets = [c["name"] for s in plan.slices for c in s["spec"].get("sharedCounters", [])]
        assert sorted(sets) == sorted(f"gpu-{i}-counters" for i in range(count))
        for s in plan.slices:
            assert s["spec"]["pool"] == {
                "name": "node-a",
                "generation": 7,
                "resourceSliceCount": len(plan.slices),
            }
            assert s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == "node-a"


def test_from_1_35_counter_sets_and_devices_live_in_separate_slices(
    make_states: Callable[..., list[GpuState]],
) -> None:
    slices = build_slices("n", make_states("H200:16"), server_version=(1, 35))
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 8]
    assert all("devices" not in s["spec"] for s in counter_slices)
    assert all(len(s["spec"].get("devices", [])) <= 64 for s in slices)


def test_on_1_34_every_device_shares_a_slice_with_its_counter_set(
    make_states: Callable[..., list[GpuState]],
) -> None:
    slices = build_slices("n", make_states("H200:5,A30:3"), server_version=(1, 34))
    for s in slices:
        local = {c["name"] for c in s["spec"].get("sharedCounters", [])}
        assert sum(len(c["counters"]) for c in s["spec"].get("sharedCounters", [])) <= 32
        for d in s["spec"].get("devices", []):
            assert {e["counterSet"] for e in d["consumesCounters"]} <= local


def test_slice_names_sort_in_the_policys_device_order(
    make_states: Callable[..., list[GpuState]],
    pool_view: Callable[..., Any],
) -> None:
    states = make_states("H100-80GB:12")
    plan = plan_pool(
        "node-a",
        states,
        server_version=(1, 36),
        device_order="best-fit",
        allocated=[SliceSpec(9, "3g.40gb", 0)],
    )
    assert pool_view(plan.slices).order == list(plan.order)
    # The GPU in use first, smallest slices first; the whole GPU and the slices overlapping the
    # claim's are not listed while it holds its slice.
    assert plan.order[0].startswith("gpu-9-mig-1g10gb-")
    assert {"gpu-9", "gpu-9-mig-7g80gb-0"} <= plan.ruled_out
    names = [s["metadata"]["name"] for s in plan.slices]
    assert names == sorted(names) and names[0] == "node-a-z.gpu-slicer.io-000"


def test_unsupported_server_versions_are_refused_with_the_reason(
    make_states: Callable[..., list[GpuState]],
) -> None:
    with pytest.raises(InventoryError, match="1.34 or later"):
        build_slices("n", make_states("H100-80GB:1"), server_version=(1, 33))


def test_the_limit_checker_reports_broken_pools(
    make_states: Callable[..., list[GpuState]],
) -> None:
    slices = build_slices("n", make_states("H100-80GB:3"), server_version=(1, 34))
    merged = {
        **slices[0],
        "spec": {**slices[0]["spec"], "devices": [d for s in slices for d in s["spec"]["devices"]]},
    }
    problems = check_limits([merged, *slices[1:]], (1, 35))
    assert any("both devices and counter sets" in p for p in problems)
    assert any("devices > 64" in p for p in problems)
    assert any("listed twice" in p for p in problems)


# --- soundness and completeness of the counters ---------------------------------------------


def _hostable(model: GpuModel) -> set[frozenset[str]]:
    """Every set of devices of one GPU that the catalog says it can host (the whole GPU alone),
    by a DFS pruned by ``is_valid``: validity is hereditary, so pruning loses nothing."""
    placements = catalog.all_placements(model)
    found: set[frozenset[str]] = {frozenset(), frozenset({"gpu-0"})}

    def dfs(start: int, chosen: list[tuple[str, int]]) -> None:
        for i in range(start, len(placements)):
            trial = [*chosen, placements[i]]
            if catalog.is_valid(model, trial):
                found.add(frozenset(SliceSpec(0, p, s).device_name for p, s in trial))
                dfs(i + 1, trial)

    dfs(0, [])
    return found


@pytest.mark.parametrize("model_key", MODEL_KEYS)
def test_counters_admit_exactly_the_device_sets_the_gpu_can_host(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any], model_key: str
) -> None:
    model = catalog.get_model(model_key)
    view = pool_view(
        build_slices("n", make_states(f"{model_key}:1", mode="dynamic"), server_version=(1, 36))
    )
    hostable = _hostable(model)
    if not model.supports_dynamic_mig:  # Ampere: MIG slices only, no whole GPU
        hostable.discard(frozenset({"gpu-0"}))
    assert set(view.devices) == set().union(*hostable)
    assert view.admitted_sets() == hostable
    assert len(hostable) > 50  # the comparison covers real combinations


@pytest.mark.parametrize("model_key", ["A30-24GB", "A100-40GB", "H100-80GB", "B200-180GB"])
def test_a_foreign_instance_leaves_exactly_the_sets_that_can_join_it(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any], model_key: str
) -> None:
    model = catalog.get_model(model_key)
    hostable = _hostable(model)
    for foreign in catalog.all_placements(model):
        own_name = SliceSpec(0, *foreign).device_name
        # S can join the foreign instance F exactly when S + F is hostable.
        joinable = {t - {own_name} for t in hostable if own_name in t}
        view = pool_view(
            build_slices(
                "n", make_states(f"{model_key}:1", instances={0: [foreign]}), server_version=(1, 37)
            )
        )
        assert view.admitted_sets() == joinable, foreign
        # Nothing that cannot join it is even listed.
        assert set(view.devices) == set().union(*joinable), foreign


@pytest.mark.parametrize("model_key", ["A30-24GB", "A100-80GB", "H100-80GB", "B200-180GB"])
def test_devices_an_allocation_leaves_no_room_for_are_ruled_out_and_nothing_else(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any], model_key: str
) -> None:
    states = make_states(f"{model_key}:1", mode="dynamic")
    full = pool_view(build_slices("n", states, server_version=(1, 37)))
    for held_name in full.devices:
        held = parse_device_name(held_name)
        plan = plan_pool("n", states, server_version=(1, 37), allocated=[held])
        view = pool_view(plan.slices)
        # Listed: the held device and exactly the devices that can still join it.
        joinable = {d for d in full.devices if d != held_name and full.admits({held_name, d})}
        assert set(view.devices) == {held_name} | joinable, held_name
        assert plan.ruled_out == set(full.devices) - set(view.devices), held_name
        # No allocation the scheduler can make beside the held device is lost.
        beside = {t for t in full.admitted_sets() if held_name in t}
        assert {t for t in view.admitted_sets() if held_name in t} == beside, held_name
    # Nothing allocated, nothing ruled out.
    assert plan_pool("n", states, server_version=(1, 37)).ruled_out == frozenset()


def test_a_whole_gpu_allocated_leaves_only_itself_on_its_gpu(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any]
) -> None:
    states = make_states("H100-80GB:2", mode="dynamic")
    plan = plan_pool("n", states, server_version=(1, 37), allocated=[WholeGpu(0)])
    listed = set(pool_view(plan.slices).devices)
    assert {n for n in listed if parse_device_name(n).gpu_index == 0} == {"gpu-0"}
    assert len([n for n in listed if parse_device_name(n).gpu_index == 1]) == 26


# --- modes, attributes, taints, static layout -------------------------------------------------


def test_modes_choose_whole_gpus_slices_or_both(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any]
) -> None:
    def names(mode: str, spec: str = "H100-80GB:1") -> set[str]:
        return set(pool_view(build_slices("n", make_states(spec, mode=mode))).devices)

    assert "gpu-0" in names("dynamic") and len(names("dynamic")) == 26
    assert "gpu-0" not in names("mig") and len(names("mig")) == 25
    assert names("full") == {"gpu-0"}
    # Ampere cannot switch MIG mode without a reset: dynamic falls back to MIG slices only.
    assert "gpu-0" not in names("dynamic", "A100-80GB:1")
    assert default_mode(catalog.get_model("A100-80GB")) == "mig"


def test_a_whole_gpu_in_full_mode_consumes_no_counters(
    make_states: Callable[..., list[GpuState]],
) -> None:
    slices = build_slices("n", make_states("H200:2", mode="full"), server_version=(1, 35))
    assert all("sharedCounters" not in s["spec"] for s in slices)
    assert all("consumesCounters" not in d for s in slices for d in s["spec"]["devices"])


def test_devices_carry_the_attributes_and_capacity_the_design_names(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any]
) -> None:
    view = pool_view(build_slices("n", make_states("H200-141GB:1")))
    model = catalog.get_model("H200")
    whole, mig = view.devices["gpu-0"], view.devices["gpu-0-mig-3g71gb-4"]
    assert whole["attributes"]["gpu-slicer.io/type"] == {"string": "gpu"}
    assert whole["attributes"]["gpu-slicer.io/uuid"]["string"].startswith("GPU-")
    sms = whole["capacity"]["gpu-slicer.io/multiprocessors"]
    assert sms == {"value": str(model.multiprocessors)}
    assert mig["attributes"]["gpu-slicer.io/type"] == {"string": "mig"}
    assert mig["attributes"]["gpu-slicer.io/profile"] == {"string": "3g.71gb"}
    assert mig["attributes"]["gpu-slicer.io/placementStart"] == {"int": 4}
    assert mig["attributes"]["gpu-slicer.io/placementSize"] == {"int": 4}
    parent = mig["attributes"]["gpu-slicer.io/parentUUID"]
    assert parent == whole["attributes"]["gpu-slicer.io/uuid"]
    assert mig["attributes"]["gpu-slicer.io/cudaComputeCapability"] == {"version": "9.0.0"}
    assert mig["attributes"]["gpu-slicer.io/driverVersion"] == {"version": "580.65.6"}
    assert "resource.kubernetes.io/pcieRoot" in mig["attributes"]
    assert "resource.kubernetes.io/pciBusID" in mig["attributes"]
    memory = cast(Callable[[str], Decimal], quantity.parse_quantity)(
        mig["capacity"]["gpu-slicer.io/memory"]["value"]
    )
    assert memory == model.profile("3g.71gb").memory_bytes
    set_counters = view.available["gpu-0-counters"]
    assert sorted(set_counters) == sorted(binding_counters(model))
    assert {c for _, cs in view.consumes["gpu-0"] for c in cs} == {
        c for c, v in set_counters.items() if v > 0
    }


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("9.0", "9.0.0"),
        ("535.104.05", "535.104.5"),
        ("570.86", "570.86.0"),
        ("12", "12.0.0"),
        ("r535", None),
        ("1.2.3.4", None),
    ],
)
def test_versions_become_semver_or_are_left_out(raw: str, expected: str | None) -> None:
    assert semver(raw) == expected


def test_taints_reach_every_device_of_the_unhealthy_gpu_only(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any]
) -> None:
    states = make_states("H100-80GB:2")
    taint = DeviceTaint("gpu-slicer.io/unhealthy", "gpu-lost", "NoExecute")
    states[1] = GpuState(states[1].info, taints=(taint,))
    view = pool_view(build_slices("n", states))
    for name, device in view.devices.items():
        expected = [taint.render()] if name.startswith("gpu-1") else None
        assert device.get("taints") == expected


def test_static_layout_lists_only_instances_that_exist_and_no_counters(
    make_states: Callable[..., list[GpuState]], pool_view: Callable[..., Any]
) -> None:
    placed = {0: [("3g.40gb", 0), ("1g.10gb", 6), ("1g.10gb", 5)], 1: [("7g.80gb", 0)]}
    states = make_states("H100-80GB:3", instances=placed, owned={0: [("3g.40gb", 0)]})
    states[2] = GpuState(states[2].info, mode="dynamic")  # MIG off, nothing made: whole GPU
    layout = StaticLayout.from_mapping({"gpus": {"0": ["1g.10gb@6"]}})
    slices = build_slices("n", states, static=True, static_layout=layout)
    view = pool_view(slices)
    # gpu-0: made by the agent, or named by the layout; gpu-1's 7g is foreign and not configured.
    assert set(view.devices) == {"gpu-0-mig-3g40gb-0", "gpu-0-mig-1g10gb-6", "gpu-2"}
    assert not view.available and all(not c for c in view.consumes.values())
    assert all(s["metadata"]["labels"]["gpu-slicer.io/layout"] == "static" for s in slices)


def test_a_very_long_node_name_still_gives_valid_sorted_slice_names(
    make_states: Callable[..., list[GpuState]],
    validate: Callable[[dict[str, Any], str], None],
) -> None:
    node = ".".join(["a" * 60] * 4) + "-x"  # 243 characters, a legal node name
    slices = build_slices(node, make_states("H200:16"), server_version=(1, 36))
    names = [s["metadata"]["name"] for s in slices]
    assert all(len(n) <= 253 for n in names) and names == sorted(names)
    assert len(set(names)) == len(names)
    # Slice names are cluster-wide: a sibling node with the same long prefix must not collide.
    sibling = build_slices(node[:-1] + "y", make_states("H200:1"), server_version=(1, 36))
    assert sibling[0]["metadata"]["name"] != names[0]
    assert all(s["spec"]["pool"]["name"] == node for s in slices)
    validate(slices[0], "1.36")
