"""The simulated backend refuses exactly what the catalog's geometry (and NVML) refuses."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.backend import HealthEvent
from gpu_slicer.slicer.errors import (
    BackendError,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    InsufficientResources,
    NotSupported,
    ResetRequired,
)
from gpu_slicer.slicer.simulated import SimulatedBackend, placement_gi_id
from tests.support.agent_fixtures import (
    NODE,
    allocate_claim,
    assert_mixed_node,
    build_agent,
    devices_by_name,
    node_slices,
)


def make_slice(backend: SimulatedBackend, gpu: int, profile: str, start: int) -> tuple[int, int]:
    gi = backend.create_gpu_instance(gpu, profile, start)
    mig = backend.create_compute_instance(gpu, gi)
    assert mig.ci_id is not None
    return gi, mig.ci_id


# --- the GPUs ------------------------------------------------------------------------------


def test_gpus_follow_the_spec_in_index_order_with_catalog_facts() -> None:
    gpus = SimulatedBackend("H100-80GB:2,A100-80GB", driver_version="570.1").gpus()
    assert [(g.index, g.model) for g in gpus] == [
        (0, "H100-80GB"),
        (1, "H100-80GB"),
        (2, "A100-80GB"),
    ]
    a100 = catalog.get_model("A100-80GB")
    assert gpus[2].product_name in a100.product_names
    assert gpus[2].memory_bytes == a100.memory_bytes
    assert gpus[2].architecture == "Ampere"
    assert gpus[0].cuda_compute_capability == "9.0"
    assert {g.driver_version for g in gpus} == {"570.1"}


def test_models_can_be_given_as_catalog_models_or_keys() -> None:
    h200 = catalog.get_model("H200")
    backend = SimulatedBackend([h200, "b200"])
    assert [g.model for g in backend.gpus()] == ["H200-141GB", "B200-180GB"]


def test_uuids_are_deterministic_per_node_and_unique() -> None:
    first = [g.uuid for g in SimulatedBackend("H100-80GB:8", node_name="a").gpus()]
    again = [g.uuid for g in SimulatedBackend("H100-80GB:8", node_name="a").gpus()]
    other = [g.uuid for g in SimulatedBackend("H100-80GB:8", node_name="b").gpus()]
    assert first == again
    assert len(set(first)) == 8
    assert not set(first) & set(other)
    assert all(u.startswith("GPU-") for u in first)


def test_pci_bus_ids_are_unique_and_two_gpus_share_a_pcie_root() -> None:
    gpus = SimulatedBackend("H100-80GB:16").gpus()
    assert len({g.pci_bus_id for g in gpus}) == 16
    roots = Counter(g.pcie_root for g in gpus)
    assert set(roots.values()) == {2}
    assert gpus[0].pcie_root == gpus[1].pcie_root != gpus[2].pcie_root
    for g in gpus:
        domain, bus, rest = g.pci_bus_id.split(":")
        assert len(domain) == 4 and len(bus) == 2 and rest == "00.0"
        assert g.pcie_root == f"pci{domain}:{g.pcie_root.split(':')[1]}"


def test_ampere_starts_in_mig_mode_and_hopper_and_newer_start_as_full_gpus() -> None:
    gpus = SimulatedBackend("A100-40GB,A30,H100-80GB,B200").gpus()
    assert [g.mig_enabled for g in gpus] == [True, True, False, False]
    assert not any(g.mig_pending != g.mig_enabled for g in gpus)


def test_the_starting_mig_mode_can_be_set_for_all_or_per_gpu() -> None:
    assert [g.mig_enabled for g in SimulatedBackend("H100-80GB:2", mig_enabled=True).gpus()] == [
        True,
        True,
    ]
    per_gpu = SimulatedBackend("H100-80GB,A30", mig_enabled=[True, False]).gpus()
    assert [g.mig_enabled for g in per_gpu] == [True, False]
    with pytest.raises(ValueError, match="2 GPUs"):
        SimulatedBackend("H100-80GB,A30", mig_enabled=[True])


def test_gpus_of_an_nvlink_board_share_a_domain_and_pcie_cards_have_none() -> None:
    gpus = SimulatedBackend("H100-80GB:4,A30:2", node_name="n1").gpus()
    assert len({g.nvlink_domain for g in gpus[:4]}) == 1
    assert gpus[0].nvlink_domain is not None
    assert [g.nvlink_domain for g in gpus[4:]] == [None, None]
    elsewhere = SimulatedBackend("H100-80GB:4", node_name="n2").gpus()
    assert elsewhere[0].nvlink_domain != gpus[0].nvlink_domain


def test_h100_nvl_cards_are_bridged_in_pairs() -> None:
    domains = [g.nvlink_domain for g in SimulatedBackend("H100-NVL:4").gpus()]
    assert domains[0] == domains[1] != domains[2] == domains[3]


def test_nvlink_can_be_switched_off() -> None:
    assert {g.nvlink_domain for g in SimulatedBackend("H100-80GB:2", nvlink=False).gpus()} == {None}


def test_a_gpu_that_does_not_exist_is_not_found() -> None:
    with pytest.raises(GpuNotFound, match="no GPU 3"):
        SimulatedBackend("A30").instances(3)


# --- creating and destroying ---------------------------------------------------------------


def test_a_created_slice_is_listed_with_its_ids_and_a_mig_uuid() -> None:
    backend = SimulatedBackend("A100-80GB")
    gi = backend.create_gpu_instance(0, "3g.40gb", 4)
    [half] = backend.instances(0)
    assert (half.profile, half.start, half.size, half.gi_id) == ("3g.40gb", 4, 4, gi)
    assert half.ci_id is None and half.uuid is None
    mig = backend.create_compute_instance(0, gi)
    assert mig.uuid is not None and mig.uuid.startswith("MIG-")
    assert backend.instances(0) == [mig]
    assert mig.spec.device_name == "gpu-0-mig-3g40gb-4"


def test_an_unknown_profile_or_an_illegal_start_is_not_supported() -> None:
    backend = SimulatedBackend("A100-80GB")
    with pytest.raises(NotSupported, match="1g.5gb"):
        backend.create_gpu_instance(0, "1g.5gb", 0)
    with pytest.raises(NotSupported, match="legal starts: \\[0, 4\\]"):
        backend.create_gpu_instance(0, "3g.40gb", 2)
    assert backend.instances(0) == []


def test_overlap_count_compute_and_media_limits_are_insufficient_resources() -> None:
    backend = SimulatedBackend("A100-80GB")
    backend.create_gpu_instance(0, "4g.40gb", 0)
    with pytest.raises(InsufficientResources, match="overlaps"):
        backend.create_gpu_instance(0, "1g.10gb", 3)
    backend.create_gpu_instance(0, "1g.10gb+me", 4)
    with pytest.raises(InsufficientResources, match="limit of 1"):
        backend.create_gpu_instance(0, "1g.10gb+me", 5)
    backend.create_gpu_instance(0, "1g.10gb", 5)
    backend.create_gpu_instance(0, "1g.10gb", 6)
    with pytest.raises(InsufficientResources, match="overlaps 1g.10gb@6"):
        # Memory slice 7 is still free, but only sizes >= 2 reach it and they start at 6.
        backend.create_gpu_instance(0, "1g.20gb", 6)
    assert len(backend.instances(0)) == 4


def test_instances_known_to_coexist_never_admit_a_second_one_at_the_same_placement() -> None:
    backend = SimulatedBackend("A100-80GB")
    gi = backend.create_gpu_instance(0, "1g.10gb", 0)
    backend.destroy_gpu_instance(0, gi)
    assert backend.create_gpu_instance(0, "1g.10gb", 0) == gi  # the same set again
    with pytest.raises(InsufficientResources, match="overlaps 1g.10gb@0"):
        backend.create_gpu_instance(0, "1g.10gb", 0)
    assert backend.placements(0) == [("1g.10gb", 0)]


def test_placements_are_the_instances_read_without_an_nvml_call() -> None:
    backend = SimulatedBackend("A100-80GB")
    backend.create_gpu_instance(0, "3g.40gb", 4)
    backend.create_gpu_instance(0, "1g.10gb", 0)
    recorded = len(backend.calls)
    assert backend.placements(0) == [("1g.10gb", 0), ("3g.40gb", 4)]
    assert len(backend.calls) == recorded
    assert [(i.profile, i.start) for i in backend.instances(0)] == backend.placements(0)
    backend.lose_gpu(0)
    with pytest.raises(GpuLost):
        backend.placements(0)


def test_creating_on_a_gpu_in_full_mode_is_not_supported_and_lists_nothing() -> None:
    backend = SimulatedBackend("H100-80GB")
    with pytest.raises(NotSupported, match="MIG mode is disabled"):
        backend.create_gpu_instance(0, "1g.10gb", 0)
    assert backend.instances(0) == []


def test_gi_ids_follow_the_placement_like_nvml_and_come_back_after_destroy() -> None:
    backend = SimulatedBackend("A100-80GB")
    assert [backend.create_gpu_instance(0, "1g.10gb", s) for s in (0, 1)] == [7, 8]
    assert backend.create_gpu_instance(0, "2g.20gb", 2) == 4
    assert backend.create_gpu_instance(0, "3g.40gb", 4) == 2
    backend.destroy_gpu_instance(0, 8)
    assert backend.create_gpu_instance(0, "1g.10gb", 1) == 8
    whole = SimulatedBackend("A30")
    assert whole.create_gpu_instance(0, "4g.24gb", 0) == 0


@pytest.mark.parametrize("model", catalog.MODELS, ids=lambda m: m.key)
def test_gi_ids_of_every_placement_stay_within_the_driver_s_fifteen(
    model: gpu_model.GpuModel,
) -> None:
    for profile in model.profiles:
        for start in profile.starts:
            assert 0 <= placement_gi_id(model, profile, start) < 15


def test_a_gpu_instance_takes_one_compute_instance() -> None:
    backend = SimulatedBackend("A30")
    gi = backend.create_gpu_instance(0, "2g.12gb", 0)
    backend.create_compute_instance(0, gi)
    with pytest.raises(InsufficientResources, match="already has compute instance"):
        backend.create_compute_instance(0, gi)


def test_mig_uuids_change_when_a_slice_is_made_again() -> None:
    backend = SimulatedBackend("A30")
    gi = backend.create_gpu_instance(0, "4g.24gb", 0)
    first = backend.create_compute_instance(0, gi)
    assert first.ci_id is not None
    backend.destroy_compute_instance(0, gi, first.ci_id)
    second = backend.create_compute_instance(0, gi)
    assert first.uuid != second.uuid


def test_destroys_wait_for_processes_and_compute_instances_and_then_report_not_found() -> None:
    backend = SimulatedBackend("A100-40GB")
    gi, ci = make_slice(backend, 0, "2g.10gb", 2)
    backend.attach_process(0, gi, 4242)
    assert backend.processes(0, gi) == [4242]
    assert backend.processes(0) == [4242]
    with pytest.raises(GpuInUse, match="4242"):
        backend.destroy_compute_instance(0, gi, ci)
    with pytest.raises(GpuInUse, match="4242"):
        backend.destroy_gpu_instance(0, gi)
    backend.detach_process(0, 4242)
    with pytest.raises(GpuInUse, match="destroy it first"):
        backend.destroy_gpu_instance(0, gi)
    backend.destroy_compute_instance(0, gi, ci)
    with pytest.raises(GpuNotFound):
        backend.destroy_compute_instance(0, gi, ci)
    backend.destroy_gpu_instance(0, gi)
    with pytest.raises(GpuNotFound):
        backend.destroy_gpu_instance(0, gi)
    assert backend.instances(0) == []


def test_processes_need_a_compute_instance_or_a_gpu_in_full_mode() -> None:
    backend = SimulatedBackend("H100-80GB,A30")
    backend.attach_process(0, None, 7)
    assert backend.processes(0) == [7]
    with pytest.raises(NotSupported):
        backend.attach_process(1, None, 8)
    gi = backend.create_gpu_instance(1, "1g.6gb", 0)
    with pytest.raises(GpuNotFound, match="no compute instance"):
        backend.attach_process(1, gi, 8)
    with pytest.raises(GpuNotFound):
        backend.detach_process(1, 8)
    with pytest.raises(GpuNotFound):
        backend.processes(1, gi + 1)


def test_capability_minors_follow_the_driver_layout_and_need_the_instance() -> None:
    backend = SimulatedBackend("A30:2")
    gi, ci = make_slice(backend, 1, "1g.6gb", 2)
    gi_minor, ci_minor = backend.capability_minors(1, gi, ci)
    assert gi_minor == 3 + 135 + 9 * gi
    assert ci_minor == gi_minor + 1 + ci
    other_gi, other_ci = make_slice(backend, 1, "1g.6gb", 3)
    assert not {gi_minor, ci_minor} & set(backend.capability_minors(1, other_gi, other_ci))
    with pytest.raises(GpuNotFound):
        backend.capability_minors(1, gi, ci + 1)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(catalog.MODELS),
    data=st.data(),
)
def test_a_create_succeeds_exactly_when_the_catalog_says_the_set_is_valid(
    model: gpu_model.GpuModel, data: st.DataObject
) -> None:
    backend = SimulatedBackend([model], mig_enabled=True)
    present: list[catalog.Placement] = []
    attempts = data.draw(st.lists(st.sampled_from(catalog.all_placements(model)), max_size=12))
    for profile, start in attempts:
        expected = catalog.is_valid(model, [*present, (profile, start)])
        try:
            backend.create_gpu_instance(0, profile, start)
        except InsufficientResources:
            assert not expected
        else:
            assert expected
            present.append((profile, start))
    assert sorted((i.profile, i.start) for i in backend.instances(0)) == sorted(present)


class SliceLifecycle(RuleBasedStateMachine):
    """Random creates, processes and destroys against a model of what must be on the GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.backend = SimulatedBackend("A30")
        self.model = catalog.get_model("A30")
        self.expected: dict[int, tuple[str, int, int | None, set[int]]] = {}
        self.next_pid = 100

    @initialize(model=st.sampled_from(catalog.MODELS))
    def choose_model(self, model: gpu_model.GpuModel) -> None:
        self.model = model
        self.backend = SimulatedBackend([model], mig_enabled=True)

    @rule(data=st.data())
    def create_gpu_instance(self, data: st.DataObject) -> None:
        names = [p.name for p in self.model.profiles] + ["9g.999gb"]
        legal_placements = st.sampled_from(catalog.all_placements(self.model))
        any_placement = st.tuples(st.sampled_from(names), st.integers(0, self.model.memory_slices))
        profile, start = data.draw(st.one_of(legal_placements, legal_placements, any_placement))
        present = [(p, s) for p, s, _, _ in self.expected.values()]
        legal = self.model.has_profile(profile) and start in self.model.profile(profile).starts
        valid = catalog.is_valid(self.model, [*present, (profile, start)])
        try:
            gi = self.backend.create_gpu_instance(0, profile, start)
        except NotSupported:
            assert not legal
        except InsufficientResources:
            assert legal and not valid
        else:
            assert valid
            assert gi not in self.expected
            self.expected[gi] = (profile, start, None, set())

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    def create_compute_instance(self, data: st.DataObject) -> None:
        gi = data.draw(st.sampled_from(sorted(self.expected)))
        profile, start, ci, pids = self.expected[gi]
        try:
            mig = self.backend.create_compute_instance(0, gi)
        except InsufficientResources:
            assert ci is not None
        else:
            assert ci is None
            self.expected[gi] = (profile, start, mig.ci_id, pids)

    @precondition(lambda self: any(ci is not None for _, _, ci, _ in self.expected.values()))
    @rule(data=st.data())
    def start_process(self, data: st.DataObject) -> None:
        gi = data.draw(
            st.sampled_from(sorted(g for g, e in self.expected.items() if e[2] is not None))
        )
        self.next_pid += 1
        self.backend.attach_process(0, gi, self.next_pid)
        self.expected[gi][3].add(self.next_pid)

    @precondition(lambda self: any(e[3] for e in self.expected.values()))
    @rule(data=st.data())
    def end_process(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(sorted(p for e in self.expected.values() for p in e[3])))
        self.backend.detach_process(0, pid)
        for entry in self.expected.values():
            entry[3].discard(pid)

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    def destroy_compute_instance(self, data: st.DataObject) -> None:
        gi = data.draw(st.sampled_from(sorted(self.expected)))
        profile, start, ci, pids = self.expected[gi]
        try:
            self.backend.destroy_compute_instance(0, gi, 0 if ci is None else ci)
        except GpuNotFound:
            assert ci is None
        except GpuInUse:
            assert pids
        else:
            assert ci is not None and not pids
            self.expected[gi] = (profile, start, None, pids)

    @rule(data=st.data())
    def destroy_gpu_instance(self, data: st.DataObject) -> None:
        existing = st.sampled_from(sorted(self.expected)) if self.expected else st.nothing()
        gi = data.draw(st.one_of(existing, existing, st.integers(0, 15)))
        try:
            self.backend.destroy_gpu_instance(0, gi)
        except GpuNotFound:
            assert gi not in self.expected
        except GpuInUse:
            assert self.expected[gi][2] is not None or self.expected[gi][3]
        else:
            _, _, ci, pids = self.expected.pop(gi)
            assert ci is None and not pids

    @invariant()
    def the_gpu_shows_what_the_model_expects(self) -> None:
        listed = {i.gi_id: i for i in self.backend.instances(0)}
        assert set(listed) == set(self.expected)
        for gi, (profile, start, ci, pids) in self.expected.items():
            assert (listed[gi].profile, listed[gi].start, listed[gi].ci_id) == (profile, start, ci)
            assert (listed[gi].uuid is None) == (ci is None)
            assert self.backend.processes(0, gi) == sorted(pids)

    @invariant()
    def the_geometry_holds(self) -> None:
        instances = self.backend.instances(0)
        assert catalog.is_valid(self.model, [(i.profile, i.start) for i in instances])
        covered = [s for i in instances for s in i.memory_slices]
        assert len(covered) == len(set(covered))
        assert all(0 <= s < self.model.memory_slices for s in covered)
        uuids = [i.uuid for i in instances if i.uuid]
        assert len(uuids) == len(set(uuids))


