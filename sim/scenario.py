"""Scenarios: a cluster, namespace policies and a trace of pods, read from YAML.

The schema is documented in docs/simulator.md. Everything is validated on load and every problem
names its key (``pods[3].duration: ...``). Pods are listed one by one or produced by seeded
generators, so a trace of 100,000 events fits in a few lines and is the same on every run with
the same seed. Durations accept seconds or ``90s``, ``30m``, ``2h``, ``1h30m``, ``1d``; arrival
times also accept a clock time ``HH:MM`` when the scenario sets ``clock``.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from gpu_slicer.core.devices import Mode
from gpu_slicer.core.errors import GpuSlicerError
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.core.gpuspec import parse_gpu_spec
from gpu_slicer.kube import documents
from gpu_slicer.sim.errors import ScenarioError, UnknownNameError
from gpu_slicer.slicer.demand import ADVERTISED_PROFILES_CHOICES, AdvertisedProfiles
from gpu_slicer.slicer.layout import LayoutError, StaticLayout

DEFAULT_DEMAND_LATENCY_S = 2.0
"""From a pod of a new shape to its binding, as the scheduler benchmark measures it on the real
scheduler (``bench/bench_scheduler.py --new-shape``, 1.37): median 1.2 s and p95 2.0 s at 100
nodes, p95 4.0 s at 250 (docs/agent.md)."""

Obj = dict[str, Any]

NODE_RULES = ("pack", "spread")
NAMESPACE_MODES = ("enabled", "audit", "disabled")
BUILTIN_LAYOUTS: dict[str, tuple[str, ...]] = {
    "balanced": ("3g", "2g", "1g", "1g"),
    "1g": ("1g",) * 7,
    "2g": ("2g", "2g", "2g", "1g"),
    "half": ("3g", "3g"),
}
"""Static MIG layouts by size kind, resolved per model (``3g`` is 3g.40gb on an A100 80GB)."""

_DURATION = re.compile(
    r"^(?:(?P<d>\d+(?:\.\d+)?)d)?(?:(?P<h>\d+(?:\.\d+)?)h)?"
    r"(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?$"
)
_CLOCK = re.compile(r"^(?P<h>\d{1,2}):(?P<m>\d{2})$")
_TOP_KEYS = (
    "name",
    "description",
    "clock",
    "end",
    "sample",
    "kubernetes",
    "scheduler",
    "agent",
    "nodes",
    "namespaces",
    "policy",
    "layouts",
    "pods",
    "generators",
    "seed",
)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: str
    models: tuple[GpuModel, ...]
    mode: Mode
    """Requested agent mode: dynamic (default; Ampere falls back to mig), mig or full."""


@dataclass(frozen=True)
class PodSpec:
    """One pod of the trace: when it arrives, how long it runs once started, what it asks."""

    name: str
    namespace: str
    arrival: float
    duration: float
    resources: Mapping[str, int]
    annotations: Mapping[str, str]
    workload: str
    """A label for reports (the generator or the listed pod's ``workload``)."""

    def manifest(self) -> Obj:
        """The Pod as a user would write it (legacy requests in limits)."""
        container: Obj = {"name": "main", "image": "registry.example/app:1"}
        if self.resources:
            container["resources"] = {"limits": {k: v for k, v in self.resources.items()}}
        metadata: Obj = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"workload": self.workload},
        }
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"containers": [container], "restartPolicy": "Never"},
        }


