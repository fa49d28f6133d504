"""The status view from API objects: slices the agent's inventory code publishes, claims and pods
as the apiserver stores them."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_slicer.slicer.demand import EVERY_PROFILE, ClaimAsks, Demand
from gpu_slicer.slicer.profile_filter import ProfileFilter
from gpu_slicer.status.view import ClusterStatus, PodRef, build_status
from tests.support.status_fixtures import (
    INFER,
    TRAIN,
    claim,
    namespace,
    node_slices,
    pod,
    sandbox_like,
)

Obj = dict[str, Any]


def _status(**objects: Any) -> ClusterStatus:
    data = {"slices": [], "claims": [], "pods": [], "namespaces": [], **objects}
    return build_status(
        data["slices"], data["claims"], data["pods"], data["namespaces"], node=objects.get("node")
    )


def test_each_gpu_shows_the_instances_claims_hold_the_pods_holding_them_and_the_free_slices() -> (
    None
):
    status = _status(**sandbox_like())
    assert [n.name for n in status.nodes] == ["a100", "h100"]
    a100 = status.node("a100")
    (gpu,) = a100.gpus
    assert (gpu.index, gpu.product, gpu.mode, gpu.memory_slices) == (
        0,
        "NVIDIA A100-SXM4-80GB",
        "mig",
        8,
    )
    assert [(i.device, i.profile, i.start, i.size) for i in gpu.instances] == [
        ("gpu-0-mig-1g10gb-1", "1g.10gb", 1, 1),
        ("gpu-0-mig-1g10gb-2", "1g.10gb", 2, 1),
        ("gpu-0-mig-1g10gb-3", "1g.10gb", 3, 1),
        ("gpu-0-mig-3g40gb-4", "3g.40gb", 4, 4),
    ]
    assert [i.pods for i in gpu.instances] == [
        (PodRef("ml", "infer-749bf8c799-dlqzb"),),
        (PodRef("ml", "infer-749bf8c799-ss84s"),),
        (PodRef("ml", "infer-749bf8c799-zpnn4"),),
        (PodRef("ml", "train"),),
    ]
    assert [i.short_pods for i in gpu.instances] == [
        ("infer-dlqzb",),
        ("infer-ss84s",),
        ("infer-zpnn4",),
        ("train",),
    ]
    assert gpu.instances[3].claim == PodRef("ml", "train-gpu-slicer-gnw8k")
    assert (gpu.free, gpu.blocked, a100.free, a100.memory_slices) == ((0,), (), 1, 8)
    whole, idle = status.node("h100").gpus
    assert (whole.mode, idle.mode) == ("dynamic", "dynamic")
    assert [(i.device, i.whole, i.start, i.size) for i in whole.instances] == [
        ("gpu-0", True, 0, 8)
    ]
    assert (whole.free, idle.free) == ((), tuple(range(8)))


def test_namespaces_show_their_migration_mode_and_how_many_pods_were_converted() -> None:
    status = _status(**sandbox_like())
    rows = {
        ns.name: (ns.migration, ns.converted, ns.holding, ns.legacy) for ns in status.namespaces
    }
    # Unlabelled namespaces without converted pods (default, gpu-slicer) are left out.
    assert rows == {"ml": ("enabled", 5, 5, 0), "aud": ("audit", 0, 0, 1)}


def test_a_converted_pod_still_waiting_for_a_device_is_converted_but_not_holding() -> None:
    objects = sandbox_like()
    objects["pods"].append(pod("ml", "waiting"))
    objects["namespaces"].append(namespace("old"))  # label removed, converted pods remain
    objects["pods"].append(pod("old", "left"))
    rows = {
        ns.name: (ns.migration, ns.converted, ns.holding) for ns in _status(**objects).namespaces
    }
    assert rows["ml"] == ("enabled", 6, 5)
    assert rows["old"] == ("", 1, 0)


@pytest.mark.parametrize("version", [(1, 34), (1, 35), (1, 36), (1, 37)], ids=lambda v: f"1.{v[1]}")
def test_the_view_is_the_same_whether_counter_sets_share_a_slice_with_devices_or_not(
    version: tuple[int, int],
) -> None:
    slices = node_slices("n", "H100-80GB:2,A30", server_version=version)
    claims = [claim("ml", "c", "n", ["gpu-1-mig-2g20gb-2", "gpu-2-mig-2g12gb-0"], pods=[TRAIN])]
    gpus = _status(slices=slices, claims=claims).node("n").gpus
    assert [(g.index, g.memory_slices, g.mode) for g in gpus] == [
        (0, 8, "dynamic"),
        (1, 8, "dynamic"),
        (2, 4, "mig"),
    ]
    assert [g.free for g in gpus] == [tuple(range(8)), (0, 1, 4, 5, 6, 7), (2, 3)]


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = node_slices("n", "A100-80GB:1", generation=3)
    new = node_slices("n", "A100-80GB:1", generation=4, foreign={0: [("2g.20gb", 2)]})
    for obj in new:
        obj["metadata"]["name"] += "-new"
    status = _status(slices=old + new)
    assert status.node("n").generation == 4
    assert status.node("n").gpus[0].blocked == (2, 3)


def test_a_node_shows_the_profiles_it_advertises_and_why() -> None:
    demand = Demand(
        frozenset({"1g.10gb", "2g.20gb", "3g.40gb"}), floor=ProfileFilter.parse("3g.40gb")
    )
    demand.observe(ClaimAsks(frozenset({"2g.20gb"})), 0.0)
    demand.observe(ClaimAsks(frozenset({"1g.10gb"})), 1.0)  # 2g.20gb: asked a moment ago
    slices = node_slices("n", "A100-80GB:1", profiles=demand.advertised(2.0))
    advertised = _status(slices=slices).node("n").advertised
    assert advertised is not None
    assert dict(advertised.reasons) == {"1g.10gb": "asked", "2g.20gb": "recent", "3g.40gb": "floor"}
    every = node_slices("m", "A100-80GB:1", profiles=EVERY_PROFILE)
    assert _status(slices=every).node("m").advertised == EVERY_PROFILE
    # the static layout and agents before demand-driven advertising say nothing
    assert _status(slices=node_slices("s", "A100-80GB:1")).node("s").advertised is None


def test_slices_taken_by_an_instance_gpu_slicer_did_not_create_are_blocked_not_free() -> None:
    slices = node_slices("n", "A100-80GB:1", foreign={0: [("2g.20gb", 2), ("1g.10gb", 6)]})
    (gpu,) = _status(slices=slices).node("n").gpus
    assert gpu.blocked == (2, 3, 6)
    assert gpu.free == (0, 1, 4, 5, 7)


def test_a_static_layout_shows_its_idle_instances_and_blocks_what_no_instance_covers() -> None:
    slices = node_slices(
        "n", "A100-80GB:1", static=True, made={0: [("1g.10gb", 0), ("3g.40gb", 4)]}
    )
    claims = [claim("ml", "c", "n", ["gpu-0-mig-1g10gb-0"], pods=[TRAIN])]
    (gpu,) = _status(slices=slices, claims=claims).node("n").gpus
    assert gpu.mode == "static"
    assert [i.device for i in gpu.instances] == ["gpu-0-mig-1g10gb-0"]
    assert gpu.blocked == (1, 2, 3)
    assert gpu.idle == (("3g.40gb", 4, 4),)
    assert gpu.free == (4, 5, 6, 7)


def test_a_gpu_without_mig_is_one_device_covering_every_memory_slice() -> None:
    slices = node_slices("n", "H100-80GB:1", mode="full")
    (gpu,) = (
        _status(slices=slices, claims=[claim("ml", "c", "n", ["gpu-0"], pods=[TRAIN])])
        .node("n")
        .gpus
    )
    assert (gpu.mode, gpu.memory_slices) == ("full", 8)  # the catalog's count: no counters
    assert [(i.whole, i.start, i.size) for i in gpu.instances] == [(True, 0, 8)]
    assert gpu.free == ()


def test_an_unhealthy_gpu_is_marked() -> None:
    gpus = _status(slices=node_slices("n", "H100-80GB:2", unhealthy=[1])).node("n").gpus
    assert [g.unhealthy for g in gpus] == [False, True]


def test_claims_of_other_drivers_and_unallocated_claims_are_left_out() -> None:
    unallocated = claim("ml", "pending", "n", [])
    del unallocated["status"]
    other = claim("ml", "nv", "n", ["gpu-0"], driver="gpu.nvidia.com")
    (gpu,) = (
        _status(slices=node_slices("n", "H100-80GB:1"), claims=[unallocated, other]).node("n").gpus
    )
    assert gpu.instances == ()


def test_a_claim_shared_by_pods_lists_each_and_one_without_pods_lists_none() -> None:
    shared = claim("ml", "shared", "n", ["gpu-0-mig-1g10gb-0"], pods=INFER[:2])
    released = claim("ml", "released", "n", ["gpu-0-mig-1g10gb-1"])
    (gpu,) = (
        _status(
            slices=node_slices("n", "A100-80GB:1"),
            claims=[shared, released],
            pods=INFER,
            namespaces=[namespace("ml", "enabled")],
        )
        .node("n")
        .gpus
    )
    assert [i.short_pods for i in gpu.instances] == [("infer-dlqzb", "infer-ss84s"), ()]


def test_a_held_device_the_node_no_longer_publishes_is_placed_by_its_name_with_a_note() -> None:
    status = _status(
        slices=node_slices("n", "A100-80GB:1", foreign={0: [("1g.10gb", 0)]}),
        claims=[claim("ml", "c", "n", ["gpu-0-mig-2g20gb-0"], pods=[TRAIN])],
    )
    (gpu,) = status.node("n").gpus
    assert [(i.profile, i.start, i.size) for i in gpu.instances] == [("2g.20gb", 0, 2)]
    assert gpu.blocked == ()  # the claim's instance holds the slice the counter took off
    assert status.notes == (
        "claim ml/c holds device gpu-0-mig-2g20gb-0, which n does not publish now",
    )


def test_a_node_whose_agent_publishes_nothing_still_shows_what_claims_hold_there() -> None:
    status = _status(claims=[claim("ml", "c", "gone", ["gpu-1-mig-1g10gb-3"], pods=[TRAIN])])
    node = status.node("gone")
    assert node.generation == -1
    assert [(g.index, g.mode) for g in node.gpus] == [(1, "unknown")]
    assert node.gpus[0].instances[0].start == 3
    assert any("publishes no gpu-slicer ResourceSlices" in n for n in status.notes)


def test_other_drivers_slices_are_not_nodes_and_the_node_filter_keeps_one() -> None:
    objects = sandbox_like()
    foreign_driver = node_slices("x", "H100-80GB:1")
    for obj in foreign_driver:
        obj["spec"]["driver"] = "gpu.nvidia.com"
    objects["slices"] += foreign_driver
    assert [n.name for n in _status(**objects).nodes] == ["a100", "h100"]
    assert [n.name for n in _status(**objects, node="h100").nodes] == ["h100"]
    assert _status(**objects, node="nowhere").nodes == ()


def test_objects_missing_optional_fields_do_not_break_the_view() -> None:
    bare_claim: Obj = {
        "metadata": {"name": "c", "namespace": "ml"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": "gpu-slicer.io", "pool": "n", "device": "not-ours"}]
                }
            }
        },
    }
    status = _status(
        slices=[{"spec": {}}, {"spec": {"driver": "gpu-slicer.io"}}],
        claims=[bare_claim, {}],
        pods=[{}, {"metadata": {}}],
        namespaces=[{}, {"metadata": {"name": "x", "labels": None}}],
    )
    assert [n.name for n in status.nodes] == ["n"]
    assert status.notes == (
        "claim ml/c holds device not-ours on n, which is not a gpu-slicer device name",
        "node n publishes no gpu-slicer ResourceSlices, but claims hold "
        "devices there (is its agent running?)",
    )