TestSliceLifecycle = SliceLifecycle.TestCase
TestSliceLifecycle.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


# --- MIG mode ------------------------------------------------------------------------------


def test_hopper_switches_mig_mode_at_once() -> None:
    backend = SimulatedBackend("H100-80GB")
    backend.set_mig_mode(0, True)
    [gpu] = backend.gpus()
    assert gpu.mig_enabled and gpu.mig_pending
    make_slice(backend, 0, "7g.80gb", 0)
    backend.set_mig_mode(0, True)  # already there: nothing to do, instances or not


def test_ampere_leaves_the_change_pending_until_a_reset() -> None:
    backend = SimulatedBackend("A100-80GB")
    with pytest.raises(ResetRequired, match="pending"):
        backend.set_mig_mode(0, False)
    [gpu] = backend.gpus()
    assert gpu.mig_enabled and not gpu.mig_pending
    backend.reset_gpu(0)
    [gpu] = backend.gpus()
    assert not gpu.mig_enabled and not gpu.mig_pending


def test_taking_back_a_pending_ampere_change_needs_no_reset() -> None:
    backend = SimulatedBackend("A100-80GB")
    with pytest.raises(ResetRequired):
        backend.set_mig_mode(0, False)
    backend.set_mig_mode(0, True)
    [gpu] = backend.gpus()
    assert gpu.mig_enabled and gpu.mig_pending


