"""What the real kube-scheduler would sustain for a scenario, from measured costs.

The simulator's allocator model decides *where* pods go; it says nothing about *how fast* a real
scheduler decides. ``bench/bench_scheduler.py`` measures that on the real kube-scheduler with
hollow nodes: scheduler CPU per pod for each of gpu-slicer's claim shapes at several node counts
and releases. ``bench_scheduler.py --cost-model FILE`` writes those figures in the format of
``scheduler-cost.yaml`` beside this module, which ships with the measurements made for
docs/performance.md. This module reads them and answers, for a scenario: at its node count and
release, how much scheduler CPU its mix of pods costs, how many pods per second one scheduler
core sustains, and whether that keeps up with the scenario's busiest minute.

Between measured node counts the cost is interpolated on a log-log scale (a power law between
two points); beyond the largest it is extrapolated with the last two points' exponent; below the
smallest it is the smallest's cost; outside the measured range the report says so. A release
that was not measured uses the nearest measured one and says that too.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_slicer.sim.demand import DemandBook
from gpu_slicer.sim.errors import ScenarioError
from gpu_slicer.sim.scenario import Scenario
from gpu_slicer.slicer.demand import AdvertisedProfiles
from gpu_slicer.webhook.claims import Alternative, ContainerRequest

COST_FILE = Path(__file__).with_name("scheduler-cost.yaml")
SHAPES = ("single", "fallback", "memory", "whole", "nvlink")
"""The benchmark's gpu-slicer claim shapes (``bench_scheduler.SHAPES``)."""


@dataclass(frozen=True)
class Point:
    nodes: int
    cpu_ms: float
    """Scheduler CPU per pod, milliseconds."""


@dataclass(frozen=True)
class CostModel:
    measured: str
    """Where and how the figures were measured (one line)."""
    releases: Mapping[str, Mapping[str, tuple[Point, ...]]]
    """``1.37`` -> shape (``single``, ``plain``, ...) -> points by node count."""

    def release_for(self, version: tuple[int, int]) -> str:
        """The measured release closest to ``version`` (the same, when it was measured)."""
        wanted = version[0] * 100 + version[1]

        def distance(name: str) -> tuple[int, int]:
            major, minor = (int(x) for x in name.split("."))
            return (abs(major * 100 + minor - wanted), -(major * 100 + minor))

        return min(self.releases, key=distance)

    def cpu_ms(self, release: str, shape: str, nodes: int) -> tuple[float, bool]:
        """Scheduler CPU per pod of ``shape`` at ``nodes`` nodes, and whether that is beyond
        the measured node counts (extrapolated)."""
        points = self.releases[release][shape]
        sizes = [p.nodes for p in points]
        if len(points) == 1:
            return points[0].cpu_ms, nodes != sizes[0]
        at = bisect.bisect_left(sizes, nodes)
        if at < len(points) and sizes[at] == nodes:
            return points[at].cpu_ms, False
        if at == 0:
            # Below the smallest cluster measured: its cost (fixed costs dominate small sizes).
            return points[0].cpu_ms, True
        lo, hi = (
            (points[0], points[1])
            if at == 0
            else ((points[-2], points[-1]) if at >= len(points) else (points[at - 1], points[at]))
        )
        slope = math.log(hi.cpu_ms / lo.cpu_ms) / math.log(hi.nodes / lo.nodes)
        value = lo.cpu_ms * (nodes / lo.nodes) ** slope
        return value, not sizes[0] <= nodes <= sizes[-1]


def load(path: Path = COST_FILE) -> CostModel:
    """The cost model in ``path`` (``scheduler-cost.yaml``); ScenarioError when unusable."""
    try:
        data = yaml.safe_load(path.read_text())
        releases = {
            str(release): {
                str(shape): tuple(
                    sorted((Point(int(n), float(ms)) for n, ms in points), key=lambda p: p.nodes)
                )
                for shape, points in shapes.items()
            }
            for release, shapes in data["releases"].items()
        }
        return CostModel(str(data["measured"]), releases)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScenarioError(f"scheduler cost model {path}: {type(exc).__name__}: {exc}") from exc


