"""Dynamic MIG mode: on for the first slice, off for a whole GPU, reported when blocked."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.backend import model_of
from gpu_slicer.slicer.inventory import default_mode
from gpu_slicer.slicer.mig_mode import MigModeBlocked, MigModeManager
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.state import PrepareError
from tests.support.agent_fixtures import NODE, allocate_claim, build_agent


def test_default_modes_follow_the_architecture() -> None:
    hopper, ampere = SimulatedBackend("H100-80GB:1,A100-80GB:1").gpus()
    assert default_mode(model_of(hopper)) == "dynamic"
    assert default_mode(model_of(ampere)) == "mig"
    assert default_mode(None) == "full"  # no MIG facts: the GPU is offered whole


def test_the_first_slice_switches_a_full_gpu_to_mig() -> None:
    backend = SimulatedBackend("H100-80GB:1")
    manager = MigModeManager(backend, {0: "dynamic"})
    manager.ensure_for_slice(backend.gpus()[0])
    assert backend.gpus()[0].mig_enabled


def test_a_whole_gpu_switches_mig_off_only_when_no_instance_exists() -> None:
    backend = SimulatedBackend("H100-80GB:1", mig_enabled=True)
    manager = MigModeManager(backend, {0: "dynamic"})
    gi = backend.create_gpu_instance(0, "1g.10gb", 0)
    with pytest.raises(MigModeBlocked, match="1g.10gb@0"):
        manager.ensure_for_whole(backend.gpus()[0])
    backend.destroy_gpu_instance(0, gi)
    manager.ensure_for_whole(backend.gpus()[0])
    assert not backend.gpus()[0].mig_enabled


def test_a_blocking_client_is_reported_and_the_claim_fails_with_a_clear_message(
    tmp_path: Path,
) -> None:
    api = InMemoryKubeApi()
    backend = SimulatedBackend("H100-80GB:1", node_name=NODE)
    backend.set_blocking_client(0, "nv-hostengine (DCGM)")
    agent = build_agent(backend, api, tmp_path)
    blocked: list[tuple[int, str]] = []
    agent.state.mig._on_blocked = lambda gpu, msg: blocked.append((gpu, msg))
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    with pytest.raises(PrepareError, match="DCGM"):
        agent.prepare(claim)
    assert blocked and blocked[0][0] == 0
    assert not backend.gpus()[0].mig_enabled
    backend.set_blocking_client(0, None)
    agent.prepare(claim)  # the kubelet's retry succeeds once the client is gone
    assert backend.gpus()[0].mig_enabled


def test_an_ampere_gpu_in_mig_mode_is_not_handed_out_whole() -> None:
    backend = SimulatedBackend("A100-80GB:1")
    manager = MigModeManager(backend, {0: "mig"})
    with pytest.raises(MigModeBlocked, match="not offered as a whole GPU"):
        manager.ensure_for_whole(backend.gpus()[0])


# --- a mode change that needs a GPU reset the node cannot do (cloud VMs) -----------------------


def test_a_mode_change_needing_a_reset_leaves_the_gpu_as_it_was_and_says_so(
    tmp_path: Path,
) -> None:
    backend = SimulatedBackend("H100-80GB:2", node_name=NODE)
    backend.require_reset(0)
    api = InMemoryKubeApi()
    agent = build_agent(backend, api, tmp_path)
    with pytest.raises(PrepareError, match="needs a GPU reset") as failed:
        agent.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-0"]))
    message = str(failed.value)
    assert "offered whole only" in message and "nvidia-smi -i 0 -mig 1" in message
    gpu = backend.gpus()[0]
    assert (gpu.mig_enabled, gpu.mig_pending) == (False, False), "no change left pending"
    assert agent.state.mig.mode(0) == "full"
    assert agent.state.mig.mode(1) == "dynamic", "the other GPU is untouched"
    # The agent carries on with the GPU as it is: offered and usable whole, slices no more.
    agent.reconcile()
    assert [g.mode for g in agent.published[-1].gpus] == ["full", "dynamic"]
    [whole] = agent.prepare(allocate_claim(api, ["gpu-0"]))
    assert whole.uuid == gpu.uuid
    blocked = agent.metrics.registry.get_sample_value(
        "gpu_slicer_agent_mig_mode_blocked_total", {"gpu": "0"}
    )
    assert blocked == 1


def test_disabling_mig_that_needs_a_reset_keeps_the_slices(tmp_path: Path) -> None:
    backend = SimulatedBackend("H100-80GB:1", node_name=NODE, mig_enabled=True)
    backend.require_reset(0)
    api = InMemoryKubeApi()
    agent = build_agent(backend, api, tmp_path)
    agent.state.mig.modes[0] = "dynamic"
    with pytest.raises(PrepareError, match="offered as MIG slices only"):
        agent.prepare(allocate_claim(api, ["gpu-0"]))
    gpu = backend.gpus()[0]
    assert (gpu.mig_enabled, gpu.mig_pending) == (True, True)
    assert agent.state.mig.mode(0) == "mig"
    [mig] = agent.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-0"]))
    assert mig.gi_id is not None
