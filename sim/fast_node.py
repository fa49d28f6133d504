"""A node on the fast path: slices compiled once, reordered in place, instances made directly.

Pods and claims stay plain dicts; the slices are compiled once per kind of node and only
*reordered* when the best-fit order changes (the order comes from the agent's policy, computed
per GPU and cached; tests/sim/test_fast_node.py checks it equals what ``plan_pool`` publishes),
and the kubelet step creates and destroys the instances on the ``SimulatedBackend`` directly.
It decides exactly like :class:`sim.api_node.ApiNode` (tests/sim/test_cluster.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, groupby
from typing import Any

from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.devices import DeviceSpec, SliceSpec, WholeGpu
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.core.identity import DRIVER
from gpu_slicer.sim.kubelet_client import RunningClaim
from gpu_slicer.sim.node import NodeBase, SimClock, parse_device_name
from gpu_slicer.sim.pools import Device, Pool, compile_pool
from gpu_slicer.sim.scenario import NodeSpec, Scenario
from gpu_slicer.slicer.checkpoint import PreparedDevice
from gpu_slicer.slicer.demand import Advertised
from gpu_slicer.slicer.inventory import (
    GpuAdvert,
    GpuState,
    advertise_gpu,
    beside_claims,
    plan_pool,
)
from gpu_slicer.slicer.ordering import (
    DYNAMIC_ORDERS,
    Candidate,
    DeviceOrder,
    Occupancy,
    RepublishLimiter,
)

GpuKey = tuple[int, tuple[Placement, ...], bool]
"""What the order of one GPU depends on: its index, the placements in use on it (sorted) and
whether it is allocated whole."""

Block = tuple[tuple[int, ...], list[str]]
"""One GPU's rank among the node's GPUs and its devices in the policy's order."""


class GpuOrderCache:
    """The agent's policy order, worked out GPU by GPU.

    The policies order GPU by GPU: each GPU's devices are contiguous, and GPUs are sorted by a
    rank computed from the GPU's own state (``gpu_rank``). So a node's order is its GPUs' blocks
    sorted by rank, and when one GPU changes only that GPU's block and rank are worked out
    again (:meth:`block`, kept by :class:`GpuUse` per state of the kind). Equality with the
    order ``plan_pool`` publishes is checked by tests/sim/test_fast_node.py.
    """

    def __init__(self, policy: DeviceOrder, candidates: Sequence[Candidate]) -> None:
        self.policy = policy
        rank = getattr(policy, "gpu_rank", None)
        if rank is None:
            raise TypeError(f"device order {policy.name!r} does not rank GPUs one by one")
        self._rank: Callable[[int, GpuModel, Occupancy], tuple[int, ...]] = rank
        self.by_gpu: dict[int, list[Candidate]] = {}
        for c in candidates:
            self.by_gpu.setdefault(c.gpu_index, []).append(c)

    def block(self, key: GpuKey) -> Block:
        """The rank and device order of one GPU in the state ``key``."""
        gpu, present, whole = key
        local = Occupancy(
            {gpu: present} if present else {}, frozenset({gpu}) if whole else frozenset()
        )
        cands = self.by_gpu[gpu]
        names = [c.name for c in self.policy.order(cands, local)]
        return (self._rank(gpu, cands[0].model, local), names)


class RuledOut:
    """The devices the agent leaves out of one GPU because the GPU's allocations take their
    counters (:func:`slicer.inventory.beside_claims`), worked out once per model, mode and
    state whatever the GPU's index (:class:`GpuUse` keeps each state's answer)."""

    def __init__(self, gpus: Sequence[GpuState], adverts: Mapping[int, GpuAdvert]) -> None:
        self.gpus = {g.index: g for g in gpus}
        self._adverts = adverts
        """Per GPU, every device it could advertise empty (:func:`advertise_gpu`, every profile
        listed, so the devices a claim holds change nothing in it)."""
        self._by_kind: dict[Any, tuple[tuple[Placement, ...], bool]] = {}
        """What a GPU of one model and mode leaves out in one state, whatever its index."""
        self._names: dict[tuple[int, Placement], str] = {}
        """Device names by GPU and placement, spelled once."""

    def of(self, key: GpuKey) -> frozenset[str]:
        gpu, placements, whole = key
        state = self.gpus[gpu]
        kind = (state.info.model, state.mode, placements, whole)
        out = self._by_kind.get(kind)
        if out is None:
            out = self._by_kind[kind] = self._work_out(state, placements, whole)
        slices, whole_out = out
        spelled = self._names
        names = []
        for placement in slices:
            name = spelled.get((gpu, placement))
            if name is None:
                name = spelled[(gpu, placement)] = SliceSpec(gpu, *placement).device_name
            names.append(name)
        if whole_out:
            names.append(WholeGpu(gpu).device_name)
        return frozenset(names)

    def _work_out(
        self, state: GpuState, placements: tuple[Placement, ...], whole: bool
    ) -> tuple[tuple[Placement, ...], bool]:
        gpu = state.index
        held: set[DeviceSpec] = {SliceSpec(gpu, p, s) for p, s in placements}
        if whole:
            held.add(WholeGpu(gpu))
        slices: list[Placement] = []
        whole_out = False
        for name in beside_claims(self._adverts[gpu], frozenset(held)).ruled_out:
            spec = parse_device_name(name)
            if isinstance(spec, SliceSpec):
                slices.append((spec.profile, spec.start))
            else:
                whole_out = True
        return tuple(slices), whole_out


