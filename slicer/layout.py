"""The static MIG layout: which instances each GPU should have when counters are unavailable.

Without partitionable devices (an apiserver that drops ``sharedCounters``), the scheduler cannot
be told that two placements overlap, so the agent advertises only instances that exist, each an
independent device. Which instances should exist then comes from configuration, like
mig-parted's config, for example::

    default: ["1g.18gb@0", "1g.18gb@1", "2g.35gb@2", "3g.71gb@4"]
    gpus:
      "3": []                  # GPU 3 stays whole (MIG off)
      "5": ["7g.141gb@0"]

``default`` applies to GPUs not listed under ``gpus``; an empty list means the whole GPU. Each
entry is ``<profile>@<start>`` (or ``{profile: ..., start: ...}``). :meth:`StaticLayout.check`
validates the layout against the catalog for the node's models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_slicer.core import catalog
from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.kube import documents
from gpu_slicer.slicer.errors import SlicerError


class LayoutError(SlicerError, ValueError):
    """The static layout configuration is malformed or impossible on a GPU."""


@dataclass(frozen=True)
class StaticLayout:
    """Desired instances per GPU index; ``default`` for GPUs without an entry."""

    gpus: Mapping[int, tuple[Placement, ...]] = field(default_factory=dict)
    default: tuple[Placement, ...] | None = None

    def for_gpu(self, index: int) -> tuple[Placement, ...] | None:
        """The configured placements of GPU ``index``; None when nothing is configured."""
        return self.gpus.get(index, self.default)

    def check(self, models: Sequence[GpuModel | None]) -> None:
        """Raise LayoutError unless every GPU's configured set is valid on its model.

        A model of None is a GPU without MIG: only an empty list (the whole GPU) fits it.
        """
        for index, model in enumerate(models):
            wanted = self.for_gpu(index)
            if not wanted:
                continue
            if model is None:
                raise LayoutError(
                    f"static layout names MIG instances for GPU {index}, which "
                    "has no MIG profiles; give it [] (the whole GPU)"
                )
            problems = catalog.violations(model, wanted)
            if problems:
                where = f"gpus.{index}" if index in self.gpus else "default"
                raise LayoutError(
                    f"static layout {where} cannot be built on GPU {index} ({model.key}): "
                    + "; ".join(problems)
                )
        for index in self.gpus:
            if index >= len(models):
                raise LayoutError(
                    f"static layout names GPU {index}, but the node has {len(models)} GPUs "
                    f"(indices 0-{len(models) - 1})"
                )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> StaticLayout:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise LayoutError("static layout must be a mapping with keys 'default' and 'gpus'")
        unknown = set(data) - {"default", "gpus"}
        if unknown:
            raise LayoutError(
                f"static layout has unknown keys {sorted(unknown)}; allowed: default, gpus"
            )
        default = None
        if data.get("default") is not None:
            default = _placements(data["default"], "default")
        gpus: dict[int, tuple[Placement, ...]] = {}
        raw_gpus = data.get("gpus") or {}
        if not isinstance(raw_gpus, Mapping):
            raise LayoutError("static layout 'gpus' must map GPU indices to lists of placements")
        for key, value in raw_gpus.items():
            text = str(key)
            if not text.isdigit():
                raise LayoutError(f"static layout gpus.{text}: the key must be a GPU index")
            gpus[int(text)] = _placements(value, f"gpus.{text}")
        return cls(gpus, default)

    @classmethod
    def load(cls, path: Path) -> StaticLayout:
        try:
            data = documents.parse(documents.read_text(path))
        except documents.DocumentError as exc:
            raise LayoutError(f"static layout {path}: {exc}") from exc
        return cls.from_mapping(data)


def _placements(value: Any, where: str) -> tuple[Placement, ...]:
    if not isinstance(value, list):
        raise LayoutError(f"static layout {where} must be a list like ['1g.10gb@0', '3g.40gb@4']")
    found: list[Placement] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            profile, sep, start = item.partition("@")
            if not sep or not start.strip().isdigit():
                raise LayoutError(
                    f"static layout {where}[{i}] = {item!r}: expected <profile>@<start>, "
                    "e.g. 1g.10gb@6"
                )
            found.append((profile.strip(), int(start)))
        elif isinstance(item, Mapping) and set(item) == {"profile", "start"}:
            if not isinstance(item["start"], int) or isinstance(item["start"], bool):
                raise LayoutError(f"static layout {where}[{i}].start must be an integer")
            found.append((str(item["profile"]), item["start"]))
        else:
            raise LayoutError(
                f"static layout {where}[{i}]: expected '<profile>@<start>' or "
                "{profile: ..., start: ...}"
            )
    return tuple(found)
