"""The strategies gpu-slicer is compared with, on the same trace.

* ``device-plugin``: no MIG; every pod gets whole GPUs from the device plugin.
* ``static-<layout>``: every GPU partitioned once, in the morning, by a layout (``balanced``,
  ``1g``, ... or one the scenario defines, per GPU); NVIDIA's MIG device plugin hands out
  instances of exactly the profile a pod names.
* ``instaslice``: InstaSlice-style dynamic MIG with its own scheduler: nodes in name order, GPUs
  in index order, the first free placement of the first profile a pod asks for; no fallbacks.
* ``oracle``: an upper bound. It may repack the slices of running pods on a GPU (which real MIG
  cannot do without stopping them), takes the earliest alternative of each chain that fits
  on the node, and puts each slice on the fullest node and GPU that can still host it.

Node choice for the device plugin and static layouts follows the scenario's
``scheduler.nodeRule`` (pack: most used node first; spread: least used first), like the
scheduler's scoring; ties go by node name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.sim.demand import Demand, DemandBook, min_memory_slices, offers
from gpu_slicer.sim.event_loop import GpuLedger, Held, Slot, Strategy
from gpu_slicer.sim.geometry import free_placements, pack, resolve_profile
from gpu_slicer.sim.scenario import NodeSpec, PodSpec, Scenario
from gpu_slicer.slicer.inventory import effective_mode
from gpu_slicer.webhook.claims import Alternative


class NodeOrder:
    """Nodes ordered by how many memory slices they use (pack: most first), kept incrementally."""

    def __init__(self, nodes: Sequence[str], rule: str) -> None:
        self.rule = rule
        self.used: dict[str, int] = {n: 0 for n in nodes}
        self.buckets: dict[int, list[str]] = {0: sorted(nodes)}

    def change(self, node: str, delta: int) -> None:
        if not delta:
            return
        before = self.used[node]
        after = before + delta
        self.used[node] = after
        bucket = self.buckets[before]
        bucket.remove(node)
        if not bucket:
            del self.buckets[before]
        target = self.buckets.setdefault(after, [])
        # keep name order inside a bucket
        lo, hi = 0, len(target)
        while lo < hi:
            mid = (lo + hi) // 2
            if target[mid] < node:
                lo = mid + 1
            else:
                hi = mid
        target.insert(lo, node)

    def __iter__(self) -> Iterator[str]:
        levels = sorted(self.buckets, reverse=self.rule == "pack")
        for level in levels:
            yield from list(self.buckets[level])

    def levels_up_to(self, most_used: int) -> list[list[str]]:
        """The nodes in order, level by level, leaving out those using more than ``most_used``
        memory slices (whole levels at once: a scheduler skips nodes without enough free
        slices). The levels must not change while they are walked."""
        ordered = sorted(self.buckets, reverse=self.rule == "pack")
        return [self.buckets[level] for level in ordered if level <= most_used]


def gpu_modes(node: NodeSpec) -> list[str]:
    return [effective_mode(node.mode, m) for m in node.models]


@dataclass
class _Gpu:
    node: str
    index: int
    model: GpuModel
    mode: str
    holders: dict[str, list[Placement]] = field(default_factory=dict)
    whole_by: str | None = None

    def present(self) -> tuple[Placement, ...]:
        return tuple(sorted(p for ps in self.holders.values() for p in ps))

    def used(self) -> int:
        if self.whole_by is not None:
            return self.model.memory_slices
        return sum(self.model.profile(p).memory_slices for p, _ in self.present())

    def empty(self) -> bool:
        return self.whole_by is None and not self.holders


class _ClusterStrategy(Strategy):
    """Shared state of the baselines: GPUs per node and the node order."""

    def __init__(self, scenario: Scenario, book: DemandBook) -> None:
        super().__init__(scenario)
        self.book = book
        self.gpus: dict[str, list[_Gpu]] = {
            n.name: [
                _Gpu(n.name, i, m, mode)
                for i, (m, mode) in enumerate(zip(n.models, gpu_modes(n), strict=True))
            ]
            for n in scenario.nodes
        }
        self.order = NodeOrder([n.name for n in scenario.nodes], scenario.node_rule)
        self.changes: list[str] = []
        self.failed_at: dict[Any, int] = {}
        self.capacity = {n.name: sum(m.memory_slices for m in n.models) for n in scenario.nodes}
        self._models = list({m.key: m for n in scenario.nodes for m in n.models}.values())
        self._need: dict[Demand, int] = {}

    def _room(self, node: str, demand: Demand) -> bool:
        """A node with fewer free memory slices than the demand's smallest form cannot host it."""
        need = self._need.get(demand)
        if need is None:
            need = self._need[demand] = min_memory_slices(demand, self._models)
        return self.capacity[node] - self.order.used[node] >= need

    def _nodes(self, demand: Demand, by_name: bool = False) -> tuple[list[str] | NodeOrder, int]:
        """Nodes to try for ``demand``: all of them, in order, or, once it fitted nowhere, only
        the nodes that changed since (the others still cannot host it). Returns the mark to
        record with :meth:`_failed` when none fits."""
        mark = len(self.changes)
        since = self.failed_at.get(demand)
        if since is None:
            return (sorted(self.gpus) if by_name else self.order), mark
        changed = set(self.changes[since:])
        if by_name:
            return sorted(changed), mark
        used = self.order.used
        sign = -1 if self.order.rule == "pack" else 1
        return sorted(changed, key=lambda n: (sign * used[n], n)), mark

    def _failed(self, demand: Demand, mark: int) -> None:
        self.failed_at[demand] = mark

    def _commit(self, pod: PodSpec, node: str, slots: list[Slot]) -> Held:
        gpus = self.gpus[node]
        delta = 0
        for slot in slots:
            gpu = gpus[slot.gpu]
            before = gpu.used()
            if slot.profile is None:
                gpu.whole_by = pod.name
            else:
                gpu.holders.setdefault(pod.name, []).append((slot.profile, slot.start))
            delta += gpu.used() - before
        self.order.change(node, delta)
        self.changes.append(node)
        return Held(node, tuple(slots))

    def gpu_can_use(self, ledger: GpuLedger, alt: Alternative) -> bool:
        if not _mode_allows(self.gpus[ledger.node][ledger.index], alt):
            return False
        return super().gpu_can_use(ledger, alt)

    def release(self, pod: PodSpec, held: Held, now: float) -> None:
        gpus = self.gpus[held.node]
        delta = 0
        for index in {s.gpu for s in held.slots}:
            gpu = gpus[index]
            before = gpu.used()
            if gpu.whole_by == pod.name:
                gpu.whole_by = None
            removed = gpu.holders.pop(pod.name, [])
            self.destructions += len(removed) if self._counts_mig else 0
            delta += gpu.used() - before
        self.order.change(held.node, delta)
        self.changes.append(held.node)

    _counts_mig = False


