"""One simulated node as the cluster and the scheduler see it, whichever way the simulation runs.

:class:`SimNode` is all the strategy and the scheduler use; :class:`sim.api_node.ApiNode` (the
agent's real parts on the in-memory apiserver) and :class:`sim.fast_node.FastNode` (slices
compiled once and reordered in place) implement it and decide the same. :class:`NodeBase` holds
what both keep: the simulated GPUs, the allocations, and the view of them the agent's
publisher plans from (:func:`slicer.observe.observe_node`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Protocol

from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.devices import DeviceSpec, Mode
from gpu_slicer.core.devices import parse_device_name as _parse_device_name
from gpu_slicer.core.identity import DRIVER
from gpu_slicer.sim.kubelet_client import RunningClaim
from gpu_slicer.sim.pools import Device, Pool, compile_pool
from gpu_slicer.sim.scenario import NodeSpec, Scenario
from gpu_slicer.slicer.checkpoint import PreparedDevice
from gpu_slicer.slicer.demand import EVERY_PROFILE, Advertised
from gpu_slicer.slicer.inventory import GpuState, effective_mode, plan_pool
from gpu_slicer.slicer.observe import NodeView, ObservedGpu, observe_node
from gpu_slicer.slicer.ordering import DYNAMIC_ORDERS, get_device_order
from gpu_slicer.slicer.simulated import SimulatedBackend

parse_device_name = functools.lru_cache(maxsize=8192)(_parse_device_name)
"""Device names repeat on every node of a kind: parse each once (specs are immutable)."""


class SimClock:
    """Simulated time, settable by the strategy and read by the agent's parts."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimNode(Protocol):
    """What the strategy and the scheduler need of a node."""

    name: str
    node: NodeSpec
    modes: dict[int, Mode]
    """Per GPU index, its effective MIG mode."""
    allocated: dict[str, DeviceSpec]
    """Device name -> spec, for every device allocated on this node."""
    publishes: int
    choice: Advertised

    def advertise(self, choice: Advertised) -> None:
        """The cluster asks for other profiles: publish ``choice`` from now on."""
        ...

    def ensure_pool(self, *, fresh: bool = True) -> Pool:
        """The pool as the scheduler sees it now. ``fresh=False`` may return it in an older
        order: good enough to learn whether a claim fits at all, which no order changes."""
        ...

    def before_change(self) -> None:
        """Called before the node's allocations change: a republish that fell due before now
        must see the allocations of its time."""
        ...

    def blank_pool(self) -> Pool:
        """The pool the node lists with nothing allocated: what a claim could ever match on a
        node of its kind (the pool now leaves out what allocations take)."""
        ...

    def allocate(self, devices: Iterable[Device]) -> None: ...

    def deallocate(self, devices: Iterable[Device]) -> None: ...

    def allocation_changed(self) -> float | None:
        """Tell the limiter; returns when :meth:`republish` is due, None when not (or when the
        node refreshes its order by itself)."""
        ...

    def republish(self) -> bool:
        """Publish the best order now (it fell due); True when the order changed."""
        ...

    def prepare(self, prepared: RunningClaim) -> str:
        """NodePrepareResources for one claim; returns an error message, empty when fine."""
        ...

    def unprepare(self, prepared: RunningClaim) -> str: ...

    def instance_placements(self, gpu: int) -> list[Placement]: ...

    def mig_calls(self) -> tuple[int, int]: ...

    def problems(self) -> list[str]:
        """What is left on the node that should not be, once every pod is gone."""
        ...

    def close(self) -> None: ...


class NodeBase(ABC):
    """The state both kinds of node keep: simulated GPUs, allocations and the agent's view."""

    def __init__(
        self, node: NodeSpec, *, device_order: str, scenario: Scenario, clock: SimClock
    ) -> None:
        self.node = node
        self.name = node.name
        self.clock = clock
        self.scenario = scenario
        self.device_order = get_device_order(device_order)
        self.dynamic = device_order in DYNAMIC_ORDERS
        self.backend = SimulatedBackend(
            list(node.models), node_name=node.name, sleep=lambda _s: None
        )
        self.modes = {i: effective_mode(node.mode, m) for i, m in enumerate(node.models)}
        self.allocated: dict[str, DeviceSpec] = {}
        self.publishes = 0
        self.choice: Advertised = (
            EVERY_PROFILE if scenario.advertised_profiles == "all" else Advertised()
        )
        """The MIG profiles this node's agent advertises (set by the strategy as pods of new
        shapes arrive, :mod:`sim.asked`)."""

    def allocate(self, devices: Iterable[Device]) -> None:
        """Record devices allocated on this node."""
        for device in devices:
            self._add(device.name)

    def deallocate(self, devices: Iterable[Device]) -> None:
        """Record devices released on this node."""
        self._remove(devices)

    def _add(self, name: str) -> int:
        spec = parse_device_name(name)
        self.allocated[name] = spec
        return spec.gpu_index

    def _remove(self, devices: Iterable[Device]) -> set[int]:
        """Forget ``devices``; returns the GPUs they were on."""
        gpus = set()
        for device in devices:
            spec = self.allocated.pop(device.name, None)
            if spec is not None:
                gpus.add(spec.gpu_index)
        return gpus

    def blank_pool(self) -> Pool:
        gpus = [GpuState(info, mode=self.modes[info.index]) for info in self.backend.gpus()]
        plan = plan_pool(
            self.name,
            gpus,
            server_version=self.scenario.kubernetes,
            device_order=self.device_order,
            profiles=self.choice,
        )
        pool = compile_pool(DRIVER, self.name, plan.slices)
        assert pool is not None
        return pool

    def view(self) -> NodeView:
        """The node as its agent observes it (:func:`slicer.observe.observe_node`): only the
        instances its checkpoint holds are its own, and the devices allocated here."""
        observed = [
            ObservedGpu(
                info,
                mode=self.modes[info.index],
                instances=tuple(self.backend.instances(info.index)) if info.mig_enabled else (),
            )
            for info in self.backend.gpus()
        ]
        return observe_node(observed, self.prepared_devices(), self.allocated.values())

    @abstractmethod
    def prepared_devices(self) -> list[PreparedDevice]:
        """The devices the node's agent holds prepared: what its checkpoint says."""

    def instance_placements(self, gpu: int) -> list[Placement]:
        return self.backend.placements(gpu)

    def mig_calls(self) -> tuple[int, int]:
        created = sum(1 for c in self.backend.calls if c[0] == "create_gpu_instance")
        destroyed = sum(1 for c in self.backend.calls if c[0] == "destroy_gpu_instance")
        return created, destroyed

    def leaks(self) -> list[str]:
        """MIG instances left on the GPUs."""
        problems = []
        for info in self.backend.gpus():
            left = self.backend.instances(info.index)
            if left:
                problems.append(f"{self.name} gpu {info.index}: {len(left)} instances leaked")
        return problems
