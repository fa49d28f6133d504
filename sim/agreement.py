"""Agreement of the allocator model with the real kube-scheduler: the pure half.

``bench/bench_allocator_agreement.py`` replays claims one at a time on the sandbox's real control
plane and, before each real allocation, asks :mod:`sim.allocator` the same question given the
same ResourceSlices and the claims already allocated (as the real scheduler allocated them). This
module holds everything that needs no cluster, so that it can be tested on its own:

* :class:`Outcome`: what one allocator decided for one claim (the results, or unschedulable),
  read from a claim's ``status.allocation`` (:func:`outcome_of_allocation`) or from the model
  (:func:`model_outcome`);
* :class:`Step` and :func:`agreement`: the comparison of the two and the agreement rate (a step
  agrees when both chose the same subrequest of every request and the same devices, or both
  found the claim unschedulable);
* the workloads: :func:`noon_burst_pods` (the shipped scenario's pods) and :func:`mixed_pods`
  (a seeded set over several node shapes: chains, whole GPUs, counts above one, NVLink
  constraints, several requests per claim), each turned into the claim spec the webhook would
  write (:func:`claim_spec_for`);
* :class:`ReplayOrder`: the order of arrivals, departures and retries of pending pods that the
  replay follows, driven by callbacks (the real cluster in the bench, fakes in tests).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_slicer.sim.allocator import allocate_on_node
from gpu_slicer.sim.demand import scenario_policy
from gpu_slicer.sim.errors import AllocationError
from gpu_slicer.sim.scenario import load_scenario
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.translate import translate_pod

Obj = dict[str, Any]
Result = tuple[str, str, str, str]
"""(request, driver, pool, device) of one allocated device; request is ``<req>/<sub>`` when a
subrequest of a ``firstAvailable`` list was chosen."""

ALLOCATED = "allocated"
UNSCHEDULABLE = "unschedulable"
ERROR = "error"


@dataclass(frozen=True)
class Outcome:
    """One allocator's decision for one claim on one node."""

    status: str
    """``allocated``, ``unschedulable`` or ``error`` (the model raised, the pod never settled)."""
    results: tuple[Result, ...] = ()
    message: str = ""

    @property
    def subrequests(self) -> tuple[str, ...]:
        """The request (or ``<request>/<subrequest>``) each device was allocated for, sorted."""
        return tuple(sorted({r[0] for r in self.results}))

    @property
    def devices(self) -> tuple[Result, ...]:
        """The allocated devices with their requests, in a canonical order."""
        return tuple(sorted(self.results))

    def describe(self) -> str:
        if self.status != ALLOCATED:
            return self.status + (f" ({self.message})" if self.message else "")
        by_request: dict[str, list[str]] = {}
        for request, _driver, _pool, device in self.results:
            by_request.setdefault(request, []).append(device)
        return "; ".join(f"{r}: {', '.join(d)}" for r, d in sorted(by_request.items()))


def outcome_of_allocation(allocation: Mapping[str, Any] | None) -> Outcome:
    """The outcome a claim's ``status.allocation`` records (None: not allocated)."""
    if not allocation:
        return Outcome(UNSCHEDULABLE)
    results = (allocation.get("devices") or {}).get("results") or []
    return Outcome(
        ALLOCATED,
        tuple(
            (str(r["request"]), str(r["driver"]), str(r["pool"]), str(r["device"])) for r in results
        ),
    )


def model_outcome(
    claim: Obj,
    *,
    node: str,
    slices: Iterable[Obj],
    device_classes: Mapping[str, Obj],
    allocated_claims: Iterable[Obj],
) -> Outcome:
    """What :mod:`sim.allocator` decides for ``claim`` on ``node`` given these slices and these
    allocated claims."""
    try:
        found = allocate_on_node(
            [claim],
            node_name=node,
            slices=slices,
            device_classes=device_classes,
            allocated_claims=allocated_claims,
        )
    except AllocationError as exc:
        return Outcome(ERROR, message=str(exc))
    if found is None:
        return Outcome(UNSCHEDULABLE)
    return outcome_of_allocation(found.allocations[0])


# --- comparison ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One claim replayed: the real scheduler's outcome and the model's."""

    workload: str
    claim: str
    node: str
    real: Outcome
    model: Outcome
    note: str = ""
    """What the replay observed around the step (a retry, slices that moved)."""

    @property
    def subrequests_agree(self) -> bool:
        return self.real.status == self.model.status and (
            self.real.subrequests == self.model.subrequests
        )

    @property
    def agrees(self) -> bool:
        """Same status and, when allocated, the same subrequests and the same devices."""
        return self.subrequests_agree and self.real.devices == self.model.devices

    def difference(self) -> str:
        """One line naming what differs; empty when the step agrees."""
        if self.agrees:
            return ""
        if self.real.status != self.model.status:
            what = "status"
        elif not self.subrequests_agree:
            what = "subrequest"
        else:
            what = "devices"
        line = (
            f"{self.workload} {self.claim} on {self.node}: {what} differs: "
            f"scheduler {self.real.describe()} | model {self.model.describe()}"
        )
        return line + (f" [{self.note}]" if self.note else "")


