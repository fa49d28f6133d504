"""The kubelet's request sharing: containers that want the same kind of device share the
claim's requests as the kubelet's device manager shares devices (an init container passes its
devices on; sidecars and app containers add up); every other container gets its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_slicer.webhook import claims
from gpu_slicer.webhook.claims import ContainerRequest
from gpu_slicer.webhook.translate.chains import Need


@dataclass(frozen=True)
class RequestPlan:
    """The claim's requests and which of them each container references."""

    requests: tuple[ContainerRequest, ...]
    uses: dict[int, tuple[str, ...]]
    """id of each need -> the names of the requests its container references, in order."""
    nvlink_sets: tuple[claims.NvlinkSet, ...]


def device_ranges(members: Sequence[tuple[bool, int]]) -> tuple[int, list[tuple[int, int]]]:
    """Where each container's devices lie on a line of ``total`` devices of one kind.

    ``members`` are (runs until the pod ends, count) in start order: init containers (plain or
    sidecar) in declaration order, then app containers. The kubelet reserves, per resource,
    ``max(max over plain init i of (count_i + sidecars declared before i), sidecars + apps)``;
    this is that total, and the ranges realise it:

    * sidecars and app containers all run at once: they get consecutive, disjoint ranges;
    * a plain init container runs beside the sidecars declared before it and nothing else, so it
      starts right after them (or at a later boundary of another container's range when its
      end falls on one too, so that fewer requests are needed) and reuses what follows.
    """
    ranges: list[tuple[int, int] | None] = []
    position = 0
    pending: list[tuple[int, int, int]] = []
    """Plain init containers: (index, sidecars before it, count)."""
    for index, (runs, count) in enumerate(members):
        if runs:
            ranges.append((position, position + count))
            position += count
        else:
            ranges.append(None)
            pending.append((index, position, count))
    total = max([position, *(before + count for _i, before, count in pending)])
    edges = sorted({0, total, *(e for r in ranges if r for e in r)})
    for index, before, count in pending:
        start = next(
            (e for e in edges if e >= before and e + count <= total and e + count in edges),
            before,
        )
        ranges[index] = (start, start + count)
    return total, [r for r in ranges if r is not None]


def plan_requests(needs: Sequence[Need]) -> RequestPlan:
    """The claim's requests: containers that want the same kind of device share them as the
    kubelet's device manager would (see :func:`device_ranges`); every other container gets its
    own."""
    groups: dict[tuple[Any, ...], list[Need]] = {}
    for need in needs:
        groups.setdefault(need.key, []).append(need)
    order = {id(n): i for i, n in enumerate(needs)}
    segments: list[tuple[int, int, list[Need], Need, int]] = []
    """(owner's position in the pod, start, members covering it, owner, size)."""
    for members in groups.values():
        if len(members) == 1 and members[0].count > 0:
            # Nothing to share: what device_ranges would give, one request for the whole count.
            only = members[0]
            segments.append((order[id(only)], 0, members, only, only.count))
            continue
        _total, ranges = device_ranges([(m.container.long_running, m.count) for m in members])
        edges = sorted({e for r in ranges for e in r})
        for start, end in zip(edges, edges[1:], strict=False):
            covering = [m for m, (a, b) in zip(members, ranges, strict=True) if a <= start < b]
            if not covering:
                continue
            owner = next((m for m in covering if m.container.long_running), covering[0])
            segments.append((order[id(owner)], start, covering, owner, end - start))
    segments.sort(key=lambda s: (s[0], s[1]))
    taken: set[str] = set()
    requests: list[ContainerRequest] = []
    placed: dict[int, list[tuple[int, str]]] = {id(n): [] for n in needs}
    for _pos, start, covering, owner, size in segments:
        name = claims.unique_label(
            claims.dns_label(owner.container.name, fallback="container"), taken
        )
        several = any(m.count > 1 for m in covering)
        requests.append(ContainerRequest(name=name, alternatives=owner.build(size, several)))
        for member in covering:
            placed[id(member)].append((start, name))
    # A container lists its requests in the order its devices lie on the line.
    uses = {k: [name for _start, name in sorted(v)] for k, v in placed.items()}
    nvlink_sets = tuple(dict.fromkeys(tuple(uses[id(n)]) for n in needs if n.count > 1))
    return RequestPlan(
        requests=tuple(requests),
        uses={k: tuple(v) for k, v in uses.items()},
        nvlink_sets=nvlink_sets,
    )
