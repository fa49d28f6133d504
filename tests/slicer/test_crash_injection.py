"""Crash injection: the agent dies at every step of prepare and unprepare; a fresh agent on the
same checkpoint directory and GPUs must leave nothing leaked, destroy nothing busy, end the claim
prepared or cleanly not prepared, and prepare it again on request.

A crash is AgentCrash (a BaseException): the dying agent runs no rollback, as if killed. Steps
crash either before the call reaches the GPU or right after it took effect (``after``), which is
when the agent has changed the GPU without recording it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.checkpoint import PREPARE_COMPLETED
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.state import instance_at
from tests.support.agent_fixtures import (
    NODE,
    Agent,
    AgentCrash,
    CrashingBackend,
    allocate_claim,
    build_agent,
    live_instances,
    ref,
)

TARGET = "gpu-0-mig-2g20gb-2"
BUSY = "gpu-0-mig-1g10gb-0"
BUSY_PID = 777


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class World:
    """One node: GPUs, API, directories, and a claim that keeps a process running throughout."""

    def __init__(self, root: Path, *, with_busy_slice: bool = True) -> None:
        self.root = root
        self.api = InMemoryKubeApi()
        self.sim = SimulatedBackend("H100-80GB:1", node_name=NODE)
        self.backend = CrashingBackend(self.sim)
        self.clock = Clock()
        self.busy = allocate_claim(self.api, [BUSY], name="busy")
        self.claim = allocate_claim(self.api, [TARGET], name="target")
        self.busy_gi: int | None = None
        if with_busy_slice:  # else the GPU stays in full mode: prepare must switch MIG on
            [busy_device] = self.agent().prepare(self.busy)
            self.sim.attach_process(0, busy_device.gi_id, BUSY_PID)
            self.busy_gi = busy_device.gi_id

    def agent(self) -> Agent:
        return build_agent(self.backend, self.api, self.root, clock=self.clock, stale_after_s=60)

    def check_invariants(self, agent: Agent, *, settled: bool = True) -> None:
        """Nothing busy destroyed, nothing leaked, the claim prepared or cleanly not.

        ``settled=False``: an unprepare was cut short and the kubelet has yet to retry it, so
        the claim's entry may outlive its (already destroyed) instance.
        """
        if self.busy_gi is not None:
            busy = [i for i in self.sim.instances(0) if i.gi_id == self.busy_gi]
            assert busy, "the busy instance was destroyed"
            assert self.sim.processes(0, self.busy_gi) == [BUSY_PID]
        entries = agent.state.entries()
        for inst in live_instances(self.sim):
            owned = any(
                instance_at([inst], d) is not None for e in entries.values() for d in e.devices
            )
            assert owned, f"leaked instance {inst}"
        uid = ref(self.claim)[0]
        entry = entries.get(uid)
        if not settled:
            return
        cdi_file = agent.state.cdi.path_for(uid)
        if entry is None:
            assert not [i for i in live_instances(self.sim) if i.start == 2], "orphan instance"
            assert not cdi_file.exists()
        elif entry.state == PREPARE_COMPLETED:
            [device] = entry.devices
            assert instance_at(self.sim.instances(0), device) is not None
            assert cdi_file.exists()

    def crash_during_prepare(self, step: str, after: bool) -> None:
        """An agent dies at ``step`` of preparing the claim; the GPUs behave again afterwards."""
        dying = self.agent()
        arm(self, dying, step, after)
        with pytest.raises(AgentCrash):
            dying.prepare(self.claim)
        self.backend.disarm()

    def crash_during_unprepare(self, step: str, after: bool) -> None:
        """An agent prepares the claim, then dies at ``step`` of unpreparing it."""
        dying = self.agent()
        dying.prepare(self.claim)
        arm(self, dying, step, after)
        with pytest.raises(AgentCrash):
            dying.unprepare(self.claim)
        self.backend.disarm()

    def assert_prepared(self, agent: Agent) -> None:
        [device] = agent.prepare(self.claim)
        inst = instance_at(self.sim.instances(0), device)
        assert inst is not None and (inst.profile, inst.start) == ("2g.20gb", 2)
        assert inst.ci_id is not None and inst.uuid == device.uuid
        assert agent.state.cdi.path_for(ref(self.claim)[0]).exists()


PREPARE_STEPS = [
    ("gpus", False),
    ("instances", False),
    ("set_mig_mode", False),
    ("set_mig_mode", True),
    ("create_gpu_instance", False),
    ("create_gpu_instance", True),
    ("create_compute_instance", False),
    ("create_compute_instance", True),
    ("capability_minors", False),
    ("checkpoint-started", False),
    ("checkpoint-started", True),
    ("cdi-write", False),
    ("cdi-write", True),
    ("checkpoint-completed", False),
    ("checkpoint-completed", True),
]
UNPREPARE_STEPS = [
    ("instances", False),
    ("processes", False),
    ("destroy_compute_instance", False),
    ("destroy_compute_instance", True),
    ("destroy_gpu_instance", False),
    ("destroy_gpu_instance", True),
    ("cdi-remove", False),
    ("cdi-remove", True),
    ("checkpoint-drop", False),
    ("checkpoint-drop", True),
]


def _ids(steps: list[tuple[str, bool]]) -> list[str]:
    return [f"{step}-{'after' if after else 'before'}" for step, after in steps]


def arm(world: World, agent: Agent, step: str, after: bool) -> None:
    """Make the agent die at ``step``."""
    if step.startswith("checkpoint-"):
        nth = {"checkpoint-started": 1, "checkpoint-completed": 2, "checkpoint-drop": 1}[step]
        _crash_method(agent.state.store, "save", nth, after)
    elif step == "cdi-write":
        _crash_method(agent.state.cdi, "write", 1, after)
    elif step == "cdi-remove":
        _crash_method(agent.state.cdi, "remove", 1, after)
    else:
        world.backend.crash_at(step, after=after)


def _crash_method(obj: Any, name: str, nth: int, after: bool) -> None:
    original = getattr(obj, name)
    remaining = [nth]

    def crashing(*args: Any, **kwargs: Any) -> Any:
        remaining[0] -= 1
        if remaining[0] > 0:
            return original(*args, **kwargs)
        setattr(obj, name, original)
        if after:
            original(*args, **kwargs)
        raise AgentCrash(f"crash {'after' if after else 'before'} {name}")

    setattr(obj, name, crashing)


@pytest.mark.parametrize(("step", "after"), PREPARE_STEPS, ids=_ids(PREPARE_STEPS))
def test_a_crash_during_prepare_is_repaired_by_a_fresh_agent(
    tmp_path: Path, step: str, after: bool
) -> None:
    world = World(tmp_path, with_busy_slice=step != "set_mig_mode")
    world.crash_during_prepare(step, after)

    fresh = world.agent()
    fresh.reconcile()
    world.check_invariants(fresh)
    world.assert_prepared(fresh)  # the kubelet retries: adopted or created, never refused
    world.check_invariants(fresh)
    assert fresh.unprepare(world.claim) is True
    world.check_invariants(fresh)
    assert [i.start for i in live_instances(world.sim) if i.start == 2] == []


@pytest.mark.parametrize(("step", "after"), PREPARE_STEPS, ids=_ids(PREPARE_STEPS))
def test_an_abandoned_prepare_is_rolled_back_once_stale(
    tmp_path: Path, step: str, after: bool
) -> None:
    world = World(tmp_path, with_busy_slice=step != "set_mig_mode")
    world.crash_during_prepare(step, after)

    world.clock.now += 3600  # the kubelet never retried (the pod went away)
    fresh = world.agent()
    fresh.reconcile()
    world.check_invariants(fresh)
    entry = fresh.state.entry(ref(world.claim)[0])
    assert entry is None or entry.state == PREPARE_COMPLETED
    world.assert_prepared(fresh)


@pytest.mark.parametrize(("step", "after"), UNPREPARE_STEPS, ids=_ids(UNPREPARE_STEPS))
def test_a_crash_during_unprepare_is_resumed_by_a_fresh_agent(
    tmp_path: Path, step: str, after: bool
) -> None:
    world = World(tmp_path)
    world.crash_during_unprepare(step, after)

    fresh = world.agent()
    report = fresh.reconcile()
    world.check_invariants(fresh, settled=False)
    entry = fresh.state.entry(ref(world.claim)[0])
    if entry is not None and not [i for i in live_instances(world.sim) if i.start == 2]:
        assert report.drift == ["gpu-0-mig-2g20gb-2: instance missing"]
    fresh.unprepare(world.claim)  # the kubelet retries
    world.check_invariants(fresh)
    assert fresh.state.entry(ref(world.claim)[0]) is None
    assert not [i for i in world.sim.instances(0) if i.start == 2]
    world.assert_prepared(fresh)


def test_a_crash_while_the_claim_is_deleted_is_cleaned_up_by_the_reconciler(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.crash_during_unprepare("destroy_gpu_instance", False)
    world.api.delete("resource.k8s.io/v1", "ResourceClaim", "target", "ml")

    fresh = world.agent()
    report = fresh.reconcile()
    assert report.vanished == [ref(world.claim)[0]]
    assert not [i for i in world.sim.instances(0) if i.start == 2]
    world.check_invariants(fresh)


def test_a_reboot_mid_run_clears_state_and_claims_prepare_again(tmp_path: Path) -> None:
    world = World(tmp_path)
    agent = world.agent()
    agent.prepare(world.claim)
    world.sim.reboot()  # every instance and process gone, MIG off again (Hopper)

    fresh = world.agent()
    assert fresh.state.rebooted
    assert fresh.state.entries() == {}
    assert fresh.state.cdi.claim_uids() == set()
    report = fresh.reconcile()
    assert report.foreign == []
    world.assert_prepared(fresh)
    [busy] = fresh.prepare(world.busy)
    assert instance_at(world.sim.instances(0), busy) is not None


def test_a_reboot_noticed_by_a_running_agent_is_handled_on_the_next_pass(tmp_path: Path) -> None:
    world = World(tmp_path)
    agent = world.agent()
    agent.prepare(world.claim)
    world.sim.reboot()
    report = agent.reconcile()
    assert report.rebooted
    assert agent.state.entries() == {}
    world.assert_prepared(agent)


def test_a_foreign_instance_made_by_hand_is_never_destroyed(tmp_path: Path) -> None:
    world = World(tmp_path)
    gi = world.sim.create_gpu_instance(0, "1g.10gb", 6)
    world.sim.create_compute_instance(0, gi)
    for _ in range(2):
        agent = world.agent()
        report = agent.reconcile()
        assert [(i.profile, i.start) for i in report.foreign] == [("1g.10gb", 6)]
    world.clock.now += 3600
    agent.reconcile()
    assert any(i.gi_id == gi and i.start == 6 for i in world.sim.instances(0))
    assert (
        agent.metrics.value(
            "gpu_slicer_agent_instances", {"profile": "1g.10gb", "owner": "foreign"}
        )
        == 1
    )
    view = agent.published[-1]
    assert [(i.start) for i in view.gpus[0].foreign] == [6]


def test_a_corrupt_checkpoint_after_a_crash_does_not_crash_the_agent(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.agent().prepare(world.claim)
    (tmp_path / "checkpoint" / "checkpoint.json").write_bytes(b"\x00" * 40)
    fresh = world.agent()
    report = fresh.reconcile()
    assert sorted(report.adopted) == sorted([ref(world.claim)[0], ref(world.busy)[0]])
    world.check_invariants(fresh)
    assert fresh.unprepare(world.claim) is True
    world.check_invariants(fresh)


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_crash_while_switching_mig_off_for_a_whole_gpu_is_repaired(
    tmp_path: Path, after: bool
) -> None:
    api = InMemoryKubeApi()
    sim = SimulatedBackend("H100-80GB:1", node_name=NODE, mig_enabled=True)
    backend = CrashingBackend(sim)
    claim = allocate_claim(api, ["gpu-0"])
    dying = build_agent(backend, api, tmp_path)
    backend.crash_at("set_mig_mode", after=after)
    with pytest.raises(AgentCrash):
        dying.prepare(claim)
    fresh = build_agent(backend, api, tmp_path)
    fresh.reconcile()
    [device] = fresh.prepare(claim)
    assert not sim.gpus()[0].mig_enabled
    assert device.uuid == sim.gpus()[0].uuid
    assert fresh.unprepare(claim) is True
    assert fresh.state.entries() == {}
