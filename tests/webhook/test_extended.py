"""Beside NVIDIA's DRA driver: which DeviceClass serves which extended resource, said out loud.

NVIDIA's driver installs DeviceClass ``gpu.nvidia.com`` with ``extendedResourceName:
nvidia.com/gpu``. With the default ``nativeExtendedResources: defer`` the webhook then leaves
``nvidia.com/gpu`` pods to the scheduler; these tests check that this is logged (a warning, since
the pods go to another driver), shown in ``/metrics``, warned about on each such pod and counted,
and that the documented combinations behave as docs/translation.md says.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.webhook.app import create_app
from gpu_slicer.webhook.config import ServerConfig
from gpu_slicer.webhook.extended import ExtendedClass, Reporter, extended_class, report, serving
from gpu_slicer.webhook.metrics import Metrics
from gpu_slicer.webhook.policy import load_policy
from gpu_slicer.webhook.server import Runtime, build_runtime
from tests.support.server_fixtures import admission_review
from tests.support.webhook_cases import build_pod, container

JSON = {"Content-Type": "application/json"}
NVIDIA_CLASS = ExtendedClass("gpu.nvidia.com", "nvidia.com/gpu", "2026-03-01T10:00:00Z")
OURS = ExtendedClass("gpu.gpu-slicer.io", "nvidia.com/gpu", "2026-01-01T10:00:00Z")


def device_class(name: str, resource: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": []}
    if resource:
        spec["extendedResourceName"] = resource
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


# --- the pure report ------------------------------------------------------------------------------


def test_a_device_class_names_its_claim() -> None:
    obj = device_class("gpu.nvidia.com", "nvidia.com/gpu")
    obj["metadata"]["creationTimestamp"] = "2026-03-01T10:00:00Z"
    assert extended_class(obj) == NVIDIA_CLASS
    assert extended_class(device_class("mig.nvidia.com", None)) is None


def test_the_scheduler_uses_the_newest_class_then_the_first_by_name() -> None:
    twin = ExtendedClass("a-twin", "nvidia.com/gpu", NVIDIA_CLASS.created)
    assert serving([OURS, NVIDIA_CLASS])["nvidia.com/gpu"] == (NVIDIA_CLASS, OURS)
    assert serving([NVIDIA_CLASS, twin, OURS])["nvidia.com/gpu"] == (twin, NVIDIA_CLASS, OURS)


def test_deferring_to_another_drivers_class_is_flagged() -> None:
    (line,) = report(load_policy(""), [NVIDIA_CLASS, OURS])
    assert (line.resource, line.device_class, line.handling) == (
        "nvidia.com/gpu",
        "gpu.nvidia.com",
        "defer",
    )
    assert line.surprising
    assert line.shadowed == ("gpu.gpu-slicer.io",)
    assert "DeviceClass gpu.nvidia.com (NVIDIA's DRA driver)" in line.message
    assert "leaves pods asking for it unchanged" in line.message


@pytest.mark.parametrize(
    ("policy", "classes", "handling", "surprising"),
    [
        ("", [OURS], "defer", False),  # gpu-slicer alone, extended-resources overlay
        ("nativeExtendedResources: convert", [NVIDIA_CLASS], "convert", False),
        ("target: nvidia", [NVIDIA_CLASS], "defer", False),  # the webhook targets NVIDIA's
    ],
    ids=["own class", "convert anyway", "target nvidia"],
)
def test_the_supported_combinations_are_not_flagged(
    policy: str, classes: list[ExtendedClass], handling: str, surprising: bool
) -> None:
    (line,) = report(load_policy(policy), classes)
    assert (line.handling, line.surprising) == (handling, surprising)


def test_names_that_are_not_gpu_resources_are_reported_as_such() -> None:
    (line,) = report(load_policy(""), [ExtendedClass("fpga", "example.com/fpga")])
    assert line.handling == "not-a-gpu-resource" and not line.surprising


def test_the_reporter_logs_changes_and_keeps_the_gauge(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    reporter = Reporter(metrics)
    policy = load_policy("")
    with caplog.at_level(logging.INFO, logger="gpu_slicer.webhook.extended"):
        reporter.update(policy, [NVIDIA_CLASS], reason="start-up")
        reporter.update(policy, [NVIDIA_CLASS], reason="DeviceClasses listed or changed")
    (record,) = caplog.records  # the unchanged second report is not logged again
    assert record.levelno == logging.WARNING and "gpu.nvidia.com" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpu_slicer.webhook.extended"):
        reporter.update(policy, [], reason="DeviceClasses listed or changed")
    assert "no DeviceClass claims an extended resource" in caplog.records[0].getMessage()
    text = metrics.exposition()[0].decode()
    series = (
        'gpu_slicer_webhook_extended_resource_classes{device_class="gpu.nvidia.com",'
        'handling="defer",resource="nvidia.com/gpu"}'
    )
    assert f"{series} 0.0" in text


# --- through the server ---------------------------------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[InMemoryKubeApi]:
    api = InMemoryKubeApi()
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "ml", "labels": {"gpu-slicer.io/migration": "enabled"}},
        }
    )
    api.create(device_class("gpu.nvidia.com", "nvidia.com/gpu"))
    api.create(device_class("mig.nvidia.com", None))
    yield api
    api.close()


@contextmanager
def served(
    api: InMemoryKubeApi, caplog: pytest.LogCaptureFixture, **settings: Any
) -> Iterator[tuple[FlaskClient, Runtime]]:
    """A ready app on ``api`` (caches synced), capturing the report's log lines."""
    runtime = build_runtime(
        ServerConfig(tls_cert="c", tls_key="k", gc_interval_s=0, **settings), api=api
    )
    try:
        with caplog.at_level(logging.INFO, logger="gpu_slicer.webhook.extended"):
            client = create_app(runtime=runtime).test_client()
            wait_for(lambda: client.get("/readyz").status_code == 200)
            yield client, runtime
    finally:
        runtime.stop()


