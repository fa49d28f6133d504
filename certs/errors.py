"""Errors of the certs package; each message says what to change.

    CertError
    ├── CertInputError      a bad service or namespace name, or lifetimes that do not fit
    ├── CertFileError       certificate files could not be read or written
    ├── CertDataError       PEM data that is not a certificate or key of the expected kind
    └── EnsureError         ``certs ensure`` could not bring the cluster to the wanted state

Lower-layer errors (``OSError``, ``cryptography``'s ``ValueError``, ``kube.errors``) are chained
with ``raise ... from`` so that the cause stays visible in logs.
"""

from __future__ import annotations

from gpu_slicer.core.errors import GpuSlicerError


class CertError(GpuSlicerError):
    """Base of every error the certs package raises on purpose."""


class CertInputError(CertError, ValueError):
    """The caller asked for something invalid (exit code 2 on the command line)."""


class CertFileError(CertError, OSError):
    """A certificate file or its directory could not be read or written."""


class CertDataError(CertError, ValueError):
    """Bytes that should hold a PEM certificate or key do not."""


class EnsureError(CertError):
    """The Secret or the webhook configuration could not be brought up to date."""
