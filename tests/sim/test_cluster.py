"""gpu-slicer on the simulated cluster: invariants, and the fast path deciding like the API path."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpu_slicer.core.devices import SliceSpec
from gpu_slicer.sim.compare import compare
from gpu_slicer.sim.demand import DemandBook
from gpu_slicer.sim.event_loop import Engine
from gpu_slicer.sim.scenario import Scenario, load_scenario, parse_scenario

SMALL: dict[str, Any] = {
    "name": "small",
    "end": "10h",
    "sample": "10m",
    "seed": 3,
    "agent": {"republishMinInterval": 0, "republishQuiet": 0},
    "nodes": [
        {"name": "h100-a", "gpus": "H100-80GB:2"},
        {"name": "a100-a", "gpus": "A100-80GB:2"},
    ],
    "namespaces": {"inference": "enabled", "research": "enabled"},
    "policy": {"namespaces": {"inference": {"gpu": ["1g.10gb", "2g.20gb", "3g.40gb"]}}},
    "generators": [
        {
            "name": "inference",
            "count": 40,
            "from": 0,
            "to": "6h",
            "namespace": "inference",
            "duration": {"distribution": "exponential", "mean": "90m", "min": "5m", "max": "5h"},
            "mix": [{"resources": {"nvidia.com/gpu": 1}}],
        },
        {
            "name": "notebooks",
            "count": 12,
            "from": 0,
            "to": "6h",
            "namespace": "research",
            "duration": "2h",
            "mix": [
                {"resources": {"nvidia.com/mig-2g.20gb": 1}},
                {"resources": {"nvidia.com/mig-3g.40gb": 1}},
                {"resources": {"nvidia.com/gpu": 1}},
            ],
        },
    ],
}


@pytest.fixture(scope="module")
def small() -> Scenario:
    return parse_scenario(SMALL)


@pytest.mark.parametrize("policy", ["name", "best-fit"])
def test_the_fast_path_decides_exactly_like_the_api_path(small: Scenario, policy: str) -> None:
    name = f"gpu-slicer-{policy}"
    through_api = compare(small, [name], through_api=True)
    fast = compare(small, [name], through_api=False)
    a, b = through_api.results[0], fast.results[0]
    assert (a.served, a.pending) == (b.served, b.pending)
    assert a.series == b.series
    assert (a.creations, a.destructions) == (b.creations, b.destructions)
    assert through_api.problems[name] == [] and fast.problems[name] == []


def test_every_strategy_ends_clean_and_never_overlaps_slices(small: Scenario) -> None:
    # The engine raises InvariantError on any overlap; drain() reports leaks.
    comparison = compare(
        small,
        [
            "device-plugin",
            "static-balanced",
            "instaslice",
            "gpu-slicer-anti-fragmentation",
            "oracle",
        ],
        through_api=False,
    )
    assert all(problems == [] for problems in comparison.problems.values())
    for result in comparison.results:
        assert result.served + result.pending == result.total == len(small.pods)


def test_the_api_path_leaves_no_claim_instance_or_checkpoint_entry(small: Scenario) -> None:
    from gpu_slicer.sim.api_node import ApiNode
    from gpu_slicer.sim.cluster import GpuSlicerStrategy
    from gpu_slicer.sim.plane import ApiControlPlane

    strategy = GpuSlicerStrategy(
        small, DemandBook(small), device_order="best-fit", through_api=True
    )
    engine = Engine(small, strategy)
    engine.run()
    assert isinstance(strategy.plane, ApiControlPlane)
    api = strategy.plane.api
    nodes = list(strategy.nodes.values())
    agents = [n for n in nodes if isinstance(n, ApiNode)]
    assert len(agents) == len(nodes)
    running = [name for name, record in engine.records.items() if record.held is not None]
    allocated = [
        c
        for c in api.list("resource.k8s.io/v1", "ResourceClaim").items
        if (c.get("status") or {}).get("allocation")
    ]
    assert len(allocated) == len(running)
    for agent in agents:
        prepared = agent.state.entries()
        instances = sum(
            len(agent.backend.instances(g.index)) for g in agent.backend.gpus() if g.mig_enabled
        )
        mig_devices = sum(1 for d in agent.allocated if "-mig-" in d)
        assert instances == mig_devices
        assert len(prepared) == len(
            {p.uid for a, ps in strategy.running.values() if a.node == agent.name for p in ps}
        )
    assert engine.drain() == []
    for agent in agents:
        assert all(
            not agent.backend.instances(g.index) for g in agent.backend.gpus() if g.mig_enabled
        )


@pytest.mark.parametrize("through_api", [True, False], ids=["api", "fast"])
def test_a_node_owns_exactly_the_instances_its_checkpoint_holds(
    small: Scenario, through_api: bool
) -> None:
    """As the reconciler does: the simulator's instances are all its agent's (they coincide),
    and one made behind the agent's back is foreign, so the slices stop offering it."""
    from gpu_slicer.sim.cluster import GpuSlicerStrategy
    from gpu_slicer.sim.node import NodeBase

    strategy = GpuSlicerStrategy(
        small, DemandBook(small), device_order="best-fit", through_api=through_api
    )
    nodes = [n for n in strategy.nodes.values() if isinstance(n, NodeBase)]
    assert len(nodes) == len(strategy.nodes)
    owned_seen = 0
    release = strategy.release

    def checked_release(pod: Any, held: Any, now: float) -> None:
        nonlocal owned_seen
        for node in nodes:
            gpus = node.view().gpus
            assert all(g.foreign == () for g in gpus)
            owned = sum(len(g.owned) for g in gpus)
            assert owned == sum(1 for d in node.allocated if "-mig-" in d)
            owned_seen += owned
        release(pod, held, now)

    strategy.release = checked_release  # type: ignore[method-assign]
    engine = Engine(small, strategy)
    engine.run()
    assert engine.drain() == []
    assert owned_seen > 0  # the check saw instances
    node = nodes[0]
    node.backend.set_mig_mode(0, True)
    gi = node.backend.create_gpu_instance(0, "1g.10gb", 0)
    node.backend.create_compute_instance(0, gi)
    assert [i.spec for i in node.view().gpus[0].foreign] == [SliceSpec(0, "1g.10gb", 0)]


