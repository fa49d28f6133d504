"""A model of the kube-scheduler's structured DRA allocator, over plain dicts.

What it reproduces (reference: the scheduler's ``structured`` allocator, as docs/simulator.md
describes it):

* Pools (:mod:`sim.pools`) are grouped by (driver, pool name); only the newest generation counts,
  and a pool whose newest generation has fewer slices than ``resourceSliceCount`` is
  *incomplete* and skipped.
* Order: pools sorted by driver then name, slices by name, devices in listed order (1.36+).
* Depth-first search with backtracking over claims -> requests -> devices; the first complete
  solution wins. ``firstAvailable`` subrequests are tried in order; a chosen subrequest shows as
  ``<request>/<subrequest>`` in the result.
* A device is skipped when it is already allocated (to another claim or earlier in this search),
  fails its DeviceClass's or the request's CEL selectors, breaks a ``matchAttribute`` constraint,
  carries a NoSchedule/NoExecute taint the request does not tolerate, or would exceed a shared
  counter of its pool.
* A CEL runtime error or an unknown DeviceClass fails the allocation with an error
  (:class:`~sim.errors.AllocationError`), as the scheduler does.

One difference, without effect on the result: the devices of one request are chosen in
increasing list position. The scheduler tries every device for every slot, so it may visit the
same set in several orders; the first solution (as a set per request) is the same, and failure is
found without exploring permutations. A step budget stands in for the scheduler's 10 s timeout.

Everything here is pure. The search runs over :class:`~sim.pools.Pool` objects compiled once
(:mod:`sim.pools`), so CEL results cached on each device survive across scheduling attempts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpu_slicer.kube.device_cel import SelectorError, matches
from gpu_slicer.sim.errors import AllocationError
from gpu_slicer.sim.pools import (
    AllocatedDevices,
    CandidateList,
    CounterKey,
    Device,
    DeviceKey,
    Obj,
    Pool,
    compile_pools,
    pools_for_node,
)

DEFAULT_MAX_STEPS = 200_000


# --- claims -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sub:
    result_name: str
    class_name: str
    selectors: tuple[str, ...]
    mode: str
    count: int
    tolerations: tuple[Obj, ...]


@dataclass(frozen=True)
class _Request:
    claim: int
    name: str
    alternatives: tuple[_Sub, ...]


@dataclass(frozen=True)
class _Constraint:
    claim: int
    requests: frozenset[str] | None
    attribute: str

    def covers(self, request: _Request, sub: _Sub) -> bool:
        if request.claim != self.claim:
            return False
        if self.requests is None:
            return True
        return request.name in self.requests or sub.result_name in self.requests


def _sub(result_name: str, raw: Mapping[str, Any]) -> _Sub:
    selectors = tuple(
        str(s["cel"]["expression"]) for s in raw.get("selectors") or [] if s.get("cel")
    )
    mode = str(raw.get("allocationMode") or "ExactCount")
    return _Sub(
        result_name=result_name,
        class_name=str(raw.get("deviceClassName", "")),
        selectors=selectors,
        mode=mode,
        count=int(raw.get("count") or 1),
        tolerations=tuple(raw.get("tolerations") or ()),
    )


@dataclass(frozen=True)
class ParsedClaims:
    """Claims read once, so that trying them on many nodes does not re-read them."""

    requests: tuple[_Request, ...]
    constraints: tuple[_Constraint, ...]
    count: int
    class_names: frozenset[str]
    """Every DeviceClass a (sub)request names: checked at once before each search."""


def parse_claims(claims: Sequence[Obj]) -> ParsedClaims:
    requests, constraints = _parse_claims(claims)
    classes = frozenset(sub.class_name for r in requests for sub in r.alternatives)
    return ParsedClaims(tuple(requests), tuple(constraints), len(claims), classes)


def _parse_claims(claims: Sequence[Obj]) -> tuple[list[_Request], list[_Constraint]]:
    requests: list[_Request] = []
    constraints: list[_Constraint] = []
    for index, claim in enumerate(claims):
        devices = (claim.get("spec") or {}).get("devices") or {}
        for raw in devices.get("requests") or []:
            name = str(raw["name"])
            if raw.get("firstAvailable"):
                alternatives = tuple(
                    _sub(f"{name}/{sub['name']}", sub) for sub in raw["firstAvailable"]
                )
            elif raw.get("exactly"):
                alternatives = (_sub(name, raw["exactly"]),)
            else:  # the pre-v1 flat shape
                alternatives = (_sub(name, raw),)
            requests.append(_Request(index, name, alternatives))
        for raw in devices.get("constraints") or []:
            attribute = raw.get("matchAttribute")
            if not attribute:
                continue
            names = raw.get("requests") or []
            constraints.append(
                _Constraint(index, frozenset(names) if names else None, str(attribute))
            )
    return requests, constraints


def _tolerated(taint: Obj, tolerations: Sequence[Obj]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        operator = toleration.get("operator", "Equal")
        key = toleration.get("key")
        if operator == "Exists" and (not key or key == taint.get("key")):
            return True
        if key == taint.get("key") and toleration.get("value") == taint.get("value"):
            return True
    return False


# --- the search ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """One solution: per claim a ``status.allocation`` dict, and the devices chosen."""

    node: str
    allocations: list[Obj]
    devices: list[Device]
    subrequest_indices: tuple[int, ...]
    """Per request, which alternative was chosen (0 for ``exactly`` requests)."""

    @property
    def score(self) -> int:
        """The scheduler's only DRA score: earlier subrequests are better (8 - index each)."""
        return sum(8 - i for i in self.subrequest_indices)


