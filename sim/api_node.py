"""A node through the API: the agent's real parts on the in-memory apiserver.

The agent's publisher writes the node's ResourceSlices to ``kube.memory``, and the scheduler
compiles what it lists back; the kubelet calls NodePrepareResources/NodeUnprepareResources over
the agent's gRPC services on unix sockets (``slicer.plugin``), backed by its ``DeviceState``
(checkpoint, CDI, MIG instances created at exactly the allocated placement).
"""

from __future__ import annotations

from pathlib import Path

from kube.memory import InMemoryKubeApi
from sim.errors import AllocationError
from sim.kubelet_client import KubeletClient, RunningClaim
from sim.node import NodeBase, SimClock
from sim.pools import Pool, compile_pool
from sim.scenario import NodeSpec, Scenario
from slicer.identity import DRIVER, RESOURCE_API
from slicer.ordering import order_fingerprint


class ApiNode(NodeBase):
    """A node whose slices are published through the apiserver and prepared over gRPC."""

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
        self._start_services(root)
        self.pool = self._publish()
        self.limiter.published(order_fingerprint(self.current_order()))

    def _start_services(self, root: Path) -> None:
        """The agent's parts for this node, wired by the agent's own factory."""
        from slicer.assembly import AgentConfig, assemble
        from slicer.clock import Clock
        from slicer.publisher import SlicePublisher

        base = root / self.name
        self._publisher = SlicePublisher(
            self.api,
            self.name,
            device_order=self.device_order,
            server_version=self.scenario.kubernetes,
            clock=Clock(sleep=lambda _s: None),
            report_scaling=False,  # the simulation's report says what a real scheduler would do
        )
        parts = assemble(
            AgentConfig(node=self.name, checkpoint_dir=base / "checkpoint", cdi_dir=base / "cdi"),
            backend=self.backend,
            api=self.api,
            modes=dict(self.modes),
            republish=lambda _view: None,  # the simulator publishes through self._publisher
            clock=Clock(time=self.clock),
            max_parallel=1,
        )
        self.state = parts.state
        self.driver = parts.driver
        self._kubelet = KubeletClient(self.driver, base)

    def ensure_pool(self, *, fresh: bool = True) -> Pool:
        """The pool compiled from the slices last published (always fresh)."""
        return self.pool

    def current_order(self) -> list[str]:
        return [d.name for d in self.pool.devices]

    def best_order(self) -> list[str]:
        """The order the device order would publish now."""
        return list(
            self._publisher.plan(self.gpu_states(), allocated=list(self.allocated.values())).order
        )

    def _publish(self) -> Pool:
        """Publish through the apiserver; returns the pool the scheduler compiles from it."""
        self._publisher.publish(self.gpu_states(), allocated=list(self.allocated.values()))
        self.publishes += 1
        listed = self.api.list(
            RESOURCE_API, "ResourceSlice", field_selector=f"spec.nodeName={self.name}"
        ).items
        pool = compile_pool(DRIVER, self.name, listed)
        if pool is None:
            raise AllocationError(f"the pool of {self.name} is incomplete after publishing")
        return pool

    def before_change(self) -> None:
        """Nothing to settle: republishes happen when due (:meth:`republish`)."""

    def allocation_changed(self) -> float | None:
        """Tell the limiter; returns the time to call :meth:`republish`."""
        if not self.dynamic:
            return None
        self.limiter.observe(order_fingerprint(self.best_order()))
        due = self.limiter.due_in()
        return None if due is None else self.clock.now + due

    def republish(self) -> bool:
        """Publish the best order now (the limiter said it is due); True when it changed."""
        order = self.best_order()
        fingerprint = order_fingerprint(order)
        if fingerprint == order_fingerprint(self.current_order()):
            self.limiter.published(fingerprint)
            return False
        self.pool = self._publish()
        self.limiter.published(fingerprint)
        return True

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
