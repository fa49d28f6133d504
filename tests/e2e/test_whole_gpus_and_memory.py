"""Whole GPUs and memory-sized requests on the real scheduler."""

from __future__ import annotations

from typing import Any

from gpu_slicer.kube.quantity import parse_quantity
from tests.support.e2e_sandbox import ENABLED, Sandbox, pod_manifest


def _attribute(device: dict[str, Any], name: str) -> object:
    """An attribute in the driver's domain, written qualified or not."""
    attributes = device.get("attributes") or {}
    value = attributes.get(f"gpu-slicer.io/{name}") or attributes.get(name) or {}
    return next(iter(value.values()), None)


def test_four_whole_gpus_on_a_four_gpu_node(sandbox: Sandbox) -> None:
    node = "h100x4"
    sandbox.create_pod(ENABLED, pod_manifest("quad", node=node, limits={"nvidia.com/gpu": "4"}))
    pod = sandbox.wait_running(ENABLED, "quad")
    [claim] = sandbox.claims_of(pod)
    devices = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
    assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    # Whole GPUs: no MIG instance was made, and the container sees all four GPUs.
    assert sandbox.instances(node) == []
    runtime = sandbox.container_runtime(node, ENABLED, "quad", "main")
    assert len(runtime["cdiDevices"]) == 4
    sandbox.delete_pod(ENABLED, "quad")


def test_a_gpu_memory_annotation_gets_the_smallest_slice_with_that_much_memory(
    sandbox: Sandbox,
) -> None:
    node = "h100"
    sandbox.create_pod(
        ENABLED, pod_manifest("sized", node=node, annotations={"gpu-slicer.io/gpu-memory": "15Gi"})
    )
    pod = sandbox.wait_running(ENABLED, "sized")
    [claim] = sandbox.claims_of(pod)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    slices = sandbox.obj(
        sandbox.resource.list_resource_slice(field_selector=f"spec.nodeName={node}")
    )["items"]
    device = next(
        d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == result["device"]
    )
    memory = parse_quantity(device["capacity"]["gpu-slicer.io/memory"]["value"])
    assert memory >= parse_quantity("15Gi")
    # Smallest first: no profile of this GPU with less memory but at least 15Gi was skipped.
    offered = sorted(
        {
            parse_quantity(d["capacity"]["gpu-slicer.io/memory"]["value"])
            for s in slices
            for d in s["spec"].get("devices") or []
            if _attribute(d, "type") == "mig"
        }
    )
    assert memory == min(m for m in offered if m >= parse_quantity("15Gi"))
    [(_, profile, _)] = sandbox.instances(node)
    assert result["device"].startswith(f"gpu-0-mig-{profile.replace('.', '')}")
    sandbox.delete_pod(ENABLED, "sized")
    sandbox.wait(lambda: sandbox.instances(node) == [], what="the instance destroyed")
