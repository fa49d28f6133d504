"""The discrete-event loop every strategy runs on, and the figures it records.

The trace is replayed in simulated time: a pod arrives, the strategy tries to place it at once
(as the scheduler does with a new pod); a pod that does not fit waits and is retried, in arrival
order, whenever something is released (the scheduler's re-queue on cluster events). A running pod
leaves ``duration`` after it started. The engine keeps a ledger of what every running pod holds
on every GPU, checks after each placement that no two pods share a memory slice, and records:

* pods served (started before the end) and left pending; wait (start - arrival), mean and p95;
* memory-slice utilization over time (slices held / all slices, time-weighted) and samples of it;
* fragmentation, sampled: the free memory slices on GPUs where no pending pod could use any of
  them, as a share of all slices (0 when nothing is pending);
* MIG creations and destructions, as the strategy counts them.

Retries are cheap because a request shape that failed stays failed until something is released
(arrivals only take capacity; a republished device order changes where things go, not whether
they fit).
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpu_slicer.core import catalog
from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.sim.demand import Demand
from gpu_slicer.sim.errors import SimError
from gpu_slicer.sim.scenario import PodSpec, Scenario
from gpu_slicer.webhook.claims import Alternative

Progress = Callable[[float], None]


class InvariantError(SimError):
    """The simulation broke a rule it must keep (overlapping slices, a leak): a bug, not input."""


@dataclass(frozen=True)
class Slot:
    """Part of a GPU a pod holds: a MIG placement, or the whole GPU (profile None)."""

    gpu: int
    profile: str | None
    start: int = 0


@dataclass(frozen=True)
class Held:
    node: str
    slots: tuple[Slot, ...]


@dataclass
class GpuLedger:
    node: str
    index: int
    model: GpuModel
    held: dict[str, list[Slot]] = field(default_factory=dict)
    """pod name -> slots held on this GPU (changed through :meth:`hold` and :meth:`drop`)."""
    _placements: tuple[Placement, ...] | None = field(default=None, repr=False, compare=False)
    _whole: bool | None = field(default=None, repr=False, compare=False)
    _used: int | None = field(default=None, repr=False, compare=False)

    def hold(self, pod: str, slots: list[Slot]) -> None:
        self.held[pod] = slots
        self._changed()

    def drop(self, pod: str) -> None:
        if self.held.pop(pod, None) is not None:
            self._changed()

    def _changed(self) -> None:
        # What the slots held decide is kept until they change: every pod placed or released
        # reads it several times, on each GPU it touches.
        self._placements = self._whole = self._used = None

    def placements(self) -> tuple[Placement, ...]:
        if self._placements is None:
            self._placements = tuple(
                sorted(
                    (s.profile, s.start)
                    for slots in self.held.values()
                    for s in slots
                    if s.profile is not None
                )
            )
        return self._placements

    @property
    def whole(self) -> bool:
        if self._whole is None:
            self._whole = any(s.profile is None for slots in self.held.values() for s in slots)
        return self._whole

    def used_slices(self) -> int:
        if self._used is None:
            if self.whole:
                self._used = self.model.memory_slices
            else:
                self._used = sum(self.model.profile(p).memory_slices for p, _ in self.placements())
        return self._used


class Strategy:
    """What a strategy implements. ``place`` must not keep state for a pod it returns None for."""

    name = "strategy"
    description = ""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.creations = 0
        self.destructions = 0
        self.notes: list[str] = []
        self.rejected: dict[str, str] = {}
        """Pods refused outright (the webhook denied them), with the reason."""

    def demand(self, pod: PodSpec) -> Demand:
        raise NotImplementedError

    def place(self, pod: PodSpec, now: float) -> Held | None:
        raise NotImplementedError

    def release(self, pod: PodSpec, held: Held, now: float) -> None:
        raise NotImplementedError

    def gpu_can_use(self, ledger: GpuLedger, alt: Alternative) -> bool:
        """Whether one unit of ``alt`` could go on this GPU now (for fragmentation)."""
        if alt.kind == "gpu":
            return not ledger.held
        if alt.profile is None or not ledger.model.has_profile(alt.profile) or ledger.whole:
            return False
        from gpu_slicer.sim.geometry import fits_next_to

        return fits_next_to(ledger.model, ledger.placements(), alt.profile)

    def mig_counts(self) -> tuple[int, int]:
        """(MIG instances created, destroyed) so far."""
        return self.creations, self.destructions

    def wakeup(self) -> float | None:
        """Simulated time at which the strategy wants :meth:`tick` (e.g. a republish)."""
        return None

    def tick(self, now: float) -> bool:
        """Time-driven work (republishing); True when pods waiting may fit now."""
        return False

    def finish(self, now: float) -> list[str]:
        """After every pod is gone: problems left behind (leaked instances, claims)."""
        return []

    def close(self) -> None:
        """Release what the strategy holds outside the process's memory (idempotent)."""

    def bind(self, mover: Callable[[dict[str, Held]], None]) -> None:
        """The engine's hook for strategies that move running pods (the oracle repacks)."""
        self.mover = mover


