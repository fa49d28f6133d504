"""Device health end to end: a critical Xid injected on a node's simulated GPU (``gpu-slicer agent
simulate-event``, as an operator would) goes through the agent's resource-health stream and the
kubelet stand-in into the status of the pod holding a slice of that GPU, and not into the status
of the pod on the other GPU; the ResourceSlices taint the GPU's devices until it recovers."""

from __future__ import annotations

from typing import Any

from gpu_slicer.core.devices import parse_device_name
from tests.support.e2e_sandbox import ENABLED, Sandbox, pod_manifest, resource_health

NODE = "health"
Obj = dict[str, Any]


def _tainted(box: Sandbox) -> set[str]:
    return {
        d["name"]
        for s in box.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
        for d in box.obj(s)["spec"].get("devices") or []
        if any(t["key"] == "gpu-slicer.io/unhealthy" for t in d.get("taints") or [])
    }


def test_a_critical_xid_reaches_the_status_of_the_pod_on_that_gpu_only(sandbox: Sandbox) -> None:
    limits = {"nvidia.com/mig-7g.80gb": "1"}  # a whole GPU's slice: one pod per GPU
    pods: dict[int, Obj] = {}
    for name in ("health-a", "health-b"):
        sandbox.create_pod(ENABLED, pod_manifest(name, node=NODE, limits=limits))
        pod = sandbox.wait_running(ENABLED, name)
        [claim] = sandbox.claims_of(pod)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        pods[parse_device_name(result["device"]).gpu_index] = pod
    hit, spared = pods[0], pods[1]

    def healthy(pod: Obj) -> list[Obj]:
        current = sandbox.pod(ENABLED, pod["metadata"]["name"])
        entries = resource_health(current)
        ok = entries and all(r["health"] == "Healthy" for e in entries for r in e["resources"])
        return entries if ok else []

    [entry] = sandbox.wait(lambda: healthy(hit), what="the pod's devices reported Healthy")
    [claim_ref] = hit["spec"]["containers"][0]["resources"]["claims"]
    request = f"/{claim_ref['request']}" if claim_ref.get("request") else ""
    assert entry["name"] == f"claim:{claim_ref['name']}{request}"
    [claim] = sandbox.claims_of(hit)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    uid = claim["metadata"]["uid"]
    assert entry["resources"] == [
        {"resourceID": f"k8s.gpu-slicer.io/claim={uid}-{result['device']}", "health": "Healthy"}
    ]
    sandbox.wait(lambda: healthy(spared), what="the other pod's device reported Healthy")

    sandbox.simulate_event(NODE, "--gpu", "0", "--xid", "79")

    def unhealthy() -> Obj | None:
        [current] = resource_health(sandbox.pod(ENABLED, hit["metadata"]["name"]))
        [resource] = current["resources"]
        return resource if resource["health"] == "Unhealthy" else None

    resource = sandbox.wait(unhealthy, what="the Xid in the pod's allocatedResourcesStatus")
    assert "GPU 0 is unhealthy (xid-79)" in resource["message"]
    assert all(name.startswith("gpu-0") for name in _tainted(sandbox)) and _tainted(sandbox)
    assert healthy(spared), "the pod on the other GPU stays Healthy"
    assert "Traceback" not in sandbox.log(f"agent-{NODE}")

    for pod in pods.values():
        sandbox.delete_pod(ENABLED, pod["metadata"]["name"])
    sandbox.simulate_event(NODE, "--gpu", "0", "--recovered")
    sandbox.wait(lambda: not _tainted(sandbox), what="the GPU's taints gone after recovery")