class Allocator:
    """The allocator model with its DeviceClasses; one instance serves a whole simulation."""

    def __init__(
        self, device_classes: Mapping[str, Obj], *, max_steps: int = DEFAULT_MAX_STEPS
    ) -> None:
        self.max_steps = max_steps
        self._class_selectors: dict[str, tuple[str, ...]] = {}
        for name, obj in device_classes.items():
            spec = obj.get("spec") or {}
            self._class_selectors[name] = tuple(
                str(s["cel"]["expression"]) for s in spec.get("selectors") or [] if s.get("cel")
            )

    def class_names(self) -> list[str]:
        return sorted(self._class_selectors)

    def allocate(
        self,
        claims: Sequence[Obj] | ParsedClaims,
        node_name: str,
        pools: Sequence[Pool],
        in_use: AllocatedDevices,
    ) -> Allocation | None:
        """The first solution for all ``claims`` on one node, or None when there is none."""
        parsed = claims if isinstance(claims, ParsedClaims) else parse_claims(claims)
        if not parsed.class_names <= self._class_selectors.keys():
            # As the scheduler (validateDeviceRequest): every (sub)request's class is looked up
            # before the search, so a missing one fails the claim even where never reached.
            for request in parsed.requests:
                for sub in request.alternatives:
                    self.candidates((), sub)  # raises at the first class that is missing
        search = _Search(self, parsed.requests, parsed.constraints, pools, in_use)
        if not search.run():
            return None
        return search.result(node_name, parsed.count)

    def best_possible_score(self, claims: ParsedClaims, pools: Iterable[Pool]) -> int:
        """The highest DRA score any node could reach: per request, 8 minus the index of the
        first subrequest that some device of ``pools`` passes the selectors of (in use or not).
        A subrequest no device matches anywhere can never be chosen."""
        pool_list = list(pools)
        score = 0
        for request in claims.requests:
            for index, sub in enumerate(request.alternatives):
                if any(self.candidates([pool], sub).devices for pool in pool_list):
                    score += 8 - index
                    break
        return score

    def candidates(self, pools: Sequence[Pool], sub: _Sub) -> CandidateList:
        """Devices that pass the class and request selectors, in search order."""
        found: list[CandidateList] = []
        try:
            class_selectors = self._class_selectors[sub.class_name]
        except KeyError:
            raise AllocationError(
                f"request {sub.result_name!r} names DeviceClass {sub.class_name!r}, which does "
                f"not exist; known classes: {', '.join(self.class_names()) or 'none'}"
            ) from None
        expressions = class_selectors + sub.selectors
        for pool in pools:
            cached = pool.candidates.get(expressions)
            if cached is None:
                members = pool.members.get(expressions)
                if members is None:
                    # Over every device the pool's node could list, not only those listed now:
                    # the answer then holds for every order and every subset it publishes.
                    members = frozenset(
                        d.name for d in pool.by_name.values() if _selected(expressions, d)
                    )
                    pool.members[expressions] = members
                # Most alternatives of a long chain match nothing on a given node kind.
                chosen = [d for d in pool.devices if d.name in members] if members else []
                every = partial(_members, pool.by_name, members)
                cached = CandidateList.of(
                    chosen,
                    pool.needs.setdefault(expressions, {}),
                    every if len(chosen) < len(members) else None,
                )
                pool.candidates[expressions] = cached
            found.append(cached)
        if len(found) == 1:
            return found[0]
        return CandidateList.of([d for c in found for d in c.devices])