def test_ampere_switches_at_once_when_a_reset_is_simulated() -> None:
    backend = SimulatedBackend("A30", auto_reset=True)
    backend.set_mig_mode(0, False)
    assert not backend.gpus()[0].mig_enabled


def test_mig_mode_does_not_change_under_instances_processes_or_blocking_clients() -> None:
    backend = SimulatedBackend("H100-80GB:3", mig_enabled=[True, False, False])
    gi = backend.create_gpu_instance(0, "1g.10gb", 0)
    with pytest.raises(GpuInUse, match="MIG instance"):
        backend.set_mig_mode(0, False)
    backend.destroy_gpu_instance(0, gi)
    backend.set_mig_mode(0, False)

    backend.attach_process(1, None, 99)
    with pytest.raises(GpuInUse, match="99"):
        backend.set_mig_mode(1, True)

    backend.set_blocking_client(2, "nvidia-dcgm")
    with pytest.raises(GpuInUse, match="nvidia-dcgm"):
        backend.set_mig_mode(2, True)
    backend.set_blocking_client(2, None)
    backend.set_mig_mode(2, True)
    assert [g.mig_enabled for g in backend.gpus()] == [False, False, True]


# --- faults --------------------------------------------------------------------------------


def test_an_injected_error_class_fails_the_next_call_only() -> None:
    backend = SimulatedBackend("A30")
    backend.inject_fault("create_gpu_instance", InsufficientResources)
    with pytest.raises(InsufficientResources, match="injected") as info:
        backend.create_gpu_instance(0, "1g.6gb", 0)
    assert info.value.gpu == 0
    assert backend.instances(0) == []
    backend.create_gpu_instance(0, "1g.6gb", 0)


