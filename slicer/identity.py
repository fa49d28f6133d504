"""gpu-slicer's names on the cluster, as the agent writes them and every reader looks for them.

The driver name keys the agent's ResourceSlices, the claims' allocation results and the
kubelet plugin's socket; the taint marks a device whose GPU reported a health event. The webhook
(DeviceClass selectors), ``gpu-slicer status`` and the simulator read the same names.
"""

from __future__ import annotations

DRIVER = "gpu-slicer.io"
RESOURCE_API = "resource.k8s.io/v1"
"""The resource.k8s.io version the agent reads and writes (claims and slices)."""
UNHEALTHY_TAINT = "gpu-slicer.io/unhealthy"
