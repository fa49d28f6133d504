"""gpu-slicer on simulated GPUs: the real webhook, agent and slices, a modelled control plane.

What runs for real (the project's own code):

* the webhook's translation (``webhook.translate.translate_pod``) and its JSON Patch, applied with
  ``jsonpatch``; the ResourceClaimTemplates it asks for;
* per node, the agent's parts as ``slicer.agent`` builds them, on the simulated clock: the
  node observed as the agent observes it (``slicer.observe``: only the instances its checkpoint
  holds are its own), its inventory and device order (``slicer.inventory``,
  ``slicer.ordering``) on a ``SimulatedBackend``, published by its ``slicer.publisher`` through
  the reconciler's publishing path, republished when that publisher's ``RepublishLimiter`` says
  a new order is due;
* the kubelet side: ``NodePrepareResources``/``NodeUnprepareResources`` over the agent's gRPC
  services on unix sockets (``slicer.plugin``), backed by its ``DeviceState`` (checkpoint, CDI,
  MIG instances created at exactly the allocated placement).

What is modelled: the apiserver (``kube.memory.InMemoryKubeApi``), the controller that makes a
pod's ResourceClaim from its template (:mod:`sim.plane`), the scheduler
(:mod:`sim.scheduler`: ``sim.allocator`` per node, nodes chosen by the scenario's rule) and the
kubelet's calls (:mod:`sim.kubelet_client`).

Two ways to run, same decisions:

* **through the API** (default for small scenarios): every object goes through the in-memory
  apiserver and the kubelet talks gRPC to a real agent per node (:mod:`sim.api_node`, files in a
  temporary folder);
* **fast** (large scenarios): pods and claims stay plain dicts, the slices are compiled once per
  node and only *reordered* when the best-fit order changes (:mod:`sim.fast_node`), and the
  kubelet step creates and destroys the instances on the ``SimulatedBackend`` directly.
"""

from __future__ import annotations

from typing import Any

from gpu_slicer.core.devices import DeviceSpec, SliceSpec, WholeGpu
from gpu_slicer.sim.allocator import Allocation
from gpu_slicer.sim.asked import ClusterAsks
from gpu_slicer.sim.demand import Demand, DemandBook, min_memory_slices
from gpu_slicer.sim.errors import AllocationError
from gpu_slicer.sim.event_loop import GpuLedger, Held, Slot, Strategy
from gpu_slicer.sim.kubelet_client import RunningClaim
from gpu_slicer.sim.node import SimClock, SimNode, parse_device_name
from gpu_slicer.sim.plane import ApiControlPlane, FastControlPlane, SimControlPlane
from gpu_slicer.sim.scenario import PodSpec, Scenario
from gpu_slicer.sim.scheduler import Scheduler

Obj = dict[str, Any]
API_POD_LIMIT = 5000
"""Scenarios with more pods than this run the fast way unless told otherwise."""


# --- the strategy --------------------------------------------------------------------------


def _slices_of(spec: DeviceSpec, node: SimNode) -> int:
    model = node.node.models[spec.gpu_index]
    if isinstance(spec, WholeGpu):
        return model.memory_slices
    return model.profile(spec.profile).memory_slices


def _slots(allocation: Allocation) -> tuple[Slot, ...]:
    """What the allocated devices hold, GPU by GPU, as the engine's ledger counts it."""
    slots = []
    for device in allocation.devices:
        spec = parse_device_name(device.name)
        if isinstance(spec, WholeGpu):
            slots.append(Slot(spec.gpu_index, None))
        else:
            slots.append(Slot(spec.gpu_index, spec.profile, spec.start))
    return tuple(slots)


