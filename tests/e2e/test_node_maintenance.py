"""Node maintenance with a converted pod on its MIG slice, on the real node with the chart's agent:
a drain, the Node deleted and registered again, and a reboot.

A sandbox of its own with one node, ``real`` (``--real-node real --install helm --agent-pod``:
the chart's agent DaemonSet from the project's image under the real kubelet; the webhook runs
beside the sandbox, so no webhook pod of its PodDisruptionBudget sits on the drained node).
The node is drained with ``kubectl drain --ignore-daemonsets`` (kubectl built from the same
release as the control plane): cordoned, then every pod that no DaemonSet owns evicted through
the Eviction API. The Deployment's converted pod is evicted and terminates normally (a grace
period, as a real pod's), its claim is released and deleted, its MIG instance destroyed and its
CDI file removed; its replacement waits, unallocated, while the node is cordoned, and gets a
slice of its own once the node is uncordoned.


The Node deleted (``kubectl delete node``) and registered again by its kubelet on restart, as an
admin recovers a node removed by mistake: the garbage collector deletes the pool's slices with
their owner, the agent writes them again (``slicer.pool_watch``) and owns them to the Node as it
is once registered again (a new uid); the running pod keeps its container and its slice
throughout (the kubelet is back well within the pod garbage collector's 40 s for pods of a
missing node), and a new pod gets a slice of its own.


A reboot (the sandbox's ``reboot/<node>``, ``sandbox.realnode.RealNode.reboot``): every process
of the node ends (kubelet, containerd, the containers, the agent's pod), ``/run`` is emptied
(containerd's state, the CDI specs) and the GPUs come back empty with a new boot id, while the
disk keeps the kubelet's and containerd's roots and the agent's checkpoint. The kubelet starts
the pod again; its claim keeps its allocation and is prepared again: the agent sees the new boot
id, forgets every entry of the old boot and creates the instance anew, at the allocated
placement, with a new UUID. Nothing of the old boot is left: one instance, one CDI spec, one
checkpoint entry.

Skipped with the reason where the machine cannot run containers or the kubelet, containerd or the
image cannot be built; under ``CI=true`` that is a failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_slicer.core.identity import DRIVER
from gpu_slicer.sandbox import binaries
from tests.support.chart_release import run_kubectl
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


def _deployment(name: str = "infer") -> Obj:
    """One replica of a probe that reports what it sees every 2 s; deleted with a grace
    period (3 s), as pods are (the tier's usual 0 would make an eviction a forced deletion)."""
    template = probe_pod(name, NODE, LIMITS, repeat=True)
    template["spec"]["terminationGracePeriodSeconds"] = 3
    template["metadata"] = {"labels": {"app": name}}
    del template["apiVersion"], template["kind"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        },
    }


def _pods(box: Sandbox, app: str = "infer") -> list[Obj]:
    listed = box.core.list_namespaced_pod(ENABLED, label_selector=f"app={app}").items
    return [box.obj(p) for p in listed]


def _cdi_claims(box: Sandbox) -> list[str]:
    cdi = box.dir / "nodes" / NODE / "cdi"
    return sorted(p.name for p in cdi.glob("k8s.gpu-slicer.io-claim_*"))


def _checkpoint_claims(box: Sandbox) -> dict[str, Any]:
    data = json.loads((box.dir / "nodes" / NODE / "checkpoint" / "checkpoint.json").read_text())
    claims: dict[str, Any] = data["data"]["claims"]  # slicer.checkpoint's envelope
    return claims


def _drain(box: Sandbox, kubectl: Path, node: str) -> list[str]:
    """``kubectl drain --ignore-daemonsets`` as an admin runs it: cordon, then evict every pod
    on the node that no DaemonSet owns, and wait until they are gone; returns the pods it
    evicted, as it reports them."""
    done = run_kubectl(
        box, kubectl, "drain", node, "--ignore-daemonsets", "--timeout=150s", timeout_s=180
    )
    assert done.returncode == 0, f"kubectl drain failed: {done.stdout}{done.stderr}"
    return sorted(re.findall(r"^evicting pod (\S+)$", done.stdout + done.stderr, re.M))


def test_a_drained_nodes_mig_pod_is_evicted_and_leaves_nothing_stale(
    box: Sandbox, kubectl: Path
) -> None:
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

    evicted = _drain(box, kubectl, NODE)

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


def _running_deployment(box: Sandbox, app: str) -> Obj:
    """A one-replica Deployment of a probe, created; its pod once running."""
    k8s.AppsV1Api(box.client).create_namespaced_deployment(ENABLED, _deployment(app))
    [pod] = box.wait(
        lambda: [p for p in _pods(box, app) if p["status"].get("phase") == "Running"],
        what=f"the Deployment {app}'s pod running",
        timeout_s=150,
    )
    return pod


def _pool(box: Sandbox) -> dict[str, list[str]]:
    """This node's slices of gpu-slicer: each one's uid -> the uids of its owners."""
    listed = box.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
    return {
        s.metadata.uid: [o.uid for o in s.metadata.owner_references or []]
        for s in listed
        if s.spec.driver == DRIVER
    }