def test_an_injected_error_instance_repeats_as_often_as_asked_and_only_on_its_gpu() -> None:
    backend = SimulatedBackend("A30:2")
    error = GpuInUse("dcgm profiling", gpu=1)
    backend.inject_fault("instances", error, times=2, gpu=1)
    assert backend.instances(0) == []
    for _ in range(2):
        with pytest.raises(GpuInUse) as info:
            backend.instances(1)
        assert info.value is error
    assert backend.instances(1) == []


def test_a_delay_fault_sleeps_through_the_injected_sleep_before_answering() -> None:
    slept: list[float] = []
    backend = SimulatedBackend("A30", sleep=slept.append)
    backend.inject_fault("destroy_gpu_instance", delay_s=1.5)
    gi = backend.create_gpu_instance(0, "1g.6gb", 1)
    backend.destroy_gpu_instance(0, gi)
    assert slept == [1.5]
    assert backend.instances(0) == []


def test_a_fault_for_an_unknown_method_or_without_effect_is_refused() -> None:
    backend = SimulatedBackend("A30")
    with pytest.raises(ValueError, match="not a GpuBackend method"):
        backend.inject_fault("create_instance", GpuNotFound)
    with pytest.raises(ValueError, match="error, a delay"):
        backend.inject_fault("gpus")
    backend.inject_fault("gpus", GpuLost, times=3)
    backend.clear_faults()
    assert len(backend.gpus()) == 1


