"""A namespace with a GPU quota of 1 that opts in still runs at most one GPU pod, on a node with
two free GPUs: without DRA quota lines its pods stay unconverted and the legacy quota counts
them; with them, the claims are counted per DeviceClass."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from tests.support.e2e_sandbox import Sandbox, pod_manifest

NODE = "quota"
GPU = {"nvidia.com/gpu": "1"}
DEVICES = ".deviceclass.resource.k8s.io/devices"


def _namespace(sandbox: Sandbox, name: str, hard: dict[str, str]) -> None:
    sandbox.core.create_namespace(
        {"metadata": {"name": name, "labels": {"gpu-slicer.io/migration": "enabled"}}}
    )
    sandbox.core.create_namespaced_resource_quota(
        name, {"metadata": {"name": "gpus"}, "spec": {"hard": hard}}
    )
    sandbox.wait(  # the quota controller must have counted before admission enforces it
        lambda: sandbox.core.read_namespaced_resource_quota("gpus", name).status.hard,
        what=f"quota {name}/gpus to be counted",
    )


def _dry_run_warnings(sandbox: Sandbox, namespace: str) -> list[str]:
    response = sandbox.core.create_namespaced_pod(
        namespace,
        pod_manifest("probe", node=NODE, limits=GPU),
        dry_run="All",
        _preload_content=False,
    )
    return list(response.headers.getlist("Warning"))


def _running(sandbox: Sandbox, namespace: str) -> list[str]:
    pods = sandbox.core.list_namespaced_pod(namespace).items
    return [p.metadata.name for p in pods if p.status.phase == "Running"]


def test_without_dra_lines_pods_stay_unconverted_and_the_legacy_quota_holds(
    sandbox: Sandbox,
) -> None:
    ns = "e2e-quota-legacy"
    _namespace(sandbox, ns, {"requests.nvidia.com/gpu": "1"})
    sandbox.wait(
        lambda: any(
            "quota limits requests.nvidia.com/gpu: 1" in w for w in _dry_run_warnings(sandbox, ns)
        ),
        what="the webhook to see the quota",
    )
    first, warnings = sandbox.create_pod(ns, pod_manifest("first", node=NODE, limits=GPU))
    assert not first["spec"].get("resourceClaims")
    assert first["spec"]["containers"][0]["resources"]["limits"] == GPU
    assert any("not converted: quota limits" in w for w in warnings), warnings
    with pytest.raises(ApiException) as refused:
        sandbox.create_pod(ns, pod_manifest("second", node=NODE, limits=GPU))
    assert refused.value.status == 403 and "exceeded quota" in str(refused.value.body)


def test_with_dra_lines_pods_are_converted_and_one_runs(sandbox: Sandbox) -> None:
    ns = "e2e-quota-dra"
    hard = {
        "requests.nvidia.com/gpu": "1",
        f"gpu.gpu-slicer.io{DEVICES}": "1",
        f"mig.gpu-slicer.io{DEVICES}": "1",
    }
    _namespace(sandbox, ns, hard)
    sandbox.wait(
        lambda: (
            sandbox.core.create_namespaced_pod(
                ns, pod_manifest("probe", node=NODE, limits=GPU), dry_run="All"
            ).spec.resource_claims
        ),
        what="the webhook to convert in the namespace",
    )
    created: list[Any] = []
    for name in ("first", "second"):
        pod, _ = sandbox.create_pod(ns, pod_manifest(name, node=NODE, limits=GPU))
        assert pod["spec"]["resourceClaims"], "converted: the DRA lines count its claim"
        created.append(pod)
    sandbox.wait(lambda: _running(sandbox, ns), what="one pod to run", timeout_s=90)
    time.sleep(5)  # the second has every chance: two GPUs are free on the node
    assert len(_running(sandbox, ns)) == 1, _running(sandbox, ns)
    waiting = next(n for n in ("first", "second") if n not in _running(sandbox, ns))
    events = " ".join(sandbox.events(ns, waiting))
    assert "quota" in events.lower(), events
