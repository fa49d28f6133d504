"""GPU sharing models other than MIG: pods that use them are left as they are.

HAMi's device plugin reads ``nvidia.com/gpumem`` (MiB of GPU memory), ``nvidia.com/gpumem-
percentage`` and ``nvidia.com/gpucores`` (a percentage of the GPU's compute) beside
``nvidia.com/gpu``; NVIDIA's device plugin with time-slicing and ``renameByDefault`` offers
``nvidia.com/gpu.shared`` (and ``nvidia.com/mig-<profile>.shared``). Converting such a pod's
``nvidia.com/gpu`` into whole GPUs while the sharing resources stay would give it a whole GPU
and still ask the scheduler for resources only the old device plugin offers, so the pod would
never start. The translation leaves the pod alone and says which resources decided it.
"""

from __future__ import annotations

from typing import Any

from gpu_slicer.core.identity import LEGACY_GPU, LEGACY_MIG_PREFIX

HAMI_RESOURCES = ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
SHARED_SUFFIX = ".shared"
"""What time-slicing's ``renameByDefault`` appends to a resource name."""
_VENDOR = "nvidia.com/"
_CONTAINER_LISTS = ("initContainers", "containers")


def is_sharing_resource(name: str) -> bool:
    """A resource of HAMi or of time-slicing (renamed), never a plain legacy name."""
    if name in HAMI_RESOURCES:
        return True
    return name.endswith(SHARED_SUFFIX) and (
        name.startswith(LEGACY_GPU) or name.startswith(LEGACY_MIG_PREFIX)
    )


def other_sharing(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """``(container, resource)`` for every sharing resource a pod spec's containers ask for."""
    found: list[tuple[str, str]] = []
    for key in _CONTAINER_LISTS:
        items = spec.get(key)
        if not isinstance(items, list):
            continue
        for body in items:
            if not isinstance(body, dict) or not isinstance(body.get("resources"), dict):
                continue
            resources = body["resources"]
            names: dict[str, None] = {}
            for section in ("limits", "requests"):
                values = resources.get(section)
                if isinstance(values, dict):
                    for name in values:
                        if isinstance(name, str) and name.startswith(_VENDOR):
                            names[name] = None
            found += [(str(body.get("name", "")), n) for n in names if is_sharing_resource(n)]
    return found


def left_alone_warning(found: list[tuple[str, str]]) -> str:
    """One warning naming every sharing resource and its container."""
    listed = ", ".join(f"{resource} in {container}" for container, resource in found)
    return f"not converted, another GPU sharing model: {listed}"
