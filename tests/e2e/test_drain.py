"""Draining a node with a converted pod on its MIG slice, on the real node with the chart's agent.

A sandbox of its own with one node, ``real`` (``--real-node real --install helm --agent-pod``:
the chart's agent DaemonSet from the project's image under the real kubelet; the webhook runs
beside the sandbox, so no webhook pod of its PodDisruptionBudget sits on the drained node).
The node is drained as ``kubectl drain --ignore-daemonsets`` does it: cordoned, then every pod
that no DaemonSet owns evicted through the Eviction API. The Deployment's converted pod is
evicted and terminates normally (a grace period, as a real pod's), its claim is released and
deleted, its MIG instance destroyed and its CDI file removed; its replacement waits, unallocated,
while the node is cordoned, and gets a slice of its own once the node is uncordoned.

Skipped with the reason where the machine cannot run containers or the kubelet, containerd or the
image cannot be built; under ``CI=true`` that is a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from sandbox import binaries
from tests.support.e2e_sandbox import (
    ENABLED,
    Obj,
    Sandbox,
    chart_pods_sandbox,
    wait_webhook_knows,
)
from tests.support.real_node_probe import latest_report, probe_pod

NODE = "real"
GPUS = "A100-80GB:1"
LIMITS = {"nvidia.com/mig-1g.10gb": "1"}


@pytest.fixture(scope="module")
def box(kube_binaries: binaries.Binaries) -> Iterator[Sandbox]:
    with chart_pods_sandbox("gs-drain-", NODE, GPUS, "--agent-pod") as running:
        running.core.create_namespace(
            {"metadata": {"name": ENABLED, "labels": {"gpu-slicer.io/migration": "enabled"}}}
        )
        running.wait(
            lambda: running.core.read_namespaced_service_account("default", ENABLED),
            what="the namespace's default ServiceAccount",
        )
        wait_webhook_knows(running)
        yield running


def _deployment() -> Obj:
    """One replica of a probe that reports what it sees every 2 s; deleted with a grace
    period (3 s), as pods are (the tier's usual 0 would make an eviction a forced deletion)."""
    template = probe_pod("infer", NODE, LIMITS, repeat=True)
    template["spec"]["terminationGracePeriodSeconds"] = 3
    template["metadata"] = {"labels": {"app": "infer"}}
    del template["apiVersion"], template["kind"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "infer"}},
            "template": template,
        },
    }


def _pods(box: Sandbox) -> list[Obj]:
    listed = box.core.list_namespaced_pod(ENABLED, label_selector="app=infer").items
    return [box.obj(p) for p in listed]


def _cdi_claims(box: Sandbox) -> list[str]:
    cdi = box.dir / "nodes" / NODE / "cdi"
    return sorted(p.name for p in cdi.glob("k8s.gpu-slicer.io-claim_*"))


def _checkpoint_claims(box: Sandbox) -> dict[str, Any]:
    data = json.loads((box.dir / "nodes" / NODE / "checkpoint" / "checkpoint.json").read_text())
    claims: dict[str, Any] = data["data"]["claims"]  # slicer.checkpoint's envelope
    return claims


def _drain(box: Sandbox, node: str) -> list[str]:
    """``kubectl drain --ignore-daemonsets``: cordon, then evict every pod on the node that no
    DaemonSet owns; returns the evicted pods."""
    box.core.patch_node(node, {"spec": {"unschedulable": True}})
    evicted = []
    for pod in box.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
        owners = pod.metadata.owner_references or []
        if any(o.kind == "DaemonSet" for o in owners):
            continue
        name, namespace = pod.metadata.name, pod.metadata.namespace
        box.core.create_namespaced_pod_eviction(
            name,
            namespace,
            k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace)),
        )
        evicted.append(f"{namespace}/{name}")
    return evicted


def test_a_drained_nodes_mig_pod_is_evicted_and_leaves_nothing_stale(box: Sandbox) -> None:
    k8s.AppsV1Api(box.client).create_namespaced_deployment(ENABLED, _deployment())
    [pod] = box.wait(
        lambda: [p for p in _pods(box) if p["status"].get("phase") == "Running"],
        what="the Deployment's pod running",
        timeout_s=150,
    )
    name = pod["metadata"]["name"]
    [claim] = box.claims_of(pod)
    uid = claim["metadata"]["uid"]
    _, seen = latest_report(box, name, ENABLED)
    assert seen["env"].startswith("NVIDIA_VISIBLE_DEVICES=MIG-")
    assert len(box.instances(NODE)) == 1
    assert _cdi_claims(box) == [f"k8s.gpu-slicer.io-claim_{uid}.json"]

    evicted = _drain(box, NODE)

    assert evicted == [f"{ENABLED}/{name}"]  # the agent's DaemonSet pod stays
    box.wait_gone(ENABLED, name, timeout_s=90)  # terminated normally: unprepared by the agent
    box.wait(lambda: box.instances(NODE) == [], what="the evicted pod's instance destroyed")
    assert _cdi_claims(box) == []
    assert uid not in _checkpoint_claims(box)
    box.wait(
        lambda: all(
            c.metadata.uid != uid
            for c in box.resource.list_namespaced_resource_claim(ENABLED).items
        ),
        what="the evicted pod's claim released and deleted",
    )
    # Its replacement waits while the node is cordoned, its claim unallocated.
    [replacement] = box.wait(
        lambda: [p for p in _pods(box) if p["metadata"]["name"] != name],
        what="the replacement pod",
    )
    assert replacement["status"].get("phase") == "Pending"
    assert not replacement["spec"].get("nodeName")
    for pending in box.resource.list_namespaced_resource_claim(ENABLED).items:
        assert pending.status is None or pending.status.allocation is None
    [agent] = box.core.list_namespaced_pod(
        "gpu-slicer", label_selector="app.kubernetes.io/component=agent"
    ).items
    assert agent.status.phase == "Running"

    # Uncordoned: the replacement gets a slice of its own, nothing of the old one.
    box.core.patch_node(NODE, {"spec": {"unschedulable": False}})
    new = box.wait_running(ENABLED, replacement["metadata"]["name"], timeout_s=150)
    [new_claim] = box.claims_of(new)
    assert new_claim["metadata"]["uid"] != uid
    _, seen_now = latest_report(box, new["metadata"]["name"], ENABLED)
    assert seen_now["env"].startswith("NVIDIA_VISIBLE_DEVICES=MIG-")
    assert len(box.instances(NODE)) == 1
    assert _cdi_claims(box) == [f"k8s.gpu-slicer.io-claim_{new_claim['metadata']['uid']}.json"]
    assert set(_checkpoint_claims(box)) == {new_claim["metadata"]["uid"]}
    k8s.AppsV1Api(box.client).delete_namespaced_deployment("infer", ENABLED)
    box.wait(lambda: box.instances(NODE) == [], what="the last instance destroyed")