def test_every_backend_call_is_logged_with_its_arguments_even_when_it_fails() -> None:
    backend = SimulatedBackend("A30")
    backend.gpus()
    with pytest.raises(NotSupported):
        backend.create_gpu_instance(0, "3g.20gb", 0)
    assert backend.calls == [("gpus", ()), ("create_gpu_instance", (0, "3g.20gb", 0))]


# --- health, resets and reboots ------------------------------------------------------------


def test_a_lost_gpu_fails_every_call_and_queues_one_event() -> None:
    backend = SimulatedBackend("A30:2")
    gi, ci = make_slice(backend, 1, "4g.24gb", 0)
    backend.lose_gpu(1)
    for call in (
        lambda: backend.instances(1),
        lambda: backend.create_gpu_instance(1, "1g.6gb", 0),
        lambda: backend.destroy_compute_instance(1, gi, ci),
        lambda: backend.processes(1),
        lambda: backend.set_mig_mode(1, False),
        lambda: backend.capability_minors(1, gi, ci),
    ):
        with pytest.raises(GpuLost):
            call()
    assert backend.instances(0) == []
    assert len(backend.gpus()) == 2
    assert backend.health_events(0) == [
        HealthEvent(1, "gpu-lost", message="GPU has fallen off the bus")
    ]
    assert backend.health_events(0) == []


