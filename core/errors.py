"""The root of gpu-slicer's errors, and the core's own.

Every error gpu-slicer raises on purpose derives from :class:`GpuSlicerError` (each package
has its own base below it: ``SlicerError``, ``WebhookError``, ``KubeError``, ``CertError``,
``SimError``), so a caller that only needs "gpu-slicer refused" catches one class. The core's
errors are about the shared model, and each says what would be valid instead::

    GpuSlicerError
    ├── CatalogError       unknown model or profile, illegal placement
    ├── DeviceNameError    a device name that is not one of ours
    └── GpuSpecError       a bad ``--gpus``/``--simulate-gpus`` spec
"""

from __future__ import annotations


class GpuSlicerError(Exception):
    """Base of every error gpu-slicer raises on purpose."""


class CatalogError(GpuSlicerError, ValueError):
    """The catalog has no such model, profile or placement."""


class DeviceNameError(GpuSlicerError, ValueError):
    """A device name does not follow ``gpu-<i>`` or ``gpu-<i>-mig-<profile>-<start>``."""


class GpuSpecError(GpuSlicerError, ValueError):
    """A simulated-GPU spec such as ``H100-80GB:2,A100-80GB:1`` is malformed."""