SAME, MORE_LEFT_OUT, LISTED_AGAIN = 0, 1, 2
"""How what one GPU state leaves out compares with another's (:meth:`GpuUse.compared`)."""


class GpuUse:
    """One GPU of a kind of node in one state (:data:`GpuKey`), interned by
    :meth:`NodeKind.use`: what the GPU's order, the devices it leaves out and the devices it
    lists depend on is worked out once and kept on this object, and a node's GPUs are compared
    by identity (a key's placements are never hashed again)."""

    __slots__ = (
        "key",
        "gpu",
        "held",
        "_kind",
        "_block",
        "_ruled_out",
        "_listed",
        "_shown",
        "_after",
        "_compared",
    )

    def __init__(self, key: GpuKey, kind: NodeKind) -> None:
        self.key = key
        self.gpu, placements, whole = key
        held = [SliceSpec(self.gpu, p, s).device_name for p, s in placements]
        if whole:
            held.append(WholeGpu(self.gpu).device_name)
        self.held = frozenset(held)
        """The devices allocated on the GPU in this state."""
        self._kind = kind
        self._block: Block | None = None
        self._ruled_out: frozenset[str] | None = None
        self._listed: dict[str, frozenset[str]] = {}
        self._shown: dict[str, list[str]] = {}
        self._after: dict[tuple[DeviceSpec, bool], GpuUse] = {}
        self._compared: dict[tuple[GpuUse, str], int] = {}

    @property
    def block(self) -> Block:
        """The GPU's rank and devices in the policy's order (a policy that reorders)."""
        if self._block is None:
            assert self._kind.orders is not None
            self._block = self._kind.orders.block(self.key)
        return self._block

    @property
    def order(self) -> list[str]:
        """The GPU's devices in the order the node lists them in this state."""
        if self._kind.orders is None:
            return self._kind.base_blocks[self.gpu]
        return self.block[1]

    @property
    def ruled_out(self) -> frozenset[str]:
        """The devices the allocations on the GPU leave out (:class:`RuledOut`)."""
        if self._ruled_out is None:
            self._ruled_out = self._kind.ruled_out.of(self.key)
        return self._ruled_out

    def left_out(self, choice: str, hidden: frozenset[str]) -> frozenset[str]:
        """Those of :attr:`ruled_out` the agent would list under the choice of profiles named
        ``choice``, which leaves ``hidden`` out: a device ruled out is never allocated, so only
        the choice decides."""
        found = self._listed.get(choice)
        if found is None:
            out = self.ruled_out
            found = self._listed[choice] = out - hidden if out and hidden else out
        return found

    def compared(self, other: GpuUse, choice: str, hidden: frozenset[str]) -> int:
        """How the devices :meth:`left_out` in state ``other`` differ from this state's, under
        the choice ``choice``: :data:`SAME`, :data:`MORE_LEFT_OUT` (only more), or
        :data:`LISTED_AGAIN` (some device this state leaves out is listed there). Kept per pair:
        a node's GPUs step between few states."""
        found = self._compared.get((other, choice))
        if found is None:
            mine, theirs = self.left_out(choice, hidden), other.left_out(choice, hidden)
            found = SAME if mine == theirs else MORE_LEFT_OUT if mine <= theirs else LISTED_AGAIN
            self._compared[(other, choice)] = found
        return found

    def after(self, spec: DeviceSpec, allocated: bool) -> GpuUse:
        """The state of the GPU once ``spec`` (on it) is allocated, or released."""
        found = self._after.get((spec, allocated))
        if found is None:
            _, placements, whole = self.key
            if isinstance(spec, WholeGpu):
                key = (self.gpu, placements, allocated)
            else:
                placement = (spec.profile, spec.start)
                if allocated:
                    changed = tuple(sorted((*placements, placement)))
                else:
                    changed = tuple(p for p in placements if p != placement)
                key = (self.gpu, changed, whole)
            found = self._after[(spec, allocated)] = self._kind.use(key)
        return found

    def shown(self, choice: str, hidden: frozenset[str]) -> list[str]:
        """What the GPU lists in this state under the choice ``choice``: :func:`shown`."""
        found = self._shown.get(choice)
        if found is None:
            found = self._shown[choice] = shown(self.order, self.ruled_out, hidden, self.held)
        return found


