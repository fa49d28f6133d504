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


def _mig_memory(sandbox: Sandbox, node: str) -> set[Any]:
    """The memory of every MIG device the node publishes now."""
    slices = sandbox.obj(
        sandbox.resource.list_resource_slice(field_selector=f"spec.nodeName={node}")
    )["items"]
    return {
        parse_quantity(d["capacity"]["gpu-slicer.io/memory"]["value"])
        for s in slices
        for d in s["spec"].get("devices") or []
        if _attribute(d, "type") == "mig"
    }


def test_a_gpu_memory_annotation_gets_the_smallest_slice_with_that_much_memory(
    sandbox: Sandbox,
) -> None:
    node = "h100"
    sized = {"gpu-slicer.io/gpu-memory": "15Gi"}
    # The shape's first pod: the agents publish what its chain asks for as they see its
    # template, and the scheduler takes the first alternative published by then. A larger
    # profile another workload asked for (the 4-GPU pod's full-GPU instances) may already be
    # there, so that pod may get it (docs/agent.md, "What a node advertises").
    sandbox.create_pod(ENABLED, pod_manifest("sized-first", node=node, annotations=sized))
    first = sandbox.wait_running(ENABLED, "sized-first")
    [first_claim] = sandbox.claims_of(first)
    [first_result] = first_claim["status"]["allocation"]["devices"]["results"]
    assert first_result["device"].startswith("gpu-0-mig-")  # a MIG slice, never the whole GPU
    sandbox.delete_pod(ENABLED, "sized-first")
    sandbox.wait(lambda: sandbox.instances(node) == [], what="the first pod's instance destroyed")
    # The shape's template keeps asking for the chain's first profile: once it is published,
    # the next pod of the shape gets the smallest slice with that much memory.
    sandbox.wait(
        lambda: any(
            m >= parse_quantity("15Gi") and m < parse_quantity("30Gi")
            for m in _mig_memory(sandbox, node)
        ),
        what="the chain's first profile (1g.20gb on an H100 80GB) published",
    )
    sandbox.create_pod(ENABLED, pod_manifest("sized", node=node, annotations=sized))
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
