"""gpu-slicer's names on the cluster, in one place for everything that writes or reads them:
the contract between the webhook and the agent, and the names around it.

The contract: the agent publishes devices under the driver name, with the attribute and
capacity keys below, and the DeviceClasses select them by ``type``; the webhook writes claims
that name those classes and select on those keys (``profile``, ``nvlinkDomain``, ``memory``);
the simulator and ``gpu-slicer status`` read the same. Change a name here and both halves
follow; a cluster running an older half then no longer matches (docs/architecture.md).

Around it: the agent keys the claims' allocation results and the kubelet plugin's socket by the
driver name and taints a device whose GPU reported a health event; the webhook converts pods in
namespaces carrying the migration label and records what it did in the converted annotation;
everything gpu-slicer creates carries the managed-by label; and the legacy device-plugin
resources they all recognise.
"""

from __future__ import annotations

from typing import Literal

DRIVER = "gpu-slicer.io"
RESOURCE_API = "resource.k8s.io/v1"
"""The resource.k8s.io version the agent reads and writes (claims and slices)."""
UNHEALTHY_TAINT = "gpu-slicer.io/unhealthy"

GPU_CLASS = f"gpu.{DRIVER}"
"""The DeviceClass of whole GPUs (devices whose ``type`` is ``gpu``)."""
MIG_CLASS = f"mig.{DRIVER}"
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

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-slicer"
"""The value of :data:`MANAGED_BY_LABEL` on everything gpu-slicer creates (DeviceClasses,
ResourceSlices, claim templates, the certificates' Secret); deploy/ spells it in YAML."""

MIGRATION_LABEL = "gpu-slicer.io/migration"
"""On a Namespace: ``enabled``, ``audit`` or ``disabled`` (the default)."""
NamespaceMode = Literal["enabled", "audit", "disabled"]
"""A namespace's mode, from its migration label: convert its pods, only say what would be
converted, or leave them alone (``gpu-slicer convert`` and a static dev setup take the first
two)."""
CONVERTED_ANNOTATION = "gpu-slicer.io/converted"
"""On a pod the webhook converted: what it replaced, container by container."""

LEGACY_GPU = "nvidia.com/gpu"
LEGACY_MIG_PREFIX = "nvidia.com/mig-"
"""The NVIDIA device plugin's resources: whole GPUs and ``nvidia.com/mig-<profile>``."""
