"""The simulated GPUs of a sandbox node, as a cluster's tools see them.

The labels NVIDIA's GPU Feature Discovery would put on the node, and a static MIG layout made
on the node's GPUs before its agent starts (what mig-parted does on a real node).
"""

from __future__ import annotations

import re
from pathlib import Path

from gpu_slicer.core.errors import GpuSlicerError
from gpu_slicer.core.gpuspec import parse_gpu_spec
from gpu_slicer.sandbox.errors import UsageError
from gpu_slicer.sandbox.nodes import NodeSpec


def check_layout(layout_file: Path, nodes: list[NodeSpec]) -> None:
    """The layout file loads and fits every node's GPUs (a usage error names what does not)."""
    from gpu_slicer.slicer.layout import LayoutError, StaticLayout

    try:
        layout = StaticLayout.load(layout_file)
        for node in nodes:
            layout.check(parse_gpu_spec(node.gpus))
    except LayoutError as exc:
        raise UsageError(f"--static-layout {layout_file}: {exc}") from exc


def make_layout(node: NodeSpec, state_file: Path, layout_file: Path) -> None:
    """Plays mig-parted: the layout's MIG instances made on the node's GPUs before its agent
    starts. The agent advertises them only while it is on the static layout, and, as instances
    it did not create, never destroys them."""
    from gpu_slicer.slicer.layout import LayoutError, StaticLayout
    from gpu_slicer.slicer.simulated import SimulatedBackend
    from gpu_slicer.slicer.simulated_store import PersistedBackend

    try:
        layout = StaticLayout.load(layout_file)
        gpus = PersistedBackend(SimulatedBackend(node.gpus, node_name=node.name), state_file)
        for gpu in gpus.gpus():
            placements = layout.for_gpu(gpu.index) or ()
            if placements:
                gpus.set_mig_mode(gpu.index, True)
            for profile, start in placements:
                gpus.create_compute_instance(
                    gpu.index, gpus.create_gpu_instance(gpu.index, profile, start)
                )
    except (LayoutError, GpuSlicerError) as exc:
        raise UsageError(f"--static-layout {layout_file}: {exc}") from exc


def gpu_feature_labels(spec: str) -> dict[str, str]:
    """The labels NVIDIA's GPU Feature Discovery puts on a node with these GPUs.

    Tools that find GPU nodes by them (``gpu-slicer plan``, node selectors in manifests) see
    the sandbox's nodes as they would see a cluster's. A node of mixed models is labelled with
    its first GPU's product, as GFD labels one product per node.
    """
    models = parse_gpu_spec(spec)
    first = models[0]
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": re.sub(r"\s+", "-", first.product_names[0]),
        "nvidia.com/gpu.count": str(len(models)),
        "nvidia.com/gpu.memory": str(first.memory_bytes // 2**20),
        "nvidia.com/mig.capable": "true",
    }
