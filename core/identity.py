"""gpu-slicer's names on the cluster, in one place for everything that writes or reads them:
the contract between the webhook and the agent, and the names around it.

The contract: the agent publishes devices under the driver name, with the attribute and
capacity keys below, and the DeviceClasses select them by ``type``; the webhook writes claims
that name those classes and select on those keys (``profile``, ``nvlinkDomain``, ``memory``);
the simulator and ``gpu-slicer status`` read the same. Change a name here and both halves
follow; a cluster running an older half then no longer matches (docs/architecture.md).

The driver name and the contract's domain are two names. Every attribute and capacity the agent
publishes is qualified with :data:`DOMAIN` (``gpu-slicer.io/profile``), and the classes and the
webhook's claims select ``device.attributes["gpu-slicer.io"]``, so what users and ``convert``
wrote does not name the driver. The driver, :data:`DRIVER`, is chosen for where it sorts: the
scheduler's allocator walks every pool of a node in driver-name order, first fit, so every pod of
a driver that sorts after gpu-slicer walks past all of its devices on every node it filters
(``gpu-slicer.io`` sorted before ``gpu.nvidia.com`` and most others; docs/install-kubernetes.md,
"Scheduler scaling"). Releases up to 0.1 published under :data:`LEGACY_DRIVERS`; claims
allocated under those names stay the agent's to prepare and release (docs/upgrading.md).

Around it: the agent keys the claims' allocation results and the kubelet plugin's socket by the
driver name and taints a device whose GPU reported a health event; the webhook converts pods in
namespaces carrying the migration label and records what it did in the converted annotation;
everything gpu-slicer creates carries the managed-by label; and the legacy device-plugin
resources they all recognise.
"""

from __future__ import annotations

from typing import Literal

DOMAIN = "gpu-slicer.io"
"""The contract's domain: device attributes and capacities, classes, labels and annotations."""
DRIVER = f"z.{DOMAIN}"
"""The driver name the agent publishes under: ``z.`` sorts it after every other driver's."""
LEGACY_DRIVERS: tuple[str, ...] = (DOMAIN,)
"""Driver names earlier releases published under (0.1): their claims are still the agent's."""
DRIVERS: tuple[str, ...] = (DRIVER, *LEGACY_DRIVERS)
"""Every name a claim's allocation may carry for gpu-slicer's devices."""
RESOURCE_API = "resource.k8s.io/v1"
"""The resource.k8s.io version the agent reads and writes (claims and slices)."""
UNHEALTHY_TAINT = f"{DOMAIN}/unhealthy"

GPU_CLASS = f"gpu.{DOMAIN}"
"""The DeviceClass of whole GPUs (devices whose ``type`` is ``gpu``)."""
MIG_CLASS = f"mig.{DOMAIN}"
"""The DeviceClass of MIG slices (devices whose ``type`` is ``mig``)."""
GPU_TYPE = "gpu"
MIG_TYPE = "mig"
TYPE_ATTRIBUTE = "type"
"""``gpu`` or ``mig``: what the DeviceClasses select on."""
PROFILE_ATTRIBUTE = "profile"
"""A slice's MIG profile name (``1g.10gb``): what the webhook's chains select on."""
NVLINK_DOMAIN_ATTRIBUTE = "nvlinkDomain"
"""Shared by the GPUs of one NVLink domain: what the webhook's NVLink constraint matches."""
PLACEMENT_START_ATTRIBUTE = "placementStart"
PLACEMENT_SIZE_ATTRIBUTE = "placementSize"
"""A slice's first memory slice and how many it spans (``gpu-slicer status`` reads them)."""
MEMORY_CAPACITY = "memory"
"""A device's memory, a quantity: what memory-sized chains compare against."""


def qualified(name: str) -> str:
    """``name`` in the contract's domain, as a slice spells it (``gpu-slicer.io/profile``); a
    name qualified already (``resource.kubernetes.io/pcieRoot``) stays as it is."""
    return name if "/" in name else f"{DOMAIN}/{name}"


MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-slicer"
"""The value of :data:`MANAGED_BY_LABEL` on everything gpu-slicer creates (DeviceClasses,
ResourceSlices, claim templates, the certificates' Secret); deploy/ spells it in YAML."""

MIGRATION_LABEL = f"{DOMAIN}/migration"
"""On a Namespace: ``enabled``, ``audit`` or ``disabled`` (the default)."""
NamespaceMode = Literal["enabled", "audit", "disabled"]
"""A namespace's mode, from its migration label: convert its pods, only say what would be
converted, or leave them alone (``gpu-slicer convert`` and a static dev setup take the first
two)."""
CONVERTED_ANNOTATION = f"{DOMAIN}/converted"
"""On a pod the webhook converted: what it replaced, container by container."""

LEGACY_GPU = "nvidia.com/gpu"
LEGACY_MIG_PREFIX = "nvidia.com/mig-"
"""The NVIDIA device plugin's resources: whole GPUs and ``nvidia.com/mig-<profile>``."""
