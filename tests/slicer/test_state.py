"""Prepare and unprepare: exact placements, idempotency, per-claim errors, busy instances."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.core.devices import SliceSpec, WholeGpu
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.checkpoint import PREPARE_COMPLETED
from gpu_slicer.slicer.claim_cache import AllocatedDevice
from gpu_slicer.slicer.errors import BackendError, InsufficientResources, SlicerError
from gpu_slicer.slicer.simulated import BACKEND_METHODS, SimulatedBackend
from gpu_slicer.slicer.state import InstanceBusy, PrepareError, plan_claim
from tests.support.agent_fixtures import (
    NODE,
    Agent,
    allocate_claim,
    build_agent,
    delete_claim,
    live_instances,
    ref,
)


def test_plan_merges_results_that_name_the_same_device_and_keeps_their_order() -> None:
    results = [
        AllocatedDevice("a", "gpu-0-mig-1g10gb-6", NODE),
        AllocatedDevice("b/small", "gpu-1", NODE),
        AllocatedDevice("c", "gpu-0-mig-1g10gb-6", NODE),
    ]
    plan = plan_claim(results)
    assert [p.device_name for p in plan] == ["gpu-0-mig-1g10gb-6", "gpu-1"]
    assert plan[0].request_names == ("a", "c")
    assert plan[0].spec == SliceSpec(0, "1g.10gb", 6)
    assert plan[1].spec == WholeGpu(1)


def test_plan_refuses_a_device_name_that_is_not_ours() -> None:
    with pytest.raises(PrepareError, match="unknown device"):
        plan_claim([AllocatedDevice("a", "nvidia-gpu-0", NODE)])


def test_prepare_creates_the_instance_at_exactly_the_allocated_placement(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-1-mig-2g20gb-4"])
    devices = agent.prepare(claim)
    [inst] = backend.instances(1)
    assert (inst.profile, inst.start) == ("2g.20gb", 4)
    assert devices[0].uuid == inst.uuid and devices[0].gi_id == inst.gi_id
    assert devices[0].cdi_device_id == f"k8s.gpu-slicer.io/claim={ref(claim)[0]}-gpu-1-mig-2g20gb-4"
    entry = agent.state.entry(ref(claim)[0])
    assert entry is not None and entry.state == PREPARE_COMPLETED
    spec = json.loads(agent.state.cdi.path_for(ref(claim)[0]).read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert env == [f"NVIDIA_VISIBLE_DEVICES={inst.uuid}"]


def test_dynamic_mode_enables_mig_for_the_first_slice(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    assert not backend.gpus()[0].mig_enabled
    agent = build_agent(backend, api, tmp_path)
    agent.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-0"]))
    assert backend.gpus()[0].mig_enabled


def test_repeated_prepare_returns_the_same_devices_without_touching_the_gpu(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-3g40gb-4"])
    first = agent.prepare(claim)
    for method in sorted(BACKEND_METHODS):  # any use of the GPU now fails
        backend.inject_fault(method, BackendError)
    again = agent.prepare(claim)
    assert again == first


def test_a_fresh_agent_answers_a_prepared_claim_from_the_checkpoint(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-3"])
    first = build_agent(backend, api, tmp_path).prepare(claim)
    calls = len(backend.calls)
    again = build_agent(backend, api, tmp_path).prepare(claim)
    assert again == first
    assert not [c for c in backend.calls[calls:] if c[0].startswith("create")]


def test_unprepare_destroys_the_instance_and_removes_cdi_and_checkpoint_entry(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1"])
    agent.prepare(claim)
    assert len(backend.instances(0)) == 2
    assert agent.unprepare(claim) is True
    assert backend.instances(0) == []
    assert not agent.state.cdi.path_for(ref(claim)[0]).exists()
    assert agent.state.entry(ref(claim)[0]) is None
    assert agent.unprepare(claim) is False  # idempotent


def test_unprepare_refuses_while_processes_run_and_succeeds_after_they_exit(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-2g20gb-0"])
    [device] = agent.prepare(claim)
    backend.attach_process(0, device.gi_id, 4242)
    with pytest.raises(InstanceBusy, match="4242"):
        agent.unprepare(claim)
    assert len(backend.instances(0)) == 1
    assert agent.metrics.value("gpu_slicer_agent_busy_refusals_total") == 1
    backend.detach_process(0, 4242)
    assert agent.unprepare(claim) is True
    assert backend.instances(0) == []


def test_unprepare_resumes_after_the_gi_destroy_failed(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-5"])
    agent.prepare(claim)
    backend.inject_fault("destroy_gpu_instance", InsufficientResources)
    with pytest.raises(InsufficientResources):
        agent.unprepare(claim)
    [half] = backend.instances(0)
    assert half.ci_id is None  # the CI went, the GI stayed
    assert agent.state.entry(ref(claim)[0]) is not None
    assert agent.unprepare(claim) is True
    assert backend.instances(0) == []


def test_a_failed_create_fails_only_that_claim_and_leaves_nothing_behind(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    good = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    bad = allocate_claim(api, ["gpu-1-mig-1g10gb-0"])
    backend.inject_fault("create_compute_instance", InsufficientResources, gpu=1)
    with pytest.raises(PrepareError, match="injected"):
        agent.prepare(bad)
    agent.prepare(good)
    assert backend.instances(1) == []
    assert agent.state.entry(ref(bad)[0]) is None
    assert len(backend.instances(0)) == 1
    agent.prepare(bad)  # the kubelet's retry succeeds
    assert len(backend.instances(1)) == 1


def test_a_placement_occupied_by_a_foreign_instance_is_refused_and_left_alone(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    backend.set_mig_mode(0, True)
    gi = backend.create_gpu_instance(0, "1g.10gb", 2)
    backend.create_compute_instance(0, gi)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-2"])
    with pytest.raises(PrepareError, match="did not create"):
        agent.prepare(claim)
    assert [(i.profile, i.start, i.gi_id) for i in backend.instances(0)] == [("1g.10gb", 2, gi)]


def test_a_whole_gpu_turns_mig_off_when_no_instance_exists(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    backend.set_mig_mode(1, True)
    [device] = agent.prepare(allocate_claim(api, ["gpu-1"]))
    assert not backend.gpus()[1].mig_enabled
    assert device.uuid == backend.gpus()[1].uuid


def test_claims_on_different_gpus_proceed_while_one_gpu_is_slow(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    gate = threading.Event()
    backend = SimulatedBackend("H100-80GB:2", node_name=NODE, sleep=lambda _: gate.wait(10))
    agent = build_agent(backend, api, tmp_path)
    backend.set_mig_mode(0, True)
    backend.set_mig_mode(1, True)
    slow = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    fast = allocate_claim(api, ["gpu-1-mig-1g10gb-0"])
    backend.inject_fault("create_gpu_instance", delay_s=1, gpu=0)
    worker = threading.Thread(target=agent.prepare, args=(slow,))
    worker.start()
    try:
        agent.prepare(fast)  # would block forever if GPU 0's lock serialised GPU 1 too
        assert len(backend.instances(1)) == 1
        assert backend.instances(0) == []
    finally:
        gate.set()
        worker.join(10)
    assert len(backend.instances(0)) == 1
    assert {i.gpu_index for i in live_instances(backend)} == {0, 1}


def test_two_claims_racing_for_the_first_slice_switch_mig_on_once(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    gate = threading.Event()
    backend = SimulatedBackend("H100-80GB:1", node_name=NODE, sleep=lambda _: gate.wait(10))
    agent = build_agent(backend, api, tmp_path)
    first = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    second = allocate_claim(api, ["gpu-0-mig-1g10gb-1"])
    backend.inject_fault("set_mig_mode", delay_s=1)  # the first switch stalls under the lock
    seen = len(backend.calls)
    threads = [threading.Thread(target=agent.prepare, args=(c,)) for c in (first, second)]
    for t in threads:
        t.start()

    def names() -> list[str]:
        return [c[0] for c in backend.calls[seen:]]

    deadline = time.monotonic() + 10  # both read the GPUs (MIG off) before the switch ends
    while names().count("gpus") < 2 or "set_mig_mode" not in names():
        assert time.monotonic() < deadline, names()
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(10)
    assert sorted(i.start for i in backend.instances(0)) == [0, 1]
    assert [c for c in backend.calls if c[0] == "set_mig_mode"] == [("set_mig_mode", (0, True))]


def test_unprepare_of_a_claim_on_a_lost_gpu_succeeds_because_the_reset_wipes_its_instances(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-1-mig-1g10gb-0"])
    agent.prepare(claim)
    backend.lose_gpu(1)
    assert agent.unprepare(claim) is True  # the kubelet would otherwise retry forever
    assert agent.state.entry(ref(claim)[0]) is None
    assert not agent.state.cdi.path_for(ref(claim)[0]).exists()
    backend.recover_gpu(1)
    assert backend.instances(1) == []


def test_a_whole_gpu_on_a_gpu_still_held_by_a_deleted_claims_slice_names_that_claim(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    old = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    agent.prepare(old)
    delete_claim(api, old)  # force-deleted pod: the kubelet never unprepared
    whole = allocate_claim(api, ["gpu-0"])
    with pytest.raises(PrepareError, match=f"held by ResourceClaim ml/{old['metadata']['name']}"):
        agent.prepare(whole)
    agent.reconcile()  # releases the deleted claim
    [device] = agent.prepare(whole)
    assert device.uuid == backend.gpus()[0].uuid and not backend.gpus()[0].mig_enabled


def test_an_unprepare_before_a_corrupt_checkpoint_is_rebuilt_waits_instead_of_leaking(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-2"])
    build_agent(backend, api, tmp_path).prepare(claim)
    (tmp_path / "checkpoint" / "checkpoint.json").write_bytes(b"\x00" * 40)
    fresh = build_agent(backend, api, tmp_path)
    with pytest.raises(SlicerError, match="retr"):
        fresh.unprepare(claim)  # "unknown, so done" would leave the instance to nobody
    fresh.reconcile()  # adopts the claim from the API and the GPU
    assert fresh.unprepare(claim) is True
    assert backend.instances(0) == []


def test_a_prepare_before_a_corrupt_checkpoint_is_rebuilt_does_not_call_its_own_instance_foreign(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-2"])
    [before] = build_agent(backend, api, tmp_path).prepare(claim)
    (tmp_path / "checkpoint" / "checkpoint.json").write_bytes(b"\x00" * 40)
    fresh = build_agent(backend, api, tmp_path)
    with pytest.raises(PrepareError, match="rebuil") as refused:
        fresh.prepare(claim)
    assert "by hand" not in str(refused.value)  # the instance is this claim's own
    fresh.reconcile()
    [after] = fresh.prepare(claim)
    assert after.uuid == before.uuid


def test_the_per_claim_locks_of_finished_calls_are_not_kept_forever(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    for _ in range(3):
        claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
        agent.prepare(claim)
        agent.unprepare(claim)
    # A long-running agent sees a new claim uid for every pod: one lock each would only grow.
    assert len(agent.state.claim_locks) == 0


def test_a_claim_on_a_gpu_that_disappeared_without_a_reboot_can_be_unprepared(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    two = SimulatedBackend("H100-80GB:2", node_name=NODE, boot_id="boot-1")
    claim = allocate_claim(api, ["gpu-1-mig-1g10gb-0"])
    build_agent(two, api, tmp_path).prepare(claim)
    one = SimulatedBackend("H100-80GB:1", node_name=NODE, boot_id="boot-1")  # GPU 1 unbound
    agent = build_agent(one, api, tmp_path)
    assert agent.unprepare(claim) is True
    assert agent.state.entries() == {}


# --- a compute instance that cannot be made (issue: GI created, CI fails) --------------------


def _failing_compute_instance(
    tmp_path: Path, gpus: str, device: str
) -> tuple[SimulatedBackend, Agent, dict[str, Any]]:
    """An agent with a claim for ``device`` whose compute instance cannot be made."""
    backend = SimulatedBackend(gpus, node_name=NODE, mig_enabled=True)
    api = InMemoryKubeApi()
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, [device])
    backend.inject_fault("create_compute_instance", InsufficientResources)
    return backend, agent, claim


def test_a_failed_compute_instance_rolls_the_gpu_instance_back(tmp_path: Path) -> None:
    backend, agent, claim = _failing_compute_instance(tmp_path, "H100-80GB:1", "gpu-0-mig-3g40gb-4")
    with pytest.raises(PrepareError, match="cannot prepare claim") as failed:
        agent.prepare(claim)
    assert "rolling it back failed" not in str(failed.value)
    assert backend.instances(0) == [], "no GPU instance is left behind"
    assert agent.state.entry(ref(claim)[0]) is None
    assert agent.state.taints(0) == ()


def test_a_failed_rollback_taints_the_gpu_says_what_to_do_and_is_lifted_by_the_retry(
    tmp_path: Path,
) -> None:
    backend, agent, claim = _failing_compute_instance(tmp_path, "H100-80GB:2", "gpu-1-mig-3g40gb-4")
    backend.inject_fault("destroy_gpu_instance", BackendError("driver said no"))
    with pytest.raises(PrepareError) as failed:
        agent.prepare(claim)
    message = str(failed.value)
    assert "rolling it back failed too" in message and "driver said no" in message
    assert "gpu-slicer.io/unhealthy=rollback-failed" in message
    assert "nvidia-smi mig -dgi -gi <id> -i 1" in message
    [left] = backend.instances(1)
    assert left.ci_id is None
    [taint] = agent.state.taints(1)
    assert (taint.key, taint.value, taint.effect) == (
        "gpu-slicer.io/unhealthy",
        "rollback-failed",
        "NoSchedule",
    )
    assert agent.state.taints(0) == ()
    published = agent.reconcile()
    assert published is not None
    view = agent.published[-1]
    assert [g.taints for g in view.gpus if g.index == 1] == [(taint,)]

    [device] = agent.prepare(claim)  # the kubelet's retry completes it on the same instance
    assert device.gi_id == left.gi_id
    assert agent.state.taints(1) == ()


def test_a_failed_rollback_is_lifted_when_the_claim_is_released(tmp_path: Path) -> None:
    backend, agent, claim = _failing_compute_instance(tmp_path, "H100-80GB:1", "gpu-0-mig-1g10gb-3")
    backend.inject_fault("destroy_gpu_instance", InsufficientResources)
    with pytest.raises(PrepareError):
        agent.prepare(claim)
    assert agent.state.taints(0) != ()
    assert agent.unprepare(claim) is True
    assert backend.instances(0) == [] and agent.state.taints(0) == ()
