"""`helm install` of deploy/helm/gpu-slicer into a real cluster brings up a working webhook and
agent: a second sandbox that applies the chart instead of deploy/base."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from gpu_slicer.sandbox import binaries
from gpu_slicer.sandbox.helm import HelmUnavailable, helm_binary
from tests.support.e2e_sandbox import (
    Sandbox,
    pod_manifest,
    start_with_enabled_namespace,
    stop_sandbox,
)

NODE = "helm-a100"


@pytest.fixture(scope="module")
def helm_sandbox(kube_binaries: binaries.Binaries) -> Iterator[Sandbox]:
    try:
        helm_binary()
    except HelmUnavailable as exc:
        pytest.fail(f"helm is needed for the chart's end-to-end test: {exc}")
    running = start_with_enabled_namespace("gs-helm-", {NODE: "A100-80GB:1"}, "--install", "helm")
    yield running
    running.client.close()
    assert stop_sandbox(running.process) == 0


def test_the_chart_installs_as_a_release_and_a_converted_pod_runs(helm_sandbox: Sandbox) -> None:
    releases = subprocess.run(
        [
            str(helm_binary()),
            "list",
            "-n",
            "gpu-slicer",
            "--kubeconfig",
            str(helm_sandbox.kubeconfig),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert '"name":"gpu-slicer"' in releases.stdout and '"status":"deployed"' in releases.stdout
    for cls in ("gpu.gpu-slicer.io", "mig.gpu-slicer.io"):
        labels = helm_sandbox.resource.read_device_class(cls).metadata.labels
        assert labels["app.kubernetes.io/managed-by"] == "Helm"

    helm_sandbox.create_pod(
        "e2e-enabled", pod_manifest("from-helm", node=NODE, limits={"nvidia.com/mig-1g.10gb": "1"})
    )
    pod = helm_sandbox.wait_running("e2e-enabled", "from-helm")
    assert pod["spec"]["resourceClaims"], "the chart's webhook configuration did not convert"
    assert [p for _, p, _ in helm_sandbox.instances(NODE)] == ["1g.10gb"]
    helm_sandbox.delete_pod("e2e-enabled", "from-helm")
    helm_sandbox.wait(lambda: helm_sandbox.instances(NODE) == [], what="the instance destroyed")
