"""The JobSet controller, built from its Go module, runs against a sandbox: a JobSet whose pod
template asks for MIG slices makes Jobs, the Jobs make pods, and the pods get their slices,
whether the webhook converts them at admission or the JobSet was converted in Git."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from gpu_slicer.sandbox.errors import BuildError
from gpu_slicer.sandbox.operators import jobset_binary, jobset_version
from tests.support.e2e_sandbox import (
    ENABLED,
    Sandbox,
    start_with_enabled_namespace,
    stop_sandbox,
)
from tests.support.operator_controllers import (
    Hook,
    as_git_keeps_it,
    install_crds,
    start_controller,
    wait_for_pods_with_slices,
)
from tests.support.operator_crds import module_crds

NODE = "jobset-a100"
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
HOOKS = [
    Hook("Mutating", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", *JOBSETS),
    Hook("Validating", "/validate-jobset-x-k8s-io-v1alpha2-jobset", *JOBSETS, ("CREATE", "UPDATE")),
]
"""The JobSet webhooks; its pod webhooks (exclusive placement) are not needed here."""


def _jobset(name: str) -> dict[str, Any]:
    pod = {
        "restartPolicy": "Never",
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
            }
        ],
    }
    job = {"parallelism": 2, "completions": 2, "template": {"spec": pod}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": ENABLED},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": job}}]},
    }


@pytest.fixture(scope="module")
def jobset_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    try:
        binary = jobset_binary()
    except BuildError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the JobSet controller is needed: {exc}")
        pytest.skip(f"the JobSet controller cannot be built: {exc}")
    crds = module_crds(
        f"sigs.k8s.io/jobset@{jobset_version()}", "config/components/crd/bases/*.yaml"
    )
    box = start_with_enabled_namespace("gs-jobset-", {NODE: "A100-80GB:1"})
    install_crds(box, crds)
    folder = tmp_path_factory.mktemp("jobset")
    controller = start_controller(
        box, "jobset", binary, "config.jobset.x-k8s.io/v1alpha1", HOOKS, folder
    )
    try:
        yield box
    finally:
        controller.stop()
        box.client.close()
        assert stop_sandbox(box.process) == 0


def _pods(box: Sandbox, jobset: str) -> list[Any]:
    pods = box.core.list_namespaced_pod(
        ENABLED, label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset}"
    ).items
    return [box.obj(p) for p in pods]


def _custom(box: Sandbox) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(box.client)


@pytest.mark.parametrize("converted_in_git", [False, True], ids=["at-admission", "in-git"])
def test_a_jobsets_pods_get_their_mig_slices(
    jobset_sandbox: Sandbox, converted_in_git: bool
) -> None:
    box = jobset_sandbox
    name = "git" if converted_in_git else "plain"
    body = _jobset(name)
    if converted_in_git:
        body = as_git_keeps_it(box, ENABLED, body)
    box.wait(
        lambda: _custom(box).create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ENABLED, "jobsets", body
        ),
        what="the JobSet to be admitted",
    )
    running = wait_for_pods_with_slices(
        box, lambda: _pods(box, name), f"JobSet {name}'s two pods to run"
    )
    for pod in running:
        if converted_in_git:
            assert "gpu-slicer.io/converted" in pod["metadata"]["annotations"]
    assert len([i for i in box.instances(NODE) if i[1] == "1g.10gb"]) >= 2
    _custom(box).delete_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ENABLED, "jobsets", name, propagation_policy="Foreground"
    )
    for pod in running:
        box.core.delete_namespaced_pod(pod["metadata"]["name"], ENABLED, grace_period_seconds=0)
