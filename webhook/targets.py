"""The DRA drivers the webhook can target, and the names each one publishes.

``gpu-slicer`` is this project's driver: its names are the contract ``core.identity`` owns
(docs/architecture.md). ``nvidia`` is NVIDIA's DRA driver for GPUs: its classes
``gpu.nvidia.com`` / ``mig.nvidia.com`` and attribute domain ``gpu.nvidia.com``; it publishes
the same ``profile`` attribute and ``memory`` capacity keys.
NVIDIA's driver publishes no attribute that tells which GPUs share an NVLink domain on a node, so
with that target the NVLink-first alternative cannot be expressed and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_slicer.core.identity import DOMAIN, GPU_CLASS, MIG_CLASS, NVLINK_DOMAIN_ATTRIBUTE


@dataclass(frozen=True)
class TargetDriver:
    name: str
    gpu_class: str
    mig_class: str
    domain: str
    """Attribute and capacity domain used in CEL selectors."""
    nvlink_attribute: str | None
    """Fully qualified attribute shared by NVLink-connected GPUs; None when not published."""


GPU_SLICER = TargetDriver(
    name="gpu-slicer",
    gpu_class=GPU_CLASS,
    mig_class=MIG_CLASS,
    domain=DOMAIN,
    nvlink_attribute=f"{DOMAIN}/{NVLINK_DOMAIN_ATTRIBUTE}",
)

NVIDIA = TargetDriver(
    name="nvidia",
    gpu_class="gpu.nvidia.com",
    mig_class="mig.nvidia.com",
    domain="gpu.nvidia.com",
    nvlink_attribute=None,
)

_BY_NAME = {GPU_SLICER.name: GPU_SLICER, NVIDIA.name: NVIDIA}


def target_driver(name: str) -> TargetDriver:
    """The driver a policy's ``target`` names (the policy validated it)."""
    return _BY_NAME[name]
