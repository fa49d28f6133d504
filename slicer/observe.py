"""The node as the agent observes it: what its GPUs hold, which of it is the agent's.

:func:`observe_node` is the one place where what was read (the backend's GPUs and instances,
the devices the checkpoint holds, the devices the API allocated) becomes the :class:`NodeView`
the publisher plans the pool from. The reconciler, ``gpu-slicer slices`` (slicer.preview) and the
simulator's nodes all call it, so that they cannot disagree on ownership: an instance is the
agent's only when a checkpointed device names its placement (and its GPU instance id, once
recorded); every other instance is foreign and only blocks what overlaps it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_slicer.core.devices import DeviceSpec, DeviceTaint, MigInstance, Mode, SliceSpec
from gpu_slicer.slicer.backend import GpuInfo
from gpu_slicer.slicer.checkpoint import PreparedDevice
from gpu_slicer.slicer.inventory import GpuState
from gpu_slicer.slicer.state import instance_at


@dataclass(frozen=True)
class ObservedGpu:
    """One GPU as read: its facts, its mode, the instances listed on it and its taints."""

    info: GpuInfo
    mode: Mode
    instances: tuple[MigInstance, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()


@dataclass(frozen=True)
class NodeView:
    """What the publisher needs to build the pool's ResourceSlices."""

    gpus: tuple[GpuState, ...]
    allocated: tuple[DeviceSpec, ...]
    """Devices the API allocated in this pool (under the current driver name)."""

    def fingerprint(self) -> str:
        def gpu_key(g: GpuState) -> list[object]:
            return [
                g.info.index,
                g.info.mig_enabled,
                g.mode,
                sorted((i.profile, i.start, i.ci_id is not None) for i in g.instances),
                sorted((s.profile, s.start) for s in g.owned),
                [t.render() for t in g.taints],
                sorted(repr(s) for s in g.held_elsewhere),
            ]

        data = [
            [gpu_key(g) for g in self.gpus],
            sorted(repr(a) for a in self.allocated),
        ]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def observe_node(
    gpus: Iterable[ObservedGpu],
    prepared: Iterable[PreparedDevice],
    allocated: Iterable[DeviceSpec] = (),
    held_elsewhere: Iterable[DeviceSpec] = (),
) -> NodeView:
    """The view of ``gpus`` where only the instances backing a ``prepared`` device (the
    checkpoint's) are owned; ``allocated`` is kept in the order given. ``held_elsewhere``: the
    devices allocated under an earlier driver name (an older release's pool), which the pool
    counts as taken (:meth:`GpuState.taken`) although their instances are the agent's."""
    elsewhere: dict[int, set[DeviceSpec]] = {}
    for spec in held_elsewhere:
        elsewhere.setdefault(spec.gpu_index, set()).add(spec)
    by_gpu: dict[int, list[PreparedDevice]] = {}
    for device in prepared:
        if device.is_mig:
            by_gpu.setdefault(device.gpu_index, []).append(device)
    states = []
    for gpu in gpus:
        listed = list(gpu.instances)
        owned: set[SliceSpec] = set()
        for device in by_gpu.get(gpu.info.index, ()):
            inst = instance_at(listed, device)
            if inst is not None:
                owned.add(inst.spec)
        states.append(
            GpuState(
                info=gpu.info,
                mode=gpu.mode,
                instances=gpu.instances,
                owned=frozenset(owned),
                taints=gpu.taints,
                held_elsewhere=frozenset(elsewhere.get(gpu.info.index, ())),
            )
        )
    return NodeView(tuple(states), tuple(allocated))


__all__ = ["NodeView", "ObservedGpu", "observe_node"]
