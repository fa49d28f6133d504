"""Errors of the Kubernetes API seam, the same for the real client and the in-memory twin.

    KubeError
    ├── ApiError(status, reason)       the apiserver answered with a failure Status
    │   ├── NotFound          404: the object (or its namespace) does not exist
    │   ├── AlreadyExists     409 on create: someone made it first (usually fine)
    │   ├── Conflict          409 on update: resourceVersion is stale; re-read and retry
    │   ├── Invalid           422: the object was rejected by validation
    │   └── Forbidden         403: RBAC does not allow the call
    └── Unavailable           no answer at all (connection refused, timeout, 5xx)

Callers branch on these types only; the real implementation maps the ``kubernetes`` client's
``ApiException`` and urllib3 errors onto them at the boundary.
"""

from __future__ import annotations

from gpu_slicer.core.errors import GpuSlicerError


class KubeError(GpuSlicerError):
    """Base of the API seam's errors."""


class ApiError(KubeError):
    """The apiserver refused the call; ``status`` is the HTTP code, ``reason`` Status.reason."""

    def __init__(self, message: str, *, status: int, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=404, reason="NotFound")


class AlreadyExists(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=409, reason="AlreadyExists")


class Conflict(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=409, reason="Conflict")


class Invalid(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=422, reason="Invalid")


class Forbidden(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=403, reason="Forbidden")


class Unavailable(KubeError):
    """The apiserver could not be reached or answered 5xx; retry with backoff."""