@dataclass(frozen=True)
class StaticLayoutSpec:
    """A static MIG layout: per GPU model a list of profiles or size kinds; ``whole`` = no MIG."""

    name: str
    default: tuple[str, ...] | None
    overrides: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    """``<node>/<gpu index>`` or ``<node>`` -> layout (None: the GPU stays whole)."""
    placements: StaticLayout | None = None
    """A layout in the agent's format (``default``/``gpus`` of ``profile@start`` entries, the
    file ``agent run --static-layout`` and ``slices --static-layout`` read): exact instances per
    GPU index instead of sizes to pack."""

    def for_gpu(self, node: str, index: int) -> tuple[str, ...] | None:
        key = f"{node}/{index}"
        if key in self.overrides:
            return self.overrides[key]
        if node in self.overrides:
            return self.overrides[node]
        return self.default


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    end: float
    sample_s: float
    clock_s: float
    kubernetes: tuple[int, int]
    node_rule: str
    republish_min_interval_s: float
    republish_quiet_s: float
    nodes: tuple[NodeSpec, ...]
    namespaces: Mapping[str, str]
    policy: Obj
    layouts: Mapping[str, StaticLayoutSpec]
    pods: tuple[PodSpec, ...]
    seed: int
    advertised_profiles: AdvertisedProfiles = "asked"
    """The agents' ``--advertised-profiles``: what the cluster asks for, or every profile."""
    demand_latency_s: float = DEFAULT_DEMAND_LATENCY_S
    """From a pod of a new shape to its profile advertised on every node (the agents see the
    template, republish; the scheduler tries the pod again)."""

    @property
    def gpu_count(self) -> int:
        return sum(len(n.models) for n in self.nodes)

    @property
    def events(self) -> int:
        """Pod events in the trace: every pod arrives and, when it runs, leaves."""
        return 2 * len(self.pods)

    def clock(self, t: float) -> str:
        """Simulated time as a clock (``12:05``) or, past a day, ``d+1 00:05``."""
        total = int(self.clock_s + t)
        days, rest = divmod(total, 86400)
        text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}"
        return f"d+{days} {text}" if days else text


# --- values -----------------------------------------------------------------------------------