class GpuSlicerStrategy(Strategy):
    """gpu-slicer with one device order, on the whole simulated cluster."""

    def __init__(
        self,
        scenario: Scenario,
        book: DemandBook,
        *,
        device_order: str,
        through_api: bool | None = None,
    ) -> None:
        super().__init__(scenario)
        self.name = f"gpu-slicer-{device_order}"
        self.description = f"gpu-slicer, device order '{device_order}'"
        self.book = book
        self.device_order = device_order
        if through_api is None:
            through_api = len(scenario.pods) <= API_POD_LIMIT and len(scenario.nodes) <= 64
        self.through_api = through_api
        self.clock = SimClock()
        self._closed = False
        self.plane: SimControlPlane = (
            ApiControlPlane(scenario, device_order=device_order, clock=self.clock)
            if through_api
            else FastControlPlane(scenario, device_order=device_order, clock=self.clock)
        )
        self.nodes = self.plane.nodes
        self.asks = ClusterAsks(
            scenario.nodes,
            every=scenario.advertised_profiles == "all",
            latency_s=scenario.demand_latency_s,
        )
        self.scheduler = Scheduler(self.nodes, scenario.node_rule)
        self.running: dict[str, tuple[Allocation, list[RunningClaim]]] = {}
        self.claims: dict[str, list[Obj]] = {}
        self.due: dict[str, float] = {}
        self.notes.append(self.plane.description)

    # --- demand ---------------------------------------------------------------------------

    def demand(self, pod: PodSpec) -> Demand:
        return self.book.chains(pod)

    def gpu_can_use(self, ledger: GpuLedger, alt: Any) -> bool:
        if alt.kind == "gpu":
            mode = self.nodes[ledger.node].modes[ledger.index]
            return not ledger.held and mode in ("dynamic", "full")
        return super().gpu_can_use(ledger, alt)

    # --- claims ---------------------------------------------------------------------------

    def _claims_for(self, pod: PodSpec) -> list[Obj]:
        found = self.claims.get(pod.name)
        if found is not None:
            return found
        translated = self.book.translated(pod)
        if translated.denied is not None:
            if not self.rejected:
                self.notes.append(f"{pod.name}: denied by the webhook: {translated.denied}")
            self.rejected[pod.name] = translated.denied
            self.claims[pod.name] = []
            return []
        if translated.claim_spec is None:
            self.claims[pod.name] = []
            return []
        self.asks.admitted(id(translated), translated, self.clock.now)
        claims = self.plane.admit(pod, translated)
        self.claims[pod.name] = claims
        return claims

    # --- placing --------------------------------------------------------------------------

    def place(self, pod: PodSpec, now: float) -> Held | None:
        self.clock.now = now
        claims = self._claims_for(pod)
        if not claims:
            return None
        allocation = self._schedule(pod, claims)
        if allocation is None:
            return None
        node = self.nodes[allocation.node]
        node.before_change()
        self.scheduler.reserve(allocation)
        prepared_list = self.plane.bind(pod, claims, allocation)
        for prepared in prepared_list:
            error = node.prepare(prepared)
            if error:
                raise AllocationError(f"{pod.name}: NodePrepareResources failed: {error}")
        node.allocate(allocation.devices)
        self._check_instances(node, allocation)
        self.running[pod.name] = (allocation, prepared_list)
        self._after_change(node)
        slots = _slots(allocation)
        used = sum(_slices_of(parse_device_name(d.name), node) for d in allocation.devices)
        self.scheduler.order.change(allocation.node, used)
        return Held(allocation.node, slots)

    def _schedule(self, pod: PodSpec, claims: list[Obj]) -> Allocation | None:
        """The scheduler's answer for the pod's claims; None (noted) when they cannot be
        allocated anywhere."""
        shape = (
            pod.namespace,
            tuple(sorted(pod.resources.items())),
            tuple(sorted(pod.annotations.items())),
        )
        if shape not in self.scheduler.min_slices:
            self.scheduler.min_slices[shape] = self._min_slices(pod)
        try:
            return self.scheduler.schedule(claims, shape)
        except AllocationError as exc:
            self.notes.append(f"{pod.name}: {exc}")
            return None

    def _min_slices(self, pod: PodSpec) -> int:
        """Memory slices the pod needs at least, on any model of the cluster (a necessary
        condition the scheduler uses to skip nodes without enough free slices)."""
        models = {m.key: m for n in self.scenario.nodes for m in n.models}.values()
        return min_memory_slices(self.demand(pod), models)

    def _check_instances(self, node: SimNode, allocation: Allocation) -> None:
        """Every prepared MIG device has exactly its instance on the GPU, and nothing else is."""
        gpus = {parse_device_name(d.name).gpu_index for d in allocation.devices}
        for gpu in gpus:
            wanted = sorted(
                (s.profile, s.start)
                for s in node.allocated.values()
                if isinstance(s, SliceSpec) and s.gpu_index == gpu
            )
            have = node.instance_placements(gpu)
            if have != wanted:
                raise AllocationError(
                    f"{node.name} gpu {gpu}: instances {have} but prepared claims hold {wanted}"
                )

    def release(self, pod: PodSpec, held: Held, now: float) -> None:
        self.clock.now = now
        allocation, prepared_list = self.running.pop(pod.name)
        node = self.nodes[allocation.node]
        node.before_change()
        for prepared in prepared_list:
            error = node.unprepare(prepared)
            if error:
                raise AllocationError(f"{pod.name}: NodeUnprepareResources failed: {error}")
        self.plane.remove(pod, prepared_list)
        self.claims.pop(pod.name, None)
        node.deallocate(allocation.devices)
        self.scheduler.release(allocation.node, allocation.devices)
        used = sum(_slices_of(parse_device_name(d.name), node) for d in allocation.devices)
        self.scheduler.order.change(allocation.node, -used)
        self._after_change(node)

    def _after_change(self, node: SimNode) -> None:
        due = node.allocation_changed()
        if due is None:
            self.due.pop(node.name, None)
        else:
            self.due[node.name] = due

    def wakeup(self) -> float | None:
        times = [*self.due.values(), *([self.asks.due] if self.asks.due is not None else [])]
        return min(times) if times else None

    def tick(self, now: float) -> bool:
        self.clock.now = now
        asked_more = self.asks.take_due(now)
        if asked_more:  # every agent saw a template asking for a profile new to it
            for node in self.nodes.values():
                node.before_change()
                node.advertise(self.asks.advertised(node.node, now))
            self.scheduler.published_more()
        for name in [n for n, t in self.due.items() if t <= now]:
            node = self.nodes[name]
            del self.due[name]
            if node.republish():
                self.scheduler.touch(name)
            later = node.allocation_changed()
            if later is not None and later > now:
                self.due[name] = later
        return asked_more

    # --- figures and the end ----------------------------------------------------------------

    def mig_counts(self) -> tuple[int, int]:
        calls = [n.mig_calls() for n in self.nodes.values()]
        return sum(c[0] for c in calls), sum(c[1] for c in calls)

    def finish(self, now: float) -> list[str]:
        problems: list[str] = []
        for node in self.nodes.values():
            problems.extend(node.problems())
        if self.scheduler.allocated.devices:
            problems.append(
                f"the scheduler still counts {len(self.scheduler.allocated.devices)} "
                "devices as allocated"
            )
        problems.extend(self.plane.problems())
        publishes = sum(n.publishes for n in self.nodes.values())
        asked = (
            "" if self.asks.every else f" ({self.asks.changes} rounds for profiles newly asked for)"
        )
        self.notes.append(
            f"{publishes} slice publications{asked}, {self.scheduler.attempts} allocator runs"
        )
        self.close()
        return problems

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.plane.close()
