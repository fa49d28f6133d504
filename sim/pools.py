"""Published devices as the scheduler's allocator sees them: ResourceSlices compiled into pools.

A pool is grouped by (driver, pool name); only the newest generation counts, and a pool whose
newest generation has fewer slices than ``resourceSliceCount`` is *incomplete* and left out.
Pools are in the scheduler's order (driver then name), slices by name, devices in listed order.

Everything here is pure. ``compile_pools`` turns ResourceSlices into :class:`Pool` objects once;
the cluster keeps them until the slices change, so CEL results cached on each :class:`Device`
survive across scheduling attempts (:mod:`sim.allocator` searches them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_slicer.kube.device_cel import DeviceView
from gpu_slicer.kube.quantity import exact_value

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_keys, dict_values

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]
"""(driver, pool, device name): what identifies an allocated device cluster-wide."""
CounterKey = tuple[str, str]
"""(counter set, counter) inside one pool."""


class Device:
    """One device of a published pool. Attributes are parsed on first use (most devices are
    only ever matched through cached selector results), then kept with their CEL results."""

    __slots__ = (
        "driver",
        "pool",
        "name",
        "slice_name",
        "consumes",
        "taints",
        "raw",
        "_view",
        "_qualified",
        "counter_sets",
        "needs",
        "key",
    )

    def __init__(
        self,
        driver: str,
        pool: str,
        name: str,
        slice_name: str,
        consumes: tuple[tuple[CounterKey, int], ...],
        taints: tuple[Obj, ...],
        raw: Obj,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.name = name
        self.slice_name = slice_name
        self.consumes = consumes
        self.taints = taints
        self.raw = raw
        self._view: DeviceView | None = None
        self._qualified: dict[str, Any] | None = None
        self.counter_sets = frozenset(c[0] for c, _ in consumes)
        self.needs = dict(consumes)
        self.key: DeviceKey = (driver, pool, name)
        """(driver, pool, name): what identifies the device cluster-wide."""

    def twin(self, pool: str) -> Device:
        """The same device in another pool (an identical node): everything but the pool name
        is shared, parsed attributes and counter needs included (a large cluster holds
        hundreds of thousands of devices)."""
        twin = Device.__new__(Device)
        twin.driver = self.driver
        twin.pool = pool
        twin.name = self.name
        twin.slice_name = self.slice_name
        twin.consumes = self.consumes
        twin.taints = self.taints
        twin.raw = self.raw
        twin._view = self.view
        twin._qualified = self._qualified
        twin.counter_sets = self.counter_sets
        twin.needs = self.needs
        twin.key = (self.driver, pool, self.name)
        return twin

    @property
    def qualified(self) -> dict[str, Any]:
        """Attributes by fully qualified name (``gpu-slicer.io/profile``), for matchAttribute."""
        if self._qualified is None:
            attributes = self.view.attributes
            self._qualified = {
                f"{domain}/{ident}": value
                for domain, values in attributes.items()
                for ident, value in values.items()
            }
        return self._qualified

    @property
    def view(self) -> DeviceView:
        if self._view is None:
            self._view = DeviceView(self.driver, self.raw)
        return self._view


class CandidateList:
    """Devices that pass a request's selectors, in search order, cut into segments of
    consecutive devices drawing on the same counter sets. What every device of a segment needs
    at least (per counter) is worked out the first time the search reaches the segment, so the
    search can skip a whole GPU whose counters are exhausted without looking at each device:
    the outcome is the same."""

    __slots__ = ("devices", "bounds", "known_needs", "_shared", "_universe")

    def __init__(
        self,
        devices: list[Device],
        bounds: dict[int, int],
        shared: dict[Any, tuple[tuple[CounterKey, int], ...]] | None = None,
        universe: Callable[[], list[Device]] | None = None,
    ) -> None:
        self.devices = devices
        self.bounds = bounds
        """start position -> end position of each segment that draws on counters."""
        self.known_needs: dict[int, tuple[tuple[str, str], tuple[tuple[CounterKey, int], ...]]] = {}
        """What :meth:`needs` found so far, by segment start."""
        self._shared = shared if shared is not None else {}
        self._universe = universe
        """Every device the list could hold, listed or not, made only when ``shared`` lacks an
        answer: it is worked out over them, so it holds for every subset a node publishes
        (allocations rule devices out)."""

    @classmethod
    def of(
        cls,
        devices: list[Device],
        shared: dict[Any, tuple[tuple[CounterKey, int], ...]] | None = None,
        universe: Callable[[], list[Device]] | None = None,
    ) -> CandidateList:
        bounds: dict[int, int] = {}
        start = 0
        count = len(devices)
        while start < count:
            first = devices[start]
            sets = first.counter_sets
            pool = first.pool
            end = start + 1
            while end < count:
                device = devices[end]
                if device.pool != pool or (
                    device.counter_sets is not sets and device.counter_sets != sets
                ):
                    break
                end += 1
            if sets:
                bounds[start] = end
            start = end
        return cls(devices, bounds, shared, universe)

    def needs(self, start: int) -> tuple[tuple[str, str], tuple[tuple[CounterKey, int], ...]]:
        """What every device of the segment at ``start`` needs at least. Computed over all the
        devices the list could hold on the same counter sets (a superset of the segment, so
        never more than the segment's own minimum) and shared by every reordering and subset of
        the list."""
        found = self.known_needs.get(start)
        if found is None:
            first = self.devices[start]
            needs = self._shared.get(first.counter_sets)
            if needs is None:
                merged: dict[CounterKey, int] | None = None
                every = self._universe() if self._universe is not None else self.devices
                for device in every:
                    if device.counter_sets != first.counter_sets:
                        continue
                    mine = device.needs
                    if merged is None:
                        merged = dict(mine)
                    else:
                        merged = {
                            c: v if v <= mine.get(c, 0) else mine[c]
                            for c, v in merged.items()
                            if c in mine
                        }
                needs = tuple((c, v) for c, v in (merged or {}).items() if v > 0)
                self._shared[first.counter_sets] = needs
            found = ((first.driver, first.pool), needs)
            self.known_needs[start] = found
        return found


class Twins(dict[str, Device]):
    """A node's devices by name, each the twin of an identical node's device (:meth:`Device.twin`)
    made when first looked up: a node lists a few of the devices its kind could advertise (the
    profiles the cluster asks for), and a large cluster has a thousand nodes. Lookups of devices
    already made run at a dict's speed; everything else answers for every device of the source,
    as a complete mapping would."""

    def __init__(self, source: Mapping[str, Device], pool: str) -> None:
        super().__init__()
        self._source = source
        self._pool = pool

    def __missing__(self, name: str) -> Device:
        twin = self[name] = self._source[name].twin(self._pool)
        return twin

    def _complete(self) -> Twins:
        """Every device made, in the source's order."""
        if dict.__len__(self) < len(self._source):
            made = dict(dict.items(self))
            self.clear()
            for name, device in self._source.items():
                found = made.get(name)
                self[name] = found if found is not None else device.twin(self._pool)
        return self

    def __contains__(self, name: object) -> bool:
        return name in self._source

    def __iter__(self) -> Iterator[str]:
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self._source else default

    def keys(self) -> dict_keys[str, Device]:
        return dict.keys(self._complete())

    def values(self) -> dict_values[str, Device]:
        return dict.values(self._complete())

    def items(self) -> dict_items[str, Device]:
        return dict.items(self._complete())


@dataclass(eq=False)
class Pool:
    """The devices of one (driver, pool) in the scheduler's order, and the pool's counters."""

    driver: str
    name: str
    generation: int
    node_name: str | None
    """None for a pool that serves every node (``allNodes``)."""
    devices: list[Device]
    counters: dict[CounterKey, int]
    by_name: dict[str, Device] = field(default_factory=dict)
    candidates: dict[tuple[str, ...], CandidateList] = field(default_factory=dict)
    """Devices passing a set of selectors, per set: valid as long as the pool is."""
    members: dict[tuple[str, ...], frozenset[str]] = field(default_factory=dict)
    """Names of the devices passing each set of selectors, among every device of ``by_name``:
    the same for every order and subset the node lists, so shared (not copied) by every
    reordering of the pool."""
    needs: dict[tuple[str, ...], dict[Any, tuple[tuple[CounterKey, int], ...]]] = field(
        default_factory=dict
    )
    """Per selector set, the least a device on each counter set needs: the same for every
    order of the same devices, and for every identical node."""

    def __post_init__(self) -> None:
        if not self.by_name:
            self.by_name = {d.name: d for d in self.devices}

    def clone(self, name: str, node_name: str | None, names: Sequence[str]) -> Pool:
        """The devices named in ``names``, for another pool (an identical node), as the next
        generation: devices share their slice entries and selector results with this pool's,
        and are made only once the node lists them (:class:`Twins`)."""
        return self._next(name, node_name, Twins(self.by_name, name), names)

    def reordered(self, names: Sequence[str], changed: frozenset[str] | None = None) -> Pool:
        """Devices of this pool's node in a new order, all or some (a republish that reorders,
        or lists only the profiles the cluster asks for), as the next generation; selector
        results carry over (``members``, shared).

        ``changed``, when given, says that the new list is this one with exactly those devices
        added or taken out, none moved: then the candidate lists of the selector sets that no
        changed device passes are the same lists, and carry over too."""
        pool = self._next(self.name, self.node_name, self.by_name, names)
        if changed is not None:
            members = self.members
            pool.candidates = {
                key: found
                for key, found in self.candidates.items()
                if members[key].isdisjoint(changed)
            }
        return pool

    def _next(
        self,
        name: str,
        node_name: str | None,
        by_name: dict[str, Device],
        names: Sequence[str],
    ) -> Pool:
        """The next generation listing ``names`` of ``by_name``, sharing this pool's counters
        and what its selectors matched."""
        pool = Pool(
            self.driver,
            name,
            self.generation + 1,
            node_name,
            list(map(by_name.__getitem__, names)),  # a Twins makes what it lacks
            self.counters,
            by_name=by_name,
        )
        pool.members = self.members
        pool.needs = self.needs
        return pool


@dataclass
class AllocatedDevices:
    """Devices already allocated and the counters they consume, kept up to date incrementally."""

    devices: set[DeviceKey] = field(default_factory=set)
    counters: dict[tuple[str, str], dict[CounterKey, int]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    consumption: dict[DeviceKey, tuple[tuple[CounterKey, int], ...]] = field(default_factory=dict)

    def add(self, device: Device) -> None:
        key = device.key
        if key in self.devices:
            return
        self.devices.add(key)
        self.consumption[key] = device.consumes
        used = self.counters[(device.driver, device.pool)]
        for counter, value in device.consumes:
            used[counter] = used.get(counter, 0) + value

    def remove(self, key: DeviceKey) -> None:
        if key not in self.devices:
            return
        self.devices.discard(key)
        used = self.counters[(key[0], key[1])]
        for counter, value in self.consumption.pop(key, ()):
            used[counter] = used.get(counter, 0) - value

    def used(self, driver: str, pool: str) -> dict[CounterKey, int]:
        return self.counters.get((driver, pool), {})


# --- compiling ResourceSlices -------------------------------------------------------------


def _compile_device(driver: str, pool: str, slice_name: str, raw: Obj) -> Device:
    consumes: list[tuple[CounterKey, int]] = []
    for entry in raw.get("consumesCounters") or []:
        counter_set = entry["counterSet"]
        for counter, value in (entry.get("counters") or {}).items():
            amount = exact_value(value.get("value") if isinstance(value, Mapping) else value)
            consumes.append(((counter_set, counter), int(amount)))
    return Device(
        driver, pool, raw["name"], slice_name, tuple(consumes), tuple(raw.get("taints") or ()), raw
    )


def compile_pools(slices: Iterable[Obj]) -> list[Pool]:
    """ResourceSlices -> complete pools in the scheduler's order; incomplete pools are left out."""
    grouped: dict[tuple[str, str], list[Obj]] = defaultdict(list)
    for item in slices:
        spec = item.get("spec") or {}
        grouped[(spec["driver"], spec["pool"]["name"])].append(item)
    pools: list[Pool] = []
    for (driver, name), items in sorted(grouped.items()):
        pool = compile_pool(driver, name, items)
        if pool is not None:
            pools.append(pool)
    return pools


def compile_pool(driver: str, name: str, items: Sequence[Obj]) -> Pool | None:
    """One pool from its slices, or None when its newest generation is incomplete."""
    newest = max(int(s["spec"]["pool"].get("generation", 0)) for s in items)
    current = [s for s in items if int(s["spec"]["pool"].get("generation", 0)) == newest]
    expected = max(int(s["spec"]["pool"].get("resourceSliceCount", 1)) for s in current)
    if len(current) < expected:
        return None
    current.sort(key=lambda s: str(s.get("metadata", {}).get("name", "")))
    node_name: str | None = None
    counters: dict[CounterKey, int] = {}
    devices: list[Device] = []
    for item in current:
        spec = item["spec"]
        slice_name = str(item.get("metadata", {}).get("name", ""))
        if spec.get("nodeName"):
            node_name = spec["nodeName"]
        for counter_set in spec.get("sharedCounters") or []:
            for counter, value in (counter_set.get("counters") or {}).items():
                amount = exact_value(value.get("value") if isinstance(value, Mapping) else value)
                counters[(counter_set["name"], counter)] = int(amount)
        for raw in spec.get("devices") or []:
            devices.append(_compile_device(driver, name, slice_name, raw))
    return Pool(driver, name, newest, node_name, devices, counters)


def pools_for_node(pools: Iterable[Pool], node_name: str) -> list[Pool]:
    """The pools a pod on ``node_name`` can use: the node's own and the cluster-wide ones."""
    return [p for p in pools if p.node_name is None or p.node_name == node_name]
