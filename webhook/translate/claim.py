"""The claim a pod's :class:`~webhook.translate.reading.Shape` gets: its requests (chains,
shared as the kubelet shares devices), template name, record and summary; remembered per
shape, as replicas and pods of one workload kind ask alike."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from gpu_slicer.webhook import claims
from gpu_slicer.webhook.claims import ContainerRequest
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import NamespaceRules, Target
from gpu_slicer.webhook.targets import target_driver
from gpu_slicer.webhook.translate.chains import Need, needs_of
from gpu_slicer.webhook.translate.conversion import MAX_CLAIM_DEVICES, MAX_CLAIM_REQUESTS
from gpu_slicer.webhook.translate.reading import Facts, Shape
from gpu_slicer.webhook.translate.request_sharing import plan_requests

if TYPE_CHECKING:
    from gpu_slicer.webhook.remembered import Remembered

SHAPE_CACHE_TEXT_MAX = 4096
"""Shapes whose names and annotation values add up to more characters are derived every time,
never remembered: a pod of many containers with long names would pin its size per entry."""
_NAME = operator.attrgetter("name")


class Use(NamedTuple):
    """A converted container: its place in the shape (which is its place among the pod's
    containers as read), its facts, and the claim's requests it references, in order."""

    place: int
    facts: Facts
    names: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Derived:
    """The part of a conversion that follows from the pod's shape alone. Shared between the
    pods of one shape: each conversion gets its own template, lists and operations (callers may
    change what they are given), never objects held here. Compared and hashed by identity: the
    patch store keys on the object itself."""

    warnings: tuple[str, ...] = ()
    requests: tuple[ContainerRequest, ...] = ()
    """Empty: nothing to convert."""
    nvlink_sets: tuple[claims.NvlinkSet, ...] = ()
    uses: tuple[Use, ...] = ()
    template_name: str = ""
    template_spec: bytes = b""
    """The claim template's ``spec`` as JSON: each pod decodes its own copy (no selector is
    built again for a shape already seen)."""
    changes: tuple[tuple[str, str], ...] = ()
    record: str = ""
    """The value of the ``gpu-slicer.io/converted`` annotation."""
    summary: str = ""


def derive_for(
    shape: Shape, rules: NamespaceRules, target: Target, remembered: Remembered | None
) -> tuple[Derived, bool]:
    """:func:`derive` and whether it is remembered: it is when the caller keeps ``remembered``,
    unless the shape is too large to keep, or holds an annotation value that is not text (a
    pod read from YAML may have any)."""
    if remembered is None:
        return derive(shape, rules, target), False
    size = sum(map(len, map(_NAME, shape.containers)))
    for _key, value in shape.annotations:
        size += len(value) if isinstance(value, str) else SHAPE_CACHE_TEXT_MAX + 1
    if size > SHAPE_CACHE_TEXT_MAX:
        return derive(shape, rules, target), False
    return remembered.derived_claims.call(shape, rules, target), True


def derive(shape: Shape, rules: NamespaceRules, target: Target) -> Derived:
    """The claim a pod of this shape gets, pure in its arguments; raises Denied."""
    driver = target_driver(target)
    warnings: list[str] = []
    needs = needs_of(shape, rules, driver, warnings)
    if not needs:
        return Derived(warnings=tuple(warnings))
    plan = plan_requests(needs)
    _check_claim_size(plan.requests)
    spec = claims.template_spec(plan.requests, driver, plan.nvlink_sets)
    name = claims.template_name(spec)
    uses = tuple(
        Use(shape.containers.index(n.container), n.container, plan.uses[id(n)]) for n in needs
    )
    changes = tuple((need.container.name, need.what) for need in needs)
    record = claims.canonical_json(
        {
            "claim": claims.CLAIM_NAME,
            "template": name,
            "containers": [_record_entry(need, plan.uses[id(need)]) for need in needs],
        }
    )
    summary = "converted " + ", ".join(f"{what} in {who}" for who, what in changes) + f" to {name}"
    return Derived(
        warnings=tuple(warnings),
        requests=plan.requests,
        nvlink_sets=plan.nvlink_sets,
        uses=uses,
        template_name=name,
        template_spec=orjson.dumps(spec),
        changes=changes,
        record=record,
        summary=summary,
    )


def _check_claim_size(requests: Sequence[ContainerRequest]) -> None:
    """Refuses a claim the API would refuse, or one the scheduler could never allocate."""
    if len(requests) > MAX_CLAIM_REQUESTS:
        raise Denied(
            f"the pod needs {len(requests)} requests in its claim ("
            f"{', '.join(r.name for r in requests[: MAX_CLAIM_REQUESTS + 1])}...); a claim holds "
            f"at most {MAX_CLAIM_REQUESTS}"
        )
    devices = sum(r.alternatives[0].count for r in requests)
    if devices > MAX_CLAIM_DEVICES:
        wanted = ", ".join(f"{r.name}: {r.alternatives[0].count}" for r in requests)
        raise Denied(
            f"the pod needs {devices} devices ({wanted}); Kubernetes allocates at most "
            f"{MAX_CLAIM_DEVICES} devices to one claim, so it could never be scheduled"
        )


def _record_entry(need: Need, names: Sequence[str]) -> dict[str, Any]:
    """The container's line in ``gpu-slicer.io/converted``."""
    container = need.container
    entry: dict[str, Any] = {"container": container.name}
    if len(names) == 1:
        entry["request"] = names[0]
    else:
        entry["requests"] = list(names)
    if container.legacy is not None and need.what == container.legacy[0]:
        entry["from"] = {need.what: container.legacy[1]}
    if need.via:
        entry["via"] = need.via
    entry["to"] = [alt.label for alt in need.build(need.count, need.count > 1)]
    return entry