def parse_duration(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise ScenarioError(f"{path}: {value!r} is not a duration (e.g. 90s, 30m, 2h, 1h30m)")
    if isinstance(value, int | float):
        if value < 0:
            raise ScenarioError(f"{path}: {value!r} is negative")
        return float(value)
    text = str(value).strip()
    match = _DURATION.match(text)
    if not text or not match or not any(match.groupdict().values()):
        raise ScenarioError(f"{path}: {value!r} is not a duration (e.g. 90s, 30m, 2h, 1h30m)")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    return (
        parts.get("d", 0) * 86400
        + parts.get("h", 0) * 3600
        + parts.get("m", 0) * 60
        + parts.get("s", 0)
    )


def _time(value: Any, path: str, clock_s: float) -> float:
    if isinstance(value, str) and _CLOCK.match(value.strip()):
        match = _CLOCK.match(value.strip())
        assert match is not None
        seconds = int(match["h"]) * 3600 + int(match["m"]) * 60
        if seconds < clock_s:
            raise ScenarioError(f"{path}: {value} is before the scenario's clock start")
        return seconds - clock_s
    return parse_duration(value, path)


MAX_COUNT = 1_000_000
"""Pods one entry may repeat: ten times the shipped ``large`` scenario, still minutes to run."""
MAX_SAMPLES = 1_000_000
"""Utilization samples one run may take (``end / sample``)."""


def _whole(value: Any, path: str, *, minimum: int | None) -> int:
    """A whole number (not a bool, not text) within bounds, or a ScenarioError naming ``path``.

    Counts (``minimum`` given) are also capped at MAX_COUNT; seeds (``minimum=None``) are not.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{path}: {value!r} must be a whole number")
    if minimum is not None and not minimum <= value <= MAX_COUNT:
        raise ScenarioError(
            f"{path}: {value!r} must be a whole number >= {minimum} and <= {MAX_COUNT:,}"
        )
    return value


def _mapping(value: Any, path: str) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{path}: must be a mapping, not {type(value).__name__}")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ScenarioError(f"{path}: must be a list, not {type(value).__name__}")
    return value


def _unknown(data: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    extra = sorted(str(k) for k in data if k not in allowed)
    if extra:
        raise ScenarioError(
            f"{path}{'.' if path else ''}{extra[0]}: unknown key; valid keys: {', '.join(allowed)}"
        )


def _resources(value: Any, path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, count in _mapping(value, path).items():
        if not str(key).startswith("nvidia.com/"):
            raise ScenarioError(f"{path}.{key}: only nvidia.com/ resources are simulated")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ScenarioError(f"{path}.{key}: {count!r} must be a whole number >= 1")
        out[str(key)] = count
    return out


def _annotations(value: Any, path: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(value, path).items()}


# --- loading ----------------------------------------------------------------------------------


def builtin_names() -> list[str]:
    """Scenarios shipped in ``sim/scenarios``."""
    folder = resources.files("gpu_slicer.sim") / "scenarios"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str, *, seed: int | None = None) -> Scenario:
    """A shipped scenario by name, or a YAML file by path; ``seed`` overrides the file's."""
    path = Path(name_or_path)
    if name_or_path in builtin_names():
        text = (
            resources.files("gpu_slicer.sim") / "scenarios" / f"{name_or_path}.yaml"
        ).read_text()
        source = name_or_path
    elif path.suffix in (".yaml", ".yml") or path.exists():
        source = str(path)
        try:
            text = documents.read_text(path)
        except documents.DocumentError as exc:
            raise ScenarioError(f"{source}: {exc}") from exc
    else:
        raise UnknownNameError(
            f"unknown scenario {name_or_path!r}; shipped scenarios: {', '.join(builtin_names())}"
            " (or give a path to a .yaml file)"
        )
    try:
        data = documents.parse(text)
    except documents.DocumentError as exc:
        raise ScenarioError(f"{source}: {exc}") from exc
    return parse_scenario(data, seed=seed, source=source)


def parse_scenario(data: Any, *, seed: int | None = None, source: str = "<scenario>") -> Scenario:
    top = _mapping(data, source)
    _unknown(top, _TOP_KEYS, "")
    name = str(top.get("name") or Path(source).stem)
    clock_s = 0.0
    if "clock" in top:
        match = _CLOCK.match(str(top["clock"]).strip())
        if not match:
            raise ScenarioError(f"clock: {top['clock']!r} must be HH:MM")
        clock_s = int(match["h"]) * 3600 + int(match["m"]) * 60
    used_seed = seed if seed is not None else _whole(top.get("seed", 0), "seed", minimum=None)
    scheduler = _mapping(top.get("scheduler"), "scheduler")
    _unknown(scheduler, ("nodeRule",), "scheduler")
    node_rule = str(scheduler.get("nodeRule", "pack"))
    if node_rule not in NODE_RULES:
        raise ScenarioError(f"scheduler.nodeRule: {node_rule!r} is not one of {NODE_RULES}")
    agent = _mapping(top.get("agent"), "agent")
    _unknown(
        agent,
        ("republishMinInterval", "republishQuiet", "advertisedProfiles", "demandLatency"),
        "agent",
    )
    advertised = str(agent.get("advertisedProfiles", "asked"))
    if advertised not in ADVERTISED_PROFILES_CHOICES:
        raise ScenarioError(
            f"agent.advertisedProfiles: {advertised!r} is not one of "
            f"{', '.join(ADVERTISED_PROFILES_CHOICES)}"
        )
    version_text = str(top.get("kubernetes", "1.36"))
    match = re.match(r"^1\.(3[4-9])$", version_text)
    if not match:
        raise ScenarioError(f"kubernetes: {version_text!r} must be 1.34 .. 1.39")
    nodes = _nodes(top.get("nodes"))
    namespaces: dict[str, str] = {}
    for ns, mode in _mapping(top.get("namespaces"), "namespaces").items():
        if str(mode) not in NAMESPACE_MODES:
            raise ScenarioError(f"namespaces.{ns}: {mode!r} is not one of {NAMESPACE_MODES}")
        namespaces[str(ns)] = str(mode)
    policy = _mapping(top.get("policy"), "policy")
    layouts = _layouts(top.get("layouts"), nodes)
    pods = _pods(top.get("pods"), clock_s, namespaces)
    pods += _generated(top.get("generators"), clock_s, namespaces, used_seed)
    pods.sort(key=lambda p: (p.arrival, p.name))
    seen: set[str] = set()
    for pod in pods:
        if pod.name in seen:
            raise ScenarioError(f"pods: the name {pod.name!r} is used twice")
        seen.add(pod.name)
    last = max((p.arrival + p.duration for p in pods), default=0.0)
    end = _time(top["end"], "end", clock_s) if "end" in top else last
    sample = parse_duration(top.get("sample", max(60.0, end / 500)), "sample")
    if sample <= 0:
        raise ScenarioError("sample: must be greater than zero")
    if end / sample > MAX_SAMPLES:
        raise ScenarioError(
            f"sample: {top.get('sample')!r} over {end / 3600:g} h would take {end / sample:.0f} "
            f"samples (at most {MAX_SAMPLES}); sample less often or end sooner"
        )
    return Scenario(
        name=name,
        description=str(top.get("description", "")).strip(),
        end=end,
        sample_s=sample,
        clock_s=clock_s,
        kubernetes=(1, int(match[1])),
        node_rule=node_rule,
        republish_min_interval_s=parse_duration(
            agent.get("republishMinInterval", 30), "agent.republishMinInterval"
        ),
        republish_quiet_s=parse_duration(agent.get("republishQuiet", 2), "agent.republishQuiet"),
        nodes=tuple(nodes),
        namespaces=namespaces,
        policy=policy,
        layouts=layouts,
        pods=tuple(pods),
        seed=used_seed,
        advertised_profiles=advertised,
        demand_latency_s=parse_duration(
            agent.get("demandLatency", DEFAULT_DEMAND_LATENCY_S), "agent.demandLatency"
        ),
    )


def _nodes(value: Any) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    for i, raw in enumerate(_list(value, "nodes")):
        path = f"nodes[{i}]"
        body = _mapping(raw, path)
        _unknown(body, ("name", "namePrefix", "count", "gpus", "mode"), path)
        if "gpus" not in body:
            raise ScenarioError(f"{path}.gpus: required (e.g. A100-80GB:1)")
        try:
            models = tuple(parse_gpu_spec(str(body["gpus"])))
        except GpuSlicerError as exc:
            raise ScenarioError(f"{path}.gpus: {exc}") from exc
        mode = str(body.get("mode", "dynamic"))
        if mode not in ("dynamic", "mig", "full"):
            raise ScenarioError(f"{path}.mode: {mode!r} is not one of dynamic, mig, full")
        count = _whole(body.get("count", 1), f"{path}.count", minimum=1)
        if "name" in body:
            if count != 1:
                raise ScenarioError(f"{path}: use namePrefix with count, not name")
            names = [str(body["name"])]
        else:
            prefix = str(body.get("namePrefix", "node-"))
            width = len(str(count))
            names = [f"{prefix}{j:0{width}d}" for j in range(count)]
        nodes.extend(NodeSpec(n, str(body["gpus"]), models, cast(Mode, mode)) for n in names)
    if not nodes:
        raise ScenarioError("nodes: at least one node is required")
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise ScenarioError(f"nodes: the node name {node.name!r} is used twice")
        seen.add(node.name)
    return nodes


def _layout_list(value: Any, path: str) -> tuple[str, ...] | None:
    if value == "whole" or value is None:
        return None
    if isinstance(value, str) and value in BUILTIN_LAYOUTS:
        return BUILTIN_LAYOUTS[value]
    items = _list(value, path)
    return tuple(str(v) for v in items)


def _agent_format(raw: Any) -> bool:
    """A layout written as the agent's static layout file (``profile@start`` entries)."""
    if not isinstance(raw, dict) or not set(raw) <= {"default", "gpus"}:
        return False
    entries = list(raw.get("default") or []) if isinstance(raw.get("default"), list) else []
    gpus = raw.get("gpus")
    if isinstance(gpus, dict):
        entries += [e for v in gpus.values() if isinstance(v, list) for e in v]
    return "gpus" in raw or any("@" in str(e) for e in entries)


def _layouts(value: Any, nodes: Sequence[NodeSpec]) -> dict[str, StaticLayoutSpec]:
    layouts = {n: StaticLayoutSpec(n, kinds) for n, kinds in BUILTIN_LAYOUTS.items()}
    for name, raw in _mapping(value, "layouts").items():
        layouts[str(name)] = _layout(str(name), raw, nodes)
    for layout in layouts.values():
        if layout.placements is None:  # placed layouts are checked against every node already
            _check_layout(layout, nodes)
    return layouts


def _layout(name: str, raw: Any, nodes: Sequence[NodeSpec]) -> StaticLayoutSpec:
    """One layout of the scenario: in the agent's format (placed, checked here against every
    node) or as profile kinds per GPU."""
    path = f"layouts.{name}"
    if _agent_format(raw):
        try:
            placed = StaticLayout.from_mapping(raw)
            for node in nodes:
                placed.check(node.models)
        except LayoutError as exc:
            raise ScenarioError(f"{path}: {exc}") from exc
        return StaticLayoutSpec(name, None, {}, placed)
    if isinstance(raw, dict):
        _unknown(raw, ("default", "overrides"), path)
        default = _layout_list(raw.get("default", "whole"), f"{path}.default")
        overrides = {
            str(k): _layout_list(v, f"{path}.overrides.{k}")
            for k, v in _mapping(raw.get("overrides"), f"{path}.overrides").items()
        }
    else:
        default, overrides = _layout_list(raw, path), {}
    return StaticLayoutSpec(name, default, overrides)


def _check_layout(layout: StaticLayoutSpec, nodes: Sequence[NodeSpec]) -> None:
    """Every GPU's kinds name profiles its model has, and they fit on it together."""
    from gpu_slicer.sim.geometry import can_pack, resolve_profile

    for node in nodes:
        for index, model in enumerate(node.models):
            kinds = layout.for_gpu(node.name, index)
            if kinds is None:
                continue
            names = []
            for kind in kinds:
                profile = resolve_profile(model, kind)
                if profile is None:
                    raise ScenarioError(
                        f"layouts.{layout.name}: {model.key} has no profile {kind!r}; it "
                        f"offers {', '.join(p.name for p in model.profiles)}"
                    )
                names.append(profile.name)
            if not can_pack(model, names):
                raise ScenarioError(
                    f"layouts.{layout.name}: {', '.join(names)} do not fit together on "
                    f"one {model.key}"
                )


def _pod_body(body: Obj, path: str) -> tuple[dict[str, int], dict[str, str]]:
    resources_ = _resources(body.get("resources"), f"{path}.resources")
    annotations = _annotations(body.get("annotations"), f"{path}.annotations")
    if not resources_ and not annotations:
        raise ScenarioError(f"{path}: give resources (nvidia.com/...) or gpu-slicer annotations")
    return resources_, annotations


def _namespace(value: Any, path: str, namespaces: Mapping[str, str]) -> str:
    ns = str(value or "default")
    if namespaces and ns not in namespaces:
        raise ScenarioError(
            f"{path}: namespace {ns!r} is not declared; declared: {', '.join(namespaces)}"
        )
    return ns


def _pods(value: Any, clock_s: float, namespaces: Mapping[str, str]) -> list[PodSpec]:
    pods: list[PodSpec] = []
    keys = (
        "name",
        "namespace",
        "at",
        "duration",
        "resources",
        "annotations",
        "count",
        "every",
        "workload",
    )
    for i, raw in enumerate(_list(value, "pods")):
        path = f"pods[{i}]"
        body = _mapping(raw, path)
        _unknown(body, keys, path)
        for required in ("name", "at", "duration"):
            if required not in body:
                raise ScenarioError(f"{path}.{required}: required")
        resources_, annotations = _pod_body(body, path)
        at = _time(body["at"], f"{path}.at", clock_s)
        duration = parse_duration(body["duration"], f"{path}.duration")
        if duration <= 0:
            raise ScenarioError(f"{path}.duration: {body['duration']!r} must be longer than zero")
        count = _whole(body.get("count", 1), f"{path}.count", minimum=1)
        every = parse_duration(body.get("every", 0), f"{path}.every")
        namespace = _namespace(body.get("namespace"), f"{path}.namespace", namespaces)
        base = str(body["name"])
        for j in range(count):
            pods.append(
                PodSpec(
                    name=base if count == 1 else f"{base}-{j}",
                    namespace=namespace,
                    arrival=at + j * every,
                    duration=duration,
                    resources=resources_,
                    annotations=annotations,
                    workload=str(body.get("workload", base)),
                )
            )
    return pods


def _sampler(value: Any, path: str) -> Any:
    """A duration distribution: a fixed duration, or {distribution, mean, min, max}."""
    if not isinstance(value, dict):
        fixed = parse_duration(value, path)
        return lambda rng: fixed
    _unknown(value, ("distribution", "mean", "min", "max"), path)
    kind = str(value.get("distribution", "exponential"))
    low = parse_duration(value.get("min", 1), f"{path}.min")
    high = parse_duration(value.get("max", 7 * 86400), f"{path}.max")
    if kind == "uniform":
        return lambda rng: rng.uniform(low, high)
    if kind not in ("exponential", "lognormal"):
        raise ScenarioError(
            f"{path}.distribution: {kind!r} is not exponential, lognormal or uniform"
        )
    mean = parse_duration(value.get("mean", 3600), f"{path}.mean")
    if mean <= 0:
        raise ScenarioError(f"{path}.mean: must be longer than zero")
    if kind == "lognormal":
        sigma = 1.0
        mu = math.log(mean) - sigma * sigma / 2
        return lambda rng: min(high, max(low, rng.lognormvariate(mu, sigma)))
    return lambda rng: min(high, max(low, rng.expovariate(1.0 / mean)))


def _generated(
    value: Any, clock_s: float, namespaces: Mapping[str, str], seed: int
) -> list[PodSpec]:
    pods: list[PodSpec] = []
    keys = (
        "name",
        "count",
        "from",
        "to",
        "arrivals",
        "duration",
        "namespace",
        "namespaces",
        "mix",
        "seed",
    )
    for i, raw in enumerate(_list(value, "generators")):
        path = f"generators[{i}]"
        body = _mapping(raw, path)
        _unknown(body, keys, path)
        name = str(body.get("name", f"gen{i}"))
        count = _whole(body.get("count"), f"{path}.count", minimum=1)
        start = _time(body.get("from", 0), f"{path}.from", clock_s)
        stop = _time(body.get("to", "1d"), f"{path}.to", clock_s)
        if stop <= start:
            raise ScenarioError(f"{path}.to: must be after from")
        arrivals = str(body.get("arrivals", "poisson"))
        if arrivals not in ("poisson", "uniform"):
            raise ScenarioError(f"{path}.arrivals: {arrivals!r} is not poisson or uniform")
        duration = _sampler(body.get("duration", "1h"), f"{path}.duration")
        ns_list = [str(n) for n in _list(body.get("namespaces"), f"{path}.namespaces")]
        if not ns_list:
            ns_list = [str(body.get("namespace", "default"))]
        for ns in ns_list:
            _namespace(ns, f"{path}.namespaces", namespaces)
        mix: list[tuple[float, dict[str, int], dict[str, str], str]] = []
        for j, entry in enumerate(_list(body.get("mix"), f"{path}.mix")):
            entry_path = f"{path}.mix[{j}]"
            entry_body = _mapping(entry, entry_path)
            _unknown(entry_body, ("weight", "resources", "annotations", "workload"), entry_path)
            resources_, annotations = _pod_body(entry_body, entry_path)
            weight = entry_body.get("weight", 1)
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not (0 < weight < math.inf)
            ):
                raise ScenarioError(f"{entry_path}.weight: {weight!r} must be a number > 0")
            mix.append((weight, resources_, annotations, str(entry_body.get("workload", name))))
        if not mix:
            raise ScenarioError(f"{path}.mix: at least one kind of pod is required")
        rng = random.Random(f"{seed}/{body.get('seed', i)}/{name}")
        weights = [m[0] for m in mix]
        times: list[float]
        if arrivals == "uniform":
            step = (stop - start) / count
            times = [start + k * step for k in range(count)]
        else:
            times = sorted(rng.uniform(start, stop) for _ in range(count))
        width = len(str(count - 1))
        for k, t in enumerate(times):
            _, resources_, annotations, workload = rng.choices(mix, weights)[0]
            pods.append(
                PodSpec(
                    name=f"{name}-{k:0{width}d}",
                    namespace=ns_list[k % len(ns_list)] if len(ns_list) > 1 else ns_list[0],
                    arrival=t,
                    duration=max(1.0, float(duration(rng))),
                    resources=resources_,
                    annotations=annotations,
                    workload=workload,
                )
            )
    return pods
