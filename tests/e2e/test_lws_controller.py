"""The LeaderWorkerSet controller, built from its Go module, runs against a sandbox: a
LeaderWorkerSet whose leader and worker templates ask for MIG slices makes StatefulSets, they
make pods, and the pods get their slices, converted at admission or in Git."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from gpu_slicer.sandbox.errors import BuildError
from gpu_slicer.sandbox.operators import lws_binary, lws_version
from tests.support.e2e_sandbox import ENABLED, Sandbox, start_with_enabled_namespace, stop_sandbox
from tests.support.operator_controllers import (
    Hook,
    as_git_keeps_it,
    install_crds,
    start_controller,
    wait_for_pods_with_slices,
)
from tests.support.operator_crds import module_crds

NODE = "lws-a100"
GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
LWS = (GROUP, VERSION, PLURAL)
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
OWN_PODS = {"matchExpressions": [{"key": NAME_LABEL, "operator": "Exists"}]}
HOOKS = [
    Hook("Mutating", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", *LWS),
    Hook(
        "Validating",
        "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        *LWS,
        ("CREATE", "UPDATE"),
    ),
    Hook("Mutating", "/mutate--v1-pod", "", "v1", "pods", object_selector=OWN_PODS),
    Hook("Validating", "/validate--v1-pod", "", "v1", "pods", object_selector=OWN_PODS),
]


def _lws(name: str) -> dict[str, Any]:
    def template() -> dict[str, Any]:
        return {
            "spec": {
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
        }

    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": ENABLED},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "leaderTemplate": template(),
                "workerTemplate": template(),
            },
        },
    }


@pytest.fixture(scope="module")
def lws_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    try:
        binary = lws_binary()
    except BuildError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the LeaderWorkerSet controller is needed: {exc}")
        pytest.skip(f"the LeaderWorkerSet controller cannot be built: {exc}")
    crds = module_crds(f"sigs.k8s.io/lws@{lws_version()}", "config/crd/bases/*.yaml")
    box = start_with_enabled_namespace("gs-lws-", {NODE: "A100-80GB:1"})
    install_crds(box, crds)
    controller = start_controller(
        box, "lws", binary, "config.lws.x-k8s.io/v1alpha1", HOOKS, tmp_path_factory.mktemp("lws")
    )
    try:
        yield box
    finally:
        controller.stop()
        box.client.close()
        assert stop_sandbox(box.process) == 0


def _pods(box: Sandbox, name: str) -> list[Any]:
    pods = box.core.list_namespaced_pod(ENABLED, label_selector=f"{NAME_LABEL}={name}").items
    return [box.obj(p) for p in pods]


@pytest.mark.parametrize("converted_in_git", [False, True], ids=["at-admission", "in-git"])
def test_a_leader_worker_sets_pods_get_their_mig_slices(
    lws_sandbox: Sandbox, converted_in_git: bool
) -> None:
    box = lws_sandbox
    name = "git" if converted_in_git else "plain"
    body = _lws(name)
    if converted_in_git:
        body = as_git_keeps_it(box, ENABLED, body)
    custom = k8s.CustomObjectsApi(box.client)
    box.wait(
        lambda: custom.create_namespaced_custom_object(GROUP, VERSION, ENABLED, PLURAL, body),
        what="the LeaderWorkerSet to be admitted",
    )
    wait_for_pods_with_slices(
        box, lambda: _pods(box, name), f"LeaderWorkerSet {name}'s leader and worker to run"
    )
    custom.delete_namespaced_custom_object(
        GROUP, VERSION, ENABLED, PLURAL, name, propagation_policy="Foreground"
    )
    box.wait(lambda: not _pods(box, name), what=f"{name}'s pods to go", timeout_s=90)
