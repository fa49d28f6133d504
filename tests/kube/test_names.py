"""Names are checked with Kubernetes' own rules before they reach the apiserver."""

from __future__ import annotations

import pytest

from gpu_slicer.kube import names


@pytest.mark.parametrize("name", ["gpu-node-1", "a", "node.example.com", "0x", "a" * 253])
def test_dns_subdomains_that_kubernetes_accepts(name: str) -> None:
    assert names.is_dns_subdomain(name)
    assert names.subdomain_problem("--node", name, "node") is None


@pytest.mark.parametrize(
    "name", ["Big_Node", "-a", "a-", "a..b", ".a", "", "a" * 254, "gpu\n", "node.Example"]
)
def test_dns_subdomains_that_kubernetes_refuses(name: str) -> None:
    assert not names.is_dns_subdomain(name)
    problem = names.subdomain_problem("--node", name, "node")
    assert problem == (
        f"--node {name!r} is not a valid node name: lower-case letters, digits, '-' and '.', "
        "at most 253 characters"
    )


def test_a_derived_name_must_fit_too() -> None:
    assert names.subdomain_problem("--secret", "s" * 250, "Secret", suffix="-ca") is None
    problem = names.subdomain_problem("--secret", "s" * 251, "Secret", suffix="-ca")
    assert problem is not None and problem.endswith("at most 250 characters")


@pytest.mark.parametrize(
    ("name", "ok"), [("gpu-node-1", True), ("a" * 63, True), ("a" * 64, False), ("a.b", False)]
)
def test_dns_labels_have_no_dots_and_at_most_63_characters(name: str, ok: bool) -> None:
    assert names.is_dns_label(name) is ok