def write(
    path: Path, measured: str, runs: Iterable[tuple[str, int, str, float]], *, merge: bool = False
) -> None:
    """Write a cost model from benchmark runs: (release, nodes, shape, CPU ms per pod). With
    ``merge``, the points of ``path`` that these runs do not measure again are kept (a run of
    one release and size adds to the model instead of replacing it)."""
    found: dict[tuple[str, str, int], float] = {}
    if merge and path.exists():
        old = load(path)
        measured = f"{old.measured}; {measured}"
        for release, shapes in old.releases.items():
            for shape, points in shapes.items():
                for point in points:
                    found[(release, shape, point.nodes)] = point.cpu_ms
    for release, nodes, shape, cpu_ms in runs:
        if math.isfinite(cpu_ms):
            found[(release, shape, nodes)] = round(cpu_ms, 1)
    releases: dict[str, dict[str, list[list[float]]]] = {}
    for (release, shape, nodes), cpu_ms in sorted(found.items()):
        releases.setdefault(release, {}).setdefault(shape, []).append([nodes, cpu_ms])
    path.write_text(
        "# Scheduler CPU per pod [nodes, milliseconds], written by bench/bench_scheduler.py\n"
        + yaml.safe_dump(
            {"measured": measured, "releases": releases},
            sort_keys=True,
            default_flow_style=None,
            width=100,
        )
    )


def shape_of(requests: tuple[ContainerRequest, ...]) -> str:
    """Which measured claim shape a converted pod's claim is closest to."""
    alternatives: list[Alternative] = [a for r in requests for a in r.alternatives]
    if any(a.kind == "gpu" and a.count > 1 for a in alternatives) or any(
        a.nvlink for a in alternatives
    ):
        return "nvlink"
    if any(a.kind == "gpu" for a in alternatives):
        return "whole"
    if any(a.any_of or a.min_memory_bytes is not None for a in alternatives):
        return "memory"
    if any(len(r.alternatives) > 1 for r in requests):
        return "fallback"
    return "single"


@dataclass(frozen=True)
class Outlook:
    """What the real scheduler would sustain for a scenario's pods."""

    release: str
    asked_release: str
    nodes: int
    mix: Mapping[str, int]
    """Converted pods per shape."""
    cpu_ms: float
    """Mean scheduler CPU per converted pod at this size."""
    plain_cpu_ms: float | None
    """The same for the benchmark's baseline pods (another driver's devices only)."""
    extrapolated: bool
    peak_per_s: float
    """Pods arriving in the scenario's busiest minute, per second."""
    measured: str
    advertised_profiles: AdvertisedProfiles = "all"
    """What the scenario's agents advertise (``asked`` or ``all``): whose measured costs apply."""
    neighbour_ms: tuple[float, float] | None = None
    """Another driver's pod (the benchmark's NIC): its CPU alone and beside gpu-slicer's
    slices as advertised, when measured."""

    @property
    def per_core_per_s(self) -> float:
        return 1000.0 / self.cpu_ms if self.cpu_ms > 0 else math.inf

    def lines(self) -> list[str]:
        where = f"Kubernetes {self.release}"
        if self.release != self.asked_release:
            where += f" (nearest measured to the scenario's {self.asked_release})"
        mix = ", ".join(f"{n} {s}" for s, n in sorted(self.mix.items(), key=lambda i: -i[1]))
        out = [
            f"real kube-scheduler, {where}, {self.nodes} node{'s' if self.nodes != 1 else ''}"
            + (" (outside the measured node counts: extrapolated)" if self.extrapolated else "")
            + ":",
            f"  converted pods by claim shape: {mix}",
            f"  scheduler CPU per pod: {self.cpu_ms:,.1f} ms"
            + (
                f" ({self.cpu_ms / self.plain_cpu_ms:.1f}x a plain-device pod's)"
                if self.plain_cpu_ms
                else ""
            )
            + f"; one scheduler core sustains about {_rate(self.per_core_per_s)} pods/s",
            f"  busiest minute of the trace: {self.peak_per_s:,.2f} pods/s arriving: "
            + self._verdict(),
        ]
        if self.neighbour_ms is not None:
            alone, beside = self.neighbour_ms
            out.append(
                f"  another driver's pod (a NIC's): {alone:,.1f} ms alone, {beside:,.1f} ms"
                f" beside gpu-slicer's slices (agents advertising {self.advertised_profiles})"
            )
        out.append(f"  cost model: {self.measured}")
        return out

    def _verdict(self) -> str:
        if self.per_core_per_s >= self.peak_per_s:
            return "one core keeps up"
        cores = self.peak_per_s / self.per_core_per_s
        return f"the scheduler needs {cores:.1f} cores to keep up, or pods wait"

    def as_json(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "nodes": self.nodes,
            "mix": dict(self.mix),
            "cpuMsPerPod": round(self.cpu_ms, 2),
            "plainCpuMsPerPod": None if self.plain_cpu_ms is None else round(self.plain_cpu_ms, 2),
            "podsPerSecondPerCore": round(self.per_core_per_s, 3),
            "peakArrivalsPerSecond": round(self.peak_per_s, 3),
            "extrapolated": self.extrapolated,
            "advertisedProfiles": self.advertised_profiles,
            "neighbourCpuMsPerPod": None
            if self.neighbour_ms is None
            else {
                "alone": round(self.neighbour_ms[0], 2),
                "beside": round(self.neighbour_ms[1], 2),
            },
        }


