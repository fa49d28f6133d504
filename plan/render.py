"""The plan as a table for a terminal, and as JSON (:meth:`plan.verdicts.Plan.as_json`)."""

from __future__ import annotations

import io
from typing import Any

from gpu_slicer.core.identity import MIGRATION_LABEL
from gpu_slicer.plan.verdicts import Plan

Obj = dict[str, Any]


def table(plan: Plan) -> str:
    out = io.StringIO()
    out.write(f"policy: {plan.policy_source}\n")
    if not plan.workloads:
        out.write(
            "no workload in "
            + (", ".join(plan.namespaces) or "the cluster")
            + " asks for GPUs: nothing would change\n"
        )
    for ns, label in plan.namespaces.items():
        items = [w for w in plan.workloads if w.namespace == ns]
        out.write(f"\nnamespace {ns} ({MIGRATION_LABEL}: {label})\n")
        _write_quota(out, plan.quotas.get(ns))
        if not items:
            out.write("  no GPU workloads\n")
            continue
        rows: list[tuple[str, ...]] = [
            ("WORKLOAD", "PODS", "ASKS TODAY", "VERDICT", "BECOMES / WHY")
        ]
        for w in items:
            asks = ", ".join(f"{k}: {v}" for k, v in w.legacy.items()) or "annotations"
            why = "; ".join(w.becomes) if w.outcome == "convert" else w.detail
            rows.append((w.label, str(w.replicas), asks, w.outcome, why))
        out.write(_columns(rows, indent="  "))
        for w in items:
            for warning in w.warnings:
                out.write(f"  warning: {w.label}: {warning}\n")
    out.write("\n")
    if plan.nodes:
        gpus = sum(n.gpus for n in plan.nodes)
        out.write(
            f"GPU nodes: {len(plan.nodes)} ({gpus} GPUs): "
            + ", ".join(f"{n.name} {n.model}x{n.gpus}" for n in plan.nodes)
            + "\n"
        )
    else:
        out.write("GPU nodes: none with a GPU model gpu-slicer can slice\n")
    for skipped in plan.skipped_nodes:
        out.write(f"  skipped {skipped}\n")
    sim = plan.simulation
    if sim is not None:
        out.write(
            "\nthe converted workloads on these nodes (simulated, every pod at once, "
            "none ending):\n"
        )
        rows = [("WORKLOAD", "PODS", "RUNNING TODAY", "WITH GPU-SLICER")]
        for key, w in sim["workloads"].items():
            rows.append(
                (key, str(w["pods"]), str(w["runningToday"]), str(w["runningWithGpuSlicer"]))
            )
        rows.append(
            (
                "total",
                str(sim["today"]["running"] + sim["today"]["pending"]),
                str(sim["today"]["running"]),
                str(sim["withGpuSlicer"]["running"]),
            )
        )
        out.write(_columns(rows, indent="  "))
        out.write(
            f"  today: {sim['today']['strategy']}\n  with gpu-slicer: "
            f"{sim['withGpuSlicer']['strategy']}\n"
        )
    for note in plan.notes:
        out.write(f"note: {note}\n")
    out.write(
        "\nnothing was changed; label a namespace gpu-slicer.io/migration=audit to see "
        "the webhook's warnings on real admissions first\n"
    )
    return out.getvalue()


def _write_quota(out: io.StringIO, quota: Obj | None) -> None:
    """A namespace's GPU quota lines, and the DRA lines that keep them once pods convert."""
    if not quota:
        return
    today = ", ".join(f"{k}: {v}" for k, v in {**quota["legacy"], **quota["devices"]}.items())
    out.write(f"  GPU quota: {today}\n")
    missing = {k: v for k, v in quota["keepWith"].items() if k not in quota["devices"]}
    if quota["legacy"] and missing:
        out.write("  converted pods would escape it; add to the namespace's ResourceQuota:\n")
        for key, value in missing.items():
            out.write(f"    {key}: {value}\n")


def _columns(rows: list[tuple[str, ...]], *, indent: str) -> str:
    """Left-aligned columns two spaces apart, as wide as their widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
