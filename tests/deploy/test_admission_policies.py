"""The ValidatingAdmissionPolicies that narrow what RBAC cannot: their CEL evaluated (cel-python)
on the requests the apiserver would send, for the identity they bind and for others."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from gpu_slicer.kube.api import Obj
from tests.support.deploy_cases import find, render

WEBHOOK_SA = "system:serviceaccount:gpu-slicer:gpu-slicer-webhook"
CERTS_SA = "system:serviceaccount:gpu-slicer:gpu-slicer-certs"
MANAGED = {"app.kubernetes.io/managed-by": "gpu-slicer"}


def _evaluate(expression: str, activation: dict[str, Any]) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    result = program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})
    assert isinstance(result, celpy.celtypes.BoolType), (expression, result)
    return bool(result)


def admitted(policy: Obj, *, user: str, operation: str, obj: Obj | None, old: Obj | None) -> bool:
    """What the apiserver decides for this request: matchConditions, then every validation."""
    activation = {
        "request": {"operation": operation, "userInfo": {"username": user}},
        "object": obj,
        "oldObject": old,
    }
    spec = policy["spec"]
    assert policy["metadata"]["name"] in {b["spec"]["policyName"] for b in BINDINGS}
    if not all(_evaluate(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return True  # not this policy's business
    return all(_evaluate(v["expression"], activation) for v in spec["validations"])


BINDINGS: list[Obj] = []


@pytest.fixture(scope="module")
def template_policy() -> Obj:
    objects = render("base")
    BINDINGS.extend(o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding")
    policy = find(objects, "ValidatingAdmissionPolicy", "gpu-slicer-webhook-resourceclaimtemplates")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["resourceclaimtemplates"]
    assert set(rules[0]["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    return policy


def _template(labels: dict[str, str] | None) -> Obj:
    meta: dict[str, Any] = {"name": "gpu-slicer-abc", "namespace": "ml"}
    if labels is not None:
        meta["labels"] = labels
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {"spec": {"devices": {"requests": []}}},
    }


@pytest.mark.parametrize(
    ("operation", "old", "new", "allowed"),
    [
        ("CREATE", None, MANAGED, True),
        ("CREATE", None, None, False),
        ("CREATE", None, {"app.kubernetes.io/managed-by": "helm"}, False),
        ("UPDATE", MANAGED, MANAGED, True),
        ("UPDATE", None, MANAGED, False),  # taking over someone else's template
        ("UPDATE", MANAGED, {}, False),  # dropping the label
        ("DELETE", MANAGED, None, True),
        ("DELETE", {"team": "ml"}, None, False),
    ],
    ids=[
        "create-managed",
        "create-unlabelled",
        "create-other-manager",
        "patch-managed",
        "patch-foreign",
        "patch-drops-label",
        "delete-managed",
        "delete-foreign",
    ],
)
def test_the_webhook_writes_only_the_templates_it_manages(
    template_policy: Obj,
    operation: str,
    old: dict[str, str] | None,
    new: dict[str, str] | None,
    allowed: bool,
) -> None:
    old_obj = _template(old) if operation != "CREATE" else None
    new_obj = _template(new) if operation != "DELETE" else None
    assert (
        admitted(template_policy, user=WEBHOOK_SA, operation=operation, obj=new_obj, old=old_obj)
        is allowed
    )
    # anyone else is not this policy's business
    assert admitted(template_policy, user="alice", operation=operation, obj=new_obj, old=old_obj)


@pytest.fixture(scope="module")
def certs_policy() -> Obj:
    objects = render("overlays/self-managed")
    BINDINGS.extend(o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding")
    return find(objects, "ValidatingAdmissionPolicy", "gpu-slicer-certs-cabundle-only")


@pytest.fixture(scope="module")
def webhook_config() -> Obj:
    return find(render("overlays/self-managed"), "MutatingWebhookConfiguration", "gpu-slicer")


def _changed(config: Obj, path: tuple[Any, ...], value: Any) -> Obj:
    changed = copy.deepcopy(config)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "allowed"),
    [
        (("webhooks", 0, "clientConfig", "caBundle"), "bmV3IENB", True),
        (("webhooks", 0, "failurePolicy"), "Fail", False),
        (("webhooks", 0, "timeoutSeconds"), 30, False),
        (("webhooks", 0, "clientConfig", "service", "name"), "evil", False),
        (("webhooks", 0, "clientConfig", "url"), "https://evil.example/", False),
        (("webhooks", 0, "namespaceSelector"), {}, False),
        (("webhooks", 0, "objectSelector"), {}, False),
        (("webhooks", 0, "matchConditions"), [], False),
        (("webhooks", 0, "rules"), [], False),
        (("webhooks", 0, "name"), "other.gpu-slicer.io", False),
        (("metadata", "labels"), {}, False),
    ],
    ids=[
        "caBundle",
        "failurePolicy",
        "timeout",
        "service",
        "url",
        "namespaceSelector",
        "objectSelector",
        "matchConditions",
        "rules",
        "name",
        "labels",
    ],
)
def test_certs_ensure_may_change_only_the_ca_bundle(
    certs_policy: Obj,
    webhook_config: Obj,
    path: tuple[Any, ...],
    value: Any,
    allowed: bool,
) -> None:
    old = _changed(webhook_config, ("webhooks", 0, "clientConfig", "caBundle"), "b2xkIENB")
    new = _changed(old, path, value)
    assert admitted(certs_policy, user=CERTS_SA, operation="UPDATE", obj=new, old=old) is allowed
    assert admitted(certs_policy, user="cluster-admin", operation="UPDATE", obj=new, old=old)


def test_a_second_webhook_added_by_certs_ensure_is_refused(
    certs_policy: Obj,
    webhook_config: Obj,
) -> None:
    new = copy.deepcopy(webhook_config)
    new["webhooks"].append(copy.deepcopy(new["webhooks"][0]) | {"name": "extra.gpu-slicer.io"})
    assert not admitted(
        certs_policy, user=CERTS_SA, operation="UPDATE", obj=new, old=webhook_config
    )