def _rate(value: float) -> str:
    return f"{value:,.1f}" if value >= 1 else f"{value:.3f}"


def outlook(
    model: CostModel,
    version: tuple[int, int],
    nodes: int,
    mix: Mapping[str, int],
    arrivals: Iterable[float],
    advertised_profiles: AdvertisedProfiles = "all",
) -> Outlook | None:
    """The outlook for ``mix`` (converted pods per shape) on ``nodes`` nodes, with agents that
    advertise ``advertised_profiles`` (the benchmark's ``-asked`` runs where measured); None when no
    pod was converted."""
    total = sum(mix.values())
    if not total:
        return None
    release = model.release_for(version)
    shapes = model.releases[release]

    def measured(shape: str) -> str | None:
        names = ([f"{shape}-asked"] if advertised_profiles == "asked" else []) + [shape]
        return next((n for n in names if n in shapes), None)

    cost, beyond = 0.0, False
    for shape, count in mix.items():
        known = measured(shape) or measured("single") or "single"
        ms, extrapolated = model.cpu_ms(release, known, nodes)
        cost += ms * count
        beyond = beyond or extrapolated
    plain = model.cpu_ms(release, "plain", nodes)[0] if "plain" in shapes else None
    beside = "nic-asked" if advertised_profiles == "asked" else "nic-gs"
    neighbour = (
        (model.cpu_ms(release, "nic", nodes)[0], model.cpu_ms(release, beside, nodes)[0])
        if "nic" in shapes and beside in shapes
        else None
    )
    return Outlook(
        release=release,
        asked_release=f"{version[0]}.{version[1]}",
        nodes=nodes,
        mix=dict(mix),
        cpu_ms=cost / total,
        plain_cpu_ms=plain,
        extrapolated=beyond,
        peak_per_s=busiest_minute(arrivals) / 60.0,
        measured=model.measured,
        advertised_profiles=advertised_profiles,
        neighbour_ms=neighbour,
    )


def busiest_minute(arrivals: Iterable[float]) -> int:
    """The most arrivals in any 60-second window."""
    times = sorted(arrivals)
    best = start = 0
    for end, t in enumerate(times):
        while t - times[start] >= 60.0:
            start += 1
        best = max(best, end - start + 1)
    return best


def scenario_outlook(scenario: Scenario, model: CostModel | None = None) -> Outlook | None:
    """The outlook for a scenario: its converted pods' shapes, node count, release and
    arrivals (the pods the webhook converts; others are not gpu-slicer's to schedule)."""
    book = DemandBook(scenario)
    shapes: list[str] = []
    arrivals: list[float] = []
    for pod in scenario.pods:
        conversion = book.translated(pod).conversion
        if conversion is None or not conversion.requests:
            continue
        shapes.append(shape_of(conversion.requests))
        arrivals.append(pod.arrival)
    return outlook(
        model or load(),
        scenario.kubernetes,
        len(scenario.nodes),
        Counter(shapes),
        arrivals,
        advertised_profiles=scenario.advertised_profiles,
    )
