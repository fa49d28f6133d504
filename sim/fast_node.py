"""A node on the fast path: slices compiled once, reordered in place, instances made directly.

Pods and claims stay plain dicts; the slices are compiled once per kind of node and only
*reordered* when the best-fit order changes (the order comes from the agent's policy, computed
per GPU and cached; tests/sim/test_fast_node.py checks it equals what ``plan_pool`` publishes),
and the kubelet step creates and destroys the instances on the ``SimulatedBackend`` directly.
It decides exactly like :class:`sim.api_node.ApiNode` (tests/sim/test_cluster.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
from gpu_slicer.slicer.inventory import GpuState, advertise_gpu, beside_claims, plan_pool
from gpu_slicer.slicer.ordering import Candidate, DeviceOrder, Occupancy, RepublishLimiter

GpuKey = tuple[int, tuple[Placement, ...], bool]
"""What the order of one GPU depends on: its index, the placements in use on it (sorted) and
whether it is allocated whole."""

Block = tuple[tuple[int, ...], list[str]]
"""One GPU's rank among the node's GPUs and its devices in the policy's order."""


def gpu_key(gpu: int, specs: Iterable[DeviceSpec]) -> GpuKey:
    """The :data:`GpuKey` of ``gpu`` with the devices ``specs`` (of that GPU) allocated."""
    placements: list[Placement] = []
    whole = False
    for spec in specs:
        if isinstance(spec, WholeGpu):
            whole = True
        else:
            placements.append((spec.profile, spec.start))
    return (gpu, tuple(sorted(placements)), whole)


class GpuOrderCache:
    """The agent's policy order, computed per GPU and cached by what is in use on that GPU.

    The policies order GPU by GPU: each GPU's devices are contiguous, and GPUs are sorted by a
    rank computed from the GPU's own state (``gpu_rank``). So a node's order is its GPUs' blocks
    sorted by rank, and when one GPU changes only that GPU's block and rank are looked up again
    (:meth:`block`). One cache serves every identical node. Equality with the order
    ``plan_pool`` publishes is checked by tests/sim/test_fast_node.py.
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
        self._blocks: dict[GpuKey, Block] = {}

    def block(self, key: GpuKey) -> Block:
        """The rank and device order of one GPU in the state ``key``."""
        found = self._blocks.get(key)
        if found is None:
            gpu, present, whole = key
            local = Occupancy(
                {gpu: present} if present else {}, frozenset({gpu}) if whole else frozenset()
            )
            cands = self.by_gpu[gpu]
            names = [c.name for c in self.policy.order(cands, local)]
            found = (self._rank(gpu, cands[0].model, local), names)
            self._blocks[key] = found
        return found

    def blocks(self, keys: Iterable[GpuKey]) -> list[list[str]]:
        """The GPUs' device lists in the node's order, for the GPU states ``keys``."""
        return [names for _, names in sorted(self.block(k) for k in keys)]

    def order(self, occupancy: Occupancy) -> list[str]:
        """The whole node's order for ``occupancy``."""
        keys = []
        for gpu in self.by_gpu:
            present = tuple(sorted(occupancy.placements.get(gpu, ())))
            keys.append((gpu, present, gpu in occupancy.whole_in_use))
        return [name for names in self.blocks(keys) for name in names]


