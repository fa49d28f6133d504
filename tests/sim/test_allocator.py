"""The allocator model follows the documented semantics of the scheduler's structured allocator."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_slicer.sim.allocator import Allocator, allocate_on_node
from gpu_slicer.sim.errors import AllocationError
from gpu_slicer.sim.pools import AllocatedDevices, compile_pools, pools_for_node

Obj = dict[str, Any]
DRIVER = "gpu-slicer.io"

CLASSES: dict[str, Obj] = {
    "mig.gpu-slicer.io": {
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": 'device.driver == "gpu-slicer.io" && '
                        'device.attributes["gpu-slicer.io"].type == "mig"'
                    }
                }
            ]
        }
    },
    "gpu.gpu-slicer.io": {
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": 'device.driver == "gpu-slicer.io" && '
                        'device.attributes["gpu-slicer.io"].type == "gpu"'
                    }
                }
            ]
        }
    },
}


def mig(
    name: str,
    profile: str,
    slices: list[int],
    *,
    extra: Obj | None = None,
    counter_set: str = "gpu-0-counters",
    domain: str = "nvlink-a",
) -> Obj:
    return {
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": profile},
            "nvlinkDomain": {"string": domain},
            **(extra or {}),
        },
        "capacity": {"memory": {"value": f"{10 * len(slices)}Gi"}},
        "consumesCounters": [
            {
                "counterSet": counter_set,
                "counters": {f"memory-slice-{i}": {"value": "1"} for i in slices},
            }
        ],
    }


def slice_obj(
    name: str,
    node: str,
    devices: list[Obj],
    *,
    counters: int = 8,
    generation: int = 1,
    count: int = 1,
    counter_set: str = "gpu-0-counters",
) -> Obj:
    spec: Obj = {
        "driver": DRIVER,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
        "nodeName": node,
        "devices": devices,
    }
    if counters:
        spec["sharedCounters"] = [
            {
                "name": counter_set,
                "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(counters)},
            }
        ]
    return {"metadata": {"name": name}, "spec": spec}


def claim(*requests: Obj, constraints: list[Obj] | None = None) -> Obj:
    return {"spec": {"devices": {"requests": list(requests), "constraints": constraints or []}}}


def exactly(
    name: str, profile: str | None = None, count: int = 1, cls: str = "mig.gpu-slicer.io"
) -> Obj:
    selectors = []
    if profile:
        selectors = [
            {"cel": {"expression": f'device.attributes["gpu-slicer.io"].profile == "{profile}"'}}
        ]
    return {
        "name": name,
        "exactly": {"deviceClassName": cls, "selectors": selectors, "count": count},
    }


def first_available(name: str, *profiles: str, count: int = 1) -> Obj:
    return {
        "name": name,
        "firstAvailable": [
            {
                "name": f"p{i}",
                "deviceClassName": "mig.gpu-slicer.io",
                "count": count,
                "selectors": [
                    {"cel": {"expression": f'device.attributes["gpu-slicer.io"].profile == "{p}"'}}
                ],
            }
            for i, p in enumerate(profiles)
        ],
    }


def devices_of(result: Any) -> list[tuple[str, str]]:
    assert result is not None
    return [
        (r["request"], r["device"]) for a in result.allocations for r in a["devices"]["results"]
    ]


def run(
    claims: list[Obj], slices: list[Obj], node: str = "n1", allocated: list[Obj] | None = None
) -> Any:
    return allocate_on_node(
        claims,
        node_name=node,
        slices=slices,
        device_classes=CLASSES,
        allocated_claims=allocated or [],
    )


def test_devices_are_taken_in_listed_order_not_by_name() -> None:
    slices = [slice_obj("n1-a", "n1", [mig("zz", "1g.10gb", [6]), mig("aa", "1g.10gb", [0])])]
    assert devices_of(run([claim(exactly("r", "1g.10gb"))], slices)) == [("r", "zz")]


def test_slices_are_walked_in_name_order() -> None:
    slices = [
        slice_obj("n1-b", "n1", [mig("first-listed", "1g.10gb", [0])], count=2),
        slice_obj("n1-a", "n1", [mig("in-slice-a", "1g.10gb", [1])], count=2, counters=0),
    ]
    assert devices_of(run([claim(exactly("r", "1g.10gb"))], slices)) == [("r", "in-slice-a")]


def test_pools_are_sorted_by_driver_then_name() -> None:
    everywhere = [
        {
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [mig(dev, "1g.10gb", [0], counter_set=f"{pool}-c")],
                "sharedCounters": [
                    {"name": f"{pool}-c", "counters": {"memory-slice-0": {"value": "1"}}}
                ],
            },
        }
        for name, pool, dev in (("s1", "pool-b", "from-b"), ("s2", "pool-a", "from-a"))
    ]
    assert devices_of(run([claim(exactly("r", "1g.10gb"))], everywhere)) == [("r", "from-a")]


def test_devices_sharing_a_counter_never_go_together() -> None:
    slices = [
        slice_obj(
            "s",
            "n1",
            [
                mig("big", "2g.20gb", [0, 1]),
                mig("small", "1g.10gb", [1]),
                mig("other", "1g.10gb", [2]),
            ],
        )
    ]
    result = run([claim(exactly("a", "2g.20gb"), exactly("b", "1g.10gb"))], slices)
    assert devices_of(result) == [("a", "big"), ("b", "other")]


def test_counters_held_by_allocated_claims_block_devices() -> None:
    slices = [slice_obj("s", "n1", [mig("big", "2g.20gb", [0, 1]), mig("small", "1g.10gb", [1])])]
    held = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "x", "driver": DRIVER, "pool": "n1", "device": "small"}]
                }
            }
        }
    }
    assert run([claim(exactly("a", "2g.20gb"))], slices, allocated=[held]) is None


def test_allocated_devices_are_skipped() -> None:
    slices = [slice_obj("s", "n1", [mig("one", "1g.10gb", [0]), mig("two", "1g.10gb", [1])])]
    held = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "x", "driver": DRIVER, "pool": "n1", "device": "one"}]
                }
            }
        }
    }
    assert devices_of(run([claim(exactly("a", "1g.10gb"))], slices, allocated=[held])) == [
        ("a", "two")
    ]


def test_search_backtracks_when_a_later_request_cannot_be_served() -> None:
    # First fit for "a" would be d0 (slices 0-1); then "b" (2g at 0-1 only) has nothing left.
    slices = [
        slice_obj(
            "s",
            "n1",
            [mig("d0", "1g.10gb", [0]), mig("d1", "1g.10gb", [4]), mig("big", "2g.20gb", [0, 1])],
        )
    ]
    result = run([claim(exactly("a", "1g.10gb"), exactly("b", "2g.20gb"))], slices)
    assert devices_of(result) == [("a", "d1"), ("b", "big")]


def test_first_available_takes_the_first_subrequest_that_completes() -> None:
    slices = [slice_obj("s", "n1", [mig("small", "1g.10gb", [0]), mig("mid", "2g.20gb", [2, 3])])]
    held = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "x", "driver": DRIVER, "pool": "n1", "device": "small"}]
                }
            }
        }
    }
    result = run([claim(first_available("gpu", "1g.10gb", "2g.20gb"))], slices, allocated=[held])
    assert devices_of(result) == [("gpu/p1", "mid")]
    assert result.subrequest_indices == (1,)
    assert result.score == 7


def test_first_available_backtracks_into_an_earlier_request() -> None:
    # "a" prefers 1g; with "a" on slice 0 the 2g that "b" needs is gone, so "a" moves on.
    slices = [
        slice_obj(
            "s",
            "n1",
            [mig("s0", "1g.10gb", [0]), mig("big", "2g.20gb", [0, 1]), mig("s2", "1g.10gb", [2])],
        )
    ]
    result = run([claim(first_available("a", "1g.10gb"), exactly("b", "2g.20gb"))], slices)
    assert devices_of(result) == [("a/p0", "s2"), ("b", "big")]


def test_match_attribute_keeps_every_device_in_one_domain() -> None:
    devices = [
        mig("a0", "1g.10gb", [0], domain="x"),
        mig("b0", "1g.10gb", [1], domain="y"),
        mig("b1", "1g.10gb", [2], domain="y"),
    ]
    result = run(
        [
            claim(
                exactly("r", "1g.10gb", count=2),
                constraints=[{"matchAttribute": "gpu-slicer.io/nvlinkDomain"}],
            )
        ],
        [slice_obj("s", "n1", devices)],
    )
    assert devices_of(result) == [("r", "b0"), ("r", "b1")]


def test_match_attribute_limited_to_named_requests() -> None:
    devices = [mig("a0", "1g.10gb", [0], domain="x"), mig("b0", "1g.10gb", [1], domain="y")]
    constraint = [{"requests": ["one"], "matchAttribute": "gpu-slicer.io/nvlinkDomain"}]
    result = run(
        [claim(exactly("one", "1g.10gb"), exactly("two", "1g.10gb"), constraints=constraint)],
        [slice_obj("s", "n1", devices)],
    )
    assert devices_of(result) == [("one", "a0"), ("two", "b0")]


def test_a_device_without_the_constrained_attribute_is_skipped() -> None:
    devices = [
        mig("plain", "1g.10gb", [0]),
        mig("tagged", "1g.10gb", [1], extra={"zone": {"string": "z"}}),
    ]
    result = run(
        [claim(exactly("r", "1g.10gb"), constraints=[{"matchAttribute": "gpu-slicer.io/zone"}])],
        [slice_obj("s", "n1", devices)],
    )
    assert devices_of(result) == [("r", "tagged")]


def test_an_incomplete_pool_is_ignored() -> None:
    slices = [slice_obj("s", "n1", [mig("d", "1g.10gb", [0])], count=2)]
    assert run([claim(exactly("r", "1g.10gb"))], slices) is None


def test_only_the_newest_generation_counts() -> None:
    slices = [
        slice_obj("old", "n1", [mig("stale", "1g.10gb", [0])], generation=1),
        slice_obj("new", "n1", [mig("fresh", "1g.10gb", [0])], generation=2),
    ]
    assert devices_of(run([claim(exactly("r", "1g.10gb"))], slices)) == [("r", "fresh")]


def test_another_nodes_pool_is_not_visible() -> None:
    slices = [slice_obj("s", "n2", [mig("d", "1g.10gb", [0])])]
    assert run([claim(exactly("r", "1g.10gb"))], slices, node="n1") is None


def test_class_selectors_apply_as_well_as_request_selectors() -> None:
    whole = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}, "profile": {"string": "1g.10gb"}},
    }
    slices = [slice_obj("s", "n1", [whole, mig("m", "1g.10gb", [0])], counters=8)]
    assert devices_of(run([claim(exactly("r", "1g.10gb"))], slices)) == [("r", "m")]


def test_capacity_quantities_compare_in_cel() -> None:
    slices = [slice_obj("s", "n1", [mig("small", "1g.10gb", [0]), mig("mid", "2g.20gb", [2, 3])])]
    request = {
        "name": "r",
        "exactly": {
            "deviceClassName": "mig.gpu-slicer.io",
            "selectors": [
                {
                    "cel": {
                        "expression": 'device.capacity["gpu-slicer.io"].memory'
                        '.compareTo(quantity("15Gi")) >= 0'
                    }
                }
            ],
        },
    }
    assert devices_of(run([claim(request)], slices)) == [("r", "mid")]


def test_a_cel_runtime_error_fails_the_allocation() -> None:
    slices = [slice_obj("s", "n1", [mig("d", "1g.10gb", [0])])]
    request = {
        "name": "r",
        "exactly": {
            "deviceClassName": "mig.gpu-slicer.io",
            "selectors": [
                {"cel": {"expression": 'device.attributes["gpu-slicer.io"].noSuchAttribute == "x"'}}
            ],
        },
    }
    with pytest.raises(AllocationError, match="CEL runtime error"):
        run([claim(request)], slices)


def test_an_unknown_device_class_is_an_error_naming_the_known_ones() -> None:
    slices = [slice_obj("s", "n1", [mig("d", "1g.10gb", [0])])]
    with pytest.raises(AllocationError, match="gpu.gpu-slicer.io"):
        run([claim(exactly("r", "1g.10gb", cls="nope"))], slices)


def test_an_unknown_device_class_anywhere_in_a_claim_fails_it_up_front() -> None:
    # The scheduler checks every (sub)request's class before searching (validateDeviceRequest),
    # so a later, never-reached subrequest or request with a missing class still fails the pod.
    slices = [slice_obj("s", "n1", [mig("d", "1g.10gb", [0])])]
    chain = first_available("r", "1g.10gb", "2g.20gb")
    chain["firstAvailable"][1]["deviceClassName"] = "nope"
    with pytest.raises(AllocationError, match="nope"):
        run([claim(chain)], slices)
    unreached = claim(exactly("a", "3g.40gb"), exactly("b", "1g.10gb", cls="nope"))
    with pytest.raises(AllocationError, match="nope"):
        run([unreached], slices)


def test_all_mode_takes_every_matching_device_or_none() -> None:
    devices = [mig("a", "1g.10gb", [0]), mig("b", "1g.10gb", [1])]
    request = {
        "name": "r",
        "exactly": {"deviceClassName": "mig.gpu-slicer.io", "allocationMode": "All"},
    }
    assert devices_of(run([claim(request)], [slice_obj("s", "n1", devices)])) == [
        ("r", "a"),
        ("r", "b"),
    ]
    held = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "x", "driver": DRIVER, "pool": "n1", "device": "b"}]
                }
            }
        }
    }
    assert run([claim(request)], [slice_obj("s", "n1", devices)], allocated=[held]) is None


def test_tainted_devices_are_skipped_unless_tolerated() -> None:
    tainted = mig("t", "1g.10gb", [0])
    tainted["taints"] = [{"key": "gpu-slicer.io/unhealthy", "effect": "NoSchedule"}]
    slices = [slice_obj("s", "n1", [tainted, mig("ok", "1g.10gb", [1])])]
    assert devices_of(run([claim(exactly("r", "1g.10gb"))], slices)) == [("r", "ok")]
    tolerant = exactly("r", "1g.10gb")
    tolerant["exactly"]["tolerations"] = [{"key": "gpu-slicer.io/unhealthy", "operator": "Exists"}]
    assert devices_of(run([claim(tolerant)], slices)) == [("r", "t")]


def test_several_claims_are_allocated_together_without_sharing_devices() -> None:
    slices = [slice_obj("s", "n1", [mig("a", "1g.10gb", [0]), mig("b", "1g.10gb", [1])])]
    result = run([claim(exactly("r", "1g.10gb")), claim(exactly("r", "1g.10gb"))], slices)
    assert result is not None
    assert [a["devices"]["results"][0]["device"] for a in result.allocations] == ["a", "b"]


def test_in_use_bookkeeping_frees_counters_on_remove() -> None:
    pools = pools_for_node(
        compile_pools(
            [slice_obj("s", "n1", [mig("big", "2g.20gb", [0, 1]), mig("small", "1g.10gb", [0])])]
        ),
        "n1",
    )
    allocator = Allocator(CLASSES)
    in_use = AllocatedDevices()
    first = allocator.allocate([claim(exactly("r", "1g.10gb"))], "n1", pools, in_use)
    assert first is not None
    in_use.add(first.devices[0])
    assert allocator.allocate([claim(exactly("r", "2g.20gb"))], "n1", pools, in_use) is None
    in_use.remove(first.devices[0].key)
    assert allocator.allocate([claim(exactly("r", "2g.20gb"))], "n1", pools, in_use) is not None


def test_results_are_shaped_like_the_claim_status() -> None:
    result = run(
        [claim(exactly("r", "1g.10gb"))], [slice_obj("s", "n1", [mig("d", "1g.10gb", [0])])]
    )
    assert result.allocations[0]["devices"]["results"] == [
        {"request": "r", "driver": DRIVER, "pool": "n1", "device": "d"}
    ]
    terms = result.allocations[0]["nodeSelector"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == ["n1"]