class DevicePluginStrategy(_ClusterStrategy):
    name = "device-plugin"
    description = "whole GPUs through the device plugin (no MIG)"

    def demand(self, pod: PodSpec) -> Demand:
        return self.book.whole_gpus(pod)

    def place(self, pod: PodSpec, now: float) -> Held | None:
        demand = self.demand(pod)
        count = sum(r[0].count for r in demand)
        nodes, mark = self._nodes(demand)
        for node in nodes:
            if not self._room(node, demand):
                continue
            free = [g.index for g in self.gpus[node] if g.empty()]
            if len(free) >= count:
                return self._commit(pod, node, [Slot(i, None) for i in free[:count]])
        self._failed(demand, mark)
        return None

    def gpu_can_use(self, ledger: GpuLedger, alt: Alternative) -> bool:
        return not ledger.held


class StaticStrategy(_ClusterStrategy):
    """Instances made once by a layout; pods get exactly the profile they name."""

    def __init__(self, scenario: Scenario, book: DemandBook, layout: str) -> None:
        super().__init__(scenario, book)
        self.name = f"static-{layout}"
        spec = scenario.layouts[layout]
        self.description = f"static MIG layout '{layout}' made in the morning"
        self.instances: dict[tuple[str, int], tuple[Placement, ...] | None] = {}
        for node in scenario.nodes:
            for index, model in enumerate(node.models):
                if spec.placements is not None:  # exact instances, as the agent's layout file
                    placed = spec.placements.for_gpu(index)
                    self.instances[(node.name, index)] = None if placed is None else placed
                    self.creations += len(placed or ())
                    continue
                kinds = spec.for_gpu(node.name, index)
                if kinds is None:
                    self.instances[(node.name, index)] = None
                    continue
                names = []
                for kind in kinds:
                    profile = resolve_profile(model, kind)
                    assert profile is not None  # checked when the scenario was loaded
                    names.append(profile.name)
                layout_placements = pack(model, tuple(sorted(names)))
                assert layout_placements is not None
                self.instances[(node.name, index)] = layout_placements
                self.creations += len(layout_placements)
        self.notes.append(f"{self.creations} MIG instances created up front by the layout")

    def demand(self, pod: PodSpec) -> Demand:
        return self.book.static(pod)

    def _free(self, node: str, index: int) -> list[Placement]:
        layout = self.instances[(node, index)]
        if layout is None:
            return []
        taken = set(self.gpus[node][index].present())
        return [p for p in layout if p not in taken]

    def place(self, pod: PodSpec, now: float) -> Held | None:
        demand = self.demand(pod)
        if not demand:
            return None
        nodes, mark = self._nodes(demand)
        for node in nodes:
            slots = self._fit(node, demand)
            if slots is not None:
                return self._commit(pod, node, slots)
        self._failed(demand, mark)
        return None

    def _fit(self, node: str, demand: Demand) -> list[Slot] | None:
        slots: list[Slot] = []
        taken: set[tuple[int, Placement]] = set()
        whole_taken: set[int] = set()
        for request in demand:
            alt = request[0]
            need = alt.count
            for gpu in self.gpus[node]:
                if need == 0:
                    break
                if alt.kind == "gpu":
                    if (
                        self.instances[(node, gpu.index)] is None
                        and gpu.empty()
                        and gpu.index not in whole_taken
                    ):
                        whole_taken.add(gpu.index)
                        slots.append(Slot(gpu.index, None))
                        need -= 1
                    continue
                for placement in self._free(node, gpu.index):
                    if need == 0:
                        break
                    if placement[0] == alt.profile and (gpu.index, placement) not in taken:
                        taken.add((gpu.index, placement))
                        slots.append(Slot(gpu.index, placement[0], placement[1]))
                        need -= 1
            if need:
                return None
        return slots

    def gpu_can_use(self, ledger: GpuLedger, alt: Alternative) -> bool:
        key = (ledger.node, ledger.index)
        if alt.kind == "gpu":
            return self.instances[key] is None and not ledger.held
        return any(p[0] == alt.profile for p in self._free(ledger.node, ledger.index))

    def state_key(self, ledger: GpuLedger) -> Any:
        return self.instances[(ledger.node, ledger.index)]


