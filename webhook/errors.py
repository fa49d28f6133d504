"""Errors raised by the webhook package.

Each error exists because its caller must react differently to it:

    WebhookError
    ├── PolicyError(problems)   the policy file is invalid; each problem names its key path.
    │                           The server keeps the last good policy; ``policy check`` exits 2.
    ├── Denied(message)         the pod must be refused: a bad annotation or a request that no GPU
    │                           model can satisfy. The message says what would be valid.
    ├── BadReview(message)      a malformed AdmissionReview: the server answers HTTP 400.
    ├── TemplateError(message)  the API failed while ensuring a ResourceClaimTemplate: the server
    │                           answers an error so that the webhook's failurePolicy decides.
    ├── ManifestError(problems) a manifest stream that is not valid YAML; each problem names
    │                           the source. (Documents ``convert`` cannot convert are kept and
    │                           reported, never raised: one never blocks the others.)
    ├── WorkloadPathError       a pod-template path of the kind table or the policy's workloads
    │                           that does not follow the syntax (the policy names the key).
    ├── YamlTextError           a changed document ruamel.yaml cannot load for editing: written
    │                           from its value instead, without its comments.
    ├── FunctionConfigError     the KRM function's config is not one gpu-slicer understands.
    └── TreeFileError(message)  a file of a converted tree that cannot be read or written
                                safely (a symlink on the way, deleted during the run, an I/O
                                error): named with its file; the rest of the tree proceeds.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_slicer.core.errors import GpuSlicerError


class WebhookError(GpuSlicerError):
    """Base of every error the webhook package raises on purpose."""


class PolicyError(WebhookError, ValueError):
    """An invalid policy. ``problems`` lists every problem found, each naming its key path."""

    def __init__(self, problems: Iterable[str], *, source: str = "<policy>") -> None:
        self.problems: list[str] = list(problems) or ["invalid policy"]
        self.source = source
        super().__init__(f"{source}: " + "; ".join(self.problems))


class Denied(WebhookError, ValueError):
    """The pod cannot be admitted as written; the message tells the user what is valid."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadReview(WebhookError, ValueError):
    """The AdmissionReview itself is malformed (HTTP 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TemplateError(WebhookError):
    """Ensuring a ResourceClaimTemplate failed at the API (HTTP 500; failurePolicy decides)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ManifestError(WebhookError, ValueError):
    """Manifests that ``convert`` cannot translate; ``problems`` name the document of each."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: list[str] = list(problems) or ["invalid manifests"]
        super().__init__("; ".join(self.problems))


class WorkloadPathError(WebhookError, ValueError):
    """A path such as ``spec.tasks[].template`` that does not follow the syntax."""


class YamlTextError(WebhookError, ValueError):
    """A document that cannot be loaded for editing with its comments."""


class FunctionConfigError(WebhookError, ValueError):
    """The KRM function's ``functionConfig.spec`` is not one gpu-slicer understands."""


class TreeFileError(WebhookError):
    """One file of a tree ``convert`` cannot read or write safely; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
