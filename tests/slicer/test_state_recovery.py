"""The state's recovery operations, as the reconciler uses them: reboot, adoption, stale and
abandoned entries, stray CDI specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.checkpoint import PREPARE_STARTED
from gpu_slicer.slicer.claim_cache import our_results
from gpu_slicer.slicer.errors import InsufficientResources
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.state import STALE_PREPARE, VANISHED_CLAIM, InstanceBusy
from tests.support.agent_fixtures import NODE, Agent, allocate_claim, build_agent, ref

DRIFT = "gpu_slicer_agent_drift_found_total"
ORPHANS = "gpu_slicer_agent_orphans_destroyed_total"


def crashed_prepare(agent: Agent, backend: SimulatedBackend, device: str) -> str:
    """A prepare that failed and could not roll back: a PrepareStarted entry with an instance."""
    claim = allocate_claim(agent.api, [device])
    backend.inject_fault("capability_minors", InsufficientResources)
    backend.inject_fault("destroy_compute_instance", InsufficientResources)
    with pytest.raises(Exception, match="rolling it back failed too"):
        agent.prepare(claim)
    return ref(claim)[0]


def test_clear_if_rebooted_clears_every_entry_only_after_a_reboot(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    agent.prepare(claim)
    assert agent.state.clear_if_rebooted() is None
    assert agent.state.entry(ref(claim)[0]) is not None
    backend.reboot()
    assert agent.state.clear_if_rebooted() == [ref(claim)[0]]
    assert agent.state.entries() == {}
    assert agent.state.cdi.claim_uids() == set()
    assert agent.metrics.value(DRIFT, {"kind": "reboot"}) == 1
    assert agent.state.clear_if_rebooted() is None  # the new boot is recorded


def test_finish_recovery_ends_the_wait_of_unknown_claims_and_counts_adoptions(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-2"])
    build_agent(backend, api, tmp_path).prepare(claim)
    (tmp_path / "checkpoint" / "checkpoint.json").write_bytes(b"\x00" * 40)
    agent = build_agent(backend, api, tmp_path)
    assert agent.state.recovering
    uid, namespace, name = ref(claim)
    results = our_results(agent.claims.allocated()[uid], pool=NODE)
    assert agent.state.adopt(uid, namespace, name, results)
    agent.state.finish_recovery(adopted=1)
    assert not agent.state.recovering
    assert agent.metrics.value(DRIFT, {"kind": "adopted"}) == 1
    assert agent.state.unprepare("never-seen") is False  # unknown now means: nothing to do
    assert agent.unprepare(claim) is True
    assert backend.instances(0) == []


def test_stale_entries_are_prepare_started_entries_at_least_that_old(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    now = [1000.0]
    agent = build_agent(backend, api, tmp_path, clock=lambda: now[0])
    uid = crashed_prepare(agent, backend, "gpu-0-mig-1g10gb-4")
    agent.prepare(allocate_claim(api, ["gpu-0-mig-1g10gb-0"]))  # completed: never stale
    assert agent.state.stale_entries(30) == []
    now[0] += 30
    [stale] = agent.state.stale_entries(30)
    assert (stale.uid, stale.state) == (uid, PREPARE_STARTED)


def test_release_abandoned_destroys_the_entrys_instances_and_counts_them(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    uid = crashed_prepare(agent, backend, "gpu-0-mig-1g10gb-4")
    entry = agent.state.entry(uid)
    assert entry is not None
    assert agent.state.instances_present(entry) == 1
    assert agent.state.release_abandoned(entry, cause=STALE_PREPARE) == 1
    assert agent.state.entry(uid) is None and backend.instances(0) == []
    assert agent.state.instances_present(entry) == 0
    assert agent.metrics.value(ORPHANS) == 1
    assert agent.metrics.value(DRIFT, {"kind": STALE_PREPARE}) == 1
    assert agent.state.release_abandoned(entry, cause=STALE_PREPARE) is None  # already gone
    assert agent.metrics.value(DRIFT, {"kind": STALE_PREPARE}) == 1


def test_release_abandoned_refuses_a_busy_instance_and_keeps_the_entry(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-1-mig-2g20gb-2"])
    [device] = agent.prepare(claim)
    backend.attach_process(1, device.gi_id, 99)
    entry = agent.state.entry(ref(claim)[0])
    assert entry is not None
    with pytest.raises(InstanceBusy):
        agent.state.release_abandoned(entry, cause=VANISHED_CLAIM)
    assert agent.state.entry(ref(claim)[0]) == entry
    assert agent.metrics.value(DRIFT, {"kind": VANISHED_CLAIM}) == 0


def test_instances_present_counts_none_on_a_lost_gpu(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-1-mig-1g10gb-0"])
    agent.prepare(claim)
    entry = agent.state.entry(ref(claim)[0])
    assert entry is not None and agent.state.instances_present(entry) == 1
    backend.lose_gpu(1)
    assert agent.state.instances_present(entry) == 0


def test_remove_stray_cdi_specs_removes_only_specs_without_an_entry(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    agent.prepare(claim)
    agent.state.cdi.write("left-behind", [])
    assert agent.state.remove_stray_cdi_specs() == {"left-behind"}
    assert agent.state.cdi.claim_uids() == {ref(claim)[0]}
    assert agent.state.remove_stray_cdi_specs() == set()
