"""Hypothesis-generated AdmissionReviews through the Flask test client.

Random pods (legacy resources, odd quantities, init and ephemeral containers, existing claims),
random gpu-slicer annotations and plain garbage never produce a 5xx (no TemplateError can occur
here: dev mode reports templates) and never crash. Every 200 is a well-formed response whose
patch applies to the pod, and applying it then reviewing again adds nothing.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_slicer.core import catalog
from gpu_slicer.webhook.app import create_app
from gpu_slicer.webhook.config import ServerConfig
from gpu_slicer.webhook.server import build_runtime
from tests.support.server_fixtures import admission_review

PROFILES = catalog.all_profile_names()
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
valid_quantities = st.one_of(st.sampled_from(["1", "2", "4"]), st.integers(1, 3))
quantities = st.one_of(
    valid_quantities,
    valid_quantities,
    valid_quantities,
    st.integers(min_value=-3, max_value=10),
    st.sampled_from(
        [
            "1",
            "2",
            "0",
            "8",
            "1k",
            "500m",
            "1.5",
            "-1",
            "",
            "x",
            "2Gi",
            "1e3",
            "99999999999999999999",
        ]
    ),
    st.text(max_size=6),
)
legacy_names = st.one_of(
    st.just("nvidia.com/gpu"),
    st.sampled_from(PROFILES).map(lambda p: f"nvidia.com/mig-{p}"),
    st.sampled_from(
        [
            "nvidia.com/mig-",
            "nvidia.com/mig-9g.1tb",
            "nvidia.com/mig-1g.10gb~x",
            "nvidia.com/mig-1g.10gb/x",
        ]
    ),
)
resource_maps = st.dictionaries(
    st.one_of(legacy_names, st.sampled_from(["cpu", "memory", "example.com/foo"])),
    quantities,
    max_size=3,
)
containers = st.fixed_dictionaries(
    {"name": names, "image": st.just("registry.example/x:1")},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "limits": resource_maps,
                "requests": resource_maps,
                "claims": st.lists(st.fixed_dictionaries({"name": names}), max_size=2),
            },
        ),
        "restartPolicy": st.just("Always"),
    },
)
annotation_values = st.one_of(
    st.lists(st.sampled_from(PROFILES[:7]), min_size=1, max_size=3, unique=True).map(",".join),
    st.lists(st.sampled_from([*PROFILES, "gpu", "9g.1tb", ""]), max_size=10).map(",".join),
    st.sampled_from(["12Gi", "0", "-5Gi", "lots", "1Ti", "40G", "5e9", "80Gi"]),
    st.text(max_size=20),
)
annotation_maps: st.SearchStrategy[dict[str, str]] = st.one_of(
    st.just({}),
    st.dictionaries(
        st.sampled_from(
            [
                "gpu-slicer.io/profiles",
                "gpu-slicer.io/gpu-memory",
                "gpu-slicer.io/containers",
                "gpu-slicer.io/converted",
                "other",
            ]
        ),
        annotation_values,
        max_size=3,
    ),
)
pods = st.builds(
    lambda meta_name, ann, labels, main, init, claims, ephemeral: {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**meta_name, "annotations": ann, "labels": labels},
        "spec": {
            "containers": main,
            **({"initContainers": init} if init else {}),
            **({"resourceClaims": claims} if claims else {}),
            **({"ephemeralContainers": ephemeral} if ephemeral else {}),
        },
    },
    st.one_of(st.just({"generateName": "p-"}), names.map(lambda n: {"name": n})),
    annotation_maps,
    st.dictionaries(
        st.sampled_from(["gpu-slicer.io/skip", "app"]),
        st.sampled_from(["true", "false", "x"]),
        max_size=2,
    ),
    st.lists(containers, min_size=1, max_size=4),
    st.lists(containers, max_size=2),
    st.lists(
        st.fixed_dictionaries({"name": names}, optional={"resourceClaimTemplateName": names}),
        max_size=2,
    ),
    st.lists(containers, max_size=1),
)
convertible_containers = st.builds(
    lambda name, resource, count, section: {
        "name": name,
        "image": "registry.example/x:1",
        "resources": {section: {resource: count, "cpu": "1"}},
    },
    names,
    st.one_of(
        st.just("nvidia.com/gpu"), st.sampled_from(PROFILES).map(lambda p: f"nvidia.com/mig-{p}")
    ),
    valid_quantities,
    st.sampled_from(["limits", "requests"]),
)
convertible_pods = st.builds(
    lambda main, init, ann: {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "job-", "annotations": ann},
        "spec": {"containers": main, **({"initContainers": init} if init else {})},
    },
    st.lists(convertible_containers, min_size=1, max_size=3, unique_by=lambda c: c["name"]),
    st.lists(convertible_containers, max_size=1),
    st.one_of(
        st.just({}),
        st.lists(st.sampled_from(PROFILES[:7]), min_size=1, max_size=3, unique=True).map(
            lambda chain: {"gpu-slicer.io/profiles": ",".join(chain)}
        ),
        st.sampled_from(["5Gi", "12Gi", "40Gi"]).map(
            lambda size: {"gpu-slicer.io/gpu-memory": size}
        ),
    ),
)
any_pods = st.one_of(convertible_pods, pods)
json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@pytest.fixture(scope="module")
def clients() -> Iterator[dict[str, FlaskClient]]:
    runtimes = {
        mode: build_runtime(ServerConfig(dev=True, namespace_mode=mode, gc_interval_s=0))
        for mode in ("enabled", "audit")
    }
    yield {mode: create_app(runtime=rt).test_client() for mode, rt in runtimes.items()}
    for runtime in runtimes.values():
        runtime.stop()


def _post(client: FlaskClient, body: Any) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body)
    reply = client.post("/mutate-pods", data=data, headers={"Content-Type": "application/json"})
    assert reply.status_code in (200, 400, 413, 415), reply.get_data(as_text=True)
    return reply


def _check_response(pod: Any, uid: str, body: Any) -> Any:
    """The response is well-formed; returns the patched pod (or the pod unchanged)."""
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] == 403 and response["status"]["message"]
        assert "patch" not in response
    warnings = response.get("warnings", [])
    assert all(0 < len(w.encode()) < 120 for w in warnings)
    assert sum(len(w.encode()) for w in warnings) < 4096
    assert ("patch" in response) == ("patchType" in response)
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops, "an empty patch must be left out"
    return jsonpatch.apply_patch(copy.deepcopy(pod), ops)


@FUZZ
@given(
    pod=any_pods,
    mode=st.sampled_from(["enabled", "audit"]),
    dry_run=st.booleans(),
    uid=st.uuids().map(str),
)
def test_random_pods_get_a_well_formed_answer_and_reinvocation_adds_nothing(
    clients: dict[str, FlaskClient], pod: dict[str, Any], mode: str, dry_run: bool, uid: str
) -> None:
    client = clients[mode]
    reply = _post(client, admission_review(pod, uid=uid, dry_run=dry_run))
    if reply.status_code != 200:
        assert reply.status_code == 400 and reply.get_json()["error"]
        return
    after = _check_response(pod, uid, reply.get_json())
    if mode == "audit":
        assert after == pod
    if after is not pod:
        again = _post(client, admission_review(after, uid=uid))
        assert again.status_code == 200
        assert "patch" not in again.get_json()["response"]


@FUZZ
@given(garbage=json_values)
def test_garbage_json_is_a_400_never_a_crash(clients: dict[str, FlaskClient], garbage: Any) -> None:
    reply = _post(clients["enabled"], garbage)
    assert reply.status_code == 400


@FUZZ
@given(
    field=st.sampled_from(
        ["uid", "kind", "operation", "object", "namespace", "dryRun", "resource", "subResource"]
    ),
    value=json_values,
    pod=pods,
)
def test_a_review_with_one_random_field_is_answered_or_refused_cleanly(
    clients: dict[str, FlaskClient], field: str, value: Any, pod: dict[str, Any]
) -> None:
    body = admission_review(pod, uid="fixed-uid")
    body["request"][field] = value
    reply = _post(clients["enabled"], body)
    if reply.status_code == 200:
        uid = body["request"]["uid"]
        _check_response(body["request"].get("object"), uid, reply.get_json())


@FUZZ
@given(raw=st.binary(max_size=200))
def test_random_bytes_are_a_400(clients: dict[str, FlaskClient], raw: bytes) -> None:
    reply = _post(clients["enabled"], raw)
    assert reply.status_code == 400