@dataclass(frozen=True)
class Agreement:
    steps: int
    agreed: int
    subrequests_agreed: int
    allocated: int
    """Steps the real scheduler allocated (the rest it found unschedulable)."""

    @property
    def rate(self) -> float:
        """Agreed steps over all steps (1.0 for no steps)."""
        return self.agreed / self.steps if self.steps else 1.0

    @property
    def subrequest_rate(self) -> float:
        return self.subrequests_agreed / self.steps if self.steps else 1.0

    def line(self, label: str) -> str:
        return (
            f"{label}: {self.agreed}/{self.steps} steps agree ({100 * self.rate:.1f}%); "
            f"subrequest {self.subrequests_agreed}/{self.steps} "
            f"({100 * self.subrequest_rate:.1f}%); scheduler allocated {self.allocated}, "
            f"unschedulable {self.steps - self.allocated}"
        )


def agreement(steps: Sequence[Step]) -> Agreement:
    """The agreement figures of a replay."""
    return Agreement(
        steps=len(steps),
        agreed=sum(1 for s in steps if s.agrees),
        subrequests_agreed=sum(1 for s in steps if s.subrequests_agree),
        allocated=sum(1 for s in steps if s.real.status == ALLOCATED),
    )


# --- workloads ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayPod:
    """A pod to replay: where it is pinned, when it arrives, how long it runs, its claim."""

    name: str
    workload: str
    node: str
    arrival: float
    duration: float
    claim_spec: Obj
    """``spec`` of the ResourceClaim the webhook's template would give the pod."""


def claim_spec_for(
    containers: Sequence[Mapping[str, int]],
    *,
    annotations: Mapping[str, str] | None = None,
    namespace: str = "ml",
    policy: Policy | None = None,
    name: str = "pod",
) -> Obj:
    """The claim spec the webhook writes for a pod whose containers ask for these legacy
    resources (one mapping per container; empty for an annotation-only container)."""
    body: list[Obj] = []
    for index, resources in enumerate(containers):
        container: Obj = {"name": f"c{index}", "image": "registry.example/app:1"}
        if resources:
            container["resources"] = {"limits": dict(resources)}
        body.append(container)
    metadata: Obj = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": body}}
    conversion = translate_pod(pod, namespace=namespace, policy=policy or Policy.default())
    if not conversion.templates:
        raise ValueError(f"the webhook converts nothing in {containers!r}: {conversion.summary}")
    spec: Obj = conversion.templates[0]["spec"]["spec"]
    return spec


def noon_burst_pods(node: str) -> list[ReplayPod]:
    """The shipped ``noon-burst`` scenario's pods, pinned to ``node`` (an A100-80GB:1)."""
    scenario = load_scenario("noon-burst")
    policy = scenario_policy(scenario)
    pods: list[ReplayPod] = []
    for pod in scenario.pods:
        conversion = translate_pod(pod.manifest(), namespace=pod.namespace, policy=policy)
        spec: Obj = conversion.templates[0]["spec"]["spec"]
        pods.append(ReplayPod(pod.name, pod.workload, node, pod.arrival, pod.duration, spec))
    return pods


