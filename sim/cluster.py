"""gpu-slicer on simulated GPUs: the real webhook, agent and slices, a modelled control plane.

What runs for real (the project's own code):

* the webhook's translation (``webhook.translate.translate_pod``) and its JSON Patch, applied with
  ``jsonpatch``; the ResourceClaimTemplates it asks for;
* per node, the agent's inventory and device-order policy (``slicer.inventory``,
  ``slicer.ordering``) on a ``SimulatedBackend``, published by ``slicer.publisher``, republished
  through the agent's ``RepublishLimiter`` on the simulated clock;
* the kubelet side: ``NodePrepareResources``/``NodeUnprepareResources`` over the agent's gRPC
  services on unix sockets (``slicer.plugin``), backed by its ``DeviceState`` (checkpoint, CDI,
  MIG instances created at exactly the allocated placement).

What is modelled: the apiserver (``kube.memory.InMemoryKubeApi``), the controller that makes a
pod's ResourceClaim from its template, the scheduler (``sim.allocator`` per node, nodes chosen
by the scenario's rule, see :class:`Scheduler`) and the kubelet's calls.

Two ways to run, same decisions:

* **through the API** (default for small scenarios): every object goes through the in-memory
  apiserver and the kubelet talks gRPC to a real agent per node (files in a temporary folder);
* **fast** (large scenarios): pods and claims stay plain dicts, the slices are compiled once per
  node and only *reordered* when the best-fit order changes (the order comes from the agent's
  policy, computed per GPU and cached; a test checks it equals what ``plan_pool`` publishes),
  and the kubelet step creates and destroys the instances on the ``SimulatedBackend`` directly.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch

from kube import errors as kerrors
from kube.memory import InMemoryKubeApi
from sim.allocator import (
    Allocation,
    Allocator,
    Device,
    InUse,
    ParsedClaims,
    Pool,
    compile_pool,
    parse_claims,
)
from sim.baselines import NodeOrder
from sim.demand import Demand, DemandBook
from sim.engine import GpuLedger, Held, Slot, Strategy
from sim.errors import AllocationError
from sim.scenario import NodeSpec, PodSpec, Scenario
from slicer.catalog import GpuModel, Placement
from slicer.deviceclasses import device_classes
from slicer.devices import DeviceSpec, SliceSpec, WholeGpu
from slicer.devices import parse_device_name as _parse_device_name
from slicer.inventory import DRIVER, GpuState, effective_mode, plan_pool
from slicer.ordering import (
    DYNAMIC_POLICIES,
    Candidate,
    Occupancy,
    OrderPolicy,
    RepublishLimiter,
    get_policy,
)
from slicer.simulated import SimulatedBackend

Obj = dict[str, Any]
RESOURCE = "resource.k8s.io/v1"
parse_device_name = functools.lru_cache(maxsize=8192)(_parse_device_name)
"""Device names repeat on every node of a kind: parse each once (specs are immutable)."""
API_POD_LIMIT = 5000
"""Scenarios with more pods than this run the fast way unless told otherwise."""


# --- per-node agent ------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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
    ``plan_pool`` publishes is checked by tests/sim/test_fast_order.py.
    """

    def __init__(self, policy: OrderPolicy, candidates: Sequence[Candidate]) -> None:
        self.policy = policy
        rank = getattr(policy, "gpu_rank", None)
        if rank is None:
            raise TypeError(f"device-order policy {policy.name!r} does not rank GPUs one by one")
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


@dataclass
class _Prepared:
    """What the kubelet model holds for one running pod's claim."""

    uid: str
    name: str
    namespace: str
    devices: list[Device]
    instances: list[tuple[int, int, int]] = field(default_factory=list)
    """(gpu, gi id, ci id) created by the fast path."""


