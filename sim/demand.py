"""What each pod of a trace asks for, as every strategy sees it.

gpu-slicer strategies get the webhook's real translation (``webhook.translate.translate_pod``):
the ResourceClaimTemplate and each container's chain of alternatives (``Conversion.requests``).
The baselines get the same pod the way their world sees it:

* device plugin (whole GPUs): every GPU or MIG slice asked for is a whole GPU; an annotation-only
  pod gets one GPU;
* static MIG layouts (NVIDIA's MIG device plugin, "mixed" strategy): ``nvidia.com/mig-<p>: N`` is
  N instances of exactly ``p``; ``nvidia.com/gpu: N`` is N GPUs left without MIG; an
  annotation-only pod asks for the first profile of its chain that the cluster has (what its
  owner would write);
* InstaSlice-style: the first alternative of each converted chain that the cluster has (no
  fallbacks);
* oracle: the converted chains with their fallbacks.

Translation is pure and depends only on the pod's content, its namespace and the policy, so it
is computed once per distinct pod shape and shared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.sim.scenario import PodSpec, Scenario
from gpu_slicer.webhook.claims import Alternative
from gpu_slicer.webhook.errors import WebhookError
from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.translate import Conversion, translate_pod

Obj = dict[str, Any]


Request = tuple[Alternative, ...]
"""Alternatives of one request, in preference order."""
Demand = tuple[Request, ...]


@dataclass(frozen=True)
class Translated:
    """The webhook's answer for one pod shape."""

    conversion: Conversion | None
    denied: str | None
    chains: Demand
    """The converted chains; empty when nothing was converted."""

    @property
    def claim_spec(self) -> Obj | None:
        if self.conversion is None or not self.conversion.templates:
            return None
        spec: Obj = self.conversion.templates[0]["spec"]["spec"]
        return spec


def offers(model: GpuModel, alt: Alternative, profile: str) -> bool:
    """Whether a GPU of ``model`` can serve ``alt`` as ``profile``: it has the profile, with
    the memory the alternative asks for (the CEL memory guard the scheduler evaluates)."""
    if not model.has_profile(profile):
        return False
    return alt.min_memory_bytes is None or model.profile(profile).memory_bytes >= (
        alt.min_memory_bytes
    )


def min_memory_slices(demand: Demand, models: Iterable[GpuModel]) -> int:
    """Memory slices ``demand`` needs at least, on whichever of ``models`` (a necessary
    condition: a node with fewer free slices cannot host it). A whole GPU asked as its
    full-size MIG instance counts through the chain's whole-GPU entry beside it."""
    models = list(models)
    total = 0
    for request in demand:
        sizes = []
        for alt in request:
            for model in models:
                if alt.kind == "gpu":
                    sizes.append(alt.count * model.memory_slices)
                    continue
                for name in (alt.profile,) if alt.profile else alt.any_of:
                    if offers(model, alt, name):
                        sizes.append(alt.count * model.profile(name).memory_slices)
        total += min(sizes, default=0)
    return total


def scenario_policy(scenario: Scenario) -> Policy:
    """The webhook policy of the scenario (its ``policy`` key, in the webhook's own schema)."""
    if not scenario.policy:
        return Policy.default()
    from gpu_slicer.sim.errors import ScenarioError

    try:
        return load_policy(json.dumps(scenario.policy), source="scenario policy")
    except WebhookError as exc:
        raise ScenarioError(f"policy: {exc}") from exc


def _shape(pod: PodSpec) -> tuple[Any, ...]:
    return (
        pod.namespace,
        tuple(sorted(pod.resources.items())),
        tuple(sorted(pod.annotations.items())),
    )


def parse_chains(conversion: Conversion) -> Demand:
    """The converted requests' alternatives, in the webhook's preference order."""
    return tuple(request.alternatives for request in conversion.requests)


class DemandBook:
    """Per pod shape: the webhook's translation and each baseline's view, computed once."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.policy = scenario_policy(scenario)
        self._translated: dict[tuple[Any, ...], Translated] = {}
        self._profiles = {p.name for n in scenario.nodes for m in n.models for p in m.profiles}

    def _available(self, chain: Request) -> Alternative:
        """The first alternative the cluster has at all (a chain built from memory spans every
        model; a person asking by hand would name one of their own GPUs' profiles)."""
        for alt in chain:
            if alt.kind == "gpu" or alt.profile in self._profiles:
                return alt
            mine = [p for p in alt.any_of if p in self._profiles]
            if mine:  # a memory chain's last entry: the person would name their GPU's profile
                return Alternative("mig", alt.count, mine[0], min_memory_bytes=alt.min_memory_bytes)
        return chain[0]

    def translated(self, pod: PodSpec) -> Translated:
        key = _shape(pod)
        found = self._translated.get(key)
        if found is None:
            found = self._translate(pod)
            self._translated[key] = found
        return found

    def _translate(self, pod: PodSpec) -> Translated:
        mode = self.scenario.namespaces.get(pod.namespace, "enabled")
        if mode != "enabled":
            return Translated(None, None, ())
        try:
            conversion = translate_pod(pod.manifest(), namespace=pod.namespace, policy=self.policy)
        except WebhookError as exc:
            return Translated(None, str(exc), ())
        return Translated(conversion, None, parse_chains(conversion))

    def whole_gpus(self, pod: PodSpec) -> Demand:
        """Device-plugin view: one request of N whole GPUs."""
        count = sum(pod.resources.values()) or 1
        return ((Alternative("gpu", count),),)

    def static(self, pod: PodSpec) -> Demand:
        """MIG-device-plugin view: exact resources."""
        requests: list[Request] = []
        for name, count in sorted(pod.resources.items()):
            if name == "nvidia.com/gpu":
                requests.append((Alternative("gpu", count),))
            elif name.startswith("nvidia.com/mig-"):
                requests.append((Alternative("mig", count, name[len("nvidia.com/mig-") :]),))
        if not requests:
            chains = self.translated(pod).chains
            requests = [(self._available(chain),) for chain in chains[:1]]
        return tuple(requests)

    def first_choice(self, pod: PodSpec) -> Demand:
        """InstaSlice view: the first alternative of each converted chain."""
        chains = self.translated(pod).chains or self.static(pod)
        return tuple((self._available(chain),) for chain in chains)

    def chains(self, pod: PodSpec) -> Demand:
        """Oracle view: the converted chains, fallbacks included."""
        return self.translated(pod).chains or self.static(pod)
