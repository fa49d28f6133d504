"""Which claim fields a CRD's structural schema would prune, along a kind's template paths
(the end-to-end tier checks the same answers against a real apiserver)."""

from __future__ import annotations

from typing import Any

from gpu_slicer.webhook.crd_schema import PRESERVE, pruned_fields
from gpu_slicer.webhook.workloads import Workload, parse_path

OBJ = {"type": "object"}


def _crd(schema: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    return {
        "spec": {
            "group": "example.com",
            "names": {"kind": "Trainer"},
            "versions": [{"name": version, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        }
    }


def _props(**fields: Any) -> dict[str, Any]:
    return {**OBJ, "properties": fields}


def _pod_spec(claim: list[str], container_claim: list[str]) -> dict[str, Any]:
    return _props(
        resourceClaims={"type": "array", "items": _props(**dict.fromkeys(claim, OBJ))},
        containers={
            "type": "array",
            "items": _props(
                resources=_props(
                    claims={"type": "array", "items": _props(**dict.fromkeys(container_claim, OBJ))}
                )
            ),
        },
    )


TRAINER = Workload("example.com", "Trainer", templates=(parse_path("spec.runs[].template"),))


def _schema(pod_spec: dict[str, Any]) -> dict[str, Any]:
    runs = {"type": "array", "items": _props(template=_props(spec=pod_spec))}
    return _props(spec=_props(runs=runs))


def test_a_schema_that_knows_both_claim_fields_keeps_them() -> None:
    schema = _schema(_pod_spec(["name", "resourceClaimTemplateName"], ["name", "request"]))
    assert pruned_fields(_crd(schema), TRAINER) == []


def test_a_schema_from_a_pod_spec_before_the_dra_api_prunes_both() -> None:
    schema = _schema(_pod_spec(["name", "source"], ["name"]))
    assert pruned_fields(_crd(schema), TRAINER) == [
        "spec.runs[].template.spec.resourceClaims[].resourceClaimTemplateName",
        "spec.runs[].template.spec.containers[].resources.claims[].request",
    ]


def test_preserved_unknown_fields_keep_everything_below() -> None:
    loose = _props(spec={**OBJ, PRESERVE: True})
    assert pruned_fields(_crd(loose), TRAINER) == []
    pod = _pod_spec([], [])
    pod["properties"]["resourceClaims"]["items"] = {**OBJ, PRESERVE: True}
    pod["properties"]["containers"]["items"] = {**OBJ, PRESERVE: True}
    assert pruned_fields(_crd(_schema(pod)), TRAINER) == []


def test_maps_of_templates_and_inline_pod_specs_are_followed() -> None:
    by_role = Workload("example.com", "Trainer", templates=(parse_path("spec.roles.*.template"),))
    roles = {**OBJ, "additionalProperties": _props(template=_props(spec=_pod_spec(["name"], [])))}
    assert len(pruned_fields(_crd(_props(spec=_props(roles=roles))), by_role)) == 2
    inline = Workload("example.com", "Trainer", specs=(parse_path("spec.predictor"),))
    schema = _props(spec=_props(predictor=_pod_spec(["resourceClaimTemplateName"], ["request"])))
    assert pruned_fields(_crd(schema), inline) == []


def test_a_crd_without_a_schema_for_the_version_says_so() -> None:
    assert pruned_fields(_crd(OBJ, "v1"), TRAINER, version="v2") == [
        "the CRD has no schema for that version"
    ]
