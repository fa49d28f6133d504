"""The baselines gpu-slicer is measured against: the oracle accepts every alternative that
gpu-slicer itself can serve, so that the packing ratio compares like with like."""

from __future__ import annotations

from typing import Any

from gpu_slicer.sim.compare import compare
from gpu_slicer.sim.scenario import Scenario, parse_scenario


def one_node(gpus: str, *pods: tuple[str, str, dict[str, Any]]) -> Scenario:
    """One node of ``gpus``; each pod ``(name, at, fields)`` runs an hour in namespace ml."""
    return parse_scenario(
        {
            "nodes": [{"name": "n", "gpus": gpus}],
            "namespaces": {"ml": "enabled"},
            "pods": [
                {"name": name, "namespace": "ml", "at": at, "duration": "1h", **fields}
                for name, at, fields in pods
            ],
        }
    )


def test_the_oracle_serves_a_whole_gpu_as_a_mig_device_where_gpus_run_mig() -> None:
    # An A100 runs MIG slices only (a mode switch needs a reset), so gpu-slicer serves
    # nvidia.com/gpu: 1 there through the chain's gpu-mig alternative, the 7g.80gb instance.
    scenario = one_node(
        "A100-80GB:1",
        ("whole", "0s", {"resources": {"nvidia.com/gpu": 1}}),
        ("later", "30m", {"resources": {"nvidia.com/mig-1g.10gb": 1}}),
    )
    results = {r.strategy: r for r in compare(scenario, ["gpu-slicer-best-fit", "oracle"]).results}
    assert results["gpu-slicer-best-fit"].served == 2
    oracle = results["oracle"]
    assert (oracle.served, oracle.pending) == (2, 0)
    assert oracle.creations == 2  # the 7g.80gb instance, then the 1g.10gb after it ended


def test_a_memory_chain_on_the_default_policy_is_served_on_an_h200_by_gpu_slicer_and_oracle() -> (
    None
):
    # No gpuModels: the chain spans the whole catalog, and 40Gi fits more profile names than a
    # chain holds; the H200's own (3g.71gb) is in its last, "any of" entry.
    scenario = one_node(
        "H200-141GB:1", ("forty", "0s", {"annotations": {"gpu-slicer.io/gpu-memory": "40Gi"}})
    )
    comparison = compare(scenario, ["gpu-slicer-best-fit", "oracle"], through_api=True)
    assert [(r.strategy, r.served) for r in comparison.results] == [
        ("gpu-slicer-best-fit", 1),
        ("oracle", 1),
    ]
    assert all(problems == [] for problems in comparison.problems.values())