@dataclass
class PodRecord:
    pod: PodSpec
    start: float | None = None
    end: float | None = None
    held: Held | None = None
    node: str | None = None


@dataclass
class Result:
    strategy: str
    description: str
    served: int
    pending: int
    rejected: int
    total: int
    wait_mean_s: float
    wait_p95_s: float
    utilization_mean: float
    fragmentation_mean: float
    fragmentation_peak: float
    creations: int
    destructions: int
    series: list[tuple[float, float, float]]
    """(t, utilization, fragmentation) samples."""
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    served_by_workload: dict[str, tuple[int, int]] = field(default_factory=dict)
    """workload -> (served, total)."""
    waits_by_workload: dict[str, tuple[float, float]] = field(default_factory=dict)
    """workload -> (mean, max) wait of its served pods, seconds."""
    immediate_by_workload: dict[str, int] = field(default_factory=dict)
    """workload -> pods that started the moment they arrived."""
    starts: dict[str, float] = field(default_factory=dict)
    """pod name -> when it started (pods never started are absent), for the plot's timelines."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "description": self.description,
            "pods": {
                "total": self.total,
                "served": self.served,
                "pending": self.pending,
                "rejected": self.rejected,
            },
            "waitSeconds": {"mean": round(self.wait_mean_s, 3), "p95": round(self.wait_p95_s, 3)},
            "utilization": {"mean": round(self.utilization_mean, 5)},
            "fragmentation": {
                "mean": round(self.fragmentation_mean, 5),
                "peak": round(self.fragmentation_peak, 5),
            },
            "mig": {"creations": self.creations, "destructions": self.destructions},
            "byWorkload": {
                k: {"served": s, "total": t}
                for k, (s, t) in sorted(self.served_by_workload.items())
            },
            "waitByWorkload": {
                k: {"mean": round(m, 3), "max": round(x, 3)}
                for k, (m, x) in sorted(self.waits_by_workload.items())
            },
            "startedOnArrival": dict(sorted(self.immediate_by_workload.items())),
            "series": [[round(t, 1), round(u, 5), round(f, 5)] for t, u, f in self.series],
            "wallSeconds": round(self.wall_s, 3),
            "notes": self.notes,
        }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[rank]


@contextmanager
def _collector_off() -> Iterator[None]:
    """The collector is off for a run. A large run builds a heap of long-lived objects (pools,
    devices, caches) and frees millions of short-lived ones by reference counting, but makes next to
    no reference cycles (its collections found about 4,000 objects to free in the first 20,000 pods
    of ``large``). Yet each collection walked every young object still alive, out of cache:
    simulated with a 2 MB last-level cache, the first 10,000 pods of ``large`` (start-up included)
    missed it on 31 million data reads, 18 million of them in the collector (the start-up's
    collections among them); with the collector off for the run, 26 million. What survives the run
    joins the oldest generation before the collector is back (left young, it would start at once a
    collection of everything the run made), and the next full collection frees the few cycles the
    run left."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


