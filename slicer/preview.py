"""The pool an agent would publish for simulated GPUs, without a cluster or a GPU.

``gpu-slicer slices`` prints it, and the scheduler benchmark's hollow nodes publish it: the same
path as the agent's (simulated backend -> :func:`slicer.observe.observe_node` with a checkpoint
that holds nothing yet -> :func:`slicer.inventory.plan_pool`), so what they show is what a
freshly started agent on such a node writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import DeviceSpec, Mode
from gpu_slicer.slicer.device_attributes import DeviceAttributes
from gpu_slicer.slicer.inventory import GpuState, PoolPlan, default_mode, plan_pool
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.slicer.observe import ObservedGpu, observe_node
from gpu_slicer.slicer.profile_filter import ProfileChoice
from gpu_slicer.slicer.simulated import SimulatedBackend


def preview_pool(
    node: str,
    gpus: str,
    *,
    server_version: tuple[int, int] = (1, 36),
    mode: Mode | None = None,
    order: str = "best-fit",
    static_layout: StaticLayout | None = None,
    generation: int = 1,
    profiles: ProfileChoice | None = None,
    attributes: DeviceAttributes = "full",
    allocated: Sequence[DeviceSpec] = (),
) -> PoolPlan:
    """The pool of ``node`` with simulated ``gpus`` (``A100-80GB:8``). With ``static_layout``
    the layout's instances are created first and only they are advertised, without counters;
    ``profiles`` keeps only the MIG profiles the agent's ``--profiles`` would, ``attributes``
    is the agent's ``--attributes``; ``allocated``: the devices claims hold (what they rule out
    is left out).

    Raises :class:`slicer.errors.SlicerError` (bad spec, a layout the GPUs cannot hold) or
    :class:`slicer.inventory.InventoryError`."""
    return plan_pool(
        node,
        preview_gpus(node, gpus, mode=mode, static_layout=static_layout),
        server_version=server_version,
        generation=generation,
        device_order=order,
        static=static_layout is not None,
        static_layout=static_layout,
        profiles=profiles,
        attributes=attributes,
        allocated=allocated,
    )


def preview_gpus(
    node: str, gpus: str, *, mode: Mode | None = None, static_layout: StaticLayout | None = None
) -> list[GpuState]:
    """The GPUs of ``node`` as a freshly started agent observes them (simulated ``gpus``; with
    ``static_layout``, its instances made first, as mig-parted would)."""
    backend = SimulatedBackend(gpus, node_name=node)
    infos = backend.gpus()
    models = [catalog.get_model(info.model) for info in infos]
    if static_layout is not None:
        static_layout.check(models)
        _create_layout(backend, static_layout, len(infos))
        infos = backend.gpus()
    observed = [
        ObservedGpu(
            info,
            mode=mode or default_mode(models[info.index]),
            instances=tuple(backend.instances(info.index)),
        )
        for info in infos
    ]
    return list(observe_node(observed, prepared=()).gpus)  # the layout's instances are no claim's


def _create_layout(backend: SimulatedBackend, layout: StaticLayout, count: int) -> None:
    """Create the configured instances on the simulated GPUs, as mig-parted would before the
    agent starts."""
    for index in range(count):
        wanted = layout.for_gpu(index)
        if not wanted:
            continue
        backend.set_mig_mode(index, True)
        for profile, start in wanted:
            gi = backend.create_gpu_instance(index, profile, start)
            backend.create_compute_instance(index, gi)