def _mode_allows(gpu: _Gpu, alt: Alternative) -> bool:
    if alt.kind == "gpu":
        return gpu.mode in ("dynamic", "full")
    return (
        gpu.mode in ("dynamic", "mig")
        and alt.profile is not None
        and gpu.model.has_profile(alt.profile)
    )


def _profile_on(model: GpuModel, alt: Alternative) -> str | None:
    """The MIG profile ``alt`` takes on a GPU of ``model``: its own; for a tier of a memory
    chain, the model's profile in it with enough memory; for a whole GPU asked as a MIG device
    (``gpu-mig``), the model's profile that spans the GPU; None when there is none."""
    if alt.profile is not None:
        return alt.profile if model.has_profile(alt.profile) else None
    return next((p for p in alt.any_of or alt.full_gpu if offers(model, alt, p)), None)


def _oracle_allows(gpu: _Gpu, alt: Alternative) -> bool:
    """What gpu-slicer itself allows: every alternative of the chain, ``gpu-mig`` included (the
    other baselines model the device plugin, which has no such thing)."""
    if alt.kind == "gpu":
        return gpu.mode in ("dynamic", "full")
    return gpu.mode in ("dynamic", "mig") and _profile_on(gpu.model, alt) is not None


class InstaSliceStrategy(_ClusterStrategy):
    name = "instaslice"
    description = "InstaSlice-style: own scheduler, first free placement, first profile only"
    _counts_mig = True

    def demand(self, pod: PodSpec) -> Demand:
        return self.book.first_choice(pod)

    def place(self, pod: PodSpec, now: float) -> Held | None:
        demand = self.demand(pod)
        if not demand:
            return None
        nodes, mark = self._nodes(demand, by_name=True)
        for node in nodes:
            if not self._room(node, demand):
                continue
            slots = self._fit(node, demand)
            if slots is not None:
                self.creations += sum(1 for s in slots if s.profile is not None)
                return self._commit(pod, node, slots)
        self._failed(demand, mark)
        return None

    def _fit(self, node: str, demand: Demand) -> list[Slot] | None:
        slots: list[Slot] = []
        extra: dict[int, list[Placement]] = {}
        whole: set[int] = set()
        for request in demand:
            alt = request[0]
            for _ in range(alt.count):
                slot = self._first(node, alt, extra, whole)
                if slot is None:
                    return None
                slots.append(slot)
        return slots

    def _first(
        self, node: str, alt: Alternative, extra: dict[int, list[Placement]], whole: set[int]
    ) -> Slot | None:
        for gpu in self.gpus[node]:
            if not _mode_allows(gpu, alt) or gpu.index in whole or gpu.whole_by is not None:
                continue
            if alt.kind == "gpu":
                if gpu.empty() and not extra.get(gpu.index):
                    whole.add(gpu.index)
                    return Slot(gpu.index, None)
                continue
            assert alt.profile is not None
            present = list(gpu.present()) + extra.get(gpu.index, [])
            options = [
                p for p in free_placements(gpu.model, tuple(sorted(present))) if p[0] == alt.profile
            ]
            if options:
                chosen = min(options, key=lambda p: p[1])
                extra.setdefault(gpu.index, []).append(chosen)
                return Slot(gpu.index, chosen[0], chosen[1])
        return None


