"""The MutatingWebhookConfiguration sends the webhook exactly the pods it should see."""

from __future__ import annotations

import copy
import functools
from typing import Any

import celpy
import pytest

from tests.support.deploy_cases import INSTALLABLE, NAMESPACE, Obj, find, render, webhook

GPU = {"limits": {"nvidia.com/gpu": "1"}}


def _pod(
    *,
    resources: dict[str, Any] | None = None,
    init_resources: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    container: Obj = {"name": "main", "image": "app"}
    if resources is not None:
        container["resources"] = resources
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "job-"},
        "spec": {"containers": [container]},
    }
    if init_resources is not None:
        pod["spec"]["initContainers"] = [
            {"name": "init", "image": "app", "resources": init_resources}
        ]
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return pod


@functools.cache
def _program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _admits(hook: Obj, pod: Obj) -> bool:
    """True when every matchCondition holds, i.e. the apiserver would call the webhook."""
    activation = {"object": celpy.json_to_cel(pod), "oldObject": celpy.json_to_cel(None)}
    results = []
    for condition in hook["matchConditions"]:
        program = _program(condition["expression"])
        result = program.evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (condition["name"], result)
        results.append(bool(result))
    return all(results)


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A label selector's matchLabels and matchExpressions, as the apiserver applies them."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


@pytest.fixture(params=("base", *INSTALLABLE))
def hook(request: pytest.FixtureRequest) -> Obj:
    return webhook(render(request.param))


def test_only_pod_creation_is_intercepted(hook: Obj) -> None:
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]


def test_failures_admit_pods_unchanged_and_calls_stay_short(hook: Obj) -> None:
    assert hook["failurePolicy"] == "Ignore"
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["admissionReviewVersions"] == ["v1"]


def test_the_webhook_is_reached_through_its_service(hook: Obj) -> None:
    assert hook["clientConfig"]["service"] == {
        "name": "gpu-slicer-webhook",
        "namespace": NAMESPACE,
        "path": "/mutate-pods",
        "port": 443,
    }
    assert "url" not in hook["clientConfig"]


@pytest.mark.parametrize(
    ("labels", "selected"),
    [
        ({"gpu-slicer.io/migration": "enabled", "kubernetes.io/metadata.name": "ml"}, True),
        ({"gpu-slicer.io/migration": "audit", "kubernetes.io/metadata.name": "ml"}, True),
        ({"gpu-slicer.io/migration": "disabled", "kubernetes.io/metadata.name": "ml"}, False),
        ({"kubernetes.io/metadata.name": "ml"}, False),
        (
            {"gpu-slicer.io/migration": "enabled", "kubernetes.io/metadata.name": "kube-system"},
            False,
        ),
        ({"gpu-slicer.io/migration": "enabled", "kubernetes.io/metadata.name": NAMESPACE}, False),
    ],
    ids=["enabled", "audit", "other value", "unlabelled", "kube-system", "own namespace"],
)
def test_only_opted_in_namespaces_are_selected(
    hook: Obj, labels: dict[str, str], selected: bool
) -> None:
    assert _selects(hook["namespaceSelector"], labels) is selected


@pytest.mark.parametrize(
    ("labels", "selected"),
    [({}, True), ({"gpu-slicer.io/skip": "false"}, True), ({"gpu-slicer.io/skip": "true"}, False)],
    ids=["no label", "skip false", "skip true"],
)
def test_pods_labelled_skip_are_left_alone(
    hook: Obj, labels: dict[str, str], selected: bool
) -> None:
    assert _selects(hook["objectSelector"], labels) is selected


@pytest.mark.parametrize(
    ("pod", "sent"),
    [
        (_pod(resources=GPU), True),
        (_pod(resources={"requests": {"nvidia.com/mig-1g.10gb": "1"}}), True),
        (_pod(resources={"limits": {"cpu": "1"}}, init_resources=GPU), True),
        (_pod(resources={}, annotations={"gpu-slicer.io/gpu-memory": "12Gi"}), True),
        (_pod(annotations={"gpu-slicer.io/profiles": "1g.10gb"}), True),
        (_pod(), False),
        (_pod(resources={"limits": {"cpu": "2", "memory": "1Gi"}}), False),
        (_pod(resources={"limits": {"amd.com/gpu": "1"}}), False),
        (_pod(resources={"limits": {"cpu": "1"}}, annotations={"team": "ml"}), False),
        (_pod(resources=GPU, annotations={"kubernetes.io/config.mirror": "abc"}), False),
        (
            _pod(annotations={"kubernetes.io/config.mirror": "x", "gpu-slicer.io/profiles": "7g"}),
            False,
        ),
    ],
    ids=[
        "GPU limit",
        "MIG request",
        "GPU in an init container",
        "memory annotation",
        "profiles annotation only",
        "no resources",
        "cpu and memory",
        "another vendor",
        "unrelated annotation",
        "mirror pod with a GPU",
        "mirror pod with an annotation",
    ],
)
def test_match_conditions_pass_only_pods_that_mention_a_gpu_and_never_mirror_pods(
    hook: Obj, pod: Obj, sent: bool
) -> None:
    assert _admits(hook, pod) is sent


def test_match_conditions_do_not_depend_on_container_order(hook: Obj) -> None:
    pod = _pod(resources={"limits": {"cpu": "1"}})
    pod["spec"]["containers"].append({"name": "gpu", "image": "app", "resources": GPU})
    assert _admits(hook, pod)
    reordered = copy.deepcopy(pod)
    reordered["spec"]["containers"].reverse()
    assert _admits(hook, reordered)


def test_the_ca_bundle_is_left_to_the_certificate_provider(base: list[Obj]) -> None:
    config = find(base, "MutatingWebhookConfiguration", "gpu-slicer")
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
