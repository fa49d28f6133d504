"""What the simulated cluster asks of its nodes, and so the MIG profiles each kind of node
advertises (the agents' ``--advertised-profiles asked``, :mod:`slicer.demand`).

Each pod shape's template is read once per kind of node (its GPU models), with the agent's own
reader. A shape that asks for a profile not advertised yet makes every node republish after
the scenario's ``demandLatency``; until then its pods wait, as on a cluster. The webhook keeps
an unused template for a day (``templateGcAfter``), longer than a scenario's trace, so nothing
is withdrawn within a run.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from gpu_slicer.sim.demand import Translated
from gpu_slicer.sim.scenario import NodeSpec
from gpu_slicer.slicer.demand import (
    EVERY_PROFILE,
    Advertised,
    ClaimAsks,
    Demand,
    DeviceMenu,
    read_claim_spec,
)
from gpu_slicer.slicer.simulated import SimulatedBackend

NodeKind = tuple[str, ...]
"""A node's GPU models (catalog keys, in index order): what the reading depends on."""


def node_kind(node: NodeSpec) -> NodeKind:
    return tuple(m.key for m in node.models)


class ClusterAsks:
    """Per kind of node, what the cluster's templates ask and what the nodes advertise."""

    def __init__(self, nodes: Iterable[NodeSpec], *, every: bool, latency_s: float) -> None:
        self.every = every
        self.latency_s = latency_s
        self._menus: dict[NodeKind, DeviceMenu] = {}
        self._demands: dict[NodeKind, Demand] = {}
        for node in nodes:
            kind = node_kind(node)
            if kind not in self._menus:
                menu = DeviceMenu(SimulatedBackend(node.gpus, node_name=node.name).gpus())
                self._menus[kind] = menu
                self._demands[kind] = Demand(menu.profiles)
        self._read: dict[Hashable, dict[NodeKind, ClaimAsks]] = {}
        self._asked: dict[NodeKind, set[str]] = {kind: set() for kind in self._menus}
        self._shown: dict[NodeKind, frozenset[str]] = {kind: frozenset() for kind in self._menus}
        self.due: float | None = None
        """When the nodes republish for a shape that asked for something new."""
        self.changes = 0
        """How many times the nodes republished because the cluster asked for more."""

    def admitted(self, shape: Hashable, translated: Translated, now: float) -> None:
        """A pod of ``shape`` was converted: its template exists from now on."""
        if self.every or shape in self._read:
            return
        spec = translated.claim_spec
        read = {kind: read_claim_spec(spec, menu) for kind, menu in self._menus.items()}
        self._read[shape] = read
        new = False
        for kind, asks in read.items():
            asked = self._asked[kind]
            if not asks.asked <= asked:
                asked |= asks.asked
                new = new or not asks.asked <= self._shown[kind]
        if new and self.due is None:
            self.due = now + self.latency_s

    def advertised(self, node: NodeSpec, now: float) -> Advertised:
        """What ``node`` advertises: every profile, or what its kind is asked for."""
        if self.every:
            return EVERY_PROFILE
        kind = node_kind(node)
        demand = self._demands[kind]
        demand.observe(ClaimAsks(frozenset(self._asked[kind])), now)
        chosen = demand.advertised(now)
        self._shown[kind] = frozenset(p for p in demand.offered if chosen.allows(p))
        return chosen

    def take_due(self, now: float) -> bool:
        """True when the republish for new asks falls due now (it is then taken)."""
        if self.due is None or self.due > now:
            return False
        self.due = None
        self.changes += 1
        return True
