"""DeviceClasses: valid for every version, and their CEL selects exactly the intended devices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_slicer.core.identity import DRIVER, LEGACY_DRIVERS
from gpu_slicer.kube.device_cel import DeviceView, matches
from gpu_slicer.slicer.deviceclasses import (
    EXTENDED_RESOURCE_NAME,
    GPU_CLASS,
    MIG_CLASS,
    device_classes,
)
from gpu_slicer.slicer.inventory import GpuState, build_slices
from tests.support.agent_fixtures import bare_names

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


def test_the_classes_select_the_pools_of_this_release_and_of_0_1_alike(
    make_states: Callable[..., list[GpuState]],
) -> None:
    """During a rollout, nodes not upgraded yet publish 0.1's pool: driver ``gpu-slicer.io``,
    attributes bare in that driver's domain. Both are what the shipped classes select; another
    driver's devices under gpu-slicer's attribute names are not."""
    states = make_states("A100-80GB:1", mode="mig")
    devices = [d for s in build_slices("n", states) for d in s["spec"].get("devices", [])]
    assert all("/" in k for d in devices for k in [*d["attributes"], *d["capacity"]])
    bare = bare_names(devices)
    classes = {
        c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"]
        for c in device_classes()
    }
    everything = {d["name"] for d in devices}
    assert {d["name"] for d in devices if selects(classes[MIG_CLASS], d)} == everything
    old = {d["name"] for d in bare if selects(classes[MIG_CLASS], d, driver=LEGACY_DRIVERS[0])}
    assert old == everything
    for other in ("gpu.nvidia.com", "zz.example.com"):
        assert not any(selects(classes[MIG_CLASS], d, driver=other) for d in devices)
    only_current = device_classes(drivers=(DRIVER,))[1]["spec"]["selectors"][0]["cel"]
    assert not any(selects(only_current["expression"], d, LEGACY_DRIVERS[0]) for d in bare)