class RuledOut:
    """The devices the agent leaves out of one GPU because the GPU's allocations take their
    counters (:func:`slicer.inventory.beside_claims`), cached by the GPU's state like the order:
    one cache serves every identical node."""

    def __init__(self, gpus: Sequence[GpuState]) -> None:
        self.gpus = {g.index: g for g in gpus}
        self._cache: dict[GpuKey, frozenset[str]] = {}
        self._by_kind: dict[Any, tuple[tuple[Placement, ...], bool]] = {}
        """What a GPU of one model and mode leaves out in one state, whatever its index."""
        self._listed: dict[tuple[GpuKey, str], frozenset[str]] = {}

    def of(self, key: GpuKey) -> frozenset[str]:
        found = self._cache.get(key)
        if found is None:
            gpu, placements, whole = key
            state = self.gpus[gpu]
            kind = (state.info.model, state.mode, placements, whole)
            out = self._by_kind.get(kind)
            if out is None:
                out = self._work_out(state, placements, whole)
                self._by_kind[kind] = out
            slices, whole_out = out
            names = [SliceSpec(gpu, p, s).device_name for p, s in slices]
            if whole_out:
                names.append(WholeGpu(gpu).device_name)
            found = frozenset(names)
            self._cache[key] = found
        return found

    @staticmethod
    def _work_out(
        state: GpuState, placements: tuple[Placement, ...], whole: bool
    ) -> tuple[tuple[Placement, ...], bool]:
        gpu = state.index
        held: set[DeviceSpec] = {SliceSpec(gpu, p, s) for p, s in placements}
        if whole:
            held.add(WholeGpu(gpu))
        keep = frozenset(held)
        slices: list[Placement] = []
        whole_out = False
        for name in beside_claims(advertise_gpu(state, keep=keep), keep).ruled_out:
            spec = parse_device_name(name)
            if isinstance(spec, SliceSpec):
                slices.append((spec.profile, spec.start))
            else:
                whole_out = True
        return tuple(slices), whole_out

    def listed(
        self, key: GpuKey, choice: str, shown: Callable[[Iterable[str]], list[str]]
    ) -> frozenset[str]:
        """Those of :meth:`of` that the agent would list under the choice of profiles named
        ``choice`` (``shown`` filters by it): a device ruled out is never allocated, so only
        the choice decides."""
        found = self._listed.get((key, choice))
        if found is None:
            out = self.of(key)
            found = frozenset(shown(out)) if out else out
            self._listed[(key, choice)] = found
        return found

    def union(self, keys: Iterable[GpuKey]) -> frozenset[str]:
        return frozenset().union(*(self.of(k) for k in keys))


Template = tuple[Pool, GpuOrderCache | None, dict[str, str | None], RuledOut]
"""A kind of node's compiled pool (every device it could advertise), its order cache when the
policy reorders, each device's MIG profile (None: a whole GPU) and its ruled_out."""

Templates = dict[Any, Template]
"""Per kind of node (GPUs, mode): identical nodes share one inventory run; their slices differ
only in names, and no selector gpu-slicer writes reads a GPU's UUID."""