MIXED_KINDS: dict[str, tuple[tuple[str, tuple[Mapping[str, int], ...], Mapping[str, str]], ...]]
MIXED_KINDS = {
    # per GPU model: (label, containers' legacy resources, annotations)
    "A100-80GB": (
        ("mig-1g", ({"nvidia.com/mig-1g.10gb": 1},), {}),
        ("mig-2g", ({"nvidia.com/mig-2g.20gb": 1},), {}),
        ("mig-3g", ({"nvidia.com/mig-3g.40gb": 1},), {}),
        ("mig-1g-x2", ({"nvidia.com/mig-1g.10gb": 2},), {}),
        ("gpu-1", ({"nvidia.com/gpu": 1},), {}),
        ("mem-15Gi", ({},), {"gpu-slicer.io/gpu-memory": "15Gi"}),
        ("profiles", ({},), {"gpu-slicer.io/profiles": "1g.10gb,2g.20gb,3g.40gb"}),
    ),
    "H100-80GB": (
        ("mig-1g", ({"nvidia.com/mig-1g.10gb": 1},), {}),
        ("mig-3g", ({"nvidia.com/mig-3g.40gb": 1},), {}),
        ("mig-4g", ({"nvidia.com/mig-4g.40gb": 1},), {}),
        ("gpu-2-nvlink", ({"nvidia.com/gpu": 2},), {}),
        ("gpu-1", ({"nvidia.com/gpu": 1},), {}),
        ("two-containers", ({"nvidia.com/mig-1g.10gb": 1}, {"nvidia.com/mig-2g.20gb": 1}), {}),
        ("mem-30Gi", ({},), {"gpu-slicer.io/gpu-memory": "30Gi"}),
    ),
    "A30-24GB": (
        ("mig-1g", ({"nvidia.com/mig-1g.6gb": 1},), {}),
        ("mig-2g", ({"nvidia.com/mig-2g.12gb": 1},), {}),
        ("mig-1g-x2", ({"nvidia.com/mig-1g.6gb": 2},), {}),
        ("gpu-1", ({"nvidia.com/gpu": 1},), {}),
        ("gpu-2-nvlink", ({"nvidia.com/gpu": 2},), {}),
        ("mem-10Gi", ({},), {"gpu-slicer.io/gpu-memory": "10Gi"}),
    ),
    "H200-141GB": (
        ("mig-1g", ({"nvidia.com/mig-1g.18gb": 1},), {}),
        ("mig-2g", ({"nvidia.com/mig-2g.35gb": 1},), {}),
        ("mig-3g", ({"nvidia.com/mig-3g.71gb": 1},), {}),
        ("gpu-1", ({"nvidia.com/gpu": 1},), {}),
        ("mem-40Gi", ({},), {"gpu-slicer.io/gpu-memory": "40Gi"}),
        ("two-containers", ({"nvidia.com/mig-1g.18gb": 1}, {"nvidia.com/mig-1g.18gb": 1}), {}),
    ),
}
"""Kinds of pod per GPU model for the mixed set: each a claim the webhook writes."""


def mixed_pods(
    nodes: Mapping[str, str],
    *,
    count: int = 60,
    seed: int = 16,
    span_s: float = 7200.0,
    durations: Sequence[float] = (300.0, 600.0, 900.0, 1200.0),
) -> list[ReplayPod]:
    """``count`` pods over ``nodes`` (name -> GPU model of :data:`MIXED_KINDS`), arriving in
    ``span_s``, each running one of ``durations``; the same list for the same seed. The
    defaults keep most nodes below saturation, so that most steps choose devices."""
    rng = random.Random(seed)
    names = sorted(nodes)
    specs: dict[tuple[str, str], Obj] = {}
    pods: list[ReplayPod] = []
    for index in range(count):
        node = names[index % len(names)]
        model = nodes[node]
        label, containers, annotations = rng.choice(MIXED_KINDS[model])
        key = (model, label)
        if key not in specs:
            specs[key] = claim_spec_for(containers, annotations=annotations)
        arrival = round(rng.uniform(0, span_s))
        duration = rng.choice(tuple(durations))
        pods.append(
            ReplayPod(
                f"mixed-{index:02d}", f"mixed/{model}/{label}", node, arrival, duration, specs[key]
            )
        )
    pods.sort(key=lambda p: (p.arrival, p.name))
    return pods


# --- the order of the replay --------------------------------------------------------------


@dataclass
class ReplayOrder:
    """Arrivals and departures in time order; a pod that could not be placed waits and is
    tried again after each departure from its node (as the scheduler retries a pending pod when
    devices are freed). Each try is one step; departures release what a pod holds.

    ``place(pod, attempt)`` returns whether the pod was allocated; ``release(pod)`` ends it.
    Pods still waiting at the end are left unplaced."""

    pods: Sequence[ReplayPod]
    pending: list[ReplayPod] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)

    def run(
        self, place: Callable[[ReplayPod, int], bool], release: Callable[[ReplayPod], None]
    ) -> None:
        events: list[tuple[float, int, int, ReplayPod]] = []
        order = 0
        for pod in self.pods:
            heapq.heappush(events, (pod.arrival, 1, order, pod))
            order += 1
        while events:
            now, kind, _, pod = heapq.heappop(events)
            if kind == 0:  # departures before arrivals at the same moment
                release(pod)
                for waiting in [p for p in self.pending if p.node == pod.node]:
                    if self._try(waiting, place):
                        self.pending.remove(waiting)
                        heapq.heappush(events, (now + waiting.duration, 0, order, waiting))
                        order += 1
                continue
            if self._try(pod, place):
                heapq.heappush(events, (now + pod.duration, 0, order, pod))
                order += 1
            else:
                self.pending.append(pod)

    def _try(self, pod: ReplayPod, place: Callable[[ReplayPod, int], bool]) -> bool:
        attempt = self.attempts.get(pod.name, 0)
        self.attempts[pod.name] = attempt + 1
        return place(pod, attempt)
