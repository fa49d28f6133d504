"""The modelled kube-scheduler: node order by rule, and failures remembered until devices free."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_slicer.sim.allocator import Allocation
from gpu_slicer.sim.demand import DemandBook
from gpu_slicer.sim.node import SimClock
from gpu_slicer.sim.plane import FastControlPlane
from gpu_slicer.sim.scenario import Scenario, parse_scenario
from gpu_slicer.sim.scheduler import Scheduler


def _scenario(rule: str) -> Scenario:
    pod = {"namespace": "ml", "at": 0, "duration": "1h"}
    return parse_scenario(
        {
            "scheduler": {"nodeRule": rule},
            # Every profile published from the start: these tests follow the scheduler alone.
            "agent": {"advertisedProfiles": "all"},
            "nodes": [
                {"name": "n-a", "gpus": "H100-80GB:1"},
                {"name": "n-b", "gpus": "H100-80GB:1"},
            ],
            "namespaces": {"ml": "enabled"},
            "pods": [
                {**pod, "name": "small-1", "resources": {"nvidia.com/mig-1g.10gb": 1}},
                {**pod, "name": "small-2", "resources": {"nvidia.com/mig-1g.10gb": 1}},
                {**pod, "name": "small-3", "resources": {"nvidia.com/mig-1g.10gb": 1}},
                {**pod, "name": "big", "resources": {"nvidia.com/mig-7g.80gb": 1}},
            ],
        }
    )


class _Cluster:
    def __init__(self, rule: str) -> None:
        self.scenario = _scenario(rule)
        self.book = DemandBook(self.scenario)
        self.plane = FastControlPlane(self.scenario, device_order="name", clock=SimClock())
        self.scheduler = Scheduler(self.plane.nodes, rule)
        self.pods = {p.name: p for p in self.scenario.pods}

    def schedule(self, name: str) -> Allocation | None:
        pod = self.pods[name]
        claims = self.plane.admit(pod, self.book.translated(pod))
        shape: Any = tuple(sorted(pod.resources.items()))
        return self.scheduler.schedule(claims, shape)

    def bind(self, allocation: Allocation) -> None:
        self.scheduler.reserve(allocation)
        self.plane.nodes[allocation.node].allocate(allocation.devices)
        self.scheduler.order.change(allocation.node, len(allocation.devices))


@pytest.mark.parametrize(("rule", "second"), [("pack", "n-a"), ("spread", "n-b")])
def test_the_rule_picks_the_fullest_or_the_emptiest_node(rule: str, second: str) -> None:
    cluster = _Cluster(rule)
    first = cluster.schedule("small-1")
    assert first is not None and first.node == "n-a"  # ties go by name
    cluster.bind(first)
    again = cluster.schedule("small-2")
    assert again is not None and again.node == second


def test_a_shape_that_fits_nowhere_is_retried_only_on_nodes_that_freed_devices() -> None:
    cluster = _Cluster("spread")
    held = []
    for name in ("small-1", "small-2"):
        allocation = cluster.schedule(name)
        assert allocation is not None
        cluster.bind(allocation)
        held.append(allocation)
    assert sorted(a.node for a in held) == ["n-a", "n-b"]
    assert cluster.schedule("big") is None
    attempts = cluster.scheduler.attempts
    assert cluster.schedule("big") is None
    assert cluster.scheduler.attempts == attempts  # nothing changed: no node tried again
    freed = next(a for a in held if a.node == "n-b")
    cluster.scheduler.release(freed.node, freed.devices)
    cluster.plane.nodes[freed.node].deallocate(freed.devices)
    big = cluster.schedule("big")
    assert big is not None and big.node == "n-b"
    assert cluster.scheduler.attempts == attempts + 1


def test_a_node_proven_unable_is_skipped_until_it_frees_devices() -> None:
    cluster = _Cluster("pack")
    small = cluster.schedule("small-1")
    assert small is not None and small.node == "n-a"
    cluster.bind(small)
    attempts = cluster.scheduler.attempts
    big = cluster.schedule("big")
    assert big is not None and big.node == "n-b"  # n-a, the fuller, tried first and failed
    assert cluster.scheduler.attempts == attempts + 2
    again = cluster.schedule("big")
    assert again is not None and again.node == "n-b"
    assert cluster.scheduler.attempts == attempts + 3  # n-a not tried again
    cluster.scheduler.release(small.node, small.devices)
    cluster.plane.nodes[small.node].deallocate(small.devices)
    cluster.scheduler.order.change(small.node, -len(small.devices))
    freed = cluster.schedule("big")
    assert freed is not None and freed.node == "n-a"  # tried again, and first by name
    assert cluster.scheduler.attempts == attempts + 4
