"""Failures users of NVIDIA's DRA driver report, on the mock library through the real bindings
(their counterparts on the simulated backend are in tests/slicer)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.nvml import NvmlBackend
from gpu_slicer.slicer.state import PrepareError
from tests.support import nvml_mock
from tests.support.agent_fixtures import (
    Agent,
    allocate_claim,
    assert_mixed_node,
    devices_by_name,
    node_slices,
)
from tests.support.nvml_mock import MockNvml

# --- the GPU instance is created, the compute instance is not --------------------------------


def test_a_failed_compute_instance_leaves_no_gpu_instance(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    agent = make_agent()
    claim = allocate_claim(api, ["gpu-0-mig-3g40gb-4"])
    mock.fail("nvmlGpuInstanceCreateComputeInstance", nvml_mock.INSUFFICIENT_RESOURCES)
    with pytest.raises(PrepareError, match="Insufficient resources") as failed:
        agent.prepare(claim)
    assert "rolling it back failed" not in str(failed.value)
    assert mock.instances(0) == []
    assert agent.state.taints(0) == ()


def test_a_failed_rollback_taints_the_gpu_until_the_retry_uses_the_instance(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    agent = make_agent()
    claim = allocate_claim(api, ["gpu-1-mig-2g20gb-2"])
    mock.fail("nvmlGpuInstanceCreateComputeInstance", nvml_mock.UNKNOWN)
    mock.fail("nvmlGpuInstanceDestroy", nvml_mock.UNKNOWN)
    with pytest.raises(PrepareError) as failed:
        agent.prepare(claim)
    message = str(failed.value)
    assert "rolling it back failed too" in message and "destroy GPU instance" in message
    assert "gpu-slicer.io/unhealthy=rollback-failed" in message
    [left] = mock.instances(1)
    assert left["compute_instances"] == []
    assert [t.value for t in agent.state.taints(1)] == ["rollback-failed"]

    [device] = agent.prepare(claim)
    [used] = mock.instances(1)
    assert used["id"] == left["id"] == device.gi_id and len(used["compute_instances"]) == 1
    assert agent.state.taints(1) == ()


# --- the compute profile of a full-size GPU instance is read, not assumed ---------------------

CI_7_SLICE = 4  # NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE
CI_7_SLICE_NVL = 8  # NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL


def test_the_full_size_compute_profile_is_the_one_the_gpu_offers(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    # GPU 0 offers its 7-slice compute profile under another constant than the catalog's.
    mock.move_ci_profile(0, CI_7_SLICE, CI_7_SLICE_NVL)
    agent = make_agent()
    claim = allocate_claim(api, ["gpu-0-mig-7g80gb-0"])
    [device] = agent.prepare(claim)
    [gi] = mock.instances(0)
    [ci] = gi["compute_instances"]
    assert ci["profile_id"] == CI_7_SLICE_NVL and device.uuid == ci["uuid"]
    # Listing finds a compute instance of any profile: the slice is complete, not half-made.
    [listed] = agent.backend.instances(0)
    assert (listed.ci_id, listed.uuid) == (ci["id"], ci["uuid"])
    assert agent.unprepare(claim) and mock.instances(0) == []


# --- MIG-capable and non-MIG GPUs on one node --------------------------------------------------


def test_a_node_with_h100s_and_an_l4_publishes_both_kinds(
    mock: MockNvml,
    make_backend: Callable[[], NvmlBackend],
    make_agent: Callable[..., Agent],
    api: InMemoryKubeApi,
    node_root: Path,
) -> None:
    mock.reset("h100,l40s,h100", root=node_root)
    backend = make_backend()
    l40s = backend.gpus()[1]
    assert (l40s.product_name, l40s.mig_model, l40s.mig_enabled) == ("NVIDIA L40S", None, False)
    assert_mixed_node(devices_by_name(node_slices(backend)), whole_only=1, mig=(0, 2))

    agent = make_agent(backend)
    [whole] = agent.prepare(allocate_claim(api, ["gpu-1"]))
    assert whole.uuid == mock.describe()["gpus"][1]["uuid"]
    [mig] = agent.prepare(allocate_claim(api, ["gpu-2-mig-1g10gb-0"]))
    assert [g["id"] for g in mock.instances(2)] == [mig.gi_id]
    assert mock.describe()["gpus"][1]["mig_current"] == 0


# --- a MIG mode change that needs a reset this node cannot do --------------------------------


def test_a_mig_mode_change_needing_a_reset_keeps_the_gpu_usable(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    mock.needs_reset(0)  # NVML: SetMigMode succeeds, its activation status is RESET_REQUIRED
    agent = make_agent()
    with pytest.raises(PrepareError, match="needs a GPU reset") as failed:
        agent.prepare(allocate_claim(api, ["gpu-0-mig-3g40gb-0"]))
    assert "(activation status)" in str(failed.value), "what NVML answered is in the message"
    described = mock.describe()["gpus"][0]
    assert (described["mig_current"], described["mig_pending"]) == (0, 0), "nothing pending"
    assert agent.state.mig.mode(0) == "full"
    info = agent.backend.gpus()[0]
    assert (info.mig_enabled, info.mig_pending) == (False, False)
    [whole] = agent.prepare(allocate_claim(api, ["gpu-0"]))
    assert whole.uuid == described["uuid"]
    # GPU 1 switches as usual.
    agent.prepare(allocate_claim(api, ["gpu-1-mig-3g40gb-0"]))
    assert mock.describe()["gpus"][1]["mig_current"] == 1


def test_the_remedy_the_reset_message_gives_works(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    """Enable MIG by hand, reset the GPU, restart the agent: the GPU then serves slices."""
    mock.needs_reset(0)
    agent = make_agent()
    with pytest.raises(PrepareError, match="nvidia-smi -i 0 -mig 1"):
        agent.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-0"]))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceSetMigMode(handle, 1) == pynvml.NVML_ERROR_RESET_REQUIRED
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 1]
    mock.reset_gpu(0)
    restarted = make_agent()
    assert restarted.state.mig.mode(0) == "dynamic"
    [device] = restarted.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-0"]))
    assert [g["id"] for g in mock.instances(0)] == [device.gi_id]
