"""Writing the patch: the JSON Patch operations that point this pod's containers at the
derived claim's requests, against where the pod's own maps and lists stand."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from gpu_slicer.core.identity import CONVERTED_ANNOTATION
from gpu_slicer.webhook import claims, patch
from gpu_slicer.webhook.translate.claim import Derived
from gpu_slicer.webhook.translate.conversion import Conversion, dict_of
from gpu_slicer.webhook.translate.reading import Container

if TYPE_CHECKING:
    from gpu_slicer.webhook.remembered import Remembered

Standing = tuple[int, ...]
"""Where a pod stands for each operation of its patch (see :func:`standing`)."""

_ABSENT, _ONLY, _AMONG = 0, 1, 2
"""Where a converted container's legacy resource is in one of its resources sections."""
_CLAIMS = ("resources", "claims")
_POD_CLAIMS = ("spec", "resourceClaims")
_ANNOTATIONS = ("metadata", "annotations")


def write(
    pod: dict[str, Any],
    containers: Sequence[Container],
    derived: Derived,
    remembered: Remembered | None,
    template: dict[str, Any],
    warnings: list[str],
    deferred: tuple[tuple[str, str], ...],
) -> Conversion:
    """The conversion of ``pod``: its patch, with the derived claim's template and record.

    The operations depend on the claim and on where the pod's maps and lists stand, nothing
    else: pods of one shape and standing get the same patch, so where the claim was
    ``remembered`` (the store its patches are kept in; None: the claim was not) it is written
    once and each further pod gets a fresh copy decoded from its JSON."""
    where = standing(pod, containers, derived)
    if remembered is not None:
        ops: list[dict[str, Any]] = orjson.loads(remembered.patches.call(derived, where))
    else:
        ops = _operations(derived, where)
    return Conversion(
        patch=ops,
        templates=[template],
        warnings=warnings,
        changes=list(derived.changes),
        summary=derived.summary,
        deferred=deferred,
        requests=derived.requests,
    )


def standing(pod: dict[str, Any], containers: Sequence[Container], derived: Derived) -> Standing:
    """Where this pod stands for each operation: per converted container, its legacy
    resource in requests and in limits (absent, the only entry, among others) and the
    ``patch.list_state`` of its ``resources.claims``; then the list state of
    ``spec.resourceClaims`` and the ``patch.map_state`` of ``metadata.annotations``."""
    where: list[int] = []
    for use in derived.uses:
        container = containers[use.place]
        legacy = use.facts.legacy
        for section in ("requests", "limits"):
            values = dict_of(container.resources.get(section))
            if legacy is None or legacy[0] not in values:
                where.append(_ABSENT)
            else:
                where.append(_ONLY if len(values) == 1 else _AMONG)
        where.append(patch.list_state(container.body, _CLAIMS))
    where.append(patch.list_state(pod, _POD_CLAIMS))
    where.append(patch.map_state(pod, _ANNOTATIONS))
    return tuple(where)


def _operations(derived: Derived, where: Standing) -> list[dict[str, Any]]:
    """The operations for a pod of ``derived``'s shape that stands as ``where`` says: drop
    each converted container's legacy resource, reference the claim's requests, add the
    claim and the ``gpu-slicer.io/converted`` record."""
    ops: list[dict[str, Any]] = []
    states = iter(where)
    for use in derived.uses:
        path: list[patch.Token] = ["spec", use.facts.kind, use.facts.position]
        for section in ("requests", "limits"):
            state = next(states)
            if state == _ONLY:
                # Only the legacy resource was there: drop the map rather than leave it empty.
                ops.append(patch.remove([*path, "resources", section]))
            elif state == _AMONG and use.facts.legacy is not None:
                ops.append(patch.remove([*path, "resources", section, use.facts.legacy[0]]))
        refs = [{"name": claims.CLAIM_NAME, "request": n} for n in use.names]
        ops.extend(patch.list_ops(next(states), _CLAIMS, refs, at=path))
    entry = {"name": claims.CLAIM_NAME, "resourceClaimTemplateName": derived.template_name}
    ops.extend(patch.list_ops(next(states), _POD_CLAIMS, [entry]))
    ops.append(patch.map_entry_op(next(states), _ANNOTATIONS, CONVERTED_ANNOTATION, derived.record))
    return ops


def patch_json(derived: Derived, where: Standing) -> bytes:
    """The operations as JSON: what :class:`~gpu_slicer.webhook.remembered.Remembered` keeps."""
    return orjson.dumps(_operations(derived, where))