def _members(by_name: Mapping[str, Device], members: frozenset[str]) -> list[Device]:
    """The devices named ``members``, listed or not (what a candidate list could hold)."""
    return [by_name[name] for name in members]


def _selected(expressions: tuple[str, ...], device: Device) -> bool:
    """Whether every selector accepts ``device``; a selector the scheduler cannot run is the
    claim's error, as in the scheduler."""
    try:
        return all(matches(e, device.view) for e in expressions)
    except SelectorError as exc:
        raise AllocationError(str(exc)) from exc


class _Search:
    def __init__(
        self,
        allocator: Allocator,
        requests: Sequence[_Request],
        constraints: Sequence[_Constraint],
        pools: Sequence[Pool],
        in_use: AllocatedDevices,
    ) -> None:
        self.allocator = allocator
        self.requests = requests
        self.constraints = constraints
        self.pools = pools
        self.in_use = in_use
        self.chosen: list[tuple[int, Device]] = []
        self.chosen_keys: set[DeviceKey] = set()
        self.extra: dict[tuple[str, str], dict[CounterKey, int]] = defaultdict(dict)
        self.values: dict[int, Any] = {}
        self.value_owner: dict[int, int] = {}
        self.picked: list[int] = [0] * len(requests)
        self.steps = 0
        self._state: dict[
            tuple[str, str],
            tuple[dict[CounterKey, int], dict[CounterKey, int], dict[CounterKey, int]],
        ] = {}
        """Per pool: (capacity, in use before this search, taken in this search); looked up
        once per search rather than once per device (in_use does not change during one)."""

    def _pool_state(
        self, pool_key: tuple[str, str]
    ) -> tuple[dict[CounterKey, int], dict[CounterKey, int], dict[CounterKey, int]]:
        state = self._state.get(pool_key)
        if state is None:
            driver, name = pool_key
            capacity = next(
                (p.counters for p in self.pools if p.name == name and p.driver == driver), {}
            )
            state = (
                capacity,
                self.in_use.used(*pool_key),
                self.extra[pool_key],
            )
            self._state[pool_key] = state
        return state

    def run(self) -> bool:
        return self._request(0)

    def _request(self, r: int) -> bool:
        if r == len(self.requests):
            return True
        request = self.requests[r]
        for index, sub in enumerate(request.alternatives):
            self.picked[r] = index
            candidates = self.allocator.candidates(self.pools, sub)
            if sub.mode == "All":
                if self._all(r, sub, candidates):
                    return True
                continue
            if self._slot(r, sub, candidates, 0, 0):
                return True
        return False

    def _all(self, r: int, sub: _Sub, candidates: CandidateList) -> bool:
        if not candidates.devices:
            return False
        taken = 0
        for device in candidates.devices:
            if not self._fits(r, sub, device):
                break
            self._take(r, sub, device)
            taken += 1
        else:
            if self._request(r + 1):
                return True
        for _ in range(taken):
            self._untake()
        return False

    def _slot(self, r: int, sub: _Sub, candidates: CandidateList, k: int, start: int) -> bool:
        if k == sub.count:
            return self._request(r + 1)
        devices = candidates.devices
        bounds = candidates.bounds
        known = candidates.known_needs
        stop = len(devices) - (sub.count - k) + 1
        pos = start
        state_key: tuple[str, str] | None = None
        capacity = used = extra = _NO_COUNTERS
        while pos < stop:
            end = bounds.get(pos)
            if end is not None:
                # Whether the least any device of the segment needs is still available (inline:
                # this check runs millions of times in a large run).
                segment = known.get(pos)
                pool_key, needs = segment if segment is not None else candidates.needs(pos)
                if needs:
                    if pool_key != state_key:
                        capacity, used, extra = self._pool_state(pool_key)
                        state_key = pool_key
                    closed = False
                    for counter, need in needs:
                        limit = capacity.get(counter)
                        if (
                            limit is None
                            or used.get(counter, 0) + extra.get(counter, 0) + need > limit
                        ):
                            closed = True
                            break
                    if closed:
                        pos = end
                        continue
            self.steps += 1
            if self.steps > self.allocator.max_steps:
                raise AllocationError(
                    f"the search took more than {self.allocator.max_steps} steps "
                    "(the scheduler's 10 s timeout)"
                )
            device = devices[pos]
            pos += 1
            if not self._fits(r, sub, device):
                continue
            self._take(r, sub, device)
            if self._slot(r, sub, candidates, k + 1, pos):
                return True
            self._untake()
        return False

    def _fits(self, r: int, sub: _Sub, device: Device) -> bool:
        key = device.key
        if key in self.in_use.devices or key in self.chosen_keys:
            return False
        for taint in device.taints:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
                taint, sub.tolerations
            ):
                return False
        if device.consumes:
            capacity, used, extra = self._pool_state((device.driver, device.pool))
            for counter, value in device.consumes:
                limit = capacity.get(counter)
                if limit is None:
                    return False
                if used.get(counter, 0) + extra.get(counter, 0) + value > limit:
                    return False
        return not self.constraints or self._agrees(r, sub, device)

    def _agrees(self, r: int, sub: _Sub, device: Device) -> bool:
        """Whether ``device`` has the attribute values the ``matchAttribute`` constraints that
        cover the request hold so far."""
        request = self.requests[r]
        for index, constraint in enumerate(self.constraints):
            if not constraint.covers(request, sub):
                continue
            value = device.qualified.get(constraint.attribute, _ABSENT)
            if value is _ABSENT:
                return False
            if index in self.values and self.values[index] != value:
                return False
        return True

    def _take(self, r: int, sub: _Sub, device: Device) -> None:
        self.chosen.append((r, device))
        self.chosen_keys.add(device.key)
        if device.consumes:
            extra = self.extra[(device.driver, device.pool)]
            for counter, value in device.consumes:
                extra[counter] = extra.get(counter, 0) + value
        if not self.constraints:
            return
        request = self.requests[r]
        depth = len(self.chosen)
        for index, constraint in enumerate(self.constraints):
            if index not in self.values and constraint.covers(request, sub):
                self.values[index] = device.qualified[constraint.attribute]
                self.value_owner[index] = depth

    def _untake(self) -> None:
        depth = len(self.chosen)
        _, device = self.chosen.pop()
        self.chosen_keys.discard(device.key)
        if device.consumes:
            extra = self.extra[(device.driver, device.pool)]
            for counter, value in device.consumes:
                extra[counter] -= value
        if not self.value_owner:
            return
        for index in [i for i, owner in self.value_owner.items() if owner == depth]:
            del self.values[index]
            del self.value_owner[index]

    def result(self, node_name: str, claim_count: int) -> Allocation:
        per_claim: list[list[Obj]] = [[] for _ in range(claim_count)]
        for r, device in self.chosen:
            request = self.requests[r]
            sub = request.alternatives[self.picked[r]]
            per_claim[request.claim].append(
                {
                    "request": sub.result_name,
                    "driver": device.driver,
                    "pool": device.pool,
                    "device": device.name,
                }
            )
        allocations = [
            {
                "devices": {"results": results, "config": []},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node_name]}
                            ]
                        }
                    ]
                },
            }
            for results in per_claim
        ]
        return Allocation(
            node=node_name,
            allocations=allocations,
            devices=[d for _, d in self.chosen],
            subrequest_indices=tuple(self.picked),
        )


