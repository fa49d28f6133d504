"""The chart's agent DaemonSet and webhook Deployment, from the project's image, on the real node.

A sandbox of its own with one node, ``real``, started with ``--real-node real --install helm
--agent-pod --webhook-pod``: the image built from the Dockerfile (``sandbox.image``) is imported
into the node's containerd, and the real kubelet runs the chart's agent pod from it (simulated
backend, host network, the apiserver's address through ``agent.k8sServiceHost``/``k8sServicePort``,
its projected ServiceAccount token) and the chart's webhook pod (host network, the same apiserver
address values). The apiserver calls the webhook through the chart's Service by its endpoint
(``--enable-aggregator-routing``: no kube-proxy here), checking the certificate against the
Service's name. A pod converted by that webhook pod then gets its MIG slice from the agent pod and
sees it from inside its container.

Skipped with the reason where the machine cannot run containers or the kubelet, containerd or the
image cannot be built; under ``CI=true`` that is a failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from gpu_slicer.sandbox import binaries, image
from tests.support.e2e_sandbox import (
    ENABLED,
    Obj,
    Sandbox,
    chart_pods_sandbox,
    wait_webhook_knows,
)
from tests.support.real_node_probe import container_report, probe_pod

NODE = "real"
GPUS = "A100-80GB:1"
HOST_FOLDERS = ("/etc/cdi", "/var/run/cdi", "/var/lib/gpu-slicer", "/var/lib/kubelet")
"""The agent pod's hostPaths: the kubelet makes them in the node's namespace, not on the host."""


@pytest.fixture(scope="module")
def box(kube_binaries: binaries.Binaries) -> Iterator[Sandbox]:
    host_folders = {p: Path(p).exists() for p in HOST_FOLDERS}
    with chart_pods_sandbox("gs-agentpod-", NODE, GPUS, "--agent-pod", "--webhook-pod") as running:
        running.core.create_namespace(
            {"metadata": {"name": ENABLED, "labels": {"gpu-slicer.io/migration": "enabled"}}}
        )
        # ServiceAccount admission is on in this sandbox: pods wait for the namespace's default.
        running.wait(
            lambda: running.core.read_namespaced_service_account("default", ENABLED),
            what="the namespace's default ServiceAccount",
        )
        wait_webhook_knows(running)
        yield running
    assert {p: Path(p).exists() for p in HOST_FOLDERS} == host_folders


def _chart_pod(box: Sandbox, component: str) -> Obj:
    [pod] = box.core.list_namespaced_pod(
        "gpu-slicer", label_selector=f"app.kubernetes.io/component={component}"
    ).items
    return box.obj(pod)


def _agent_pod(box: Sandbox) -> Obj:
    return _chart_pod(box, "agent")


def _log(box: Sandbox, pod: Obj) -> str:
    return str(box.core.read_namespaced_pod_log(pod["metadata"]["name"], "gpu-slicer"))


def test_the_agent_pod_from_the_image_registers_with_the_real_kubelet_and_publishes(
    box: Sandbox,
) -> None:
    pod = _agent_pod(box)
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert pod["spec"]["nodeName"] == NODE
    assert pod["status"]["phase"] == "Running"
    [container] = pod["spec"]["containers"]
    assert container["image"] == image.image_name()
    assert f"agent-{NODE}" not in box.ready["pids"]  # no agent process beside the pod
    assert "registered with the kubelet" in _log(box, pod)
    slices = box.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
    assert slices and {s.spec.driver for s in slices} == {"z.gpu-slicer.io"}


def test_the_webhook_pod_from_the_image_is_what_the_apiserver_calls_through_its_service(
    box: Sandbox,
) -> None:
    pod = _chart_pod(box, "webhook")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert (pod["spec"]["nodeName"], pod["spec"]["hostNetwork"]) == (NODE, True)
    assert pod["status"]["phase"] == "Running"
    [container] = pod["spec"]["containers"]
    assert container["image"] == image.image_name()
    assert "webhook" not in box.ready["pids"]  # no webhook process beside the pod
    configuration = box.obj(
        k8s.AdmissionregistrationV1Api(box.client).read_mutating_webhook_configuration("gpu-slicer")
    )
    [webhook] = configuration["webhooks"]
    assert "url" not in webhook["clientConfig"]
    assert webhook["clientConfig"]["service"]["name"] == "gpu-slicer-webhook"


def test_a_converted_pod_gets_its_slice_from_the_agent_pod_and_sees_it_inside(
    box: Sandbox,
) -> None:
    box.create_pod(ENABLED, probe_pod("converted", NODE, {"nvidia.com/mig-1g.10gb": "1"}))
    running = box.wait_running(ENABLED, "converted", timeout_s=150)
    [claim] = box.claims_of(running)
    path = (
        box.dir
        / "nodes"
        / NODE
        / "cdi"
        / f"k8s.gpu-slicer.io-claim_{claim['metadata']['uid']}.json"
    )
    [device] = json.loads(path.read_text())["devices"]
    [visible] = [e for e in device["containerEdits"]["env"] if "NVIDIA_VISIBLE_DEVICES" in e]
    seen = container_report(box, "converted")
    assert seen["env"] == visible
    assert re.fullmatch(r"NVIDIA_VISIBLE_DEVICES=MIG-[0-9a-f-]{36}", seen["env"])
    assert "/dev/nvidia0" in seen["devices"]
    assert len({d for d in seen["devices"] if d.startswith("/dev/nvidia-caps/")}) == 2
    assert len(box.instances(NODE)) == 1  # made by the agent pod in the node's GPU state
    assert claim["metadata"]["uid"] in _log(box, _agent_pod(box))
    # The webhook pod converted it: it made the pod's ResourceClaimTemplate.
    [template] = {c["resourceClaimTemplateName"] for c in running["spec"]["resourceClaims"]}
    assert f"{ENABLED}/{template}" in _log(box, _chart_pod(box, "webhook"))

    box.delete_pod(ENABLED, "converted")
    box.wait(lambda: box.instances(NODE) == [], what="the agent pod destroying the instance")
