"""The Flask layer through its test client: status codes, probes, metrics, live policy reload."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from gpu_slicer.kube.errors import Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.webhook.app import create_app
from gpu_slicer.webhook.config import ServerConfig
from gpu_slicer.webhook.server import RBAC_RULES, Runtime, build_runtime
from gpu_slicer.webhook.templates import ApiTemplates, ReportingTemplates, TemplateCollector
from tests.support.server_fixtures import admission_review, mig_pod, patched, plain_pod

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def dev_runtime() -> Iterator[Runtime]:
    runtime = build_runtime(ServerConfig(dev=True, gc_interval_s=0))
    yield runtime
    runtime.stop()


@pytest.fixture
def client(dev_runtime: Runtime) -> FlaskClient:
    return create_app(runtime=dev_runtime).test_client()


def post(client: FlaskClient, body: Any, headers: dict[str, str] | None = None) -> Any:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return client.post("/mutate-pods", data=data, headers=headers or JSON)


def metric(client: FlaskClient, line_start: str) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_review_is_answered_with_a_patch(client: FlaskClient) -> None:
    pod = mig_pod()
    reply = post(client, admission_review(pod, uid="u-1"))
    assert reply.status_code == 200
    assert reply.mimetype == "application/json"
    response = reply.get_json()["response"]
    assert response["uid"] == "u-1"
    assert patched(pod, response)["spec"]["resourceClaims"]


def test_json_with_a_charset_parameter_is_accepted(client: FlaskClient) -> None:
    reply = post(
        client, admission_review(plain_pod()), {"Content-Type": "application/json; charset=utf-8"}
    )
    assert reply.status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_a_body_that_is_not_declared_json_gets_415(client: FlaskClient, content_type: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    reply = client.post(
        "/mutate-pods", data=json.dumps(admission_review(plain_pod())), headers=headers
    )
    assert reply.status_code == 415
    assert "application/json" in reply.get_json()["error"]


@pytest.mark.parametrize(
    "body", [b"{not json", b"\xff\xfe\x00", b""], ids=["broken", "binary", "empty"]
)
def test_a_body_that_is_not_json_gets_400(client: FlaskClient, body: bytes) -> None:
    reply = post(client, body)
    assert reply.status_code == 400
    assert "not JSON" in reply.get_json()["error"]


def test_a_malformed_review_gets_400_with_the_reason(client: FlaskClient) -> None:
    body = admission_review(mig_pod())
    body["request"]["object"]["spec"]["containers"] = "main"
    reply = post(client, body)
    assert reply.status_code == 400
    assert "containers" in reply.get_json()["error"]


def test_a_body_over_3_mib_gets_413(client: FlaskClient) -> None:
    body = admission_review(mig_pod())
    body["request"]["object"]["metadata"]["annotations"] = {"big": "x" * (3 * 1024 * 1024)}
    reply = post(client, body)
    assert reply.status_code == 413


def _post_chunked(client: FlaskClient, body: bytes) -> Any:
    """A body without Content-Length, as gunicorn hands over a chunked one."""
    return client.post(
        "/mutate-pods",
        input_stream=io.BytesIO(body),
        headers=JSON,
        environ_overrides={"wsgi.input_terminated": True},
    )


def test_a_body_over_3_mib_without_a_length_gets_413(client: FlaskClient) -> None:
    """Chunked bodies have no Content-Length; the size limit still answers 413, not 400."""
    body = admission_review(mig_pod())
    body["request"]["object"]["metadata"]["annotations"] = {"big": "x" * (3 * 1024 * 1024)}
    reply = _post_chunked(client, json.dumps(body).encode())
    assert reply.status_code == 413
    assert reply.get_json()["error"] == "request body over 3145728 bytes"


def test_a_body_of_exactly_3_mib_is_read_whole(client: FlaskClient) -> None:
    body = json.dumps(admission_review(mig_pod())).encode()
    body += b" " * (3 * 1024 * 1024 - len(body))  # JSON allows trailing white space
    reply = _post_chunked(client, body)
    assert reply.status_code == 200


def test_json_nested_100000_levels_deep_gets_the_documented_json_400(
    client: FlaskClient,
) -> None:
    reply = post(client, b"[" * 100_000 + b"]" * 100_000)
    assert reply.status_code == 400
    assert "nested too deeply" in reply.get_json()["error"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_quantity_that_is_no_finite_number_is_denied_with_a_message(
    client: FlaskClient, number: str
) -> None:
    raw = json.dumps(admission_review(mig_pod())).replace(
        '"nvidia.com/mig-1g.10gb": "1"', f'"nvidia.com/mig-1g.10gb": {number}'
    )
    assert number in raw
    reply = post(client, raw)
    assert reply.status_code == 200
    response = reply.get_json()["response"]
    assert response["allowed"] is False
    assert "nvidia.com/mig-1g.10gb" in response["status"]["message"]
    assert "not a quantity" in response["status"]["message"]


def test_a_denial_quoting_a_1_mb_annotation_stays_under_1_kib(client: FlaskClient) -> None:
    pod = mig_pod(annotations={"gpu-slicer.io/profiles": "\n" + "y" * 1_000_000})
    reply = post(client, admission_review(pod))
    message = reply.get_json()["response"]["status"]["message"]
    assert reply.get_json()["response"]["allowed"] is False
    assert len(message.encode()) <= 1024 and message.endswith("...")
    assert "\n" not in message and message.startswith("annotation gpu-slicer.io/profiles")


def test_a_denied_pod_is_a_200_with_allowed_false(client: FlaskClient) -> None:
    pod = mig_pod(annotations={"gpu-slicer.io/gpu-memory": "lots"})
    reply = post(client, admission_review(pod))
    assert reply.status_code == 200
    response = reply.get_json()["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403


def test_unknown_paths_and_methods_answer_json(client: FlaskClient) -> None:
    assert client.get("/mutate-pods").status_code == 405
    reply = client.get("/nope")
    assert reply.status_code == 404 and "error" in reply.get_json()


def test_health_and_readiness_in_dev_mode(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").get_json() == {"status": "ready"}


def test_metrics_count_requests_by_outcome_and_conversions_by_resource(
    client: FlaskClient,
) -> None:
    post(client, admission_review(mig_pod("1g.10gb")))
    post(client, admission_review(mig_pod("1g.10gb")))
    post(client, admission_review(plain_pod()))
    post(client, b"{")
    assert (
        metric(client, 'gpu_slicer_webhook_requests_total{mode="enabled",outcome="patched"}') == 2
    )
    assert (
        metric(client, 'gpu_slicer_webhook_requests_total{mode="enabled",outcome="unchanged"}') == 1
    )
    assert (
        metric(client, 'gpu_slicer_webhook_requests_total{mode="n/a",outcome="bad_request"}') == 1
    )
    assert (
        metric(
            client,
            'gpu_slicer_webhook_conversions_total{mode="enabled",resource="nvidia.com/mig-1g.10gb"}',
        )
        == 2
    )
    assert metric(client, "gpu_slicer_webhook_request_duration_seconds_count") == 4
    # Both patched pods name one template: reported once, as a cluster creates it once.
    assert metric(client, 'gpu_slicer_webhook_templates_total{action="reported"}') == 1
    post(client, admission_review(mig_pod("2g.20gb")))
    assert metric(client, 'gpu_slicer_webhook_templates_total{action="reported"}') == 2


def test_dev_mode_reports_templates_instead_of_creating_them(dev_runtime: Runtime) -> None:
    client = create_app(runtime=dev_runtime).test_client()
    reply = post(client, admission_review(mig_pod(), namespace="sandbox"))
    name = patched(mig_pod(), reply.get_json()["response"])["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"
    ]
    assert isinstance(dev_runtime.templates, ReportingTemplates)
    assert dev_runtime.templates.reported == [f"sandbox/{name}"]


def test_dev_mode_audit_answers_with_warnings_only() -> None:
    runtime = build_runtime(ServerConfig(dev=True, namespace_mode="audit"))
    try:
        reply = post(create_app(runtime=runtime).test_client(), admission_review(mig_pod()))
    finally:
        runtime.stop()
    response = reply.get_json()["response"]
    assert "patch" not in response and response["warnings"]


# ----------------------------------------------------------------------------- with a cluster


@pytest.fixture
def cluster() -> Iterator[InMemoryKubeApi]:
    api = InMemoryKubeApi()
    for name, label in (("ml", "enabled"), ("staging", "audit"), ("web", None)):
        labels = {"gpu-slicer.io/migration": label} if label else {}
        api.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        )
    yield api
    api.close()


@contextmanager
def cluster_app(api: InMemoryKubeApi, **settings: Any) -> Iterator[tuple[Flask, Runtime]]:
    """The app on ``api`` with its runtime (caches, policy reload), stopped afterwards."""
    config = ServerConfig(tls_cert="c", tls_key="k", gc_interval_s=0, **settings)
    runtime = build_runtime(config, api=api)
    try:
        yield create_app(runtime=runtime), runtime
    finally:
        runtime.stop()


def _wait_ready(client: FlaskClient) -> None:
    deadline = time.monotonic() + 5
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, client.get("/readyz").get_json()
        time.sleep(0.01)


def test_with_a_cluster_the_namespace_label_decides_the_mode(cluster: InMemoryKubeApi) -> None:
    with cluster_app(cluster) as (app, _runtime):
        client = app.test_client()
        _wait_ready(client)
        enabled = post(client, admission_review(mig_pod(), namespace="ml")).get_json()
        audited = post(client, admission_review(mig_pod(), namespace="staging")).get_json()
        ignored = post(client, admission_review(mig_pod(), namespace="web")).get_json()
    assert "patch" in enabled["response"]
    assert "patch" not in audited["response"] and audited["response"]["warnings"]
    assert ignored["response"] == {"uid": ignored["response"]["uid"], "allowed": True}
    templates = cluster.objects("resource.k8s.io/v1", "ResourceClaimTemplate")
    assert [t["metadata"]["namespace"] for t in templates] == ["ml"]


def test_the_hot_path_makes_no_api_call_once_the_template_is_known(
    cluster: InMemoryKubeApi,
) -> None:
    with cluster_app(cluster) as (app, _runtime):
        client = app.test_client()
        _wait_ready(client)
        post(client, admission_review(mig_pod(), namespace="ml"))
        cluster.clear_calls()
        for _ in range(5):
            assert post(client, admission_review(mig_pod(), namespace="ml")).status_code == 200
        calls = [c for c in cluster.calls if c.verb != "watch"]
    assert calls == []


def test_an_unreachable_api_while_creating_the_template_is_a_500(
    cluster: InMemoryKubeApi,
) -> None:
    with cluster_app(cluster) as (app, _runtime):
        client = app.test_client()
        _wait_ready(client)
        cluster.fail_next("create", Unavailable("connection refused"), kind="ResourceClaimTemplate")
        reply = post(client, admission_review(mig_pod(), namespace="ml"))
        dry = post(client, admission_review(mig_pod("2g.20gb"), namespace="ml", dry_run=True))
    assert reply.status_code == 500
    assert "connection refused" in reply.get_json()["error"]
    assert dry.status_code == 200  # dryRun never touches the API


def test_readyz_waits_for_the_caches(cluster: InMemoryKubeApi) -> None:
    cluster.fail_next("list", Unavailable("apiserver starting"), times=1000, kind="Namespace")
    with cluster_app(cluster) as (app, _runtime):
        reply = app.test_client().get("/readyz")
    assert reply.status_code == 503
    assert any("Namespace" in p for p in reply.get_json()["problems"])


def test_a_bad_new_policy_is_refused_and_the_previous_stays_in_force(
    tmp_path: Path, cluster: InMemoryKubeApi
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("namespaces:\n  ml:\n    gpu: [1g.10gb, 2g.20gb]\n")
    gpu_pod = mig_pod()
    gpu_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    with cluster_app(cluster, policy=str(policy), policy_check_s=0) as (app, runtime):
        assert runtime.policy is not None
        client = app.test_client()
        _wait_ready(client)
        before = runtime.policy.current()
        policy.write_text("namespaces:\n  ml:\n    gpu: [9g.1tb]\n")
        assert runtime.policy.check() is False
        assert runtime.policy.current() is before
        assert client.get("/readyz").status_code == 200
        assert metric(client, 'gpu_slicer_webhook_policy_reloads_total{result="refused"}') == 1
        policy.write_text("namespaces:\n  ml:\n    gpu: [3g.40gb]\n")
        assert runtime.policy.check() is True
        assert runtime.policy.current() != before
        response = post(client, admission_review(gpu_pod, namespace="ml")).get_json()["response"]
    converted = patched(gpu_pod, response)["metadata"]["annotations"]["gpu-slicer.io/converted"]
    assert "3g.40gb" in converted and "2g.20gb" not in converted


def test_without_a_valid_policy_the_server_is_not_ready_and_answers_500(
    tmp_path: Path, cluster: InMemoryKubeApi
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("target: somebody-else\n")
    with cluster_app(cluster, policy=str(policy), policy_check_s=0) as (app, _runtime):
        client = app.test_client()
        ready = client.get("/readyz")
        reply = post(client, admission_review(mig_pod(), namespace="ml"))
    assert ready.status_code == 503
    assert any("target" in p for p in ready.get_json()["problems"])
    assert reply.status_code == 500


def test_the_documented_rbac_rules_cover_exactly_what_the_server_calls(
    cluster: InMemoryKubeApi,
) -> None:
    cluster.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "mig.gpu-slicer.io"},
            "spec": {},
        }
    )
    cluster.clear_calls()  # the fixture's own creates are not the server's
    with cluster_app(cluster) as (app, runtime):
        client = app.test_client()
        _wait_ready(client)
        reply = post(client, admission_review(mig_pod(), namespace="ml"))
        name = patched(mig_pod(), reply.get_json()["response"])["spec"]["resourceClaims"][0][
            "resourceClaimTemplateName"
        ]
        assert isinstance(runtime.templates, ApiTemplates)
        runtime.templates.forget("ml", name)  # as after the cache entry expired: exists -> stamp
        post(client, admission_review(mig_pod(), namespace="ml"))
        post(client, admission_review(mig_pod(), namespace="created-a-moment-ago"))
        TemplateCollector(
            cluster, gc_after_s=lambda: 60, wall_clock=lambda: datetime.now(UTC) + timedelta(days=1)
        ).sweep()
        _wait_for(
            lambda: (
                {c.kind for c in cluster.calls if c.verb == "watch"}
                == {"Namespace", "DeviceClass", "ResourceQuota"}
            )
        )
    assert cluster.rbac_verbs() == {key: set(verbs) for key, verbs in RBAC_RULES.items()}


def _wait_for(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)