class NodeAgent:
    """One node: a simulated backend, the agent's slices, and (through the API) its services."""

    def __init__(
        self,
        node: NodeSpec,
        *,
        policy: str,
        scenario: Scenario,
        clock: _Clock,
        api: InMemoryKubeApi | None,
        root: Path | None,
        templates: dict[Any, tuple[Pool, GpuOrderCache | None]] | None = None,
    ) -> None:
        self.node = node
        self.templates = templates if templates is not None else {}
        self.name = node.name
        self.clock = clock
        self.scenario = scenario
        self.policy_name = policy
        self.policy = get_policy(policy)
        self.dynamic = policy in DYNAMIC_POLICIES
        self.backend = SimulatedBackend(
            list(node.models), node_name=node.name, sleep=lambda _s: None
        )
        self.modes = {i: effective_mode(node.mode, m) for i, m in enumerate(node.models)}
        self.api = api
        self.limiter = RepublishLimiter(
            min_interval_s=scenario.republish_min_interval_s,
            quiet_s=scenario.republish_quiet_s,
            clock=clock,
        )
        self.allocated: dict[str, DeviceSpec] = {}
        """Device name -> spec, for every device allocated on this node."""
        self.gpu_keys: dict[int, GpuKey] = {i: (i, (), False) for i in range(len(node.models))}
        """Per GPU, what its order depends on (kept up to date with ``allocated``)."""
        self.publishes = 0
        self.pool: Pool | None = None
        self._services: Any = None
        self._root = root
        # Fast path: the limiter sees allocation versions; the order is computed lazily.
        self.version = 0
        self._due: float | None = None
        self._snapshot: tuple[GpuKey, ...] = tuple(self.gpu_keys.values())
        """The GPUs' states when the last republish fell due: what the published order is of."""
        self._materialized: tuple[GpuKey, ...] | None = None
        """The GPUs' states the pool's current order was computed for."""
        self._blocks: list[list[str]] = []
        """The pool's current order, GPU by GPU."""
        self._ranked: list[Block] = []
        """Per GPU (by index), its rank and block in the state ``_materialized``."""
        self._mig_enabled: list[bool] | None = None
        if api is not None:
            assert root is not None
            self._start_services(api, root)
            self._publish_through_api()
            self.limiter.published(order_fingerprint_names(self.current_order()))
        else:
            self.limiter.published("v0")

    def ensure_pool(self, *, fresh: bool = True) -> Pool:
        """The pool as the scheduler sees it now (fast path: built on first use, and reordered
        when a republish happened since the last look). ``fresh=False`` may return the pool in
        an older order: good enough to learn whether a claim fits at all, which no order
        changes."""
        if self.api is not None:
            assert self.pool is not None
            return self.pool
        if self.pool is None:
            key = (self.node.gpus, self.node.mode)
            template = self.templates.get(key)
            if template is None:
                plan = plan_pool(
                    self.name,
                    self.gpu_states(),
                    server_version=self.scenario.kubernetes,
                    policy=self.policy,
                )
                pool = compile_pool(DRIVER, self.name, plan.slices)
                assert pool is not None
                orders = (
                    GpuOrderCache(self.policy, self._candidates(plan.order))
                    if self.dynamic
                    else None
                )
                template = (pool, orders)
                self.templates[key] = template
                self.pool = pool
            else:
                self.pool = template[0].clone(self.name, self.name)
            self.publishes = 1
            self._materialized = tuple((i, (), False) for i in range(len(self.node.models)))
            if template[1] is not None:
                self.orders = template[1]
                self._ranked = [self.orders.block(k) for k in self._materialized]
                self._blocks = [names for _, names in sorted(self._ranked)]
        self._settle()
        assert self.pool is not None
        if fresh and self.dynamic and self._materialized != self._snapshot:
            # Only the GPUs whose state changed are looked up again (their keys are new).
            before = self._materialized
            assert before is not None
            self._ranked = ranked = [
                block if key is before[i] else self.orders.block(key)
                for i, (key, block) in enumerate(zip(self._snapshot, self._ranked, strict=True))
            ]
            blocks = [names for _, names in sorted(ranked)]
            if blocks != self._blocks:
                self.pool = self.pool.reordered([name for names in blocks for name in names])
                self._blocks = blocks
                self.publishes += 1
            self._materialized = self._snapshot
        return self.pool

    def _settle(self) -> None:
        """Fast path: a republish that fell due before now happened at its due time, with the
        allocations of that moment (nothing changed on this node in between)."""
        if self._due is None or self._due > self.clock.now:
            return
        now = self.clock.now
        self.clock.now = self._due
        self.limiter.published(f"v{self.version}")
        self.clock.now = now
        self._snapshot = tuple(self.gpu_keys.values())
        self._due = None

    def allocate(self, devices: Iterable[Device]) -> None:
        """Record devices allocated on this node (and the state of the GPUs they are on)."""
        self._changed({self._add(d.name) for d in devices})

    def deallocate(self, devices: Iterable[Device]) -> None:
        """Record devices released on this node."""
        gpus = set()
        for device in devices:
            spec = self.allocated.pop(device.name, None)
            if spec is not None:
                gpus.add(spec.gpu_index)
        self._changed(gpus)

    def _add(self, name: str) -> int:
        spec = parse_device_name(name)
        self.allocated[name] = spec
        return spec.gpu_index

    def _changed(self, gpus: Iterable[int]) -> None:
        for gpu in gpus:
            self.gpu_keys[gpu] = gpu_key(
                gpu, (s for s in self.allocated.values() if s.gpu_index == gpu)
            )

    # --- inventory ------------------------------------------------------------------------

    def gpu_states(self) -> list[GpuState]:
        states = []
        for info in self.backend.gpus():
            instances = tuple(self.backend.instances(info.index)) if info.mig_enabled else ()
            states.append(
                GpuState(
                    info=info,
                    mode=self.modes[info.index],
                    instances=instances,
                    owned=frozenset(i.spec for i in instances),
                )
            )
        return states

    def _candidates(self, order: Sequence[str]) -> list[Candidate]:
        models = {i: m for i, m in enumerate(self.node.models)}
        out = []
        for name in order:
            spec = parse_device_name(name)
            model = models[spec.gpu_index]
            profile = model.profile(spec.profile) if isinstance(spec, SliceSpec) else None
            out.append(Candidate(spec, model, profile))
        return out

    def occupancy(self) -> Occupancy:
        return Occupancy.of({}, list(self.allocated.values()))

    def current_order(self) -> list[str]:
        assert self.pool is not None
        return [d.name for d in self.pool.devices]

    def best_order(self) -> list[str]:
        """The order the policy would publish now."""
        if self.api is not None:
            return list(
                self._publisher.plan(
                    self.gpu_states(), allocated=list(self.allocated.values())
                ).order
            )
        return self.orders.order(self.occupancy())

    # --- publishing -----------------------------------------------------------------------

    def _publish_through_api(self) -> None:
        assert self.api is not None
        self._publisher.publish(self.gpu_states(), allocated=list(self.allocated.values()))
        self.publishes += 1
        listed = self.api.list(
            RESOURCE, "ResourceSlice", field_selector=f"spec.nodeName={self.name}"
        ).items
        pool = compile_pool(DRIVER, self.name, listed)
        if pool is None:
            raise AllocationError(f"the pool of {self.name} is incomplete after publishing")
        self.pool = pool

    def before_change(self) -> None:
        """Fast path: settle a republish that fell due before the allocations change."""
        if self.api is None and self.dynamic:
            self._settle()

    def allocation_changed(self) -> float | None:
        """Tell the limiter; returns when a republish is due (through the API: the time to
        call :meth:`republish`; fast path: None, the pool is refreshed when next looked at)."""
        if not self.dynamic:
            return None
        if self.api is None:
            self.version += 1
            self.limiter.observe(f"v{self.version}")
            due_in = self.limiter.due_in()
            self._due = None if due_in is None else self.clock.now + due_in
            return None
        self.limiter.observe(order_fingerprint_names(self.best_order()))
        due = self.limiter.due_in()
        return None if due is None else self.clock.now + due

    def republish(self) -> bool:
        """Publish the best order now (the limiter said it is due); True when it changed."""
        order = self.best_order()
        fingerprint = order_fingerprint_names(order)
        if fingerprint == order_fingerprint_names(self.current_order()):
            self.limiter.published(fingerprint)
            return False
        self._publish_through_api()
        self.limiter.published(fingerprint)
        return True

    # --- the kubelet's calls --------------------------------------------------------------

    def _start_services(self, api: InMemoryKubeApi, root: Path) -> None:
        from slicer.cdi import CdiDirectory
        from slicer.checkpoint import CheckpointStore
        from slicer.claims import ClaimCache
        from slicer.mig_mode import MigModeManager
        from slicer.plugin import DraDriver
        from slicer.publisher import SlicePublisher
        from slicer.state import DeviceState

        base = root / self.name
        self._publisher = SlicePublisher(
            api,
            self.name,
            policy=self.policy,
            server_version=self.scenario.kubernetes,
            sleep=lambda _s: None,
        )
        mig = MigModeManager(self.backend, dict(self.modes))
        self.state = DeviceState(
            self.backend,
            CheckpointStore(base / "checkpoint"),
            CdiDirectory(base / "cdi"),
            mig=mig,
            clock=self.clock,
        )
        claims = ClaimCache(api, pool=self.name)
        self.driver = DraDriver(self.state, claims, pool=self.name, max_parallel=1)
        self._services = _KubeletClient(self.driver, base)

    def prepare(self, prepared: _Prepared) -> str:
        """NodePrepareResources for one claim; returns an error message, empty when fine."""
        if self._services is not None:
            return str(self._services.prepare(prepared))
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
                prepared.instances.append((spec.gpu_index, gi, ci.ci_id))
        return ""

    def unprepare(self, prepared: _Prepared) -> str:
        if self._services is not None:
            return str(self._services.unprepare(prepared))
        for gpu, gi, ci in prepared.instances:
            self.backend.destroy_compute_instance(gpu, gi, ci)
            self.backend.destroy_gpu_instance(gpu, gi)
        prepared.instances.clear()
        return ""

    def instance_placements(self, gpu: int) -> list[Placement]:
        return sorted((i.profile, i.start) for i in self.backend.instances(gpu))

    def mig_calls(self) -> tuple[int, int]:
        created = sum(1 for c in self.backend.calls if c[0] == "create_gpu_instance")
        destroyed = sum(1 for c in self.backend.calls if c[0] == "destroy_gpu_instance")
        return created, destroyed

    def close(self) -> None:
        if self._services is not None:
            self._services.close()
            self.driver.close()


