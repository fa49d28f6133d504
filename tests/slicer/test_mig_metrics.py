"""MIG creations and destructions are counted: the dashboard's churn panel and its alerts."""

from __future__ import annotations

from pathlib import Path

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import allocate_claim, build_agent


def test_each_instance_created_and_destroyed_is_counted_by_profile_and_repeats_are_not(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0", "gpu-0-mig-2g20gb-4"])
    agent.prepare(claim)
    agent.prepare(claim)  # idempotent repeat: nothing new on the GPU
    value = agent.metrics.value
    assert value("gpu_slicer_agent_mig_created_total", {"profile": "1g.10gb"}) == 1
    assert value("gpu_slicer_agent_mig_created_total", {"profile": "2g.20gb"}) == 1
    assert value("gpu_slicer_agent_mig_destroyed_total", {"profile": "1g.10gb"}) == 0
    agent.unprepare(claim)
    agent.unprepare(claim)
    assert value("gpu_slicer_agent_mig_destroyed_total", {"profile": "1g.10gb"}) == 1
    assert value("gpu_slicer_agent_mig_destroyed_total", {"profile": "2g.20gb"}) == 1
