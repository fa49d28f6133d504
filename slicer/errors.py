"""Errors raised by the node agent.

Every error a user can see says what went wrong and what would be valid instead.

    SlicerError                 (a ``core.errors.GpuSlicerError``; the MIG model's own errors
    │                           are the core's: CatalogError, DeviceNameError, GpuSpecError)
    ├── BackendError            what NVML (or the simulator) refused; mirrors NVML's return codes
    │   ├── InsufficientResources   the placement overlaps, or a budget is exhausted
    │   ├── GpuInUse                processes or compute instances still hold it
    │   ├── GpuNotFound             already gone
    │   ├── NotSupported
    │   ├── NoPermission
    │   ├── ResetRequired           a MIG mode change waits for a GPU reset
    │   └── GpuLost                 the GPU fell off the bus
    ├── CheckpointError         unreadable or corrupt checkpoint
    │   └── CheckpointTooNew        written by a newer agent in a format this one cannot read
    ├── ClaimReferenceError     a kubelet request names a claim by a uid, namespace or name
    │                           that cannot be one (refused before it reaches a path)
    ├── PublishError            ResourceSlices could not be written
    └── AgentSettingsError      ``agent run``'s flags or environment cannot be used (also a
                                ``kube.settings.SettingsError``: ``problems`` name each flag)
"""

from __future__ import annotations

from gpu_slicer.core.errors import GpuSlicerError
from gpu_slicer.kube.settings import SettingsError


class SlicerError(GpuSlicerError):
    """Base of every error the agent raises on purpose."""


class BackendError(SlicerError):
    """A GPU backend refused an operation. ``gpu`` is the index concerned, when known."""

    def __init__(self, message: str, *, gpu: int | None = None) -> None:
        super().__init__(message)
        self.gpu = gpu


class InsufficientResources(BackendError):
    """The instance would overlap another, or exceed a count or compute budget."""


class GpuInUse(BackendError):
    """Processes (or compute instances) still use the instance or GPU; retry later."""


class GpuNotFound(BackendError):
    """The instance or GPU does not exist (any more)."""


class NotSupported(BackendError):
    """The GPU or driver cannot do this (no MIG, unknown profile on this device)."""


class NoPermission(BackendError):
    """The agent lacks the privileges (capabilities, device nodes) for the call."""


class ResetRequired(BackendError):
    """A MIG mode change is pending until the GPU is reset (Ampere)."""


class GpuLost(BackendError):
    """The GPU stopped answering; it needs a reset or a reboot."""


class CheckpointError(SlicerError):
    """The checkpoint file is unreadable, corrupt or from an unknown version."""


class CheckpointTooNew(CheckpointError):
    """The checkpoint is in a newer format than this agent reads. Never moved aside: it still
    says which MIG instances are the agent's; the message names the versions and the way out."""

    def __init__(self, message: str, *, version: int, writer: str | None) -> None:
        super().__init__(message)
        self.version = version
        self.writer = writer


class ClaimReferenceError(SlicerError, ValueError):
    """A kubelet request's claim uid, namespace or name cannot be a claim's; the message names
    the field and the rule."""


class PublishError(SlicerError):
    """ResourceSlices could not be written or read back."""


class AgentSettingsError(SlicerError, SettingsError):
    """``agent run``'s settings cannot be used; ``problems`` name the flag of each."""
