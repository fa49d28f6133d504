"""Which MIG profiles the agents would advertise for the planned workloads.

The agents advertise, by default (``--advertised-profiles asked``), only the profiles the
cluster's claims and claim templates ask for (docs/agent.md, "What a node advertises"). The plan
reads the templates the webhook would write for the converted workloads the way each agent reads
them (:func:`slicer.demand.read_claim_spec`, against the GPU model's devices), so an admin sees
before enabling a namespace how few devices each node will publish.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpu_slicer.core import catalog
from gpu_slicer.plan.cluster import GpuNode
from gpu_slicer.plan.verdicts import WorkloadPlan
from gpu_slicer.slicer.demand import NOTHING, DeviceMenu, read_claim_spec
from gpu_slicer.slicer.simulated import SimulatedBackend


def asked_profiles(model: str, workloads: Iterable[WorkloadPlan]) -> list[str]:
    """The profiles of ``model`` that the converted workloads' claims ask for, in the catalog's
    order (smallest first)."""
    menu = DeviceMenu(SimulatedBackend(f"{model}:1", node_name="plan").gpus())
    asks = NOTHING
    for workload in workloads:
        if workload.outcome == "convert":
            for spec in workload.claim_specs:
                asks = asks | read_claim_spec(spec, menu)
    order = [p.name for p in catalog.get_model(model).profiles]
    return [p for p in order if p in asks.asked]


def advertising_notes(nodes: Sequence[GpuNode], workloads: Sequence[WorkloadPlan]) -> list[str]:
    """One line per GPU model of the cluster's nodes: what its nodes would advertise."""
    if not any(w.outcome == "convert" for w in workloads):
        return []
    notes = []
    for model in sorted({n.model for n in nodes}):
        offered = len(catalog.get_model(model).profiles)
        asked = asked_profiles(model, workloads)
        what = ", ".join(asked) if asked else "whole GPUs only"
        notes.append(
            f"{model} nodes would advertise {what} ({len(asked)} of {offered} MIG profiles) "
            "for these workloads, with the agents' default --advertised-profiles asked; other "
            "claims in the cluster and --always-advertise add theirs"
        )
    return notes
