"""Pools shared by identical nodes: a clone lists what its node publishes, and its devices are
made only once they are looked up, yet it answers for every device its node could list."""

from __future__ import annotations

from typing import Any

from gpu_slicer.sim.allocator import Allocator
from gpu_slicer.sim.pools import AllocatedDevices, Pool, Twins, compile_pool

Obj = dict[str, Any]
DRIVER = "gpu-slicer.io"
MIG_CLASS = {
    "mig.gpu-slicer.io": {
        "spec": {
            "selectors": [
                {"cel": {"expression": 'device.attributes["gpu-slicer.io"].type == "mig"'}}
            ]
        }
    }
}


def _device(name: str, profile: str, memory_slices: range) -> Obj:
    return {
        "name": name,
        "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}},
        "consumesCounters": [
            {
                "counterSet": "gpu-0-counters",
                "counters": {f"memory-slice-{i}": {"value": "1"} for i in memory_slices},
            }
        ],
    }


def _kind_pool(node: str = "n1") -> Pool:
    """What the first node of a kind compiles: every device its kind could advertise."""
    devices = [
        _device("gpu-0-mig-1g10gb-0", "1g.10gb", range(0, 1)),
        _device("gpu-0-mig-1g10gb-1", "1g.10gb", range(1, 2)),
        _device("gpu-0-mig-3g40gb-0", "3g.40gb", range(0, 4)),
        _device("gpu-0-mig-3g40gb-4", "3g.40gb", range(4, 8)),
    ]
    item = {
        "metadata": {"name": f"{node}-000"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "sharedCounters": [
                {
                    "name": "gpu-0-counters",
                    "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(8)},
                }
            ],
            "devices": devices,
        },
    }
    pool = compile_pool(DRIVER, node, [item])
    assert pool is not None
    return pool


def _claim(profile: str) -> Obj:
    selector = f'device.attributes["gpu-slicer.io"].profile == "{profile}"'
    return {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "mig.gpu-slicer.io",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        }
    }


def test_a_clone_lists_the_named_devices_as_its_own_next_generation() -> None:
    source = _kind_pool()
    listed = ["gpu-0-mig-3g40gb-4", "gpu-0-mig-1g10gb-0"]
    clone = source.clone("n2", "n2", listed)
    assert [d.name for d in clone.devices] == listed
    assert [d.key for d in clone.devices] == [(DRIVER, "n2", name) for name in listed]
    assert (clone.name, clone.node_name, clone.generation) == ("n2", "n2", source.generation + 1)
    assert clone.counters == source.counters
    twin, original = clone.devices[0], source.by_name["gpu-0-mig-3g40gb-4"]
    assert twin is not original and twin.view is original.view and twin.needs is original.needs
    # The source's own devices keep their pool.
    assert {d.pool for d in source.devices} == {"n1"}


def test_twins_answer_for_every_device_but_make_only_those_looked_up() -> None:
    source = _kind_pool()
    twins = Twins(source.by_name, "n2")
    assert len(twins) == 4 and list(twins) == list(source.by_name)
    assert "gpu-0-mig-1g10gb-1" in twins and "gpu-0-mig-7g80gb-0" not in twins
    assert dict.__len__(twins) == 0  # nothing made yet
    found = twins["gpu-0-mig-1g10gb-1"]
    assert found.key == (DRIVER, "n2", "gpu-0-mig-1g10gb-1")
    assert twins["gpu-0-mig-1g10gb-1"] is found  # made once
    assert twins.get("gpu-0-mig-7g80gb-0") is None
    assert twins.get("gpu-0-mig-1g10gb-1") is found
    assert dict.__len__(twins) == 1
    assert [d.key for d in twins.values()] == [(DRIVER, "n2", n) for n in source.by_name]
    assert [name for name, _ in twins.items()] == list(twins.keys()) == list(source.by_name)


def test_a_device_a_clone_did_not_list_is_never_allocated_until_it_is_listed() -> None:
    source = _kind_pool()
    allocator = Allocator(MIG_CLASS)
    clone = source.clone("n2", "n2", ["gpu-0-mig-1g10gb-0"])
    assert allocator.allocate([_claim("3g.40gb")], "n2", [clone], AllocatedDevices()) is None
    relisted = clone.reordered(["gpu-0-mig-1g10gb-0", "gpu-0-mig-3g40gb-0"])
    found = allocator.allocate([_claim("3g.40gb")], "n2", [relisted], AllocatedDevices())
    assert found is not None
    [allocation] = found.allocations
    [result] = allocation["devices"]["results"]
    assert (result["pool"], result["device"]) == ("n2", "gpu-0-mig-3g40gb-0")