def shown(
    order: Iterable[str], ruled_out: frozenset[str], hidden: frozenset[str], held: frozenset[str]
) -> list[str]:
    """The devices of ``order`` the agent lists: whole GPUs, the chosen profiles' (the choice
    leaves ``hidden`` out) and every device ``held`` (never withdrawn from under a claim), less
    those ``ruled_out`` for the allocations beside them."""
    excluded = ruled_out.union(hidden.difference(held)) if hidden else ruled_out
    return [name for name in order if name not in excluded] if excluded else list(order)


class NodeKind:
    """What identical nodes (same GPUs, same mode) share: their compiled pool (every device they
    could advertise), the policy's order cache, each device's MIG profile, the devices
    allocations rule out and the interned states of their GPUs. Their slices differ only in
    names, and no selector gpu-slicer writes reads a GPU's UUID."""

    def __init__(self) -> None:
        self.pool: Pool | None = None
        """Compiled by the first node of the kind that is looked at (:meth:`compile`)."""
        self.orders: GpuOrderCache | None = None
        self.profiles: dict[str, str | None] = {}
        """Each device's MIG profile (None: a whole GPU)."""
        self.base_blocks: dict[int, list[str]] = {}
        """Per GPU, its devices in the compiled pool's order (a policy that never reorders)."""
        self.gpu_order: list[int] = []
        """The GPUs in the compiled pool's order."""
        self._ruled_out: RuledOut | None = None
        self._uses: dict[GpuKey, GpuUse] = {}
        self._hidden: dict[str, frozenset[str]] = {}

    @property
    def ruled_out(self) -> RuledOut:
        assert self._ruled_out is not None, "nothing is allocated before the first look"
        return self._ruled_out

    def use(self, key: GpuKey) -> GpuUse:
        """The one :class:`GpuUse` of ``key``."""
        found = self._uses.get(key)
        if found is None:
            found = self._uses[key] = GpuUse(key, self)
        return found

    def compile(
        self,
        node: str,
        gpus: Sequence[GpuState],
        *,
        device_order: DeviceOrder,
        server_version: tuple[int, int],
    ) -> None:
        """The kind's pool and caches, from one node's inventory run (``gpus`` empty)."""
        plan = plan_pool(node, gpus, server_version=server_version, device_order=device_order)
        compiled = compile_pool(DRIVER, node, plan.slices)
        assert compiled is not None
        adverts = {g.index: advertise_gpu(g) for g in gpus}
        if device_order.name in DYNAMIC_ORDERS:
            # The devices as the agent's policies see them, in the published order.
            seen = {d.name: d.candidate for a in adverts.values() for d in a.devices}
            self.orders = GpuOrderCache(device_order, [seen[name] for name in plan.order])
        for device in compiled.devices:
            spec = parse_device_name(device.name)
            self.profiles[device.name] = spec.profile if isinstance(spec, SliceSpec) else None
            if spec.gpu_index not in self.base_blocks:
                self.gpu_order.append(spec.gpu_index)
            self.base_blocks.setdefault(spec.gpu_index, []).append(device.name)
        runs = [
            gpu for gpu, _ in groupby(parse_device_name(d.name).gpu_index for d in compiled.devices)
        ]
        if len(runs) != len(self.gpu_order):
            raise AssertionError(f"the agent's order splits a GPU's devices (GPUs in turn: {runs})")
        self._ruled_out = RuledOut(gpus, adverts)
        self.pool = compiled

    def node_order(self, uses: Sequence[GpuUse]) -> list[int]:
        """The GPUs of a node whose GPUs are in the states ``uses``, in the node's order."""
        if self.orders is None:
            return list(self.gpu_order)
        return sorted(range(len(uses)), key=lambda i: uses[i].block[0])

    def hidden(self, key: str, choice: Advertised) -> frozenset[str]:
        """The devices whose profile ``choice`` (in words: ``key``) leaves out, allocated or
        not: one set lookup per device then replaces a call of ``allows`` per device and
        look."""
        found = self._hidden.get(key)
        if found is None:
            allows = choice.allows
            found = self._hidden[key] = frozenset(
                name
                for name, profile in self.profiles.items()
                if profile is not None and not allows(profile)
            )
        return found


