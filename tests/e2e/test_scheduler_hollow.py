"""The scheduler benchmark's cluster (sandbox.hollow) on the real control plane, at a size that
checks behaviour, not speed: hollow nodes with gpu-slicer's slices and another driver's, gated
pods released together, each claim allocated from the driver and profile it asks for, in the
partitionable and the static layout; the run's figures are measured, and clearing a run frees
every device. bench/bench_scheduler.py prints the figures at cluster size."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_slicer.core.identity import DRIVER, RESOURCE_API
from gpu_slicer.sandbox import binaries
from gpu_slicer.sandbox.hollow import (
    PLAIN_DRIVER,
    HollowCluster,
    gpu_slicer_slices,
    plain_claim_spec,
    plain_device_class,
    plain_slices,
)
from gpu_slicer.sandbox.neighbours import NVIDIA_DRIVER, dynamic_mig_slices, nvidia_device_classes
from gpu_slicer.sim.agreement import claim_spec_for
from gpu_slicer.slicer.deviceclasses import device_classes
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.webhook.policy import Policy

NODES = [f"hollow-{i}" for i in range(3)]


@pytest.fixture(scope="module")
def cluster(
    kube_binaries: binaries.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HollowCluster]:
    folder = Path(tmp_path_factory.mktemp("hollow"))
    hollow = HollowCluster(folder, kube_bin=kube_binaries.kube_dir, progress=lambda _m: None)
    try:
        hollow.start()
        hollow.create_all([plain_device_class(), *device_classes(), *nvidia_device_classes()])
        hollow.add_nodes(NODES)
        hollow.create_all([s for n in NODES for s in plain_slices(n, 150)])
        yield hollow
    finally:
        hollow.stop()


def _allocations(cluster: HollowCluster, namespace: str) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of every allocated claim in ``namespace``."""
    assert cluster.api is not None
    found: list[tuple[str, str, str]] = []
    for claim in cluster.api.list(RESOURCE_API, "ResourceClaim", namespace).items:
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            found.extend(
                (r["driver"], r["pool"], r["device"]) for r in allocation["devices"]["results"]
            )
    return found


def test_gated_pods_are_scheduled_once_released_on_the_devices_they_ask_for(
    cluster: HollowCluster,
) -> None:
    plain = cluster.run("plain", plain_claim_spec(), pods=6, timeout_s=60)
    assert (plain.released, plain.bound) == (6, 6)
    assert plain.seconds > 0 and math.isfinite(plain.cpu_ms_per_pod)
    assert {d for d, _p, _n in _allocations(cluster, "bench-plain")} == {PLAIN_DRIVER}
    cluster.clear("bench-plain")

    server = cluster.api_version
    cluster.create_all([s for n in NODES for s in gpu_slicer_slices(n, "A100-80GB:2", server)])
    single = cluster.run(
        "single", claim_spec_for([{"nvidia.com/mig-1g.10gb": 1}]), pods=6, timeout_s=60
    )
    assert single.bound == 6
    devices = _allocations(cluster, "bench-single")
    assert {d for d, _p, _n in devices} == {DRIVER}
    assert all("-mig-1g10gb-" in name for _d, _p, name in devices)
    assert len(set(devices)) == 6
    cluster.clear("bench-single")
    assert cluster.api is not None
    assert not cluster.api.list(RESOURCE_API, "ResourceClaim", "bench-single").items


def test_the_static_layout_serves_only_the_instances_it_names(cluster: HollowCluster) -> None:
    cluster.delete_slices(DRIVER)
    layout = StaticLayout.from_mapping({"default": ["3g.40gb@0", "3g.40gb@4"]})
    cluster.create_all(
        [
            s
            for n in NODES
            for s in gpu_slicer_slices(n, "A100-80GB:1", cluster.api_version, static_layout=layout)
        ]
    )
    memory = claim_spec_for([{}], annotations={"gpu-slicer.io/gpu-memory": "20Gi"})
    result = cluster.run("memory", memory, pods=len(NODES) * 2 + 1, timeout_s=20)
    # Two 3g.40gb instances per node and nothing else: the last pod never fits.
    assert result.bound == len(NODES) * 2
    names = {name for _d, _p, name in _allocations(cluster, "bench-memory")}
    assert names == {"gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"}
    cluster.clear("bench-memory")