class FastNode(NodeBase):
    """A node whose republishes are settled lazily, when the scheduler next looks at it.

    The limiter sees allocation versions instead of orders; a republish that fell due is applied
    at its due time with the allocations of that moment (nothing changed on the node between).
    What the publisher writes at once, a device that a release lets the allocator pick again,
    is applied at once."""

    def __init__(
        self,
        node: NodeSpec,
        *,
        device_order: str,
        scenario: Scenario,
        clock: SimClock,
        templates: Templates,
    ) -> None:
        super().__init__(node, device_order=device_order, scenario=scenario, clock=clock)
        self.limiter = RepublishLimiter(
            min_interval_s=scenario.republish_min_interval_s,
            quiet_s=min(scenario.republish_quiet_s, scenario.republish_min_interval_s),
            clock=clock,
        )
        """The agent's limiter as :func:`slicer.agent.assemble` sets it up, told allocation
        versions instead of orders."""
        self.templates = templates
        self.gpu_keys: dict[int, GpuKey] = {i: (i, (), False) for i in range(len(node.models))}
        """Per GPU, what its order depends on (kept up to date with ``allocated``)."""
        self.pool: Pool | None = None
        self.orders: GpuOrderCache | None = None
        self._profiles: dict[str, str | None] = {}
        self._hidden_for: tuple[str | None, frozenset[str]] = (None, frozenset())
        """The choice (in words) and the devices it leaves out (:meth:`_hidden`)."""
        """Each device's MIG profile (None: a whole GPU), from the kind's template."""
        self._base: list[str] = []
        """Every device the kind could advertise, in the template's order."""
        self._names: list[str] | None = None
        """The devices the pool lists now, in its order (None: not published yet)."""
        self._choice_stale = True
        """The profiles to advertise changed since the pool was last built."""
        self.version = 0
        self._due: float | None = None
        self._snapshot: tuple[GpuKey, ...] = tuple(self.gpu_keys.values())
        """The GPUs' states when the last republish fell due: what the published order is of."""
        self._materialized: tuple[GpuKey, ...] | None = None
        """The GPUs' states the pool's current order was computed for."""
        self._ruled_out: RuledOut | None = None
        self._left_out: frozenset[str] = frozenset()
        """The devices the published pool leaves out for the allocations beside them."""
        self._left_out_for: tuple[GpuKey, ...] | None = None
        """The GPUs' states ``_left_out`` was computed for (it follows every republish, even
        where the order is looked up later)."""
        self._blocks: list[list[str]] = []
        """The pool's current order, GPU by GPU."""
        self._ranked: list[Block] = []
        """Per GPU (by index), its rank and block in the state ``_materialized``."""
        self._mig_enabled: list[bool] | None = None
        self._instances: dict[str, list[PreparedDevice]] = {}
        """Per prepared claim (uid), its MIG devices and the instances made for them (what the
        agent's checkpoint would hold)."""
        self._published_tag = "v0"
        self._choice_key = self.choice.text()
        """The choice of profiles in words: what :meth:`_gpu_left_out` is cached under."""
        self._observed: tuple[GpuKey, ...] = self._snapshot
        """The GPUs' states last told to the limiter (the ``name`` order's)."""
        self.limiter.published("v0")

    def advertise(self, choice: Advertised) -> None:
        """The profiles to advertise from now on (the pool follows at the next look)."""
        self.choice = choice
        self._choice_key = choice.text()
        self._choice_stale = True

    def ensure_pool(self, *, fresh: bool = True) -> Pool:
        """Built on first use, and reordered when a republish happened since the last look;
        listing only the devices of the profiles the cluster asks for (and those allocated)."""
        if self.pool is None:
            self.pool = self._first_pool()
        self._settle()
        reordered = False
        if self._left_out_for != self._snapshot:
            assert self._ruled_out is not None
            left_out = self._ruled_out.union(self._snapshot)
            reordered = left_out != self._left_out
            self._left_out, self._left_out_for = left_out, self._snapshot
        if fresh and self.orders is not None and self._materialized != self._snapshot:
            # Only the GPUs whose state changed are looked up again (their keys are new).
            before = self._materialized
            assert before is not None
            orders = self.orders
            self._ranked = ranked = [
                block if key is before[i] else orders.block(key)
                for i, (key, block) in enumerate(zip(self._snapshot, self._ranked, strict=True))
            ]
            blocks = [names for _, names in sorted(ranked)]
            reordered = reordered or blocks != self._blocks
            self._blocks = blocks
            self._materialized = self._snapshot
        if reordered or self._choice_stale:
            # A new choice is published whether or not the caller wants a fresh order.
            self._choice_stale = False
            order = [n for b in self._blocks for n in b] if self.orders is not None else self._base
            names = self._shown(order, self._left_out)
            if names != self._names:
                self.pool = self.pool.reordered(names)
                self._names = names
                self.publishes += 1
        return self.pool

    def _shown(self, order: Iterable[str], left_out: frozenset[str]) -> list[str]:
        """The devices of ``order`` the agent advertises: whole GPUs, the chosen profiles' and
        every allocated device (never withdrawn from under a claim), less those ``left_out``
        for the allocations beside them."""
        hidden = self._hidden()
        excluded = left_out.union(hidden.difference(self.allocated)) if hidden else left_out
        return [name for name in order if name not in excluded]

    def _hidden(self) -> frozenset[str]:
        """The devices whose profile the choice leaves out (allocated or not), per choice: one
        set lookup per device then replaces a call of ``allows`` per device and look."""
        if self._hidden_for[0] != self._choice_key:
            allows = self.choice.allows
            hidden = frozenset(
                name
                for name, profile in self._profiles.items()
                if profile is not None and not allows(profile)
            )
            self._hidden_for = (self._choice_key, hidden)
        return self._hidden_for[1]

    def _first_pool(self) -> Pool:
        """The first publication: the kind's template, compiled once per kind of node."""
        key = (self.node.gpus, self.node.mode)
        template = self.templates.get(key)
        if template is None:
            plan = plan_pool(
                self.name,
                self.view().gpus,
                server_version=self.scenario.kubernetes,
                device_order=self.device_order,
            )
            compiled = compile_pool(DRIVER, self.name, plan.slices)
            assert compiled is not None
            orders = (
                GpuOrderCache(self.device_order, self._candidates(plan.order))
                if self.dynamic
                else None
            )
            profiles = {
                d.name: spec.profile
                if isinstance(spec := parse_device_name(d.name), SliceSpec)
                else None
                for d in compiled.devices
            }
            template = (compiled, orders, profiles, RuledOut(self.view().gpus))
            self.templates[key] = template
            pool = compiled
        else:
            pool = template[0].clone(self.name, self.name)
        self._profiles = template[2]
        self._hidden_for = (None, frozenset())
        self._ruled_out = template[3]
        self._base = [d.name for d in pool.devices]
        self._materialized = tuple((i, (), False) for i in range(len(self.node.models)))
        if template[1] is not None:
            self.orders = template[1]
            self._ranked = [self.orders.block(k) for k in self._materialized]
            self._blocks = [names for _, names in sorted(self._ranked)]
        return pool

    def _candidates(self, order: Sequence[str]) -> list[Candidate]:
        models = {i: m for i, m in enumerate(self.node.models)}
        out = []
        for name in order:
            spec = parse_device_name(name)
            model = models[spec.gpu_index]
            profile = model.profile(spec.profile) if isinstance(spec, SliceSpec) else None
            out.append(Candidate(spec, model, profile))
        return out

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
        self._snapshot = tuple(self.gpu_keys.values())
        self._due = None

    def before_change(self) -> None:
        """Settle a republish that fell due before the allocations change."""
        self._settle()

    def allocate(self, devices: Iterable[Device]) -> None:
        """Record devices allocated on this node (and the state of the GPUs they are on)."""
        self._changed({self._add(d.name) for d in devices})

    def deallocate(self, devices: Iterable[Device]) -> None:
        self._changed(self._remove(devices))

    def _changed(self, gpus: Iterable[int]) -> None:
        for gpu in gpus:
            self.gpu_keys[gpu] = gpu_key(
                gpu, (s for s in self.allocated.values() if s.gpu_index == gpu)
            )

    def allocation_changed(self) -> float | None:
        """Always None: the republish falls due here and is settled when next looked at, or
        happens now when it lists a device again (what the publisher never holds back).

        Only the GPUs whose state changed are looked at: the others leave out what they did."""
        current = tuple(self.gpu_keys.values())
        published = self._snapshot
        changed = [
            i for i, (was, now) in enumerate(zip(published, current, strict=True)) if was != now
        ]
        if any(self._gpu_left_out(published[i]) - self._gpu_left_out(current[i]) for i in changed):
            self._published_now(current)
            return None
        if not self.dynamic:
            # The order never moves: only what is left out changes what the agent lists.
            seen = self._observed
            if all(
                self._gpu_left_out(seen[i]) == self._gpu_left_out(current[i])
                for i in range(len(current))
                if seen[i] != current[i]
            ):
                return None
            self._observed = current
            if all(
                self._gpu_left_out(published[i]) == self._gpu_left_out(current[i]) for i in changed
            ):
                self.limiter.observe(self._published_tag)  # back to what is published
                self._due = None
                return None
        self.version += 1
        self.limiter.observe(f"v{self.version}")
        due_in = self.limiter.due_in()
        self._due = None if due_in is None else self.clock.now + due_in
        return None

    def _gpu_left_out(self, key: GpuKey) -> frozenset[str]:
        """The devices the agent would list on one GPU but leaves out, the GPU in state
        ``key``."""
        assert self._ruled_out is not None  # nothing is allocated before the first look
        return self._ruled_out.listed(
            key, self._choice_key, lambda names: self._shown(names, frozenset())
        )

    def _published_now(self, current: tuple[GpuKey, ...]) -> None:
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
