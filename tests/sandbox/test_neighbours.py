"""sandbox.neighbours: NVIDIA's DynamicMIG layout and an RDMA NIC driver, as the hollow nodes
publish them beside gpu-slicer's slices."""

from __future__ import annotations

import kubernetes_validate
import pytest

from gpu_slicer.kube.names import is_dns_label
from gpu_slicer.sandbox.neighbours import (
    NIC_DRIVER,
    NVIDIA_DRIVER,
    dynamic_mig_slices,
    nic_claim_spec,
    nic_device_class,
    nic_slices,
    nvidia_device_classes,
)
from gpu_slicer.sim.allocator import Allocator, parse_claims
from gpu_slicer.sim.pools import AllocatedDevices, compile_pools
from gpu_slicer.slicer.inventory import check_limits


def devices(slices: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [d for s in slices for d in s["spec"].get("devices") or ()]


def test_an_a100_node_has_25_devices_per_gpu_in_nvidias_dynamic_mig_layout() -> None:
    slices = dynamic_mig_slices("n", "A100-80GB:8", (1, 37))
    names = [d["name"] for d in devices(slices)]
    assert len(names) == 200 and len(set(names)) == 200
    gpu0 = [n for n in names if n.startswith("gpu-0-")]
    per_profile = {
        p: sum(1 for n in gpu0 if f"-mig-{p}-" in n) for p in ("1g10gb-19", "1g10gb-me-20")
    }
    assert per_profile == {"1g10gb-19": 7, "1g10gb-me-20": 7}
    assert "gpu-0-mig-7g80gb-0-0" in names and "gpu-0" not in names  # Ampere: no whole GPU
    assert len(slices) == 9 and len(slices[0]["spec"]["sharedCounters"]) == 8


def test_hopper_adds_the_whole_gpu() -> None:
    names = [d["name"] for d in devices(dynamic_mig_slices("n", "H100-80GB:1", (1, 37)))]
    assert names[0] == "gpu-0"


def test_every_device_consumes_the_seven_budgets_and_its_memory_slices() -> None:
    slices = dynamic_mig_slices("n", "A100-80GB:1", (1, 37))
    [counter_set] = slices[0]["spec"]["sharedCounters"]
    assert len(counter_set["counters"]) == 15
    for device in devices(slices):
        [consumed] = device["consumesCounters"]
        budgets = [c for c in consumed["counters"] if not c.startswith("memory-slice-")]
        assert len(budgets) == 7 and len(device["capacity"]) == 7
        # the apiserver takes only DNS labels as counter names (the schema does not say so)
        assert all(is_dns_label(c) for c in consumed["counters"]), consumed["counters"]
        assert 12 <= len(device["attributes"]) <= 13


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_the_layout_is_valid_for_each_release(version: str) -> None:
    minor = (1, int(version.split(".")[1]))
    slices = dynamic_mig_slices("n", "A100-80GB:8", minor)
    assert check_limits(slices, minor) == []
    for obj in [*slices, *nvidia_device_classes(), *nic_slices("n"), nic_device_class()]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_counters_refuse_an_eighth_small_slice_and_nic_claims_get_a_vf() -> None:
    slices = [*dynamic_mig_slices("n", "A100-80GB:1", (1, 37)), *nic_slices("n")]
    classes = {c["metadata"]["name"]: c for c in [*nvidia_device_classes(), nic_device_class()]}
    allocator = Allocator(classes)
    pools = compile_pools(slices)
    taken = AllocatedDevices()
    one_small = f'device.attributes["{NVIDIA_DRIVER}"].profile == "1g.10gb"'
    request = {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": one_small}}],
    }
    small = {"devices": {"requests": [{"name": "r", "exactly": request}]}}
    claims = parse_claims([{"metadata": {"name": "c"}, "spec": small}])
    for _ in range(7):
        found = allocator.allocate(claims, "n", pools, taken)
        assert found is not None
        for device in found.devices:
            taken.add(device)
    assert allocator.allocate(claims, "n", pools, taken) is None
    nic = parse_claims([{"metadata": {"name": "v"}, "spec": nic_claim_spec()}])
    found = allocator.allocate(nic, "n", pools, taken)
    assert found is not None and found.devices[0].driver == NIC_DRIVER