def wait_for(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def metrics_text(client: FlaskClient) -> str:
    return client.get("/metrics").get_data(as_text=True)


def gpu_review() -> dict[str, Any]:
    return admission_review(build_pod(container(limits={"nvidia.com/gpu": 1})), namespace="ml")


def test_beside_nvidias_driver_gpu_pods_are_left_alone_visibly(
    cluster: InMemoryKubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    with served(cluster, caplog) as (client, _runtime):
        wait_for(lambda: "extended_resource_classes{" in metrics_text(client))
        # The cache's thread sets the gauge, then logs: wait for the log line too.
        wait_for(lambda: any(r.levelno == logging.WARNING for r in caplog.records))
        reply = client.post("/mutate-pods", data=json.dumps(gpu_review()), headers=JSON)
        response = reply.get_json()["response"]
        text = metrics_text(client)
    assert "patch" not in response
    assert any(
        "nvidia.com/gpu in main not converted: a DeviceClass serves it" in w
        for w in response["warnings"]
    )
    assert (
        'gpu_slicer_webhook_extended_resource_classes{device_class="gpu.nvidia.com",'
        'handling="defer",resource="nvidia.com/gpu"} 1.0'
    ) in text
    assert 'gpu_slicer_webhook_deferred_total{mode="enabled",resource="nvidia.com/gpu"} 1.0' in text
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and "DeviceClass gpu.nvidia.com (NVIDIA's DRA driver)" in warned[0].getMessage()


def test_every_policy_reload_reports_again(
    tmp_path: Path, cluster: InMemoryKubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("nativeExtendedResources: defer\n")
    with served(cluster, caplog, policy=str(policy), policy_check_s=0) as (client, runtime):
        wait_for(lambda: "extended_resource_classes{" in metrics_text(client))
        wait_for(lambda: any("is served by" in r.getMessage() for r in caplog.records))
        caplog.clear()
        policy.write_text("nativeExtendedResources: convert\n")
        assert runtime.policy is not None and runtime.policy.check()
        reply = client.post("/mutate-pods", data=json.dumps(gpu_review()), headers=JSON)
        text = metrics_text(client)
        wait_for(lambda: any("is served by" in r.getMessage() for r in caplog.records))
    (line,) = [r for r in caplog.records if "nvidia.com/gpu is served by" in r.getMessage()]
    assert line.levelno == logging.INFO and "nativeExtendedResources=convert" in line.getMessage()
    assert "patch" in reply.get_json()["response"]
    assert 'handling="convert",resource="nvidia.com/gpu"} 1.0' in text
    assert 'handling="defer",resource="nvidia.com/gpu"} 0.0' in text


def test_a_class_installed_later_is_reported_when_it_appears(
    cluster: InMemoryKubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    with served(cluster, caplog) as (client, _runtime):
        cluster.create(device_class("gpu.gpu-slicer.io", "nvidia.com/gpu"))
        wait_for(lambda: "gpu.gpu-slicer.io" in metrics_text(client))
        wait_for(
            lambda: any("gpu.gpu-slicer.io (gpu-slicer)" in r.getMessage() for r in caplog.records)
        )
    messages = [r.getMessage() for r in caplog.records]
    assert any("DeviceClass gpu.gpu-slicer.io (gpu-slicer)" in m for m in messages)
