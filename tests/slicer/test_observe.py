"""slicer.observe: which instances the agent counts as its own, and what the publisher plans from.

The reconciler, ``gpu-slicer slices`` and the simulator's nodes all observe the node through
:func:`slicer.observe.observe_node`; these are the rules they share."""

from __future__ import annotations

from gpu_slicer.core.devices import MigInstance, SliceSpec, WholeGpu
from gpu_slicer.slicer.checkpoint import PreparedDevice
from gpu_slicer.slicer.inventory import plan_pool
from gpu_slicer.slicer.observe import NodeView, ObservedGpu, observe_node
from gpu_slicer.slicer.simulated import SimulatedBackend

NODE = "node-a"


def _backend_with(*placements: tuple[int, str, int]) -> SimulatedBackend:
    backend = SimulatedBackend("H100-80GB:2", node_name=NODE)
    for gpu in (0, 1):
        backend.set_mig_mode(gpu, True)
    for gpu, profile, start in placements:
        gi = backend.create_gpu_instance(gpu, profile, start)
        backend.create_compute_instance(gpu, gi)
    return backend


def _observed(backend: SimulatedBackend) -> list[ObservedGpu]:
    return [
        ObservedGpu(info, mode="dynamic", instances=tuple(backend.instances(info.index)))
        for info in backend.gpus()
    ]


def _prepared(inst: MigInstance, *, gi_id: int | None = None) -> PreparedDevice:
    return PreparedDevice(
        ("gpu",),
        f"gpu-{inst.gpu_index}-mig-{inst.profile.replace('.', '')}-{inst.start}",
        inst.gpu_index,
        inst.profile,
        inst.start,
        gi_id=inst.gi_id if gi_id is None else gi_id,
    )


def test_only_instances_a_checkpointed_device_names_are_owned() -> None:
    backend = _backend_with((0, "1g.10gb", 0), (0, "3g.40gb", 4), (1, "1g.10gb", 0))
    mine = backend.instances(0)[0]
    view = observe_node(_observed(backend), [_prepared(mine)])
    gpu0, gpu1 = view.gpus
    assert gpu0.owned == {mine.spec}
    assert [i.spec for i in gpu0.foreign] == [SliceSpec(0, "3g.40gb", 4)]
    assert gpu1.owned == frozenset()  # same placement on another GPU is not the device's


def test_an_instance_at_the_placement_with_another_gpu_instance_id_is_foreign() -> None:
    backend = _backend_with((0, "1g.10gb", 0))
    inst = backend.instances(0)[0]
    view = observe_node(_observed(backend), [_prepared(inst, gi_id=inst.gi_id + 7)])
    assert view.gpus[0].owned == frozenset()


def test_a_prepared_device_without_its_instance_owns_nothing() -> None:
    backend = _backend_with()
    device = PreparedDevice(("gpu",), "gpu-0-mig-1g10gb-0", 0, "1g.10gb", 0)
    whole = PreparedDevice(("gpu",), "gpu-1", 1)
    view = observe_node(_observed(backend), [device, whole])
    assert all(g.owned == frozenset() for g in view.gpus)


def test_foreign_instances_block_the_placements_they_overlap_and_owned_ones_do_not() -> None:
    backend = _backend_with((0, "7g.80gb", 0))
    inst = backend.instances(0)[0]
    foreign = observe_node(_observed(backend), [])
    owned = observe_node(_observed(backend), [_prepared(inst)])
    assert _gpu0_devices(foreign) == set()  # a foreign 7g holds every memory slice of GPU 0
    assert "gpu-0-mig-1g10gb-3" in _gpu0_devices(owned)  # the agent's own blocks nothing


def _gpu0_devices(view: NodeView) -> set[str]:
    return {n for n in plan_pool(NODE, view.gpus).order if n.startswith("gpu-0-")}


def test_the_allocated_devices_are_kept_in_the_order_given() -> None:
    backend = _backend_with()
    allocated = [WholeGpu(1), SliceSpec(0, "1g.10gb", 2)]
    view = observe_node(_observed(backend), [], allocated)
    assert view.allocated == tuple(allocated)
    assert [g.index for g in view.gpus] == [0, 1]
