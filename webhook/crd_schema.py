"""Whether a CustomResourceDefinition keeps a converted pod template's claim.

The apiserver prunes every field of a custom resource that the CRD's structural schema does not
know. A CRD generated from a PodSpec older than the DRA API in ``resource.k8s.io/v1`` knows
``resourceClaims[].name`` but not ``resourceClaims[].resourceClaimTemplateName``, and
``resources.claims[].name`` but not ``resources.claims[].request``: the converted object keeps
neither the legacy request (converted away) nor the claim, and its pods run without a GPU.

:func:`pruned_fields` walks the schema along the kind's pod-template paths
(:mod:`webhook.workloads`) and names the first claim field each would lose; ``[]`` follows
``items``, ``*`` ``additionalProperties``; ``x-kubernetes-preserve-unknown-fields`` keeps
everything below it. The end-to-end tier checks these answers against a real apiserver.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_slicer.webhook.workloads import Workload

PRESERVE = "x-kubernetes-preserve-unknown-fields"
_POD_CLAIM = ("resourceClaims", "[]", "resourceClaimTemplateName")
_CONTAINER_CLAIM = ("containers", "[]", "resources", "claims", "[]", "request")


def schema_of(crd: Mapping[str, Any], version: str | None = None) -> Mapping[str, Any] | None:
    """The openAPIV3Schema of ``version`` (default: the storage version)."""
    spec = crd.get("spec")
    versions = spec.get("versions") if isinstance(spec, Mapping) else None
    for entry in versions if isinstance(versions, list) else []:
        if not isinstance(entry, Mapping):
            continue  # a malformed entry describes no schema
        if (version is None and entry.get("storage") is True) or entry.get("name") == version:
            holder = entry.get("schema")
            schema = holder.get("openAPIV3Schema") if isinstance(holder, Mapping) else None
            return schema if isinstance(schema, Mapping) else None
    return None


def pruned_fields(
    crd: Mapping[str, Any], workload: Workload, version: str | None = None
) -> list[str]:
    """The claim fields the CRD would prune, as ``<template path>.<field path>``; [] when every
    pod template (and inline pod spec) of the kind keeps its claims."""
    schema = schema_of(crd, version)
    if schema is None:
        return ["the CRD has no schema for that version"]
    found: list[str] = []
    for path, inline in [(p, False) for p in workload.templates] + [
        (p, True) for p in workload.specs
    ]:
        node = _walk(schema, path)
        if node is None:
            continue  # preserved whole, or a path the schema does not have at all
        below = () if inline else ("spec",)
        spec = _walk(node, below)
        if spec is None:
            continue
        for field in (_POD_CLAIM, _CONTAINER_CLAIM):
            if _lost(spec, field):
                found.append(".".join(path + below + field).replace(".[]", "[]"))
    return found


def _walk(schema: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any] | None:
    """The schema node at ``path``; None when the path is preserved or not described."""
    node: Any = schema
    for step in path:
        if not isinstance(node, Mapping) or node.get(PRESERVE):
            return None
        if step == "[]":
            node = node.get("items")
        elif step == "*":
            node = node.get("additionalProperties")
        else:
            node = (node.get("properties") or {}).get(step)
    if not isinstance(node, Mapping) or node.get(PRESERVE):
        return None
    return node


def _lost(spec: Mapping[str, Any], field: tuple[str, ...]) -> bool:
    """Whether a value at ``field`` below ``spec`` would be pruned."""
    node: Any = spec
    for step in field:
        if not isinstance(node, Mapping):
            return True
        if node.get(PRESERVE):
            return False
        if step == "[]":
            node = node.get("items")
        else:
            properties = node.get("properties")
            if properties is None:
                return not isinstance(node.get("additionalProperties"), Mapping)
            node = properties.get(step)
        if node is None:
            return True
    return False
