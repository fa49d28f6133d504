"""The allocator model agrees with a brute-force reading of the same rules on random cases.

The reference enumerates, request by request and subrequest by subrequest, every set of devices in
list order and takes the first one that satisfies everything (unallocated, selectors, counters,
constraints): the documented "first complete solution wins". The model's shortcuts (candidate
lists, skipping a GPU whose counters are exhausted, feasibility memos) must not change the answer.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from gpu_slicer.sim.allocator import Allocator
from gpu_slicer.sim.pools import AllocatedDevices, compile_pools, pools_for_node
from gpu_slicer.slicer.inventory import GpuState, plan_pool
from gpu_slicer.slicer.simulated import SimulatedBackend

CLASSES = {
    "mig.gpu-slicer.io": {
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": (
                            'device.driver == "gpu-slicer.io" && '
                            'device.attributes["gpu-slicer.io"].type == "mig"'
                        )
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
                        "expression": (
                            'device.driver == "gpu-slicer.io" && '
                            'device.attributes["gpu-slicer.io"].type == "gpu"'
                        )
                    }
                }
            ]
        }
    },
}
PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


def _request(rng: random.Random, name: str) -> dict[str, Any]:
    def sub(profile: str | None) -> dict[str, Any]:
        if profile is None:
            return {"deviceClassName": "gpu.gpu-slicer.io", "count": rng.choice([1, 1, 2])}
        return {
            "deviceClassName": "mig.gpu-slicer.io",
            "count": rng.choice([1, 1, 2]),
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.attributes["gpu-slicer.io"].profile == "{profile}"'
                    }
                }
            ],
        }

    choices = [rng.choice(PROFILES + [None]) for _ in range(rng.randint(1, 3))]
    if len(choices) == 1:
        return {"name": name, "exactly": sub(choices[0])}
    return {
        "name": name,
        "firstAvailable": [{"name": f"s{i}", **sub(c)} for i, c in enumerate(choices)],
    }


def _fits(
    devices: list[Any],
    pool: Any,
    in_use: AllocatedDevices,
    constraint: dict[str, Any] | None,
) -> bool:
    """The documented checks: distinct free devices, counters within capacity, the
    matchAttribute constraint."""
    capacity = pool.counters
    counters = dict(in_use.used(pool.driver, pool.name))
    seen = set()
    for device in devices:
        if device.key in in_use.devices or device.key in seen:
            return False
        seen.add(device.key)
        for counter, value in device.consumes:
            counters[counter] = counters.get(counter, 0) + value
            if counters[counter] > capacity[counter]:
                return False
    if constraint is not None:
        values = {d.qualified.get(constraint["matchAttribute"]) for d in devices}
        if len(values) > 1 or None in values:
            return False
    return True


def _reference(
    claim: dict[str, Any], pool: Any, in_use: AllocatedDevices, allocator: Allocator
) -> Any:
    """Brute force over the documented semantics; returns [(request name, device name)]."""
    from gpu_slicer.sim.allocator import parse_claims

    parsed = parse_claims([claim])
    constraint = (claim["spec"]["devices"].get("constraints") or [None])[0]

    def fits(devices: list[Any]) -> bool:
        return _fits(devices, pool, in_use, constraint)

    def solve(index: int, chosen: list[tuple[str, Any]]) -> list[tuple[str, Any]] | None:
        if index == len(parsed.requests):
            return chosen
        for sub in parsed.requests[index].alternatives:
            candidates = allocator.candidates([pool], sub).devices
            for combo in itertools.combinations(candidates, sub.count):
                picked = chosen + [(sub.result_name, d) for d in combo]
                if fits([d for _, d in picked]):
                    found = solve(index + 1, picked)
                    if found is not None:
                        return found
        return None

    result = solve(0, [])
    return None if result is None else [(r, d.name) for r, d in result]


@pytest.mark.parametrize("seed", range(6))
def test_the_model_finds_the_same_first_solution_as_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    backend = SimulatedBackend("H100-80GB:2", node_name="n")
    states = [GpuState(info=g, mode="dynamic") for g in backend.gpus()]
    policy = rng.choice(["name", "anti-fragmentation"])
    pool = pools_for_node(compile_pools(plan_pool("n", states, device_order=policy).slices), "n")[0]
    allocator = Allocator(CLASSES)
    for _ in range(25):
        in_use = AllocatedDevices()
        # a random set of devices already held by other claims
        for _ in range(rng.randint(0, 4)):
            warm = allocator.allocate(
                [{"spec": {"devices": {"requests": [_request(rng, "w")]}}}], "n", [pool], in_use
            )
            if warm is not None:
                for device in warm.devices:
                    in_use.add(device)
        requests = [_request(rng, f"r{i}") for i in range(rng.randint(1, 2))]
        devices: dict[str, Any] = {"requests": requests}
        if rng.random() < 0.3:
            devices["constraints"] = [{"matchAttribute": "gpu-slicer.io/parentUUID"}]
        claim = {"spec": {"devices": devices}}
        found = allocator.allocate([claim], "n", [pool], in_use)
        got = (
            None
            if found is None
            else [(r["request"], r["device"]) for r in found.allocations[0]["devices"]["results"]]
        )
        assert got == _reference(claim, pool, in_use, allocator)