def test_minimal_attributes_leave_the_real_schedulers_choices_unchanged(
    cluster: HollowCluster,
) -> None:
    """The agent's ``--attributes minimal`` on the real scheduler: for each claim shape the
    webhook writes, the same pods take the same devices as from the full pool (one node, so
    that only the device choice can differ)."""
    node = NODES[0]
    shapes = {
        "single": (claim_spec_for([{"nvidia.com/mig-1g.10gb": 1}]), 3),
        "memory": (claim_spec_for([{}], annotations={"gpu-slicer.io/gpu-memory": "20Gi"}), 2),
        "nvlink": (claim_spec_for([{"nvidia.com/gpu": 2}]), 1),
    }
    chosen: dict[str, dict[str, set[tuple[str, str, str]]]] = {}
    for attributes in ("full", "minimal"):
        cluster.delete_slices(DRIVER)
        slices = gpu_slicer_slices(node, "A100-80GB:2", cluster.api_version, attributes=attributes)
        cluster.create_all(slices)
        for shape, (spec, pods) in shapes.items():
            label = f"{shape}-{attributes}"
            result = cluster.run(label, spec, pods=pods, timeout_s=60)
            assert result.bound == pods, label
            chosen.setdefault(shape, {})[attributes] = set(_allocations(cluster, f"bench-{label}"))
            cluster.clear(f"bench-{label}")
    for shape, by_attributes in chosen.items():
        assert by_attributes["full"] and by_attributes["full"] == by_attributes["minimal"], shape


def test_the_webhooks_nvidia_target_binds_to_the_devices_it_asks_for_in_nvidias_layout(
    cluster: HollowCluster,
) -> None:
    """Claims the webhook writes in its NVIDIA target mode (``mig.nvidia.com`` and
    ``gpu.nvidia.com``) on NVIDIA's DynamicMIG layout, through the real scheduler: each binds
    to a device of the profile, memory or kind it asks for."""
    cluster.delete_slices(DRIVER)
    slices = [s for n in NODES for s in dynamic_mig_slices(n, "H100-80GB:2", cluster.api_version)]
    cluster.create_all(slices)
    devices = {
        (s["spec"]["pool"]["name"], d["name"]): d
        for s in slices
        for d in s["spec"].get("devices", ())
    }
    nvidia = dataclasses.replace(Policy.default(), target="nvidia")
    shapes = {
        "nv-single": ([{"nvidia.com/mig-1g.10gb": 1}], {}),
        "nv-memory": ([{}], {"gpu-slicer.io/gpu-memory": "20Gi"}),
        "nv-whole": ([{"nvidia.com/gpu": 1}], {}),
    }
    try:
        for label, (resources, annotations) in shapes.items():
            spec = claim_spec_for(resources, annotations=annotations, policy=nvidia)
            result = cluster.run(label, spec, pods=3, timeout_s=60)
            assert result.bound == 3, label
            allocated = _allocations(cluster, f"bench-{label}")
            assert len(set(allocated)) == 3 and {d for d, _p, _n in allocated} == {NVIDIA_DRIVER}
            for _driver, pool, name in allocated:
                attributes = devices[(pool, name)]["attributes"]
                memory = devices[(pool, name)]["capacity"]["memory"]["value"]
                if label == "nv-single":
                    assert attributes["profile"] == {"string": "1g.10gb"}, name
                elif label == "nv-memory":
                    assert attributes["type"] == {"string": "mig"}, name
                    assert _gib(memory) >= 20, (name, memory)
                    # the chain's first tier (the smallest profiles that fit) on an idle node
                    assert _subrequests(cluster, f"bench-{label}") == {"c0/mig-fit"}
                else:
                    assert attributes["type"] == {"string": "gpu"}, name
            cluster.clear(f"bench-{label}")
    finally:
        cluster.delete_slices(NVIDIA_DRIVER)


def _subrequests(cluster: HollowCluster, namespace: str) -> set[str]:
    assert cluster.api is not None
    return {
        r["request"]
        for claim in cluster.api.list(RESOURCE_API, "ResourceClaim", namespace).items
        for r in claim["status"]["allocation"]["devices"]["results"]
    }


def _gib(quantity: str) -> float:
    units = {"Gi": 1.0, "Mi": 1 / 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return int(quantity) / 2**30
