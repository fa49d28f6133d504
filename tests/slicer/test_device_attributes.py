"""slicer.device_attributes: ``--attributes minimal`` drops what only users' own selectors could
read, and nothing gpu-slicer's classes, claims or status depend on."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_slicer.core.devices import Mode
from gpu_slicer.core.identity import qualified
from gpu_slicer.sim.agreement import mixed_pods
from gpu_slicer.sim.allocator import allocate_on_node
from gpu_slicer.slicer.device_attributes import (
    MINIMAL_ATTRIBUTES,
    MINIMAL_CAPACITY,
    DeviceAttributes,
    device_body,
)
from gpu_slicer.slicer.deviceclasses import device_classes
from gpu_slicer.slicer.preview import preview_pool
from gpu_slicer.status.view import build_status

Obj = dict[str, Any]
SERVER = (1, 37)
NODES = {"a100": "A100-80GB", "h100": "H100-80GB", "a30": "A30-24GB", "h200": "H200-141GB"}


def _devices(slices: list[Obj]) -> list[Obj]:
    return [d for s in slices for d in s["spec"].get("devices", ())]


def _pool(
    node: str, gpus: str, attributes: DeviceAttributes, mode: Mode | None = None
) -> list[Obj]:
    plan = preview_pool(node, gpus, server_version=SERVER, mode=mode, attributes=attributes)
    return [dict(s) for s in plan.slices]


@pytest.mark.parametrize("mode", [None, "full"], ids=["default-mode", "whole-gpus"])
@pytest.mark.parametrize("model", sorted(set(NODES.values())))
def test_minimal_keeps_what_gpu_slicer_reads_and_the_pool_otherwise_unchanged(
    model: str, mode: Mode | None
) -> None:
    full = _pool("n1", f"{model}:2", "full", mode)
    minimal = _pool("n1", f"{model}:2", "minimal", mode)
    for f, m in zip(_devices(full), _devices(minimal), strict=True):
        assert m["attributes"] == {
            k: v for k, v in f["attributes"].items() if k in MINIMAL_ATTRIBUTES
        }
        assert m["capacity"] == {k: v for k, v in f["capacity"].items() if k in MINIMAL_CAPACITY}
        assert {k: v for k, v in m.items() if k not in ("attributes", "capacity")} == {
            k: v for k, v in f.items() if k not in ("attributes", "capacity")
        }
        kind = m["attributes"]["gpu-slicer.io/type"]["string"]
        read = {"type", "productName", "index"}  # nvlinkDomain: only where NVLink is
        read |= (
            {"profile", "parentUUID", "placementStart", "placementSize"}
            if kind == "mig"
            else {"uuid"}
        )
        assert {qualified(r) for r in read} <= set(m["attributes"]), m["name"]
        assert "gpu-slicer.io/memory" in m["capacity"]
        assert len(m["attributes"]) < len(f["attributes"])
    strip = [{**s, "spec": {**s["spec"], "devices": []}} for s in full]
    assert strip == [{**s, "spec": {**s["spec"], "devices": []}} for s in minimal]


def test_full_is_the_device_as_built() -> None:
    brand = {"gpu-slicer.io/brand": {"string": "Nvidia"}}
    body = {"name": "gpu-0", "attributes": brand, "capacity": {}}
    assert device_body(body, "full") is body
    assert device_body(body, "minimal") == {"name": "gpu-0", "attributes": {}, "capacity": {}}
    assert body["attributes"] == brand  # the input is not changed


def test_gpu_slicers_claims_get_the_same_devices_and_status_reads_the_same() -> None:
    """Every claim shape the webhook writes (profiles, chains, memory sizes, whole GPUs, counts
    above one, NVLink constraints), replayed one after the other on nodes of four models: the
    scheduler's allocator (the simulator's model of it, CEL included) picks the same devices
    from the minimal pool as from the full one, and ``gpu-slicer status`` shows the same."""
    classes = {c["metadata"]["name"]: c for c in device_classes()}
    both: tuple[DeviceAttributes, ...] = ("full", "minimal")
    pools = {a: {node: _pool(node, f"{model}:4", a) for node, model in NODES.items()} for a in both}
    held: dict[DeviceAttributes, list[tuple[float, Obj]]] = {a: [] for a in both}
    chosen = 0
    for pod in sorted(mixed_pods(NODES, count=80), key=lambda p: p.arrival):
        picks = {}
        for attributes, running in held.items():
            running[:] = [(end, c) for end, c in running if end > pod.arrival]  # departures
            found = allocate_on_node(
                [{"metadata": {"name": pod.name, "namespace": "ml"}, "spec": pod.claim_spec}],
                node_name=pod.node,
                slices=pools[attributes][pod.node],
                device_classes=classes,
                allocated_claims=[c for _, c in running],
            )
            picks[attributes] = None if found is None else found.allocations[0]
            if found is not None:
                claim = {
                    "metadata": {"name": pod.name, "namespace": "ml", "uid": pod.name},
                    "spec": pod.claim_spec,
                    "status": {"allocation": found.allocations[0]},
                }
                running.append((pod.arrival + pod.duration, claim))
        assert picks["full"] == picks["minimal"], pod.name
        chosen += picks["full"] is not None
    assert chosen >= 50  # most pods found devices: the comparison covers real choices

    def status(attributes: DeviceAttributes) -> Any:
        slices = [s for node in NODES for s in pools[attributes][node]]
        return build_status(slices, [c for _, c in held[attributes]], [], [])

    assert status("minimal") == status("full")
