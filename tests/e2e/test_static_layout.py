"""Kubernetes 1.35, where partitionable devices are alpha and off: the apiserver drops the
agent's counters, the agent notices on read-back and falls back to its static layout, and a pod
still gets a MIG slice: one of the layout's instances, which stays on the GPU after the pod."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_slicer.sandbox import binaries
from tests.support.e2e_sandbox import (
    Sandbox,
    pod_manifest,
    start_with_enabled_namespace,
    stop_sandbox,
)

NODE = "old-a100"
LAYOUT = '{default: ["1g.10gb@0", "1g.10gb@1", "2g.20gb@2", "3g.40gb@4"]}\n'


@pytest.fixture(scope="module")
def sandbox_135(kube_binaries: binaries.Binaries) -> Iterator[Sandbox]:
    binaries.ensure("1.35", progress=lambda m: print(f"[e2e] {m}", flush=True))
    layout = Path(tempfile.mkdtemp(prefix="gs-layout-")) / "layout.yaml"
    layout.write_text(LAYOUT)
    running = start_with_enabled_namespace(
        "gs-135-", {NODE: "A100-80GB:1"}, "--k8s-version", "1.35", "--static-layout", str(layout)
    )
    yield running
    running.client.close()
    assert stop_sandbox(running.process) == 0


def test_on_135_the_agent_falls_back_to_the_static_layout_and_pods_run(
    sandbox_135: Sandbox,
) -> None:
    box = sandbox_135
    assert box.ready["kubernetes"].startswith("v1.35.")

    def published() -> list[str]:
        slices = box.obj(box.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}"))[
            "items"
        ]
        if any(s["spec"].get("sharedCounters") for s in slices):
            return []
        return sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])

    devices = box.wait(published, what="the static layout published without counters")
    assert devices == [
        "gpu-0-mig-1g10gb-0",
        "gpu-0-mig-1g10gb-1",
        "gpu-0-mig-2g20gb-2",
        "gpu-0-mig-3g40gb-4",
    ]
    assert "PartitionableDevicesUnavailable" in box.log(f"agent-{NODE}")
    layout = box.instances(NODE)

    box.create_pod(
        "e2e-enabled", pod_manifest("static", node=NODE, limits={"nvidia.com/mig-2g.20gb": "1"})
    )
    pod = box.wait_running("e2e-enabled", "static")
    [claim] = box.claims_of(pod)
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == [
        "gpu-0-mig-2g20gb-2"
    ]
    assert box.instances(NODE) == layout  # the layout's instance was used, none was made
    box.delete_pod("e2e-enabled", "static")
    assert box.instances(NODE) == layout  # and it stays for the next pod
