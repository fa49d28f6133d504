"""The kubelet stand-in's rules, as the kubelet's DRA manager applies them."""

from __future__ import annotations

from typing import Any

from gpu_slicer.sandbox.kubelet import PreparedClaim, claim_names, container_device_ids


def _pod(
    claims: list[dict[str, Any]],
    statuses: list[dict[str, Any]] | None = None,
    extended: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"resourceClaimStatuses": statuses or []}
    if extended:
        status["extendedResourceClaimStatus"] = extended
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"resourceClaims": claims, "containers": []},
        "status": status,
    }


def test_claim_names_follow_the_claim_or_the_template_status() -> None:
    pod = _pod(
        [
            {"name": "direct", "resourceClaimName": "shared"},
            {"name": "made", "resourceClaimTemplateName": "t"},
            {"name": "pending", "resourceClaimTemplateName": "t"},
            {"name": "not-needed", "resourceClaimTemplateName": "t"},
        ],
        [{"name": "made", "resourceClaimName": "p-made-x1"}, {"name": "not-needed"}],
    )
    assert claim_names(pod) == [("direct", "shared"), ("made", "p-made-x1"), ("pending", None)]


def test_the_extended_resource_claim_is_prepared_too() -> None:
    pod = _pod([], extended={"resourceClaimName": "p-extended", "requestMappings": []})
    assert claim_names(pod) == [("", "p-extended")]


def test_a_container_gets_the_devices_of_the_requests_it_names() -> None:
    claim = PreparedClaim(
        "ns", "c", {"gpu-slicer.io"}, {"u"}, {"init": ["id-0"], "main": ["id-1", "id-2"]}
    )
    names = {"gpu-slicer": "c"}
    container = {
        "name": "app",
        "resources": {"claims": [{"name": "gpu-slicer", "request": "main"}]},
    }
    assert container_device_ids(_pod([]), container, {"c": claim}, names) == ["id-1", "id-2"]
    whole = {"name": "all", "resources": {"claims": [{"name": "gpu-slicer"}]}}
    assert container_device_ids(_pod([]), whole, {"c": claim}, names) == ["id-0", "id-1", "id-2"]
    unrelated = {"name": "side", "resources": {}}
    assert container_device_ids(_pod([]), unrelated, {"c": claim}, names) == []


def test_a_subrequest_chosen_by_the_allocator_counts_as_its_request() -> None:
    claim = PreparedClaim("ns", "c", {"gpu-slicer.io"}, {"u"}, {"gpu": ["id-9"]})
    container = {"name": "app", "resources": {"claims": [{"name": "x", "request": "gpu"}]}}
    assert container_device_ids(_pod([]), container, {"c": claim}, {"x": "c"}) == ["id-9"]


def test_extended_resource_mappings_give_each_container_its_request() -> None:
    claim = PreparedClaim(
        "ns",
        "ext",
        {"gpu-slicer.io"},
        {"u"},
        {"container-0-request-0": ["id-a"], "container-1-request-0": ["id-b"]},
    )
    pod = _pod(
        [],
        extended={
            "resourceClaimName": "ext",
            "requestMappings": [
                {
                    "containerName": "one",
                    "resourceName": "nvidia.com/gpu",
                    "requestName": "container-0-request-0",
                },
                {
                    "containerName": "two",
                    "resourceName": "nvidia.com/gpu",
                    "requestName": "container-1-request-0",
                },
            ],
        },
    )
    assert container_device_ids(pod, {"name": "two"}, {"ext": claim}, {}) == ["id-b"]
