"""A static layout's instances (made by mig-parted before the agent) are lent to claims.

On an apiserver without partitionable devices the agent advertises the existing instances its
static layout names; the scheduler allocates them, so a prepare must use the instance that is
there instead of refusing it as foreign, and the release must leave it for the next claim.
Found by the sandbox on Kubernetes 1.35: pods were scheduled onto such devices and never started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.state import PrepareError
from tests.support.agent_fixtures import allocate_claim, build_agent, delete_claim, ref

LAYOUT = StaticLayout.from_mapping(
    {"default": ["1g.10gb@0", "1g.10gb@1", "2g.20gb@2", "3g.40gb@4"]}
)


@pytest.fixture
def a100() -> SimulatedBackend:
    backend = SimulatedBackend("A100-80GB:1")
    for profile, start in LAYOUT.for_gpu(0) or ():
        backend.create_compute_instance(0, backend.create_gpu_instance(0, profile, start))
    return backend


def test_a_layout_instance_is_used_as_it_is_and_left_on_the_gpu(
    api: InMemoryKubeApi, a100: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(a100, api, tmp_path, static_layout=LAYOUT)
    before = {(i.profile, i.start): i.uuid for i in a100.instances(0)}
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-1"])
    [device] = agent.prepare(claim)
    assert device.provided and device.uuid == before[("1g.10gb", 1)]
    assert {(i.profile, i.start): i.uuid for i in a100.instances(0)} == before
    assert not [c for c in a100.calls if c[0].startswith("create")][8:]  # the layout's only

    delete_claim(api, claim)
    assert agent.unprepare(claim)
    assert {(i.profile, i.start): i.uuid for i in a100.instances(0)} == before
    assert agent.state.entry(ref(claim)[0]) is None

    again = allocate_claim(api, ["gpu-0-mig-1g10gb-1"])
    [device] = agent.prepare(again)
    assert device.uuid == before[("1g.10gb", 1)]


def test_without_the_layout_the_same_instance_is_refused_as_foreign(
    api: InMemoryKubeApi, a100: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(a100, api, tmp_path)
    with pytest.raises(PrepareError, match="did not create"):
        agent.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-1"]))


def test_an_instance_the_layout_does_not_name_is_still_refused(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    backend = SimulatedBackend("A100-80GB:1")
    backend.create_compute_instance(0, backend.create_gpu_instance(0, "1g.10gb", 5))
    agent = build_agent(backend, api, tmp_path, static_layout=LAYOUT)
    with pytest.raises(PrepareError, match="did not create"):
        agent.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-5"]))
