"""``gpu-slicer status`` output: the terminal picture and the JSON document (pure).

The picture has one row per GPU, two lines high; each memory slice is a cell between ``|``. The
cells of one instance are drawn as one wide cell labelled with its profile (``gpu`` for a whole
GPU) on the first line and a short name of the pod that holds it on the second; a free memory
slice reads ``free`` (``.`` when the cell is too narrow), a blocked one is filled with ``#``.
Cells are as wide as the terminal allows, so a row does not wrap; a profile too long for its
cell is shortened (``1g.10gb`` -> ``1g``) and a pod name loses its head (``~dlqzb``). Only plain
ASCII is written, without colour.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

from gpu_slicer.slicer.demand import Advertised
from gpu_slicer.status.view import ClusterStatus, Gpu, Instance, Node

Obj = dict[str, Any]

MAX_CELL = 24
"""Wider cells do not make the picture clearer."""
FREE, BLOCKED = "free", "#"
_PROFILE = re.compile(r"^(?P<compute>\d+g)\.\d+gb(?P<variant>.*)$")


# --- JSON -------------------------------------------------------------------------------------


def as_json(status: ClusterStatus) -> Obj:
    """The document ``-o json`` prints (its schema is in docs/status.md)."""
    return {
        "nodes": [_node_json(n) for n in status.nodes],
        "namespaces": [
            {
                "name": ns.name,
                "migration": ns.migration or None,
                "convertedPods": ns.converted,
                "podsHoldingDevices": ns.holding,
                "legacyPods": ns.legacy,
            }
            for ns in status.namespaces
        ],
        "notes": list(status.notes),
    }


def _node_json(node: Node) -> Obj:
    return {
        "name": node.name,
        "generation": node.generation,
        "memorySlices": node.memory_slices,
        "freeMemorySlices": node.free,
        "advertised": _advertised_json(node.advertised),
        "gpus": [_gpu_json(g) for g in node.gpus],
    }


def _advertised_json(advertised: Advertised | None) -> Obj | None:
    if advertised is None:
        return None
    return {"everyProfile": advertised.every, "profiles": dict(sorted(advertised.reasons.items()))}


def _gpu_json(gpu: Gpu) -> Obj:
    return {
        "index": gpu.index,
        "productName": gpu.product,
        "mode": gpu.mode,
        "unhealthy": gpu.unhealthy,
        "memorySlices": gpu.memory_slices,
        "freeSlices": list(gpu.free),
        "blockedSlices": list(gpu.blocked),
        "idleInstances": [
            {"profile": p, "placementStart": s, "placementSize": n} for p, s, n in gpu.idle
        ],
        "instances": [_instance_json(i) for i in gpu.instances],
    }


def _instance_json(inst: Instance) -> Obj:
    return {
        "device": inst.device,
        "profile": inst.profile,
        "wholeGpu": inst.whole,
        "placementStart": inst.start,
        "placementSize": inst.size,
        "claim": {"namespace": inst.claim.namespace, "name": inst.claim.name},
        "request": inst.request,
        "pods": [{"namespace": p.namespace, "name": p.name} for p in inst.pods],
    }


# --- the picture ------------------------------------------------------------------------------


def table(status: ClusterStatus, *, width: int = 80) -> str:
    """The whole report: the GPU picture per node, the instances, the namespaces, notes."""
    out = io.StringIO()
    if status.nodes:
        out.write(picture(status.nodes, width=width))
        instances = instance_rows(status.nodes)
        if len(instances) > 1:
            out.write("\n" + _columns(instances))
    else:
        out.write("no node publishes gpu-slicer.io ResourceSlices (is the agent installed?)\n")
    out.write("\n")
    if status.namespaces:
        rows = [("NAMESPACE", "MIGRATION", "CONVERTED PODS", "HOLDING A DEVICE", "LEGACY PODS")]
        rows += [
            (ns.name, ns.migration or "-", str(ns.converted), str(ns.holding), str(ns.legacy))
            for ns in status.namespaces
        ]
        out.write(_columns(rows))
    else:
        out.write("no namespace is labelled gpu-slicer.io/migration\n")
    for note in status.notes:
        out.write(f"note: {note}\n")
    return out.getvalue()


def picture(nodes: Sequence[Node], *, width: int = 80) -> str:
    """Per node a header line (GPU models, free memory slices), then one row (two lines) per
    GPU: its index, its mode, its cells, in ``width`` columns. When the cells would be too
    narrow to read ``free``, the mode column is left out; below about three columns per memory
    slice a row can exceed ``width``."""
    gpus = [g for n in nodes for g in n.gpus]
    widest = max((g.memory_slices for g in gpus), default=1)
    index_width = max((len(str(g.index)) for g in gpus), default=1)
    mode_width = max((len(_mode(g)) for g in gpus), default=0)
    with_mode = cell_width(widest, width - (2 + index_width + 2 + mode_width + 2)) >= len(FREE)
    out = io.StringIO()
    blocked = False
    for node in nodes:
        out.write(node_header(node, width=width) + "\n")
        if node.advertised is not None:
            out.write(advertised_line(node.advertised) + "\n")
        for gpu in node.gpus:
            head = "  " + str(gpu.index).rjust(index_width) + "  "
            if with_mode:
                head += _mode(gpu).ljust(mode_width) + "  "
            top, bottom = cells(gpu, width=width - len(head))
            out.write(head + top + "\n" + " " * len(head) + bottom + "\n")
            blocked = blocked or bool(gpu.blocked)
    if blocked:
        out.write(
            f"{BLOCKED * 3}: blocked (a MIG instance gpu-slicer did not make, or outside "
            "every device)\n"
        )
    return out.getvalue()


def node_header(node: Node, *, width: int = 80) -> str:
    """``h100: 2 GPUs H100 80GB HBM3, 8 of 16 memory slices free``; a node with several
    models names them by GPU index (``0-1 H100 80GB HBM3, 2 A30``)."""
    count = len(node.gpus)
    products = [_product(g) for g in node.gpus]
    if len(set(products)) == 1:
        models = products[0]
    else:
        runs: list[tuple[int, int, str]] = []
        for gpu, product in zip(node.gpus, products, strict=True):
            if runs and runs[-1][2] == product and runs[-1][1] == gpu.index - 1:
                runs[-1] = (runs[-1][0], gpu.index, product)
            else:
                runs.append((gpu.index, gpu.index, product))
        models = ", ".join(f"{a}{'' if a == b else f'-{b}'} {product}" for a, b, product in runs)
    line = (
        f"{node.name}: {count} GPU{'' if count == 1 else 's'}"
        + (f" {models}" if count else "")
        + f", {node.free} of {node.memory_slices} memory slices free"
    )
    if len(line) > width and len(set(products)) > 1:
        line = (
            f"{node.name}: {count} GPUs of {len(set(products))} models, {node.free} of "
            f"{node.memory_slices} memory slices free"
        )
    return line


def advertised_line(advertised: Advertised) -> str:
    """``  advertises 1g.10gb (asked), 2g.20gb (recent), 3g.40gb (floor)``: what pods of which
    shapes can be placed on the node now, and why each profile is there."""
    if advertised.every:
        return "  advertises every profile (--advertised-profiles all)"
    if not advertised.reasons:
        return (
            "  advertises no MIG profile (no claim asks for one; --always-advertise sets a floor)"
        )
    shown = ", ".join(f"{p} ({r})" for p, r in sorted(advertised.reasons.items()))
    return f"  advertises {shown}"


def _product(gpu: Gpu) -> str:
    return gpu.product.removeprefix("NVIDIA ").strip() or "unknown model"


def _mode(gpu: Gpu) -> str:
    return gpu.mode + (" UNHEALTHY" if gpu.unhealthy else "")


def cell_width(slices: int, width: int) -> int:
    """Characters inside one memory slice's cell so that ``slices`` cells fit in ``width``."""
    if slices <= 0:
        return 1
    return max(1, min(MAX_CELL, (width - 1) // slices - 1))


def cells(gpu: Gpu, *, width: int) -> tuple[str, str]:
    """The GPU's memory slices in ``width`` columns, as two lines of the same cells: what holds
    each (``1g.10gb``, ``gpu`` for the whole GPU, ``free``) and the pod holding it."""
    size = cell_width(gpu.memory_slices, width)
    top: list[str] = []
    bottom: list[str] = []
    i = 0
    while i < gpu.memory_slices:
        inst = gpu.owner(i)
        if inst is not None and inst.start == i:
            span = min(inst.start + inst.size, gpu.memory_slices) - i
            inner = span * size + span - 1
            top.append(_profile_label(inst, inner).ljust(inner))
            bottom.append(_pod_label(inst, inner).ljust(inner))
            i += span
            continue
        idle = next((x for x in gpu.idle if x[1] == i), None)
        if inst is None and idle is not None:  # static layout: an instance nobody holds
            span = min(idle[1] + idle[2], gpu.memory_slices) - i
            inner = span * size + span - 1
            top.append(_shorten(idle[0], inner).ljust(inner))
            bottom.append((FREE if inner >= len(FREE) else ".").ljust(inner))
            i += span
            continue
        if i in gpu.blocked:
            top.append(BLOCKED * size)
            bottom.append(BLOCKED * size)
        elif inst is not None:  # the rest of an instance that overlaps another one
            top.append("?" * size)
            bottom.append(" " * size)
        else:
            top.append((FREE if size >= len(FREE) else ".").ljust(size))
            bottom.append(" " * size)
        i += 1
    return "|" + "|".join(top) + "|", "|" + "|".join(bottom) + "|"


def _profile_label(inst: Instance, room: int) -> str:
    """``gpu`` for a whole GPU, else the profile as :func:`_shorten` fits it."""
    return "gpu"[:room] if inst.whole else _shorten(str(inst.profile), room)


def _shorten(profile: str, room: int) -> str:
    """``1g.10gb+me``, else without the memory size (``1g+me``), else ``1g``, cut to ``room``."""
    match = _PROFILE.match(profile)
    if len(profile) <= room or match is None:
        return profile[:room]
    shorter = match["compute"] + match["variant"]
    return (shorter if len(shorter) <= room else match["compute"])[:room]


def _pod_label(inst: Instance, room: int) -> str:
    """The (first) pod's short name in ``room`` characters: when it is too long its head goes
    first (the tail tells replicas apart), marked by ``~``; ``+N`` counts further pods."""
    if not inst.short_pods:
        return "no pod" if room >= len("no pod") else "-"[:room]
    more = f"+{len(inst.short_pods) - 1}" if len(inst.short_pods) > 1 else ""
    pod = inst.short_pods[0]
    if len(pod) + len(more) <= room:
        return pod + more
    keep = room - len(more) - 1
    if keep < 1:
        return pod[:room]
    tail = pod[len(pod) - keep :]
    if "-" in tail[:-1]:
        tail = tail.split("-", 1)[1]  # start at a word: ~dlqzb, not ~r-dlqzb
    return "~" + tail + more


def instance_rows(nodes: Sequence[Node]) -> list[tuple[str, ...]]:
    """The held devices as table rows, a header first."""
    rows: list[tuple[str, ...]] = [("NODE", "GPU", "DEVICE", "PROFILE", "SLICES", "POD")]
    for node in nodes:
        for gpu in node.gpus:
            for inst in gpu.instances:
                slices = (
                    str(inst.start)
                    if inst.size == 1
                    else f"{inst.start}-{inst.start + inst.size - 1}"
                )
                pods = ", ".join(str(p) for p in inst.pods) or f"none (claim {inst.claim})"
                rows.append(
                    (
                        node.name,
                        str(gpu.index),
                        inst.device,
                        inst.profile or "whole GPU",
                        slices,
                        pods,
                    )
                )
    return rows


def _columns(rows: Sequence[tuple[str, ...]]) -> str:
    """Left-aligned columns two spaces apart, as wide as their widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        text = "  ".join([c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]])
        lines.append(text.rstrip())
    return "\n".join(lines) + "\n"
