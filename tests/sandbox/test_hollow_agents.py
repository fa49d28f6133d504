"""The scheduler benchmark's hollow agents publish as the agent's reconciler does: one publish
of a node at a time, always what is asked now. (Two at once made a node's publisher find its
own pool rewritten under it; the figures of the new-shape wait were the benchmark's own.)"""

from __future__ import annotations

import time
from typing import Any

from gpu_slicer.core.identity import RESOURCE_API
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.sandbox.hollow_agents import HollowAgents
from gpu_slicer.sim.agreement import claim_spec_for
from gpu_slicer.webhook.claims import template_object

NODES = [f"node-{i}" for i in range(6)]
ASKED = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "1g.20gb", "7g.80gb")


class _SlowWrites(InMemoryKubeApi):
    """Writes take a moment, as over the network: long enough for two publishes of one node to
    overlap if the agents let them."""

    def create(self, obj: Any, **kwargs: Any) -> Any:
        time.sleep(0.01)
        return super().create(obj, **kwargs)

    def update(self, obj: Any, **kwargs: Any) -> Any:
        time.sleep(0.01)
        return super().update(obj, **kwargs)


def _advertised(api: InMemoryKubeApi, node: str) -> set[str]:
    return {
        device["attributes"]["gpu-slicer.io/profile"]["string"]
        for s in api.objects(RESOURCE_API, "ResourceSlice")
        if s["spec"].get("nodeName") == node
        for device in s["spec"].get("devices") or []
        if "gpu-slicer.io/profile" in device.get("attributes", {})
    }


def test_shapes_asked_in_quick_succession_leave_every_node_advertising_all_of_them() -> None:
    api = _SlowWrites(server_version=(1, 37))
    for node in NODES:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    agents = HollowAgents(api, NODES, "A100-80GB:1", (1, 37), workers=8)
    agents.start()
    try:
        for profile in ASKED:  # each change arrives while the last one is being published
            spec = claim_spec_for([{f"nvidia.com/mig-{profile}": 1}])
            api.create(template_object({"spec": spec}, "shapes"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_advertised(api, n) != set(ASKED) for n in NODES):
            time.sleep(0.05)
        assert {n: _advertised(api, n) for n in NODES} == {n: set(ASKED) for n in NODES}
        assert not any(p.static for p in agents.publishers.values())  # none fell back
        assert agents.wait_published(timeout_s=30) is not None
    finally:
        agents.stop()
