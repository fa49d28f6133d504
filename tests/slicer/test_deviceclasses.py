"""DeviceClasses: valid for every version, and their CEL selects exactly the intended devices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kube.device_cel import DeviceView, matches
from slicer.deviceclasses import (
    EXTENDED_RESOURCE_NAME,
    GPU_CLASS,
    MIG_CLASS,
    device_classes,
)
from slicer.identity import DRIVER
from slicer.inventory import GpuState, build_slices

VERSIONS = ("1.34", "1.35", "1.36", "1.37")


def selects(expression: str, device: dict[str, Any], driver: str = DRIVER) -> bool:
    """``expression`` on a ResourceSlice device entry, in the simulator's model of the
    scheduler's CEL environment (``kube.device_cel``)."""
    return matches(expression, DeviceView(driver, device))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("extended", [False, True])
def test_device_classes_validate_strictly_for_every_version(
    validate: Callable[[dict[str, Any], str], None], version: str, extended: bool
) -> None:
    for obj in device_classes(extended_resources=extended):
        validate(obj, version)


def test_the_extended_resources_variant_serves_nvidia_gpu_from_the_gpu_class_only() -> None:
    plain = {c["metadata"]["name"]: c for c in device_classes()}
    extended = {c["metadata"]["name"]: c for c in device_classes(extended_resources=True)}
    assert set(plain) == set(extended) == {GPU_CLASS, MIG_CLASS}
    assert "extendedResourceName" not in plain[GPU_CLASS]["spec"]
    assert extended[GPU_CLASS]["spec"]["extendedResourceName"] == EXTENDED_RESOURCE_NAME
    assert "extendedResourceName" not in extended[MIG_CLASS]["spec"]


def test_class_selectors_split_the_pool_into_whole_gpus_and_mig_slices(
    make_states: Callable[..., list[GpuState]],
) -> None:
    states = make_states("H100-80GB:1,A100-80GB:1", mode="dynamic")
    devices = [d for s in build_slices("n", states) for d in s["spec"].get("devices", [])]
    classes = {
        c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"]
        for c in device_classes()
    }
    gpus = {d["name"] for d in devices if selects(classes[GPU_CLASS], d)}
    migs = {d["name"] for d in devices if selects(classes[MIG_CLASS], d)}
    assert gpus == {"gpu-0"}  # the A100 is in mig mode: no whole device
    assert migs == {d["name"] for d in devices} - {"gpu-0"}
    assert len(migs) == 25 + 25


def test_class_selectors_ignore_another_drivers_devices_of_the_same_type() -> None:
    foreign = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    for obj in device_classes():
        expression = obj["spec"]["selectors"][0]["cel"]["expression"]
        assert not selects(expression, foreign, driver="gpu.nvidia.com")


def test_classes_for_two_driver_names_select_the_same_devices_under_either(
    make_states: Callable[..., list[GpuState]],
) -> None:
    # A pool published under a second driver name (the benchmark's pool sorting last) with its
    # attributes qualified by gpu-slicer's domain, as sandbox.hollow.as_driver writes it.
    states = make_states("A100-80GB:1", mode="mig")
    devices = [d for s in build_slices("n", states) for d in s["spec"].get("devices", [])]
    qualified = [
        {
            **d,
            "attributes": {f"{DRIVER}/{k}": v for k, v in d["attributes"].items() if "/" not in k},
        }
        for d in devices
    ]
    both = {
        c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"]
        for c in device_classes(drivers=(DRIVER, "z.gpu-slicer.io"))
    }
    ours = {d["name"] for d in devices if selects(both[MIG_CLASS], d)}
    renamed = {
        d["name"] for d in qualified if selects(both[MIG_CLASS], d, driver="z.gpu-slicer.io")
    }
    assert ours == renamed == {d["name"] for d in devices}
    assert not any(selects(both[MIG_CLASS], d, driver="gpu.nvidia.com") for d in qualified)
    only_ours = device_classes()[1]["spec"]["selectors"][0]["cel"]["expression"]
    assert not any(selects(only_ours, d, driver="z.gpu-slicer.io") for d in qualified)