def test_a_recovered_gpu_answers_again_empty() -> None:
    backend = SimulatedBackend("A30")
    make_slice(backend, 0, "4g.24gb", 0)
    backend.lose_gpu(0)
    backend.recover_gpu(0)
    assert backend.instances(0) == []
    assert [e.kind for e in backend.health_events(0)] == ["gpu-lost", "recovered"]


def test_xid_events_carry_the_xid() -> None:
    backend = SimulatedBackend("A30")
    backend.inject_xid(0, 79)
    [event] = backend.health_events(0)
    assert (event.gpu_index, event.kind, event.xid) == (0, "xid", 79)


def test_a_waiting_health_reader_wakes_up_for_an_event() -> None:
    backend = SimulatedBackend("A30")
    got: list[HealthEvent] = []
    reader = threading.Thread(target=lambda: got.extend(backend.health_events(30)))
    reader.start()
    backend.inject_xid(0, 48)
    reader.join()
    assert [e.xid for e in got] == [48]


def test_a_reboot_clears_everything_changes_the_boot_id_and_turns_hopper_mig_off() -> None:
    backend = SimulatedBackend("H100-80GB,A100-80GB", mig_enabled=True, node_name="n")
    boot = backend.boot_id()
    assert boot == SimulatedBackend("A30", node_name="n").boot_id()
    for gpu in (0, 1):
        gi, _ = make_slice(backend, gpu, "7g.80gb", 0)
        backend.attach_process(gpu, gi, 10 + gpu)
    backend.lose_gpu(1)
    backend.health_events(0)
    backend.reboot()
    assert backend.boot_id() != boot
    assert [g.mig_enabled for g in backend.gpus()] == [False, True]
    assert backend.instances(1) == [] and backend.processes(1) == []
    assert backend.processes(0) == []
    assert [e.kind for e in backend.health_events(0)] == ["recovered"]


