"""Today against gpu-slicer for the converted workloads on the cluster's GPU nodes: a scenario
built from the plan, run by the simulator under two strategies."""

from __future__ import annotations

import re
from typing import Any

from gpu_slicer.plan.cluster import GpuNode
from gpu_slicer.plan.verdicts import Plan

Obj = dict[str, Any]

HORIZON = "2h"
"""How long the simulated pods run: long enough that none ends, so the report compares who
gets a GPU at all, not who gets one sooner."""
TODAY, AFTER = "static-current", "gpu-slicer-best-fit"


def _layout_of(node: GpuNode) -> list[str] | str:
    """Today's layout per GPU: the advertised MIG devices spread evenly, else a whole GPU."""
    if not node.mig:
        return "whole"
    per_gpu: list[str] = []
    for profile, count in sorted(node.mig.items()):
        per_gpu += [profile] * (count // node.gpus)
    return per_gpu or "whole"


def _sim_name(text: str) -> str:
    """A simulated pod's name: lower-case letters, digits and '-'."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def simulate(plan: Plan, raw_policy: Obj, kubernetes: tuple[int, int]) -> Obj | None:
    """Today against gpu-slicer for the converted workloads on the cluster's GPU nodes."""
    from gpu_slicer.sim.compare import compare
    from gpu_slicer.sim.errors import SimError
    from gpu_slicer.sim.scenario import parse_scenario

    converted = [w for w in plan.workloads if w.outcome == "convert" and w.replicas > 0]
    if not plan.nodes or not converted:
        return None
    minor = min(max(kubernetes[1], 34), 39)
    pods = []
    for w in converted:
        body: Obj = {
            "name": _sim_name(f"{w.namespace}-{w.kind}-{w.name}-{w.template}"),
            "workload": w.key,
            "namespace": w.namespace,
            "at": "0s",
            "duration": HORIZON,
            "count": w.replicas,
        }
        if w.legacy:
            body["resources"] = w.legacy
        if w.annotations:
            body["annotations"] = w.annotations
        pods.append(body)
    data: Obj = {
        "name": "plan",
        "description": "the converted workloads on the cluster's GPU nodes",
        "end": HORIZON,
        "sample": "1m",
        "kubernetes": f"1.{minor}",
        "nodes": [{"name": n.name, "gpus": f"{n.model}:{n.gpus}"} for n in plan.nodes],
        "namespaces": dict.fromkeys(plan.namespaces, "enabled"),
        "policy": raw_policy,
        "layouts": {
            "current": {
                "default": "whole",
                "overrides": {n.name: _layout_of(n) for n in plan.nodes},
            }
        },
        "pods": pods,
    }
    try:
        scenario = parse_scenario(data, source="plan")
        comparison = compare(scenario, [TODAY, AFTER], through_api=False)
    except SimError as exc:
        plan.notes.append(f"the simulation could not run: {exc}")
        return None
    today, after = comparison.results
    workloads = {}
    for w in converted:
        key = w.key
        workloads[key] = {
            "pods": w.replicas,
            "runningToday": today.served_by_workload.get(key, (0, 0))[0],
            "runningWithGpuSlicer": after.served_by_workload.get(key, (0, 0))[0],
        }
    return {
        "gpus": scenario.gpu_count,
        "today": {
            "strategy": "device plugin: whole GPUs and the MIG devices nodes advertise",
            "running": today.served,
            "pending": today.pending,
            "memorySlicesHeld": round(today.utilization_mean, 4),
        },
        "withGpuSlicer": {
            "strategy": "gpu-slicer, MIG slices made on demand (best-fit order)",
            "running": after.served,
            "pending": after.pending,
            "memorySlicesHeld": round(after.utilization_mean, 4),
        },
        "workloads": workloads,
    }
