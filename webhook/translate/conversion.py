"""What translating one pod gives, and the limits every step of it checks against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_slicer.webhook.claims import ContainerRequest

MAX_COUNT = 2**31 - 1
"""A legacy count above this (the largest int32) is refused as a mistake, not put in a claim."""
MAX_CLAIM_DEVICES = 32
"""Kubernetes allocates at most this many devices to one claim (``AllocationResultsMaxSize``):
a bigger claim is accepted by the API but the scheduler can never allocate it."""
MAX_CLAIM_REQUESTS = 32
"""The API's limit on ``devices.requests`` of one claim."""
WARNING_MAX_BYTES = 119
"""The apiserver refuses a warning of 120 characters or more; counted in UTF-8 bytes (never
fewer than characters) by the engine, which cuts every warning it returns to this."""
CHANGE_ANNOTATION = "annotation"
"""The ``what`` of a change made because of an annotation rather than a legacy resource."""


@dataclass(frozen=True)
class Conversion:
    """What the webhook does to one pod. An empty ``patch`` means "admit unchanged"."""

    patch: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    changes: list[tuple[str, str]] = field(default_factory=list)
    summary: str = "nothing to convert"
    deferred: tuple[tuple[str, str], ...] = ()
    """(container, legacy resource) left unconverted because a DeviceClass serves the resource
    and the policy defers to it (counted in metrics)."""
    requests: tuple[ContainerRequest, ...] = ()
    """The claim's requests with their alternatives in preference order, for tools that reason
    about the chains (the simulator's baselines) without re-reading the template."""

    @property
    def template_name(self) -> str | None:
        if not self.templates:
            return None
        return str(self.templates[0]["metadata"]["name"])


def short(text: str) -> str:
    """``text`` cut to a warning the apiserver accepts."""
    return text if len(text) <= WARNING_MAX_BYTES else text[: WARNING_MAX_BYTES - 3] + "..."


def dict_of(value: Any) -> dict[str, Any]:
    """``value`` if it is a map, else an empty one: a pod's JSON may hold anything anywhere."""
    return value if isinstance(value, dict) else {}