class Engine:
    def __init__(
        self,
        scenario: Scenario,
        strategy: Strategy,
        *,
        progress: Progress | None = None,
        check_overlaps: bool = True,
    ) -> None:
        self.scenario = scenario
        self.strategy = strategy
        self.progress = progress
        self.check_overlaps = check_overlaps
        self.ledgers: dict[tuple[str, int], GpuLedger] = {
            (n.name, i): GpuLedger(n.name, i, m)
            for n in scenario.nodes
            for i, m in enumerate(n.models)
        }
        self.total_slices = sum(g.model.memory_slices for g in self.ledgers.values())
        self.used = 0
        self.records: dict[str, PodRecord] = {p.name: PodRecord(p) for p in scenario.pods}
        self.pending: dict[str, None] = {}
        self.failed: dict[Any, int] = {}
        self.epoch = 0
        self.integral = 0.0
        self.last_t = 0.0
        self.series: list[tuple[float, float, float]] = []
        self.fragmentation: list[float] = []
        self._violations = catalog.KnownViolations()
        """The catalog's rules, once per distinct set of instances on a model (a large run places
        the same few thousand sets tens of thousands of times)."""
        strategy.bind(self._move)

    # --- ledger ----------------------------------------------------------------------------

    def _hold(self, record: PodRecord, held: Held) -> None:
        name = record.pod.name
        by_gpu: dict[int, list[Slot]] = {}
        for slot in held.slots:
            by_gpu.setdefault(slot.gpu, []).append(slot)
        for gpu, slots in by_gpu.items():
            ledger = self.ledgers[(held.node, gpu)]
            before = ledger.used_slices()
            if ledger.whole or (ledger.held and any(s.profile is None for s in slots)):
                raise InvariantError(f"{name} shares GPU {held.node}/{gpu} held whole")
            ledger.hold(name, slots)
            if self.check_overlaps:
                problems = self._violations(ledger.model, ledger.placements())
                if problems:
                    raise InvariantError(
                        f"{self.strategy.name}: {name} on {held.node}/gpu-{gpu}: "
                        + "; ".join(problems)
                    )
            self.used += ledger.used_slices() - before
        record.held = held
        record.node = held.node

    def _move(self, moves: dict[str, Held]) -> None:
        records = [self.records[name] for name in moves]
        for record in records:
            self._drop(record)
        for record in records:
            self._hold(record, moves[record.pod.name])

    def _drop(self, record: PodRecord) -> None:
        held = record.held
        if held is None:
            return
        for gpu in {s.gpu for s in held.slots}:
            ledger = self.ledgers[(held.node, gpu)]
            before = ledger.used_slices()
            ledger.drop(record.pod.name)
            self.used += ledger.used_slices() - before
        record.held = None

    # --- metrics ---------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if now > self.last_t:
            self.integral += self.used * (now - self.last_t)
            self.last_t = now

    def _sample(self, t: float) -> None:
        fragmented = 0
        if self.pending:
            alts: set[Alternative] = set()
            for name in self.pending:
                for request in self.strategy.demand(self.records[name].pod):
                    for alt in request:
                        alts.add(Alternative(alt.kind, 1, alt.profile))
            cache: dict[Any, bool] = {}
            for ledger in self.ledgers.values():
                free = ledger.model.memory_slices - ledger.used_slices()
                if free == 0:
                    continue
                key = (ledger.model.key, ledger.placements(), ledger.whole, self._state_key(ledger))
                usable = cache.get(key)
                if usable is None:
                    usable = any(self.strategy.gpu_can_use(ledger, a) for a in alts)
                    cache[key] = usable
                if not usable:
                    fragmented += free
        share = fragmented / self.total_slices if self.total_slices else 0.0
        self.fragmentation.append(share)
        self.series.append((t, self.used / self.total_slices if self.total_slices else 0.0, share))

    def _state_key(self, ledger: GpuLedger) -> Any:
        key = getattr(self.strategy, "state_key", None)
        return key(ledger) if key else None

    # --- the loop --------------------------------------------------------------------------

    def _try(self, record: PodRecord, now: float) -> bool:
        pod = record.pod
        sig = (
            pod.namespace,
            tuple(sorted(pod.resources.items())),
            tuple(sorted(pod.annotations.items())),
        )
        if self.failed.get(sig) == self.epoch:
            return False
        held = self.strategy.place(pod, now)
        if held is None:
            self.failed[sig] = self.epoch
            return False
        self._hold(record, held)
        record.start = now
        self.pending.pop(pod.name, None)
        heapq.heappush(self.queue, (now + pod.duration, 1, self._seq(), pod.name))
        return True

    def _seq(self) -> int:
        self.counter += 1
        return self.counter

    def run(self) -> Result:
        with _collector_off():
            return self._run()

    def _run(self) -> Result:
        scenario = self.scenario
        self.queue: list[tuple[float, int, int, str]] = []
        self.counter = 0
        for pod in scenario.pods:
            if pod.arrival <= scenario.end:
                heapq.heappush(self.queue, (pod.arrival, 2, self._seq(), pod.name))
        next_sample = 0.0
        total = len(self.queue)
        done = 0
        report_every = max(1, total // 200)
        while True:
            wake = self.strategy.wakeup()
            head = self.queue[0][0] if self.queue else math.inf
            now = min(head, wake if wake is not None else math.inf, next_sample)
            if now > scenario.end or now == math.inf:
                break
            self._advance(now)
            if now == next_sample:
                self._sample(now)
                next_sample += scenario.sample_s
                continue
            if wake is not None and now == wake and wake <= head:
                if self.strategy.tick(now):
                    self._retry_pending(now)
                continue
            _, kind, _, name = heapq.heappop(self.queue)
            record = self.records[name]
            if kind == 2:
                done += 1
                if self.progress and done % report_every == 0:
                    self.progress(done / total)
                self.pending[name] = None
                self._try(record, now)
            else:
                assert record.held is not None
                self.strategy.release(record.pod, record.held, now)
                self._drop(record)
                record.end = now
                self._retry_pending(now)
        self._advance(scenario.end)
        if self.progress:
            self.progress(1.0)
        return self._result()

    def _retry_pending(self, now: float) -> None:
        """Something was freed or published: every waiting pod is tried again."""
        self.epoch += 1
        for waiting in list(self.pending):
            self._try(self.records[waiting], now)

    def drain(self) -> list[str]:
        """Release every running pod and ask the strategy what is left behind."""
        now = self.scenario.end
        for record in self.records.values():
            if record.held is not None:
                self.strategy.release(record.pod, record.held, now)
                self._drop(record)
        problems = self.strategy.finish(now)
        if self.used != 0:
            problems.append(f"the ledger still holds {self.used} memory slices")
        return problems

    def _result(self) -> Result:
        started = [r for r in self.records.values() if r.start is not None]
        waits = [r.start - r.pod.arrival for r in started if r.start is not None]
        arrived = [r for r in self.records.values() if r.pod.arrival <= self.scenario.end]
        by_workload: dict[str, tuple[int, int]] = {}
        workload_waits: dict[str, list[float]] = {}
        for r in arrived:
            served, total = by_workload.get(r.pod.workload, (0, 0))
            by_workload[r.pod.workload] = (served + (r.start is not None), total + 1)
            if r.start is not None:
                workload_waits.setdefault(r.pod.workload, []).append(r.start - r.pod.arrival)
        rejected = sum(1 for r in arrived if r.pod.name in self.strategy.rejected)
        span = self.scenario.end or 1.0
        return Result(
            strategy=self.strategy.name,
            description=self.strategy.description,
            served=len(started),
            pending=len(arrived) - len(started),
            rejected=rejected,
            total=len(arrived),
            wait_mean_s=sum(waits) / len(waits) if waits else 0.0,
            wait_p95_s=percentile(waits, 0.95),
            utilization_mean=self.integral / (span * self.total_slices)
            if self.total_slices
            else 0.0,
            fragmentation_mean=sum(self.fragmentation) / len(self.fragmentation)
            if self.fragmentation
            else 0.0,
            fragmentation_peak=max(self.fragmentation, default=0.0),
            creations=self.strategy.mig_counts()[0],
            destructions=self.strategy.mig_counts()[1],
            series=self.series,
            notes=list(self.strategy.notes),
            served_by_workload=by_workload,
            waits_by_workload={k: (sum(v) / len(v), max(v)) for k, v in workload_waits.items()},
            immediate_by_workload={
                k: sum(1 for w in v if w == 0) for k, v in workload_waits.items()
            },
            starts={r.pod.name: r.start for r in started if r.start is not None},
        )
