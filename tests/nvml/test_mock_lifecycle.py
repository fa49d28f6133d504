"""Prepare and unprepare through the agent's parts on the real bindings: instances are really
created and destroyed in the mock, the CDI spec names the MIG device NVML created, and an
agent that dies between the GPU-instance and compute-instance creation is finished by the next.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.nvml import NvmlBackend
from tests.support.agent_fixtures import (
    Agent,
    AgentCrash,
    CrashingBackend,
    allocate_claim,
    live_instances,
)
from tests.support.nvml_mock import MockNvml

SLICE = "gpu-0-mig-3g40gb-4"


def _cdi_devices(agent: Agent, claim: dict[str, object]) -> list[dict[str, object]]:
    uid = claim["metadata"]["uid"]  # type: ignore[index]
    spec = json.loads(agent.state.cdi.path_for(uid).read_text())
    devices: list[dict[str, object]] = spec["devices"]
    return devices


def test_prepare_creates_the_instance_in_nvml_and_unprepare_destroys_it(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    agent = make_agent()
    claim = allocate_claim(api, [SLICE])
    [device] = agent.prepare(claim)

    [gi] = mock.instances(0)
    assert (gi["start"], gi["size"]) == (4, 4)
    [ci] = gi["compute_instances"]
    assert (device.gi_id, device.ci_id, device.uuid) == (gi["id"], ci["id"], ci["uuid"])
    assert mock.describe()["gpus"][0]["mig_current"] == 1, "dynamic mode switched MIG on"
    edits = json.dumps(_cdi_devices(agent, claim))
    assert ci["uuid"] in edits
    # The capability minors come from the driver's files (the mock keeps them as the driver does).
    gi_minor = 3 + 9 * gi["id"]
    assert f"nvidia-cap{gi_minor}" in edits and f"nvidia-cap{gi_minor + 1 + ci['id']}" in edits

    assert agent.unprepare(claim) is True
    assert mock.instances(0) == []
    assert not agent.state.cdi.path_for(claim["metadata"]["uid"]).exists()


def test_two_slices_on_one_gpu_do_not_overlap_and_a_busy_one_is_not_destroyed(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    agent = make_agent()
    first = allocate_claim(api, ["gpu-0-mig-3g40gb-0"])
    second = allocate_claim(api, [SLICE])
    [a] = agent.prepare(first)
    [b] = agent.prepare(second)
    assert sorted((g["start"], g["size"]) for g in mock.instances(0)) == [(0, 4), (4, 4)]

    mock.set_process(0, b.gi_id, 4242)
    with pytest.raises(Exception, match="still runs processes"):
        agent.unprepare(second)
    assert len(mock.instances(0)) == 2
    mock.set_process(0, b.gi_id, 0)
    assert agent.unprepare(second) and agent.unprepare(first)
    assert mock.instances(0) == []
    assert a.gi_id != b.gi_id


def test_a_crash_between_gpu_and_compute_instance_is_finished_by_the_next_agent(
    mock: MockNvml,
    make_agent: Callable[..., Agent],
    make_backend: Callable[[], NvmlBackend],
    api: InMemoryKubeApi,
) -> None:
    claim = allocate_claim(api, [SLICE])
    dying_backend = CrashingBackend(make_backend())  # type: ignore[arg-type]
    dying = make_agent(dying_backend)
    dying_backend.crash_at("create_gpu_instance", after=True)
    with pytest.raises(AgentCrash):
        dying.prepare(claim)
    [gi] = mock.instances(0)
    assert gi["compute_instances"] == [], "the agent died before the compute instance"

    restarted = make_agent()
    [device] = restarted.prepare(claim)
    [gi_after] = mock.instances(0)
    assert gi_after["id"] == gi["id"], "the GPU instance was adopted, not made again"
    [ci] = gi_after["compute_instances"]
    assert device.uuid == ci["uuid"]
    assert restarted.unprepare(claim)
    assert live_instances(restarted.backend) == [] and mock.instances(0) == []