def test_noon_burst_serves_the_whole_burst_at_noon_where_the_static_layout_serves_two() -> None:
    comparison = compare(load_scenario("noon-burst"), ["static-balanced", "gpu-slicer-best-fit"])
    static, slicer = comparison.results
    # At noon the static layout has two 1g.10gb instances; the rest of the burst waits.
    static_waits = static.waits_by_workload["noon-burst"]
    assert static_waits[1] > 0
    assert slicer.served_by_workload["noon-burst"] == (7, 7)
    # The burst's profile is new at noon: its first pods wait for the agents to advertise it.
    mean, p95 = slicer.waits_by_workload["noon-burst"]
    assert 0 < mean < p95 <= load_scenario("noon-burst").demand_latency_s
    assert slicer.served_by_workload["training-3g"] == (1, 1)
    assert all(p == [] for p in comparison.problems.values())


def test_with_every_profile_advertised_the_burst_waits_for_nothing() -> None:
    scenario = replace(load_scenario("noon-burst"), advertised_profiles="all")
    [slicer] = compare(scenario, ["gpu-slicer-best-fit"]).results
    assert slicer.waits_by_workload["noon-burst"] == (0.0, 0.0)


def test_a_pod_the_webhook_denies_is_counted_as_rejected_and_never_placed() -> None:
    scenario = parse_scenario(
        {
            "nodes": [{"name": "n", "gpus": "H100-80GB:1"}],
            "namespaces": {"ml": "enabled"},
            "pods": [
                {
                    "name": "bad",
                    "namespace": "ml",
                    "at": 0,
                    "duration": "1h",
                    "annotations": {"gpu-slicer.io/profiles": "9g.1tb"},
                },
                {
                    "name": "good",
                    "namespace": "ml",
                    "at": 0,
                    "duration": "1h",
                    "resources": {"nvidia.com/mig-1g.10gb": 1},
                },
            ],
        }
    )
    result = compare(scenario, ["gpu-slicer-best-fit"]).results[0]
    assert (result.served, result.pending, result.rejected) == (1, 1, 1)
