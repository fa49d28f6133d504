"""The reconciler: vanished claims, stale prepares, busy instances, API outages, republishing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.core.devices import SliceSpec
from gpu_slicer.kube.errors import Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.agent import AgentConfig, NodeAgent
from gpu_slicer.slicer.clock import Clock
from gpu_slicer.slicer.errors import InsufficientResources
from gpu_slicer.slicer.reconciler import ReconcileReport
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.state import PrepareError
from tests.support.agent_fixtures import (
    NODE,
    AgentCrash,
    CrashingBackend,
    agent_config,
    allocate_claim,
    build_agent,
    deallocate,
    delete_claim,
    live_instances,
    ref,
)


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
    agent.claims._cache.failures = 1  # the watch broke
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
    with pytest.raises(Exception, match="rolling it back failed too"):
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
    assert (
        agent.metrics.value("gpu_slicer_agent_instances", {"profile": "3g.40gb", "owner": "agent"})
        == 1
    )
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
    with pytest.raises(Exception, match="rolling it back failed too"):
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


# --- republish rate limiting (best-fit) through the agent's wiring --------------------------


def _agent(
    api: InMemoryKubeApi,
    backend: SimulatedBackend,
    root: Path,
    clock: Callable[[], float] = time.monotonic,
    **config: Any,
) -> NodeAgent:
    # The agent's own reconcile interval: these tests drive the passes themselves. Every profile
    # is advertised: they follow the device order as allocations come and go, whatever asks.
    config.setdefault("advertised_profiles", "all")
    settings = agent_config(root, reconcile_interval_s=AgentConfig.reconcile_interval_s, **config)
    return NodeAgent(settings, backend=backend, api=api, clock=Clock(monotonic=clock))


def _pool(api: InMemoryKubeApi) -> tuple[int, list[str]]:
    slices = sorted(
        (s for s in api.objects("resource.k8s.io/v1", "ResourceSlice")),
        key=lambda s: s["metadata"]["name"],
    )
    generation = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
    return generation, [d["name"] for s in slices for d in s["spec"].get("devices", [])]


def _best_order(agent: NodeAgent) -> list[str]:
    assert agent.publisher is not None
    view = agent.reconciler._observe(ReconcileReport())
    return list(agent.publisher.plan(view.gpus, allocated=view.allocated).order)


def test_a_burst_of_allocations_rewrites_the_order_at_most_once_per_interval(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    backend = SimulatedBackend("H100-80GB:3", node_name=NODE)
    now = [1000.0]
    agent = _agent(api, backend, tmp_path, clock=lambda: now[0], republish_interval_s=10)
    agent.claims.sync_once()
    agent.reconciler.reconcile_once()
    assert _pool(api)[0] == 1
    # Allocations every 3 s for 30 s; the loop wakes for each one (a nudge) and whenever the
    # publisher asked to be called back, exactly as NodeAgent's reconciler thread does.
    arrivals = [1003.0 + 3 * i for i in range(10)]
    devices = [f"gpu-2-mig-1g10gb-{s}" for s in range(7)] + [
        f"gpu-1-mig-1g10gb-{s}" for s in range(3)
    ]
    recall_at: float | None = None
    rewrites: list[float] = []
    while arrivals or recall_at is not None:
        now[0] = min([*arrivals[:1], *([recall_at] if recall_at is not None else [])])
        if arrivals and arrivals[0] <= now[0]:
            arrivals.pop(0)
            allocate_claim(api, [devices.pop(0)])
        before = _pool(api)[0]
        agent.claims.sync_once()
        report = agent.reconciler.reconcile_once()
        if _pool(api)[0] != before:
            rewrites.append(now[0])
        recall_at = (
            None if report.recall_in is None or report.recall_in > 60 else now[0] + report.recall_in
        )
    gaps = [b - a for a, b in zip([1000.0, *rewrites], rewrites, strict=False)]
    assert rewrites and all(gap >= 10 for gap in gaps), rewrites
    assert len(rewrites) < 10  # one per allocation without the limiter
    assert _pool(api)[1] == _best_order(agent)  # the last order was published in the end
    assert agent.metrics.value("gpu_slicer_slices_publishes_total", {"result": "deferred"}) > 0


def test_a_health_taint_is_published_at_once_even_inside_the_interval(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    backend = SimulatedBackend("H100-80GB:2", node_name=NODE)
    now = [1000.0]
    agent = _agent(api, backend, tmp_path, clock=lambda: now[0], republish_interval_s=600)
    agent.claims.sync_once()
    agent.reconciler.reconcile_once()
    allocate_claim(api, ["gpu-1-mig-1g10gb-6"])
    now[0] += 5
    agent.claims.sync_once()
    held = agent.reconciler.reconcile_once()
    assert held.recall_in is not None and _pool(api)[0] == 1  # order change held back
    backend.lose_gpu(0)
    agent.health.poll(0)
    now[0] += 1
    agent.reconciler.reconcile_once()
    generation, order = _pool(api)
    assert generation == 2 and order == _best_order(agent)
    slices = api.objects("resource.k8s.io/v1", "ResourceSlice")
    tainted = {d["name"] for s in slices for d in s["spec"].get("devices", []) if d.get("taints")}
    assert tainted and all(name.startswith("gpu-0") for name in tainted)


def test_the_reconciler_thread_publishes_a_held_back_order_when_the_delay_is_over(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    backend = SimulatedBackend("H100-80GB:3", node_name=NODE)
    agent = _agent(api, backend, tmp_path, republish_interval_s=0.5, republish_quiet_s=0.1)
    stop = threading.Event()
    agent.claims.sync_once()
    thread = threading.Thread(target=agent.reconciler.run, args=(stop, 3600.0), daemon=True)
    thread.start()
    try:
        _wait_for(lambda: _pool(api)[0] == 1)
        allocate_claim(api, ["gpu-2-mig-3g40gb-4"])
        agent.claims.sync_once()
        agent.reconciler.nudge()  # one nudge; the periodic pass is an hour away
        _wait_for(
            lambda: (
                _pool(api)[1][:1] == _best_order(agent)[:1] and _pool(api)[1][0].startswith("gpu-2")
            )
        )
    finally:
        stop.set()
        agent.reconciler.nudge()
        thread.join(timeout=10)
    assert not thread.is_alive()


def _wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def test_an_agent_on_the_static_fallback_switches_back_by_itself_after_the_gate_is_on(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    backend = SimulatedBackend("H100-80GB:1", node_name=NODE)
    now = [1000.0]
    agent = _agent(api, backend, tmp_path, clock=lambda: now[0], reprobe_interval_s=300)
    api.drop_fields("ResourceSlice", ["spec.sharedCounters", "spec.devices[].consumesCounters"])
    agent.claims.sync_once()
    report = agent.reconciler.reconcile_once()
    assert agent.publisher is not None and agent.publisher.fell_back
    assert report.recall_in == 300  # nothing changes on the node, yet the loop comes back
    api.stop_dropping("ResourceSlice")
    now[0] += 301
    agent.reconciler.reconcile_once()
    assert not agent.publisher.static
    assert any(
        s["spec"].get("sharedCounters") for s in api.objects("resource.k8s.io/v1", "ResourceSlice")
    )


def test_a_deleted_claim_on_a_lost_gpu_is_released_instead_of_failing_every_pass(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-1-mig-1g10gb-0"])
    agent.prepare(claim)
    backend.lose_gpu(1)
    delete_claim(api, claim)
    report = agent.reconcile()
    assert report.vanished == [ref(claim)[0]]
    assert agent.state.entry(ref(claim)[0]) is None


def test_releasing_a_crashed_prepare_never_destroys_the_instance_of_the_claim_now_on_its_placement(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    crashing = CrashingBackend(backend)
    dying = build_agent(crashing, api, tmp_path)
    old = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    crashing.crash_at("create_gpu_instance")
    with pytest.raises(AgentCrash):
        dying.prepare(old)  # PrepareStarted names the placement; nothing created yet
    agent = build_agent(backend, api, tmp_path)
    delete_claim(api, old)  # the pod was deleted; the scheduler hands the slice to a new claim
    new = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    with pytest.raises(PrepareError, match=f"held by ResourceClaim ml/{old['metadata']['name']}"):
        agent.prepare(new)  # says whose release it waits for
    agent.reconcile()  # releases the crashed prepare of the deleted claim
    agent.prepare(new)  # the kubelet's retry
    [inst] = backend.instances(0)
    entry = agent.state.entry(ref(new)[0])
    assert entry is not None and entry.devices[0].gi_id == inst.gi_id


def test_a_deleted_claim_on_a_gpu_that_left_the_node_is_released(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    two = SimulatedBackend("H100-80GB:2", node_name=NODE, boot_id="boot-1")
    claim = allocate_claim(api, ["gpu-1-mig-1g10gb-0"])
    build_agent(two, api, tmp_path).prepare(claim)
    one = SimulatedBackend("H100-80GB:1", node_name=NODE, boot_id="boot-1")  # GPU 1 unbound
    agent = build_agent(one, api, tmp_path)
    delete_claim(api, claim)
    assert agent.reconcile().vanished == [ref(claim)[0]]