_ABSENT = object()
_NO_COUNTERS: dict[CounterKey, int] = {}
"""Read only: what the segment check starts from before it looks a pool up."""


# --- convenience over plain dicts (tests, small tools) ------------------------------------


def allocated_from_claims(claims: Iterable[Obj], pools: Sequence[Pool]) -> AllocatedDevices:
    """What allocated claims hold, looked up in ``pools`` (results of other drivers are kept
    as allocated devices without counters)."""
    by_key = {(p.driver, p.name): p for p in pools}
    in_use = AllocatedDevices()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            pool = by_key.get((result["driver"], result["pool"]))
            device = pool.by_name.get(result["device"]) if pool else None
            if device is not None:
                in_use.add(device)
            else:
                in_use.devices.add((result["driver"], result["pool"], result["device"]))
    return in_use


def allocate_on_node(
    claims: Sequence[Obj],
    *,
    node_name: str,
    slices: Iterable[Obj],
    device_classes: Mapping[str, Obj],
    allocated_claims: Iterable[Obj] = (),
) -> Allocation | None:
    """One-shot allocation over plain dicts: what the scheduler would write for ``claims``."""
    pools = pools_for_node(compile_pools(slices), node_name)
    in_use = allocated_from_claims(allocated_claims, pools)
    return Allocator(device_classes).allocate(claims, node_name, pools, in_use)