def test_a_node_deleted_and_registered_again_keeps_its_pod_and_gets_its_pool_back(
    box: Sandbox,
) -> None:
    apps = k8s.AppsV1Api(box.client)
    pod = _running_deployment(box, "keeper")
    name = pod["metadata"]["name"]
    [status] = pod["status"]["containerStatuses"]
    container = (status["containerID"], status["restartCount"])
    [claim] = box.claims_of(pod)
    instances = box.instances(NODE)
    _, seen = latest_report(box, name, ENABLED)
    old_uid = box.core.read_node(NODE).metadata.uid
    before = _pool(box)
    assert before and all(owners == [old_uid] for owners in before.values())

    box.core.delete_node(NODE)
    box.restart(f"kubelet-{NODE}")  # registers the Node again as it starts

    new_uid = box.wait(
        lambda: _node_uid(box) not in (None, old_uid) and _node_uid(box),
        what="the Node registered again by its kubelet",
        timeout_s=60,
    )
    after = box.wait(
        lambda: (
            (pool := _pool(box)) and all(owners == [new_uid] for owners in pool.values()) and pool
        ),
        what="the pool written again, owned by the Node registered again",
        timeout_s=60,
    )
    assert not set(after) & set(before)  # collected with the deleted Node, written anew
    current = box.pod(ENABLED, name)
    [status] = current["status"]["containerStatuses"]
    assert (status["containerID"], status["restartCount"]) == container
    assert current["status"]["phase"] == "Running"
    assert box.instances(NODE) == instances
    assert [c["metadata"]["uid"] for c in box.claims_of(current)] == [claim["metadata"]["uid"]]
    number, seen_now = latest_report(box, name, ENABLED)
    _, seen_later = latest_report(box, name, ENABLED, after=number)  # still reporting
    assert seen_later["env"] == seen_now["env"] == seen["env"]

    # The node schedules again: a second replica gets a slice of its own.
    apps.patch_namespaced_deployment_scale("keeper", ENABLED, {"spec": {"replicas": 2}})
    [second] = box.wait(
        lambda: [
            p
            for p in _pods(box, "keeper")
            if p["metadata"]["name"] != name and p["status"].get("phase") == "Running"
        ],
        what="a second replica running on the node",
        timeout_s=150,
    )
    _, seen_second = latest_report(box, second["metadata"]["name"], ENABLED)
    assert seen_second["env"].startswith("NVIDIA_VISIBLE_DEVICES=MIG-")
    assert seen_second["env"] != seen["env"]
    assert len(box.instances(NODE)) == 2
    apps.delete_namespaced_deployment("keeper", ENABLED)
    box.wait(lambda: box.instances(NODE) == [], what="both instances destroyed")
    box.wait(lambda: _cdi_claims(box) == [], what="both CDI specs removed")


def _node_uid(box: Sandbox) -> str | None:
    try:
        uid: str = box.core.read_node(NODE).metadata.uid
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return uid


def test_a_reboot_prepares_the_pods_claim_again_and_leaves_nothing_of_the_old_boot(
    box: Sandbox,
) -> None:
    apps = k8s.AppsV1Api(box.client)
    pod = _running_deployment(box, "survivor")
    name = pod["metadata"]["name"]
    [status] = pod["status"]["containerStatuses"]
    [claim] = box.claims_of(pod)
    uid = claim["metadata"]["uid"]
    instances = box.instances(NODE)
    _, seen = latest_report(box, name, ENABLED)
    boot = _checkpoint_boot(box)

    box.reboot(NODE)

    def restarted() -> Obj | None:
        current = box.pod(ENABLED, name)
        statuses = current["status"].get("containerStatuses") or [{}]
        fresh = statuses[0].get("containerID") not in (None, status["containerID"])
        running = "running" in (statuses[0].get("state") or {})
        return current if fresh and running else None

    current = box.wait(restarted, what="the pod's container started again", timeout_s=240)
    assert [c["metadata"]["uid"] for c in box.claims_of(current)] == [uid]  # the same claim
    assert box.instances(NODE) == instances  # made again at the allocated placement
    _, seen_now = latest_report(box, name, ENABLED)
    assert seen_now["env"].startswith("NVIDIA_VISIBLE_DEVICES=MIG-")
    assert seen_now["env"] != seen["env"]  # a new boot: a new instance, a new UUID
    assert _cdi_claims(box) == [f"k8s.gpu-slicer.io-claim_{uid}.json"]
    assert set(_checkpoint_claims(box)) == {uid}
    assert _checkpoint_boot(box) != boot
    apps.delete_namespaced_deployment("survivor", ENABLED)
    box.wait(lambda: box.instances(NODE) == [], what="the instance destroyed")
    box.wait(lambda: _cdi_claims(box) == [], what="the CDI spec removed")


def _checkpoint_boot(box: Sandbox) -> str:
    data = json.loads((box.dir / "nodes" / NODE / "checkpoint" / "checkpoint.json").read_text())
    boot: str = data["data"]["bootId"]
    return boot