class OracleStrategy(_ClusterStrategy):
    name = "oracle"
    description = "upper bound: repacks running slices, fullest node and GPU first"
    _counts_mig = True

    def __init__(self, scenario: Scenario, book: DemandBook) -> None:
        super().__init__(scenario, book)
        # Consolidate whatever the scheduler's rule: keeping GPUs and nodes empty for large
        # requests is part of what makes this a bound.
        self.order = NodeOrder([n.name for n in scenario.nodes], "pack")
        self._tops: dict[Demand, int] = {}
        kinds: dict[tuple[str, str], _Gpu] = {}
        for gpus in self.gpus.values():
            for gpu in gpus:
                kinds.setdefault((gpu.model.key, gpu.mode), gpu)
        self._kinds = list(kinds.values())

    def demand(self, pod: PodSpec) -> Demand:
        return self.book.chains(pod)

    def gpu_can_use(self, ledger: GpuLedger, alt: Alternative) -> bool:
        gpu = self.gpus[ledger.node][ledger.index]
        if not _oracle_allows(gpu, alt):
            return False
        if alt.kind == "gpu":
            return not ledger.held
        profile = _profile_on(gpu.model, alt)
        if profile is None or ledger.whole:
            return False
        profiles = tuple(sorted([p for p, _ in ledger.placements()] + [profile]))
        return pack(ledger.model, profiles) is not None

    def place(self, pod: PodSpec, now: float) -> Held | None:
        demand = self.demand(pod)
        if not demand:
            return None
        best: tuple[int, str, dict[int, list[str]], list[int]] | None = None
        top = self._top(demand)
        nodes, mark = self._nodes(demand)
        for node in nodes:
            if not self._room(node, demand):
                continue
            found = self._fit(node, demand)
            if found is None:
                continue
            score, adds, wholes = found
            if best is None or score > best[0]:
                best = (score, node, adds, wholes)
            if score == top:
                break
        if best is None:
            self._failed(demand, mark)
            return None
        _, node, adds, wholes = best
        return self._apply(pod, node, adds, wholes)

    def _top(self, demand: Demand) -> int:
        """The best score any node could give: alternatives no GPU of the cluster can ever host
        (a profile of another model, a whole GPU where every GPU runs MIG) do not count."""
        found = self._tops.get(demand)
        if found is None:
            found = 0
            for request in demand:
                for index, alt in enumerate(request):
                    if any(_oracle_allows(g, alt) for g in self._kinds):
                        found += 8 - index
                        break
            self._tops[demand] = found
        return found

    def _fit(self, node: str, demand: Demand) -> tuple[int, dict[int, list[str]], list[int]] | None:
        adds: dict[int, list[str]] = {}
        wholes: list[int] = []
        score = 0
        for request in demand:
            for index, alt in enumerate(request):
                trial_adds = {k: list(v) for k, v in adds.items()}
                trial_wholes = list(wholes)
                if self._fit_alt(node, alt, trial_adds, trial_wholes):
                    adds, wholes = trial_adds, trial_wholes
                    score += 8 - index
                    break
            else:
                return None
        return score, adds, wholes

    def _fit_alt(
        self, node: str, alt: Alternative, adds: dict[int, list[str]], wholes: list[int]
    ) -> bool:
        for _ in range(alt.count):
            choice: tuple[int, int, str] | None = None
            for gpu in self.gpus[node]:
                if not _oracle_allows(gpu, alt) or gpu.whole_by is not None or gpu.index in wholes:
                    continue
                if alt.kind == "gpu":
                    if gpu.empty() and not adds.get(gpu.index):
                        choice = (0, gpu.index, "")
                        break
                    continue
                profile = _profile_on(gpu.model, alt)
                assert profile is not None
                profiles = [p for p, _ in gpu.present()] + adds.get(gpu.index, []) + [profile]
                if pack(gpu.model, tuple(sorted(profiles))) is None:
                    continue
                free_after = gpu.model.memory_slices - sum(
                    gpu.model.profile(p).memory_slices for p in profiles
                )
                if choice is None or free_after < choice[0]:
                    choice = (free_after, gpu.index, profile)
            if choice is None:
                return False
            if alt.kind == "gpu":
                wholes.append(choice[1])
            else:
                adds.setdefault(choice[1], []).append(choice[2])
        return True

    def _apply(
        self, pod: PodSpec, node: str, adds: dict[int, list[str]], wholes: list[int]
    ) -> Held:
        gpus = self.gpus[node]
        slots: list[Slot] = [Slot(i, None) for i in wholes]
        moves: dict[str, Held] = {}
        for index, profiles in adds.items():
            gpu = gpus[index]
            placed = _placed_around(gpu, profiles)
            if placed is not None:
                slots.extend(Slot(index, p, s) for p, s in placed)
                continue
            slots.extend(self._repack(node, gpu, profiles, moves))
        if moves:
            for holder in moves:
                held_slots = tuple(
                    [Slot(g.index, None) for g in gpus if g.whole_by == holder]
                    + [Slot(g.index, p, s) for g in gpus for p, s in g.holders.get(holder, [])]
                )
                moves[holder] = Held(node, held_slots)
            self.mover(moves)
        self.creations += sum(1 for s in slots if s.profile is not None)
        return self._commit(pod, node, slots)

    def _repack(
        self, node: str, gpu: _Gpu, profiles: list[str], moves: dict[str, Held]
    ) -> list[Slot]:
        """Repack the GPU: every running slice may move (each move a destruction and a
        creation, its holder added to ``moves``); returns the slots of ``profiles``."""
        everything = tuple(sorted([p for p, _ in gpu.present()] + profiles))
        layout = pack(gpu.model, everything)
        assert layout is not None
        remaining = list(layout)
        keep: dict[str, list[Placement]] = {}
        for holder, ps in gpu.holders.items():
            for placement in ps:
                if placement in remaining:
                    remaining.remove(placement)
                    keep.setdefault(holder, []).append(placement)
        for holder, ps in gpu.holders.items():
            for placement in ps:
                if placement in keep.get(holder, []):
                    continue
                target = next(r for r in remaining if r[0] == placement[0])
                remaining.remove(target)
                keep.setdefault(holder, []).append(target)
                self.destructions += 1
                self.creations += 1
                moves[holder] = Held(node, ())
        gpu.holders = keep
        slots = []
        for profile in profiles:
            target = next(r for r in remaining if r[0] == profile)
            remaining.remove(target)
            slots.append(Slot(gpu.index, target[0], target[1]))
        return slots


def _placed_around(gpu: _Gpu, profiles: list[str]) -> list[Placement] | None:
    """Placements for ``profiles`` next to what runs on the GPU (the highest start free for
    each in turn), or None when one does not fit without moving a running slice."""
    present = list(gpu.present())
    placed: list[Placement] = []
    for profile in profiles:
        options = [
            p
            for p in free_placements(gpu.model, tuple(sorted(present + placed)))
            if p[0] == profile
        ]
        if not options:
            return None
        placed.append(max(options, key=lambda p: p[1]))
    return placed


def baseline(name: str, scenario: Scenario, book: DemandBook) -> Strategy:
    if name == "device-plugin":
        return DevicePluginStrategy(scenario, book)
    if name == "instaslice":
        return InstaSliceStrategy(scenario, book)
    if name == "oracle":
        return OracleStrategy(scenario, book)
    if name.startswith("static-"):
        return StaticStrategy(scenario, book, name[len("static-") :])
    raise KeyError(name)
