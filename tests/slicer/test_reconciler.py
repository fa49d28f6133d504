"""The reconciler: vanished claims, stale prepares, busy instances, API outages, republishing."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_fixtures import (
    NODE,
    allocate_claim,
    build_agent,
    deallocate,
    delete_claim,
    live_instances,
    ref,
)

from kube.errors import Unavailable
from kube.memory import InMemoryKubeApi
from slicer.devices import SliceSpec
from slicer.errors import InsufficientResources
from slicer.simulated import SimulatedBackend


@pytest.fixture
def api() -> InMemoryKubeApi:
    return InMemoryKubeApi()


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend("H100-80GB:2", node_name=NODE)


def test_a_deleted_claim_is_unprepared_although_the_kubelet_never_called(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-3g40gb-0"])
    keep = allocate_claim(api, ["gpu-0-mig-3g40gb-4"])
    agent.prepare(claim)
    agent.prepare(keep)
    delete_claim(api, claim)
    report = agent.reconcile()
    assert report.vanished == [ref(claim)[0]]
    assert report.orphans_destroyed == 1
    assert [i.start for i in backend.instances(0)] == [4]
    assert agent.metrics.value("gpu_slicer_agent_orphans_destroyed_total") == 1
    assert not agent.state.cdi.path_for(ref(claim)[0]).exists()


def test_a_deallocated_or_recreated_claim_counts_as_vanished(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    dealloc = allocate_claim(api, ["gpu-0-mig-1g10gb-0"], name="a")
    recreated = allocate_claim(api, ["gpu-0-mig-1g10gb-1"], name="b")
    agent.prepare(dealloc)
    agent.prepare(recreated)
    deallocate(api, dealloc)
    delete_claim(api, recreated)
    allocate_claim(api, ["gpu-0-mig-1g10gb-1"], name="b")  # same name, new uid
    report = agent.reconcile()
    assert sorted(report.vanished) == sorted([ref(dealloc)[0], ref(recreated)[0]])
    assert backend.instances(0) == []


def test_a_vanished_claim_with_running_processes_is_kept_until_they_exit(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-1-mig-2g20gb-2"])
    [device] = agent.prepare(claim)
    backend.attach_process(1, device.gi_id, 99)
    delete_claim(api, claim)
    report = agent.reconcile()
    assert report.busy == [ref(claim)[0]] and report.vanished == []
    assert len(backend.instances(1)) == 1
    backend.detach_process(1, 99)
    assert agent.reconcile().vanished == [ref(claim)[0]]
    assert backend.instances(1) == []


def test_an_unreachable_api_is_not_taken_for_vanished_claims(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    agent.prepare(claim)
    agent.claims._synced = False  # the watch broke
    api.fail_next("get", Unavailable("connection refused"), times=5)
    report = agent.reconciler.reconcile_once()
    assert not report.api_synced and report.vanished == []
    assert len(backend.instances(0)) == 1
    assert agent.metrics.value("gpu_slicer_agent_api_reachable") == 0
    assert agent.prepare(claim)  # a prepared claim keeps working from the checkpoint


def test_a_stale_prepare_whose_rollback_fails_is_retried_on_the_next_pass(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    now = [1000.0]
    agent = build_agent(backend, api, tmp_path, clock=lambda: now[0], stale_after_s=30)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-4"])
    backend.inject_fault("capability_minors", InsufficientResources)
    backend.inject_fault("destroy_compute_instance", InsufficientResources)
    with pytest.raises(Exception, match="rollback incomplete"):
        agent.prepare(claim)
    assert len(backend.instances(0)) == 1  # left for the reconciler
    assert agent.reconcile().rolled_back == []  # not stale yet: the kubelet may retry
    now[0] += 60
    report = agent.reconcile()
    assert report.rolled_back == [ref(claim)[0]]
    assert backend.instances(0) == []


def test_republishes_only_when_instances_or_health_change(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    assert agent.reconcile().republished
    assert not agent.reconcile().republished
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-3"])
    agent.prepare(claim)
    report = agent.reconcile()
    assert report.republished
    view = agent.published[-1]
    assert view.gpus[0].owned == frozenset({SliceSpec(0, "1g.10gb", 3)})
    assert SliceSpec(0, "1g.10gb", 3) in view.allocated
    assert not agent.reconcile().republished
    backend.lose_gpu(1)
    agent.health.poll(0)
    assert agent.reconcile().republished
    assert [t.key for t in agent.published[-1].gpus[1].taints] == ["gpu-slicer.io/unhealthy"]


def test_a_failed_republish_is_retried_and_does_not_stop_the_pass(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    calls: list[int] = []

    def flaky(view: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("apiserver down")

    agent.reconciler.republish = flaky
    first = agent.reconcile()
    assert not first.republished and first.errors
    assert agent.reconcile().republished
    assert agent.metrics.value("gpu_slicer_agent_republishes_total", {"outcome": "error"}) == 1


def test_instance_and_free_slice_metrics_follow_the_gpus(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    agent.prepare(allocate_claim(api, ["gpu-0-mig-3g40gb-4"]))
    agent.reconcile()
    assert agent.metrics.value("gpu_slicer_agent_instances",
                               {"profile": "3g.40gb", "owner": "agent"}) == 1
    assert agent.metrics.value("gpu_slicer_agent_free_memory_slices", {"gpu": "0"}) == 4
    assert agent.metrics.value("gpu_slicer_agent_free_memory_slices", {"gpu": "1"}) == 8
    assert len(live_instances(backend)) == 1


def test_a_stray_cdi_spec_without_a_checkpoint_entry_is_removed(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    agent.prepare(claim)
    stray = agent.state.cdi.write("left-behind", [])
    agent.reconcile()
    assert not stray.exists()
    assert agent.state.cdi.path_for(ref(claim)[0]).exists()


def test_a_rollback_decided_on_a_snapshot_does_not_undo_a_prepare_completed_since(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-2"])
    backend.inject_fault("create_compute_instance", InsufficientResources)
    backend.inject_fault("destroy_gpu_instance", InsufficientResources)
    with pytest.raises(Exception, match="rollback incomplete"):
        agent.prepare(claim)
    stale = agent.state.entry(ref(claim)[0])
    assert stale is not None
    agent.prepare(claim)  # the kubelet's retry adopts and completes it
    assert agent.state.release_entry(ref(claim)[0], only_if=stale) is False
    assert len(backend.instances(0)) == 1


def test_a_lost_gpu_is_not_reported_as_missing_instances(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    agent.prepare(allocate_claim(api, ["gpu-1-mig-1g10gb-0"]))
    backend.lose_gpu(1)
    report = agent.reconcile()
    assert report.drift == [] and report.vanished == []
    assert any("GPU 1" in e for e in report.errors)
