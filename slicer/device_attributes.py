"""Which attributes and capacities each advertised device carries (the agent's ``--attributes``).

``full`` (the default) publishes everything the agent knows of a device: what gpu-slicer's own
claims, classes and tools read, plus the GPU's descriptive facts that users' own selectors may
name (brand, architecture, compute capability, driver and CUDA versions, PCIe placement) and the
engine capacities NVIDIA's DRA driver publishes.

``minimal`` publishes only what gpu-slicer reads: the device classes (``type``), the webhook's
selectors (``profile``, the ``memory`` capacity), its NVLink constraint (``nvlinkDomain``) and
``gpu-slicer status`` (``productName``, ``index``, the placement, the UUIDs). The reason is the
scheduler: for every DRA pod of every driver and every node it filters, the upstream allocator
builds each selector's CEL input from all of a device's attributes and capacities anew (and
parses every version attribute), so each one costs all DRA pods, not only gpu-slicer's.
Measured with ``bench/bench_scheduler.py --minimal-attributes`` (docs/install-kubernetes.md).
The cost of ``minimal``: claims that select on a dropped attribute (for example
``architecture``, or ``resource.kubernetes.io/pcieRoot`` to align a GPU with a NIC) find no
device.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from gpu_slicer.core.identity import (
    MEMORY_CAPACITY,
    NVLINK_DOMAIN_ATTRIBUTE,
    PLACEMENT_SIZE_ATTRIBUTE,
    PLACEMENT_START_ATTRIBUTE,
    PROFILE_ATTRIBUTE,
    TYPE_ATTRIBUTE,
    qualified,
)

DeviceAttributes = Literal["full", "minimal"]
ATTRIBUTES_CHOICES: tuple[DeviceAttributes, ...] = get_args(DeviceAttributes)

MINIMAL_ATTRIBUTES = frozenset(
    map(
        qualified,
        (
            TYPE_ATTRIBUTE,
            PROFILE_ATTRIBUTE,
            NVLINK_DOMAIN_ATTRIBUTE,
            PLACEMENT_START_ATTRIBUTE,
            PLACEMENT_SIZE_ATTRIBUTE,
            "productName",
            "index",
            "uuid",
            "parentUUID",
        ),
    )
)
"""The attributes ``minimal`` keeps: those gpu-slicer's classes, claims and status read."""
MINIMAL_CAPACITY = frozenset({qualified(MEMORY_CAPACITY)})
"""The capacities ``minimal`` keeps: the one the webhook's memory selectors compare."""

Obj = dict[str, Any]


def device_body(body: Obj, attributes: DeviceAttributes) -> Obj:
    """``body`` (one device of a ResourceSlice) as ``attributes`` publishes it; counters, taints
    and the name are never touched, so the scheduler's decisions on gpu-slicer's own claims
    stay the same."""
    if attributes == "full":
        return body
    trimmed = dict(body)
    trimmed["attributes"] = {
        k: v for k, v in (body.get("attributes") or {}).items() if k in MINIMAL_ATTRIBUTES
    }
    trimmed["capacity"] = {
        k: v for k, v in (body.get("capacity") or {}).items() if k in MINIMAL_CAPACITY
    }
    return trimmed
