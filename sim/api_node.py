"""A node through the API: the agent's real parts on the in-memory apiserver.

The agent's publisher writes the node's ResourceSlices to ``kube.memory``, and the scheduler
compiles what it lists back; the kubelet calls NodePrepareResources/NodeUnprepareResources over
the agent's gRPC services on unix sockets (``slicer.plugin``), backed by its ``DeviceState``
(checkpoint, CDI, MIG instances created at exactly the allocated placement).
"""

from __future__ import annotations

from pathlib import Path

from gpu_slicer.core.identity import DRIVER, RESOURCE_API
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.sim.errors import AllocationError
from gpu_slicer.sim.kubelet_client import KubeletClient, RunningClaim
from gpu_slicer.sim.node import NodeBase, SimClock
from gpu_slicer.sim.pools import Pool, compile_pool
from gpu_slicer.sim.scenario import NodeSpec, Scenario
from gpu_slicer.slicer.checkpoint import PreparedDevice
from gpu_slicer.slicer.demand import Advertised
from gpu_slicer.slicer.ordering import order_fingerprint


class ApiNode(NodeBase):
    """A node whose slices are published through the apiserver and prepared over gRPC.

    Every part is the agent's, built by :func:`slicer.agent.assemble` and paced by the
    simulated clock: the publisher with its republish limiter, called when the limiter says a
    new device order is due and when the cluster asks for other profiles."""

    def __init__(
        self,
        node: NodeSpec,
        *,
        device_order: str,
        scenario: Scenario,
        clock: SimClock,
        api: InMemoryKubeApi,
        root: Path,
    ) -> None:
        super().__init__(node, device_order=device_order, scenario=scenario, clock=clock)
        self.api = api
        self._generation = 0
        """The pool generation last compiled: a new one is a publication."""
        self._start_services(root)
        self.pool = self._publish()

    def _start_services(self, root: Path) -> None:
        """The agent's parts for this node, wired by the agent's own factory."""
        from gpu_slicer.slicer.agent import AgentConfig, assemble
        from gpu_slicer.slicer.clock import Clock

        base = root / self.name
        parts = assemble(
            AgentConfig(
                node=self.name,
                checkpoint_dir=base / "checkpoint",
                cdi_dir=base / "cdi",
                device_order=self.device_order.name,
                republish_interval_s=self.scenario.republish_min_interval_s,
                republish_quiet_s=self.scenario.republish_quiet_s,
                reprobe_interval_s=0,  # the in-memory apiserver's version and counters stay
                report_scaling=False,  # the simulation's report says what a real scheduler would do
                advertised_profiles="all",  # the strategy says what the cluster asks (sim.asked)
            ),
            backend=self.backend,
            api=self.api,
            modes=dict(self.modes),
            clock=Clock(monotonic=self.clock, time=self.clock, sleep=lambda _s: None),
            max_parallel=1,
        )
        assert parts.publisher is not None and parts.limiter is not None
        self.state = parts.state
        self.driver = parts.driver
        self.publisher = parts.publisher
        self.limiter = parts.limiter
        self._kubelet = KubeletClient(self.driver, base)

    def prepared_devices(self) -> list[PreparedDevice]:
        return [d for e in self.state.entries().values() for d in e.devices]

    def ensure_pool(self, *, fresh: bool = True) -> Pool:
        """The pool compiled from the slices last published (always fresh)."""
        return self.pool

    def current_order(self) -> list[str]:
        return [d.name for d in self.pool.devices]

    def best_order(self) -> list[str]:
        """The order the device order would publish now."""
        view = self.view()
        plan = self.publisher.plan(view.gpus, allocated=view.allocated, profiles=self.choice)
        return list(plan.order)

    def advertise(self, choice: Advertised) -> None:
        self.choice = choice
        self.pool = self._publish()

    def _publish(self) -> Pool:
        """Publish through the agent's publisher, the profiles the cluster asks for; returns the
        pool the scheduler compiles from what the apiserver then lists (the one it had when
        nothing was written)."""
        view = self.view()
        self.publisher.publish(view.gpus, allocated=view.allocated, profiles=self.choice)
        listed = self.api.list(
            RESOURCE_API, "ResourceSlice", field_selector=f"spec.nodeName={self.name}"
        ).items
        pool = compile_pool(DRIVER, self.name, listed)
        if pool is None:
            raise AllocationError(f"the pool of {self.name} is incomplete after publishing")
        if pool.generation != self._generation:
            self.publishes += 1
            self._generation = pool.generation
        return pool

    def before_change(self) -> None:
        """Nothing to settle: republishes happen when due (:meth:`republish`)."""

    def allocation_changed(self) -> float | None:
        """Publish at once when the pool would list a device again (a release made room for
        it); otherwise tell the publisher's limiter what it would list now, and return the time
        to call :meth:`republish`."""
        order = self.best_order()
        listed = {d.name for d in self.pool.devices}
        if any(name not in listed for name in order):
            self.pool = self._publish()
            return None
        self.limiter.observe(order_fingerprint(order))
        due = self.limiter.due_in()
        return None if due is None else self.clock.now + due

    def republish(self) -> bool:
        """Publish now (the limiter said the best order is due); True when the order changed."""
        before = self.current_order()
        self.pool = self._publish()
        return self.current_order() != before

    def prepare(self, prepared: RunningClaim) -> str:
        return self._kubelet.prepare(prepared)

    def unprepare(self, prepared: RunningClaim) -> str:
        return self._kubelet.unprepare(prepared)

    def problems(self) -> list[str]:
        """Leaked instances, and claims the agent's checkpoint still holds."""
        problems = self.leaks()
        if self.state.entries():
            problems.append(
                f"{self.name}: checkpoint still holds {len(self.state.entries())} claims"
            )
        return problems

    def close(self) -> None:
        self._kubelet.close()
        self.driver.close()
