"""The DeviceClasses through which workloads ask for gpu-slicer devices (their names and the
attribute they select on are the contract's, ``core.identity``).

* ``gpu.gpu-slicer.io``: whole GPUs (``type == "gpu"``);
* ``mig.gpu-slicer.io``: MIG slices (``type == "mig"``); a claim narrows it with selectors on
  ``profile`` or on ``capacity.memory``.

The extended-resources variant adds ``spec.extendedResourceName: nvidia.com/gpu`` to the GPU
class (KEP-5004), so that the scheduler itself serves unchanged ``nvidia.com/gpu: N`` requests
from DRA. The field is in the ``resource.k8s.io/v1`` schema of 1.34-1.37, but behind the
DRAExtendedResource gate (alpha in 1.34 and 1.35, beta and on in 1.36, GA in 1.37): an apiserver
with the gate off drops it silently. A node must not also run a device plugin that serves
``nvidia.com/gpu``.
"""

from __future__ import annotations

from typing import Any

from gpu_slicer.core.identity import (
    DOMAIN,
    DRIVERS,
    GPU_CLASS,
    GPU_TYPE,
    LEGACY_GPU,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MIG_CLASS,
    MIG_TYPE,
    RESOURCE_API,
    TYPE_ATTRIBUTE,
)

Obj = dict[str, Any]

EXTENDED_RESOURCE_NAME = LEGACY_GPU


def type_selector(device_type: str, drivers: tuple[str, ...] = DRIVERS) -> str:
    """CEL that matches our devices of one ``type`` attribute, published under any of
    ``drivers``: the current name and the earlier one, whose pools the agents not yet
    upgraded still publish during a rollout (docs/upgrading.md)."""
    names = " || ".join(f'device.driver == "{name}"' for name in drivers)
    driver = names if len(drivers) == 1 else f"({names})"
    return f'{driver} && device.attributes["{DOMAIN}"].{TYPE_ATTRIBUTE} == "{device_type}"'


MIG_SELECTOR = type_selector(MIG_TYPE)


def device_class(name: str, expression: str, *, extended_resource_name: str | None = None) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": expression}}]}
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": spec,
    }


def device_classes(
    *, extended_resources: bool = False, drivers: tuple[str, ...] = DRIVERS
) -> list[Obj]:
    """Both classes; with ``extended_resources`` the GPU class serves ``nvidia.com/gpu``;
    ``drivers``: the driver names whose devices they select."""
    return [
        device_class(
            GPU_CLASS,
            type_selector(GPU_TYPE, drivers),
            extended_resource_name=EXTENDED_RESOURCE_NAME if extended_resources else None,
        ),
        device_class(MIG_CLASS, type_selector(MIG_TYPE, drivers)),
    ]