def test_an_ampere_mode_change_pending_at_reboot_takes_effect() -> None:
    backend = SimulatedBackend("A100-40GB")
    with pytest.raises(ResetRequired):
        backend.set_mig_mode(0, False)
    backend.reboot()
    assert not backend.gpus()[0].mig_enabled


def test_an_explicit_boot_id_is_reported() -> None:
    assert SimulatedBackend("A30", boot_id="b-1").boot_id() == "b-1"


def test_concurrent_creates_never_overfill_a_gpu() -> None:
    backend = SimulatedBackend("A100-80GB")
    outcomes: list[str] = []
    lock = threading.Lock()

    def create(start: int) -> None:
        try:
            backend.create_gpu_instance(0, "1g.20gb", start)
            result = "ok"
        except BackendError as exc:
            result = type(exc).__name__
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=create, args=(s,)) for s in (0, 2, 4, 6) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(outcomes) == {"ok": 4, "InsufficientResources": 12}


# --- a node with MIG and non-MIG GPUs ----------------------------------------------------------

L4 = gpu_model.whole_only_model(
    "L4",
    product_name="NVIDIA L4",
    memory_bytes=23034 * gpu_model.MIB,
    architecture="Ada Lovelace",
    cuda_compute_capability="8.9",
)


def test_a_node_with_mig_and_non_mig_gpus_publishes_both_kinds(tmp_path: Path) -> None:
    h100 = catalog.get_model("H100-80GB")
    backend = SimulatedBackend([h100, L4, h100], node_name=NODE)
    devices = devices_by_name(node_slices(backend))
    assert_mixed_node(devices, whole_only=1, mig=(0, 2))
    with pytest.raises(NotSupported, match="has no MIG"):
        backend.set_mig_mode(1, True)
    api = InMemoryKubeApi()
    agent = build_agent(backend, api, tmp_path)
    [whole] = agent.prepare(allocate_claim(api, ["gpu-1"]))
    assert whole.uuid == backend.gpus()[1].uuid
    [mig] = agent.prepare(allocate_claim(api, ["gpu-2-mig-1g10gb-0"]))
    assert mig.gi_id is not None