def devices_changed(before: list[list[str]], after: list[list[str]]) -> frozenset[str] | None:
    """The devices listed in ``after`` and not ``before`` or the other way round, when no
    device listed in both moved (None when one did): GPU by GPU, the GPUs in the same order."""
    if len(before) != len(after):
        return None
    changed: set[str] = set()
    for was, now in zip(before, after, strict=True):
        if was is now:
            continue
        gone, came = set(was), set(now)
        if [n for n in was if n in came] != [n for n in now if n in gone]:
            return None
        changed.update(gone.symmetric_difference(came))
    return frozenset(changed)


NodeKinds = dict[Any, NodeKind]
"""Per kind of node (GPUs, mode), what its nodes share."""


class FastNode(NodeBase):
    """A node whose republishes are settled lazily, when the scheduler next looks at it.

    The limiter sees allocation versions instead of orders; a republish that fell due is applied
    at its due time with the allocations of that moment (nothing changed on the node between).
    What the publisher writes at once, a device that a release lets the allocator pick again,
    is applied at once.

    The node's state is one :class:`GpuUse` per GPU: the allocations now (``uses``), when the
    last republish fell due (``_snapshot``: what the published pool leaves out) and what the
    published order was computed for (``_materialized``; a policy that reorders may be looked
    at without a fresh order)."""

    def __init__(
        self,
        node: NodeSpec,
        *,
        device_order: str,
        scenario: Scenario,
        clock: SimClock,
        kinds: NodeKinds,
    ) -> None:
        super().__init__(node, device_order=device_order, scenario=scenario, clock=clock)
        self.limiter = RepublishLimiter(
            min_interval_s=scenario.republish_min_interval_s,
            quiet_s=min(scenario.republish_quiet_s, scenario.republish_min_interval_s),
            clock=clock,
        )
        """The agent's limiter as :func:`slicer.agent.assemble` sets it up, told allocation
        versions instead of orders."""
        kind = kinds.get((node.gpus, node.mode))
        if kind is None:
            kind = kinds[(node.gpus, node.mode)] = NodeKind()
        self.kind = kind
        self.uses: list[GpuUse] = [kind.use((i, (), False)) for i in range(len(node.models))]
        """Per GPU, what is allocated on it now (kept up to date with ``allocated``)."""
        self.pool: Pool | None = None
        self._names: list[str] | None = None
        """The devices the pool lists now, in its order (None: not published yet)."""
        self._shown_blocks: list[list[str]] = []
        """The pool's devices GPU by GPU, in its order."""
        self._shown_order: list[int] = []
        """The GPUs of ``_shown_blocks``, in that order."""
        self._choice_stale = True
        """The profiles to advertise changed since the pool was last built."""
        self.version = 0
        self._due: float | None = None
        self._snapshot: tuple[GpuUse, ...] = tuple(self.uses)
        """The GPUs' states when the last republish fell due: what the published order is of."""
        self._materialized: tuple[GpuUse, ...] = self._snapshot
        """The GPUs' states the pool's current order was computed for."""
        self._left_out_for: tuple[GpuUse, ...] | None = None
        """The GPUs' states the published pool leaves devices out for (it follows every
        republish, even where the order is looked up later)."""
        self._gpu_order: list[int] = []
        """The GPUs in the pool's current order (by rank in the state ``_materialized``)."""
        self._mig_enabled: list[bool] | None = None
        self._instances: dict[str, list[PreparedDevice]] = {}
        """Per prepared claim (uid), its MIG devices and the instances made for them (what the
        agent's checkpoint would hold)."""
        self._published_tag = "v0"
        self._choice_key = self.choice.text()
        """The choice of profiles in words: what the GPUs' listings are cached under."""
        self._hidden_now: frozenset[str] | None = None
        self._observed: tuple[GpuUse, ...] = self._snapshot
        """The GPUs' states last told to the limiter (the ``name`` order's)."""
        self.limiter.published("v0")

    def advertise(self, choice: Advertised) -> None:
        """The profiles to advertise from now on (the pool follows at the next look)."""
        self.choice = choice
        self._choice_key = choice.text()
        self._choice_stale = True
        self._hidden_now = None

    def _hidden(self) -> frozenset[str]:
        """The devices the choice leaves out (:meth:`NodeKind.hidden`), until it changes."""
        if self._hidden_now is None:
            self._hidden_now = self.kind.hidden(self._choice_key, self.choice)
        return self._hidden_now

    def ensure_pool(self, *, fresh: bool = True) -> Pool:
        """Built on first use, and reordered when a republish happened since the last look;
        listing only the devices of the profiles the cluster asks for (and those allocated)."""
        source = self._first_pool() if self.pool is None else None
        self._settle()
        snapshot = self._snapshot
        reordered = False
        before = self._left_out_for
        if before is not snapshot:
            assert before is not None
            reordered = any(
                now.ruled_out != was.ruled_out
                for now, was in zip(snapshot, before, strict=True)
                if now is not was
            )
            self._left_out_for = snapshot
        if fresh and self.kind.orders is not None and self._materialized is not snapshot:
            # Only the GPUs whose state changed are ranked again (their uses are new).
            gpu_order = self.kind.node_order(snapshot)
            reordered = (
                reordered
                or gpu_order != self._gpu_order
                or any(
                    now is not was and now.block[1] != was.block[1]
                    for now, was in zip(snapshot, self._materialized, strict=True)
                )
            )
            self._gpu_order = gpu_order
            self._materialized = snapshot
        if reordered or self._choice_stale:
            # A new choice is published whether or not the caller wants a fresh order.
            self._choice_stale = False
            blocks = self._shown_now()
            before_blocks = self._shown_blocks
            if len(blocks) != len(before_blocks) or any(
                b is not was for b, was in zip(blocks, before_blocks, strict=True)
            ):
                names = list(chain.from_iterable(blocks))
                same_gpus = self._shown_order == self._gpu_order
                self._shown_blocks, self._shown_order = blocks, self._gpu_order
                if names != self._names:
                    if source is not None:
                        self.pool = self._first_listing(source, names)
                    else:
                        assert self.pool is not None
                        changed = devices_changed(before_blocks, blocks) if same_gpus else None
                        self.pool = self.pool.reordered(names, changed)
                    self._names = names
                    self.publishes += 1
        if self.pool is None:  # a node without GPUs lists nothing
            assert source is not None
            self.pool = self._first_listing(source, [])
        return self.pool

    def _shown_now(self) -> list[list[str]]:
        """The devices the node lists, GPU by GPU in its order: each GPU's order of the state
        ``_materialized``, less what its state ``_snapshot`` rules out and the profiles the
        choice leaves out (but those allocated now)."""
        choice = self._choice_key
        hidden = self._hidden()
        blocks = []
        # A policy that never reorders lists each GPU in one order, whatever its state.
        ordered = self._materialized if self.kind.orders is not None else self._snapshot
        for i in self._gpu_order:
            order, out, now = ordered[i], self._snapshot[i], self.uses[i]
            if order is out is now:
                blocks.append(now.shown(choice, hidden))
            else:
                blocks.append(shown(order.order, out.ruled_out, hidden, now.held))
        return blocks

    def _first_pool(self) -> Pool:
        """What the first publication lists from: the kind's pool, compiled once per kind of
        node (by the first node of the kind looked at, under its name)."""
        kind = self.kind
        if kind.pool is None:
            kind.compile(
                self.name,
                self.view().gpus,
                device_order=self.device_order,
                server_version=self.scenario.kubernetes,
            )
            assert kind.pool is not None
        self._left_out_for = self._snapshot
        self._gpu_order = kind.node_order(self._snapshot)
        return kind.pool

    def _first_listing(self, source: Pool, names: list[str]) -> Pool:
        """The first publication: ``names`` of the kind's pool, as this node's."""
        if source.name == self.name:
            return source.reordered(names)
        return source.clone(self.name, self.name, names)

    def _settle(self) -> None:
        """A republish that fell due before now happened at its due time, with the allocations
        of that moment (nothing changed on this node in between)."""
        if self._due is None or self._due > self.clock.now:
            return
        now = self.clock.now
        self.clock.now = self._due
        self._published_tag = f"v{self.version}"
        self.limiter.published(self._published_tag)
        self.clock.now = now
        self._snapshot = tuple(self.uses)
        self._due = None

    def before_change(self) -> None:
        """Settle a republish that fell due before the allocations change."""
        self._settle()

    def allocate(self, devices: Iterable[Device]) -> None:
        """Record devices allocated on this node (and the state of the GPUs they are on)."""
        for device in devices:
            if device.name not in self.allocated:
                gpu = self._add(device.name)
                self.uses[gpu] = self.uses[gpu].after(self.allocated[device.name], True)

    def deallocate(self, devices: Iterable[Device]) -> None:
        for device in devices:
            spec = self.allocated.get(device.name)
            if spec is not None:
                self._remove((device,))
                self.uses[spec.gpu_index] = self.uses[spec.gpu_index].after(spec, False)

    def allocation_changed(self) -> float | None:
        """Always None: the republish falls due here and is settled when next looked at, or
        happens now when it lists a device again (what the publisher never holds back).

        Only the GPUs whose state changed are looked at: the others leave out what they did."""
        current = tuple(self.uses)
        published = self._snapshot
        choice = self._choice_key
        hidden = self._hidden()
        since_published = [
            was.compared(now, choice, hidden)
            for was, now in zip(published, current, strict=True)
            if was is not now
        ]
        if LISTED_AGAIN in since_published:
            self._published_now(current)
            return None
        if not self.dynamic:
            # The order never moves: only what is left out changes what the agent lists.
            seen = self._observed
            if all(
                was.compared(now, choice, hidden) == SAME
                for was, now in zip(seen, current, strict=True)
                if was is not now
            ):
                return None
            self._observed = current
            if all(found == SAME for found in since_published):
                self.limiter.observe(self._published_tag)  # back to what is published
                self._due = None
                return None
        self.version += 1
        self.limiter.observe(f"v{self.version}")
        due_in = self.limiter.due_in()
        self._due = None if due_in is None else self.clock.now + due_in
        return None

    def _published_now(self, current: tuple[GpuUse, ...]) -> None:
        self.version += 1
        self._published_tag = f"v{self.version}"
        self.limiter.observe(self._published_tag)
        self.limiter.published(self._published_tag)
        self._snapshot = self._observed = current
        self._due = None

    def republish(self) -> bool:
        """Never due (see :meth:`allocation_changed`)."""
        return False

    def prepare(self, prepared: RunningClaim) -> str:
        """What the agent would do: MIG mode switched as needed, the instances created at
        exactly the allocated placements."""
        if self._mig_enabled is None:  # the fast path alone switches MIG modes from here on
            self._mig_enabled = [info.mig_enabled for info in self.backend.gpus()]
        enabled = self._mig_enabled
        for device in prepared.devices:
            spec = parse_device_name(device.name)
            if isinstance(spec, WholeGpu):
                if enabled[spec.gpu_index] and self.modes[spec.gpu_index] == "dynamic":
                    self.backend.set_mig_mode(spec.gpu_index, False)
                    enabled[spec.gpu_index] = False
                continue
            if not enabled[spec.gpu_index]:
                self.backend.set_mig_mode(spec.gpu_index, True)
                enabled[spec.gpu_index] = True
            if isinstance(spec, SliceSpec):
                gi = self.backend.create_gpu_instance(spec.gpu_index, spec.profile, spec.start)
                ci = self.backend.create_compute_instance(spec.gpu_index, gi)
                assert ci.ci_id is not None
                made = self._instances.setdefault(prepared.uid, [])
                made.append(
                    PreparedDevice(
                        (),
                        device.name,
                        spec.gpu_index,
                        spec.profile,
                        spec.start,
                        gi_id=gi,
                        ci_id=ci.ci_id,
                    )
                )
        return ""

    def unprepare(self, prepared: RunningClaim) -> str:
        for made in self._instances.pop(prepared.uid, ()):
            assert made.gi_id is not None and made.ci_id is not None
            self.backend.destroy_compute_instance(made.gpu_index, made.gi_id, made.ci_id)
            self.backend.destroy_gpu_instance(made.gpu_index, made.gi_id)
        return ""

    def prepared_devices(self) -> list[PreparedDevice]:
        return [d for made in self._instances.values() for d in made]

    def problems(self) -> list[str]:
        return self.leaks()

    def close(self) -> None:
        """Nothing to stop: no services run."""
