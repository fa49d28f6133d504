"""The modelled kube-scheduler: its DRA path over the simulated nodes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import filterfalse
from typing import Any

from gpu_slicer.sim.allocator import Allocation, Allocator, ParsedClaims, parse_claims
from gpu_slicer.sim.baselines import NodeOrder
from gpu_slicer.sim.node import SimNode
from gpu_slicer.sim.pools import AllocatedDevices, Device, Pool
from gpu_slicer.slicer.deviceclasses import device_classes

Obj = dict[str, Any]


class Scheduler:
    """kube-scheduler's DRA path: filter nodes with the allocator model, score, bind.

    Nodes are visited in the scenario's rule order (pack: most allocated memory slices first;
    spread: least first; ties by name). The only DRA score is the prioritized-list score
    (8 - subrequest index, per request): the first node reaching the best score any node could
    reach wins; otherwise the best of the feasible nodes found, stopping after ``enough``
    feasible nodes like ``percentageOfNodesToScore``.

    Bookkeeping that changes no decision, only its cost: a node proven unable to host a claim
    shape is remembered until it releases devices (further allocations only take capacity, and a
    new device order changes where a claim goes, never whether it fits); once a shape failed on
    every node, a retry looks only at the nodes that changed since; a node of a kind where some
    request matches no device is never tried; with a single request (the
    score is then the index of the first subrequest that fits, whatever the device order) a
    node's score is remembered until its allocations change, and only the chosen node is
    allocated on its current device order.
    """

    def __init__(self, nodes: Mapping[str, SimNode], rule: str) -> None:
        classes = {c["metadata"]["name"]: c for c in device_classes()}
        self.allocator = Allocator(classes)
        self.nodes = nodes
        self.allocated = AllocatedDevices()
        self.order = NodeOrder(sorted(nodes), rule)
        self.rule = rule
        self.versions: dict[str, int] = dict.fromkeys(nodes, 0)
        self.changes: list[str] = []
        self.unable: dict[Any, set[str]] = {}
        """Per claim shape, the nodes proven unable to host it since they last freed devices (a
        claim that did not fit still does not fit after further allocations: they only take
        devices and counters)."""
        self._unable_for: dict[str, list[set[str]]] = {}
        """Per node, the sets of ``unable`` that hold it, emptied when it frees devices."""
        self.failed_everywhere: dict[Any, int] = {}
        self.scores: dict[Any, dict[str, tuple[int, int]]] = {}
        """Per single-request claim shape, per node: (``versions`` of the node, its score)."""
        self._parsed: dict[Any, ParsedClaims] = {}
        self._top: dict[Any, int] = {}
        representatives: dict[tuple[str, str], str] = {}
        self._kind: dict[str, tuple[str, str]] = {}
        for name, sim_node in sorted(nodes.items()):
            self._kind[name] = (sim_node.node.gpus, sim_node.node.mode)
            representatives.setdefault(self._kind[name], name)
        self._representatives = sorted(representatives.values())
        self._never: dict[Any, frozenset[tuple[str, str]]] = {}
        """Per claim shape, the node kinds where some request matches no device at all."""
        n = len(nodes)
        self.enough = max(100, n * max(5, 50 - n // 125) // 100)
        self.attempts = 0
        self.capacity = {
            name: sum(m.memory_slices for m in sim_node.node.models)
            for name, sim_node in nodes.items()
        }
        self.largest = max(self.capacity.values(), default=0)
        self.min_slices: dict[Any, int] = {}
        """Per claim shape, the fewest memory slices any solution holds (a lower bound)."""

    def touch(self, node: str) -> None:
        self.versions[node] += 1
        self.changes.append(node)

    def published_more(self) -> None:
        """The nodes advertise more devices (the cluster asked for a new profile): what was
        proven unable to fit, or to score well, may now. Forget it; every node changed."""
        for cache in (self._parsed, self._top, self._never, self.unable, self._unable_for):
            cache.clear()
        self.failed_everywhere.clear()
        self.scores.clear()
        for node in self.nodes:
            self.touch(node)

    def _nodes(self, shape: Any) -> list[str] | None:
        """Nodes worth trying: all (None) or, after a failure everywhere, the changed ones."""
        since = self.failed_everywhere.get(shape)
        if since is None:
            return None
        changed = set(self.changes[since:])
        used = self.order.used
        sign = -1 if self.rule == "pack" else 1
        return sorted(changed, key=lambda n: (sign * used[n], n))

    def _parse(self, claims: Sequence[Obj], shape: Any) -> ParsedClaims:
        """The claims of ``shape`` parsed, with the best score any node could reach and the
        kinds of node that can never host them (worked out once per shape)."""
        parsed = self._parsed.get(shape)
        if parsed is not None:
            return parsed
        parsed = parse_claims(claims)
        self._parsed[shape] = parsed
        pools = [self.nodes[n].blank_pool() for n in self._representatives]
        self._top[shape] = self.allocator.best_possible_score(parsed, pools)
        self._never[shape] = frozenset(
            self._kind[n]
            for n, pool in zip(self._representatives, pools, strict=True)
            if not all(
                any(self.allocator.candidates([pool], sub).devices for sub in request.alternatives)
                for request in parsed.requests
            )
        )
        return parsed

    def _worth_trying(self, shape: Any, unable: set[str]) -> Iterator[str]:
        """The nodes to try in order, less those that cannot host ``shape``: proven unable
        since they last freed devices, short of free slices, or of a kind that never fits."""
        never = self._never[shape]
        kind = self._kind
        need = self.min_slices.get(shape, 0)
        used = self.order.used
        capacity = self.capacity
        subset = self._nodes(shape)
        # Nodes using more than this cannot have ``need`` free slices, whatever their size.
        walks = [subset] if subset is not None else self.order.levels_up_to(self.largest - need)
        for nodes in walks:
            # Most nodes of a large cluster are proven unable: skip them without a Python step.
            for node in filterfalse(unable.__contains__, nodes):
                if capacity[node] - used[node] < need or (never and kind[node] in never):
                    continue
                yield node

    def schedule(self, claims: Sequence[Obj], shape: Any) -> Allocation | None:
        parsed = self._parse(claims, shape)
        top = self._top[shape]
        unable = self.unable.setdefault(shape, set())
        mark = len(self.changes)
        feasible = 0
        # (score, node, its allocation on the node's current order when there is one)
        best: tuple[int, str, Allocation | None] | None = None
        for node in self._worth_trying(shape, unable):
            tried = self._try(parsed, shape, node, top)
            if tried is None:
                unable.add(node)
                self._unable_for.setdefault(node, []).append(unable)
                continue
            score, found = tried
            if found is not None and score >= top:
                return found
            feasible += 1
            if best is None or score > best[0]:
                best = (score, node, found)
            if feasible >= self.enough:
                break
        if best is None:
            self.failed_everywhere[shape] = mark
            return None
        score, node, allocation = best
        if allocation is None:
            allocation = self._rerun(parsed, node, self.nodes[node].ensure_pool())
        return allocation

    def _try(
        self, parsed: ParsedClaims, shape: Any, node: str, top: int
    ) -> tuple[int, Allocation | None] | None:
        """The node's score and, when known, its allocation on the node's current order; None
        when the claims do not fit there.

        With one request the score is the index of the first subrequest that fits, which no
        device order changes: a node that does not win needs no run on its current order, and
        its score stands until its allocations change."""
        sim_node = self.nodes[node]
        single = len(parsed.requests) == 1
        scores = self.scores.setdefault(shape, {})
        known = scores.get(node) if single else None
        if known is not None and known[0] == self.versions[node]:
            sim_node.ensure_pool()  # what looking at the node does to its order, as below
            return known[1], None
        pool = sim_node.ensure_pool(fresh=False)
        self.attempts += 1
        found = self.allocator.allocate(parsed, node, [pool], self.allocated)
        if found is None:
            return None
        current = sim_node.ensure_pool()
        score = found.score
        result: Allocation | None = found
        if current is not pool:
            if single and score < top:
                result = None  # it fits; allocated on the current order if it wins
            else:
                result = self._rerun(parsed, node, current)
                score = result.score
        if single and score < top:
            scores[node] = (self.versions[node], score)
        return score, result

    def _rerun(self, parsed: ParsedClaims, node: str, pool: Pool) -> Allocation:
        """The allocation on the node's current order (it fits on the older one). Not counted
        in ``attempts``, which counts the nodes tried."""
        found = self.allocator.allocate(parsed, node, [pool], self.allocated)
        assert found is not None, "feasibility cannot depend on device order"
        return found

    def reserve(self, allocation: Allocation) -> None:
        for device in allocation.devices:
            self.allocated.add(device)
        self.touch(allocation.node)

    def release(self, node: str, devices: Sequence[Device]) -> None:
        for device in devices:
            self.allocated.remove(device.key)
        for unable in self._unable_for.pop(node, ()):
            unable.discard(node)
        self.touch(node)
