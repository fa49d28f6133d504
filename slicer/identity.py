"""gpu-slicer's names on the cluster, in one place for everything that writes or reads them.

The agent keys its ResourceSlices, the claims' allocation results and the kubelet plugin's
socket by the driver name, and taints a device whose GPU reported a health event. The webhook
converts pods in namespaces carrying the migration label and records what it did in the
converted annotation; ``gpu-slicer status`` and ``gpu-slicer plan`` read the same names, and the
legacy device-plugin resources they all recognise.
"""

from __future__ import annotations

DRIVER = "gpu-slicer.io"
RESOURCE_API = "resource.k8s.io/v1"
"""The resource.k8s.io version the agent reads and writes (claims and slices)."""
UNHEALTHY_TAINT = "gpu-slicer.io/unhealthy"

MIGRATION_LABEL = "gpu-slicer.io/migration"
"""On a Namespace: ``enabled``, ``audit`` or ``disabled`` (the default)."""
CONVERTED_ANNOTATION = "gpu-slicer.io/converted"
"""On a pod the webhook converted: what it replaced, container by container."""

LEGACY_GPU = "nvidia.com/gpu"
LEGACY_MIG_PREFIX = "nvidia.com/mig-"
"""The NVIDIA device plugin's resources: whole GPUs and ``nvidia.com/mig-<profile>``."""