def _scratch_dir() -> str | None:
    """A memory-backed folder when the system has one: the agent fsyncs its checkpoint and CDI
    files on every prepare, which on a disk costs far more than the simulated work."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def order_fingerprint_names(names: Sequence[str]) -> str:
    return ",".join(names)


class _KubeletClient:
    """The kubelet's side of the DRA protocol: v1 gRPC calls over the agent's unix socket."""

    def __init__(self, driver: Any, base: Path) -> None:
        import grpc

        from slicer.plugin import PluginServer
        from slicer.proto import dra_v1_pb2

        self.pb = dra_v1_pb2
        # unix socket paths are limited to 107 bytes: keep them short.
        self.sockets = Path(tempfile.mkdtemp(prefix="gs-", dir=_scratch_dir()))
        self.server = PluginServer(
            driver, plugins_dir=self.sockets / "p", registry_dir=self.sockets / "r", workers=2
        )
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix://{self.server.dra_path}")
        service = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        self.prepare_call = self.channel.unary_unary(
            f"/{service}/NodePrepareResources",
            request_serializer=self.pb.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=self.pb.NodePrepareResourcesResponse.FromString,
        )
        self.unprepare_call = self.channel.unary_unary(
            f"/{service}/NodeUnprepareResources",
            request_serializer=self.pb.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=self.pb.NodeUnprepareResourcesResponse.FromString,
        )

    def _claim(self, prepared: _Prepared) -> Any:
        return self.pb.Claim(namespace=prepared.namespace, uid=prepared.uid, name=prepared.name)

    def prepare(self, prepared: _Prepared) -> str:
        request = self.pb.NodePrepareResourcesRequest(claims=[self._claim(prepared)])
        response = self.prepare_call(request, timeout=30)
        answer = response.claims[prepared.uid]
        if answer.error:
            return str(answer.error)
        got = sorted(d.device_name for d in answer.devices)
        wanted = sorted(d.name for d in prepared.devices)
        if got != wanted:
            return f"prepared {got}, allocated {wanted}"
        return ""

    def unprepare(self, prepared: _Prepared) -> str:
        request = self.pb.NodeUnprepareResourcesRequest(claims=[self._claim(prepared)])
        response = self.unprepare_call(request, timeout=30)
        return str(response.claims[prepared.uid].error)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0)
        shutil.rmtree(self.sockets, ignore_errors=True)


# --- the scheduler -------------------------------------------------------------------------


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

    def __init__(self, agents: dict[str, NodeAgent], rule: str) -> None:
        classes = {c["metadata"]["name"]: c for c in device_classes()}
        self.allocator = Allocator(classes)
        self.agents = agents
        self.in_use = InUse()
        self.order = NodeOrder(sorted(agents), rule)
        self.rule = rule
        self.versions: dict[str, int] = dict.fromkeys(agents, 0)
        self.freed: dict[str, int] = dict.fromkeys(agents, 0)
        """Per node, a version that moves only when devices are released: a claim that did not
        fit still does not fit after further allocations (they only take devices and counters),
        so a node's failure is remembered until it frees something."""
        self.changes: list[str] = []
        self.infeasible: dict[Any, dict[str, int]] = {}
        self.failed_everywhere: dict[Any, int] = {}
        self.scores: dict[Any, dict[str, tuple[int, int]]] = {}
        """Per single-request claim shape, per node: (``versions`` of the node, its score)."""
        self._parsed: dict[Any, ParsedClaims] = {}
        self._top: dict[Any, int] = {}
        representatives: dict[tuple[str, str], str] = {}
        self._kind: dict[str, tuple[str, str]] = {}
        for name, agent in sorted(agents.items()):
            self._kind[name] = (agent.node.gpus, agent.node.mode)
            representatives.setdefault(self._kind[name], name)
        self._representatives = sorted(representatives.values())
        self._never: dict[Any, frozenset[tuple[str, str]]] = {}
        """Per claim shape, the node kinds where some request matches no device at all."""
        n = len(agents)
        self.enough = max(100, n * max(5, 50 - n // 125) // 100)
        self.attempts = 0
        self.capacity = {
            name: sum(m.memory_slices for m in agent.node.models) for name, agent in agents.items()
        }
        self.largest = max(self.capacity.values(), default=0)
        self.min_slices: dict[Any, int] = {}
        """Per claim shape, the fewest memory slices any solution holds (a lower bound)."""

    def touch(self, node: str) -> None:
        self.versions[node] += 1
        self.changes.append(node)

    def _nodes(self, shape: Any) -> list[str] | None:
        """Nodes worth trying: all (None) or, after a failure everywhere, the changed ones."""
        since = self.failed_everywhere.get(shape)
        if since is None:
            return None
        changed = set(self.changes[since:])
        used = self.order.used
        sign = -1 if self.rule == "pack" else 1
        return sorted(changed, key=lambda n: (sign * used[n], n))

    def schedule(self, claims: Sequence[Obj], shape: Any) -> Allocation | None:
        parsed = self._parsed.get(shape)
        if parsed is None:
            parsed = parse_claims(claims)
            self._parsed[shape] = parsed
            pools = [self.agents[n].ensure_pool() for n in self._representatives]
            self._top[shape] = self.allocator.best_possible_score(parsed, pools)
            self._never[shape] = frozenset(
                self._kind[n]
                for n, pool in zip(self._representatives, pools, strict=True)
                if not all(
                    any(
                        self.allocator.candidates([pool], sub).devices
                        for sub in request.alternatives
                    )
                    for request in parsed.requests
                )
            )
        top = self._top[shape]
        never = self._never[shape]
        kind = self._kind
        memo = self.infeasible.setdefault(shape, {})
        subset = self._nodes(shape)
        mark = len(self.changes)
        feasible = 0
        need = self.min_slices.get(shape, 0)
        used = self.order.used
        capacity = self.capacity
        # With one request the score is the index of the first subrequest that fits, which no
        # device order changes: a node that does not win needs no run on its current order,
        # and its score stands until its allocations change.
        single = len(parsed.requests) == 1
        scores = self.scores.setdefault(shape, {})
        # (score, node, its allocation on the node's current order when there is one)
        best: tuple[int, str, Allocation | None] | None = None
        # Nodes using more than this cannot have ``need`` free slices, whatever their size.
        most_used = self.largest - need
        for node in subset if subset is not None else self.order.up_to(most_used):
            version = self.freed[node]
            if memo.get(node) == version:
                continue
            if capacity[node] - used[node] < need or (never and kind[node] in never):
                continue
            agent = self.agents[node]
            known = scores.get(node) if single else None
            if known is not None and known[0] == self.versions[node]:
                score: int = known[1]
                agent.ensure_pool()  # what looking at the node does to its order, as below
                found: Allocation | None = None
            else:
                pool = agent.ensure_pool(fresh=False)
                self.attempts += 1
                found = self.allocator.allocate(parsed, node, [pool], self.in_use)
                if found is None:
                    memo[node] = version
                    continue
                current = agent.ensure_pool()
                score = found.score
                if current is not pool:
                    if single and score < top:
                        found = None  # it fits; allocated on the current order if it wins
                    else:
                        found = self._rerun(parsed, node, current)
                        score = found.score
                if score >= top:
                    assert found is not None
                    return found
                if single:
                    scores[node] = (self.versions[node], score)
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
            allocation = self._rerun(parsed, node, self.agents[node].ensure_pool())
        return allocation

    def _rerun(self, parsed: ParsedClaims, node: str, pool: Pool) -> Allocation:
        """The allocation on the node's current order (it fits on the older one). Not counted
        in ``attempts``, which counts the nodes tried."""
        found = self.allocator.allocate(parsed, node, [pool], self.in_use)
        assert found is not None, "feasibility cannot depend on device order"
        return found

    def reserve(self, allocation: Allocation) -> None:
        for device in allocation.devices:
            self.in_use.add(device)
        self.touch(allocation.node)

    def release(self, node: str, devices: Sequence[Device]) -> None:
        for device in devices:
            self.in_use.remove(device.key)
        self.freed[node] += 1
        self.touch(node)


# --- the strategy --------------------------------------------------------------------------


def _slices_of(spec: DeviceSpec, agent: NodeAgent) -> int:
    model = agent.node.models[spec.gpu_index]
    if isinstance(spec, WholeGpu):
        return model.memory_slices
    return model.profile(spec.profile).memory_slices


class GpuSlicerStrategy(Strategy):
    """gpu-slicer with one device-order policy, on the whole simulated cluster."""

    def __init__(
        self, scenario: Scenario, book: DemandBook, *, policy: str, through_api: bool | None = None
    ) -> None:
        super().__init__(scenario)
        self.name = f"gpu-slicer-{policy}"
        self.description = f"gpu-slicer, device order '{policy}'"
        self.book = book
        self.policy = policy
        if through_api is None:
            through_api = len(scenario.pods) <= API_POD_LIMIT and len(scenario.nodes) <= 64
        self.through_api = through_api
        self.clock = _Clock()
        self._closed = False
        self.api: InMemoryKubeApi | None = None
        self.root: Path | None = None
        if through_api:
            self.api = InMemoryKubeApi()
            self.api.set_server_version(*scenario.kubernetes)
            self.root = Path(tempfile.mkdtemp(prefix="gpu-slicer-sim-", dir=_scratch_dir()))
            for obj in device_classes():
                self.api.create(obj)
            for ns, mode in scenario.namespaces.items():
                labels = {"gpu-slicer.io/migration": mode} if mode != "disabled" else {}
                self.api.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": ns, "labels": labels},
                    }
                )
            for node in scenario.nodes:
                self.api.create(
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name}}
                )
        # Fast path: identical nodes (same GPUs and mode) share one inventory run; their
        # slices differ only in names, and no selector gpu-slicer writes reads a GPU's UUID.
        templates: dict[Any, tuple[Pool, GpuOrderCache | None]] = {}
        self.agents = {
            n.name: NodeAgent(
                n,
                policy=policy,
                scenario=scenario,
                clock=self.clock,
                api=self.api,
                root=self.root,
                templates=templates,
            )
            for n in scenario.nodes
        }
        self.scheduler = Scheduler(self.agents, scenario.node_rule)
        self.running: dict[str, tuple[Allocation, list[_Prepared]]] = {}
        self.claims: dict[str, list[Obj]] = {}
        self.due: dict[str, float] = {}
        self._uids = itertools.count(1)
        mode = (
            "through the in-memory API and the agent's gRPC services"
            if through_api
            else "fast path: direct backend calls, slices reordered in place"
        )
        self.notes.append(mode)

    # --- demand ---------------------------------------------------------------------------

    def demand(self, pod: PodSpec) -> Demand:
        return self.book.chains(pod)

    def gpu_can_use(self, ledger: GpuLedger, alt: Any) -> bool:
        if alt.kind == "gpu":
            mode = self.agents[ledger.node].modes[ledger.index]
            return not ledger.held and mode in ("dynamic", "full")
        return super().gpu_can_use(ledger, alt)

    # --- claims ---------------------------------------------------------------------------

    def _claims_for(self, pod: PodSpec) -> list[Obj] | None:
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
        spec = translated.claim_spec
        if spec is None:
            self.claims[pod.name] = []
            return []
        if self.api is None:
            claim = {
                "apiVersion": RESOURCE,
                "kind": "ResourceClaim",
                "metadata": {
                    "name": f"{pod.name}-gpu-slicer",
                    "namespace": pod.namespace,
                    "uid": f"uid-{next(self._uids)}",
                },
                "spec": spec,
            }
            self.claims[pod.name] = [claim]
            return [claim]
        claims = self._admit_through_api(pod, translated.conversion)
        self.claims[pod.name] = claims
        return claims

    def _admit_through_api(self, pod: PodSpec, conversion: Any) -> list[Obj]:
        """Webhook patch + templates, pod creation, and the claim controller."""
        assert self.api is not None
        manifest = pod.manifest()
        mutated = jsonpatch.apply_patch(manifest, conversion.patch)
        for template in conversion.templates:
            try:
                self.api.create(template)
            except kerrors.AlreadyExists:
                pass
        stored = self.api.create(mutated)
        claims: list[Obj] = []
        statuses: list[Obj] = []
        for entry in stored["spec"].get("resourceClaims") or []:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name:
                continue
            template = self.api.get(RESOURCE, "ResourceClaimTemplate", template_name, pod.namespace)
            claim = self.api.create(
                {
                    "apiVersion": RESOURCE,
                    "kind": "ResourceClaim",
                    "metadata": {
                        "name": f"{pod.name}-{entry['name']}",
                        "namespace": pod.namespace,
                        "annotations": {"resource.kubernetes.io/pod-claim-name": entry["name"]},
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Pod",
                                "name": pod.name,
                                "uid": stored["metadata"]["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": template["spec"]["spec"],
                }
            )
            claims.append(claim)
            statuses.append({"name": entry["name"], "resourceClaimName": claim["metadata"]["name"]})
        self.api.patch(
            "v1",
            "Pod",
            pod.name,
            {"status": {"resourceClaimStatuses": statuses}},
            namespace=pod.namespace,
        )
        return claims

    # --- placing --------------------------------------------------------------------------

    def place(self, pod: PodSpec, now: float) -> Held | None:
        self.clock.now = now
        claims = self._claims_for(pod)
        if not claims:
            return None
        shape = (
            pod.namespace,
            tuple(sorted(pod.resources.items())),
            tuple(sorted(pod.annotations.items())),
        )
        if shape not in self.scheduler.min_slices:
            self.scheduler.min_slices[shape] = self._min_slices(pod)
        try:
            allocation = self.scheduler.schedule(claims, shape)
        except AllocationError as exc:
            self.notes.append(f"{pod.name}: {exc}")
            return None
        if allocation is None:
            return None
        agent = self.agents[allocation.node]
        agent.before_change()
        self.scheduler.reserve(allocation)
        prepared_list: list[_Prepared] = []
        for claim, status in zip(claims, allocation.allocations, strict=True):
            results = status["devices"]["results"]
            names = {r["device"] for r in results}
            devices = [d for d in allocation.devices if d.name in names]
            meta = claim["metadata"]
            if self.api is not None:
                stored = self.api.get(RESOURCE, "ResourceClaim", meta["name"], meta["namespace"])
                stored["status"] = {
                    "allocation": status,
                    "reservedFor": [{"resource": "pods", "name": pod.name}],
                }
                claim = self.api.update(stored)
                meta = claim["metadata"]
            prepared_list.append(_Prepared(meta["uid"], meta["name"], meta["namespace"], devices))
        if self.api is not None:
            self.api.patch(
                "v1",
                "Pod",
                pod.name,
                {"spec": {"nodeName": allocation.node}},
                namespace=pod.namespace,
            )
        for prepared in prepared_list:
            error = agent.prepare(prepared)
            if error:
                raise AllocationError(f"{pod.name}: NodePrepareResources failed: {error}")
        agent.allocate(allocation.devices)
        self._check_instances(agent, allocation)
        self.running[pod.name] = (allocation, prepared_list)
        self._after_change(agent)
        slots = []
        for device in allocation.devices:
            spec = parse_device_name(device.name)
            if isinstance(spec, WholeGpu):
                slots.append(Slot(spec.gpu_index, None))
            else:
                slots.append(Slot(spec.gpu_index, spec.profile, spec.start))
        used = sum(_slices_of(parse_device_name(d.name), agent) for d in allocation.devices)
        self.scheduler.order.change(allocation.node, used)
        return Held(allocation.node, tuple(slots))

    def _min_slices(self, pod: PodSpec) -> int:
        """Memory slices the pod needs at least, on any model of the cluster (a necessary
        condition the scheduler uses to skip nodes without enough free slices)."""
        models = {m.key: m for n in self.scenario.nodes for m in n.models}.values()
        total = 0
        for request in self.demand(pod):
            options = []
            for alt in request:
                for model in models:
                    if alt.kind == "gpu":
                        options.append(alt.count * model.memory_slices)
                    elif alt.profile is not None and model.has_profile(alt.profile):
                        options.append(alt.count * model.profile(alt.profile).memory_slices)
            total += min(options, default=0)
        return total

    def _check_instances(self, agent: NodeAgent, allocation: Allocation) -> None:
        """Every prepared MIG device has exactly its instance on the GPU, and nothing else is."""
        gpus = {parse_device_name(d.name).gpu_index for d in allocation.devices}
        for gpu in gpus:
            wanted = sorted(
                (s.profile, s.start)
                for s in agent.allocated.values()
                if isinstance(s, SliceSpec) and s.gpu_index == gpu
            )
            have = agent.instance_placements(gpu)
            if have != wanted:
                raise AllocationError(
                    f"{agent.name} gpu {gpu}: instances {have} but prepared claims hold {wanted}"
                )

    def release(self, pod: PodSpec, held: Held, now: float) -> None:
        self.clock.now = now
        allocation, prepared_list = self.running.pop(pod.name)
        agent = self.agents[allocation.node]
        agent.before_change()
        for prepared in prepared_list:
            error = agent.unprepare(prepared)
            if error:
                raise AllocationError(f"{pod.name}: NodeUnprepareResources failed: {error}")
        if self.api is not None:
            self.api.delete("v1", "Pod", pod.name, pod.namespace)
            for prepared in prepared_list:  # the claim controller: owner gone, claim goes
                self.api.delete(RESOURCE, "ResourceClaim", prepared.name, prepared.namespace)
        self.claims.pop(pod.name, None)
        agent.deallocate(allocation.devices)
        self.scheduler.release(allocation.node, allocation.devices)
        used = sum(_slices_of(parse_device_name(d.name), agent) for d in allocation.devices)
        self.scheduler.order.change(allocation.node, -used)
        self._after_change(agent)

    def _after_change(self, agent: NodeAgent) -> None:
        due = agent.allocation_changed()
        if due is None:
            self.due.pop(agent.name, None)
        else:
            self.due[agent.name] = due

    def wakeup(self) -> float | None:
        return min(self.due.values()) if self.due else None

    def tick(self, now: float) -> None:
        self.clock.now = now
        for name in [n for n, t in self.due.items() if t <= now]:
            agent = self.agents[name]
            del self.due[name]
            if agent.republish():
                self.scheduler.touch(name)
            later = agent.allocation_changed()
            if later is not None and later > now:
                self.due[name] = later

    # --- figures and the end ----------------------------------------------------------------

    def mig_counts(self) -> tuple[int, int]:
        calls = [a.mig_calls() for a in self.agents.values()]
        return sum(c[0] for c in calls), sum(c[1] for c in calls)

    def finish(self, now: float) -> list[str]:
        problems: list[str] = []
        for agent in self.agents.values():
            for info in agent.backend.gpus():
                left = agent.backend.instances(info.index)
                if left:
                    problems.append(f"{agent.name} gpu {info.index}: {len(left)} instances leaked")
            if agent.api is not None and agent.state.entries():
                problems.append(
                    f"{agent.name}: checkpoint still holds {len(agent.state.entries())} claims"
                )
        if self.scheduler.in_use.devices:
            problems.append(
                f"the scheduler still counts {len(self.scheduler.in_use.devices)} "
                "devices as allocated"
            )
        if self.api is not None:
            allocated = [
                c
                for c in self.api.list(RESOURCE, "ResourceClaim").items
                if (c.get("status") or {}).get("allocation")
            ]
            if allocated:
                problems.append(f"{len(allocated)} claims still allocated in the API")
        publishes = sum(a.publishes for a in self.agents.values())
        self.notes.append(
            f"{publishes} slice publications, {self.scheduler.attempts} allocator runs"
        )
        self.close()
        return problems

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for agent in self.agents.values():
            agent.close()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
