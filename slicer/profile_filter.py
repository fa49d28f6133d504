"""Which MIG profiles the agent advertises: an admin's list, to keep the scheduler's work small.

The upstream allocator converts every device of a node's pool for every pod it filters on that
node, and builds CEL input for each device it looks at; its cost grows with the devices per node.
An A100 80GB x 8 node advertises 200 devices in the partitionable layout, 72 of them ``+me`` and
``1g.20gb`` variants that few clusters use. ``--profiles`` keeps only the listed ones (the whole
GPU stays), so every DRA pod in the cluster, gpu-slicer's or another driver's, pays for fewer.

The setting is one text for every node (a DaemonSet's flag), so a cluster with several GPU
models lists profiles of each: a name must be a profile of some model in the catalog (a typo is
refused at start-up), and on a node the setting must leave each of its GPU models at least one
profile. Entries are profile names or shell-style patterns (``*+me``); an entry starting with
``-`` excludes. Without any plain entry, everything not excluded is kept:

    1g.10gb,2g.20gb,3g.40gb,7g.80gb       only these
    -*+me,-1g.20gb                        all but the media-engine variants and 1g.20gb

It applies to the partitionable layout only: the static layout advertises the instances that
exist, whatever their profile. Pure.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Protocol

from gpu_slicer.core import catalog
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.slicer.errors import SlicerError


class ProfileChoice(Protocol):
    """Which MIG profiles a node advertises: the admin's :class:`ProfileFilter`, or what the
    cluster asks for (:class:`slicer.demand.Advertised`)."""

    def allows(self, profile: str) -> bool: ...

    def text(self) -> str:
        """The choice in words, for the pool's ``gpu-slicer.io/advertised-profiles``."""
        ...


class ProfileFilterError(SlicerError, ValueError):
    """A ``--profiles`` entry names no profile of any GPU model, or leaves a model none."""


@dataclass(frozen=True)
class ProfileFilter:
    """The profiles to advertise: kept when an include matches (or none is given) and no
    exclude does."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> ProfileFilter | None:
        """``1g.10gb,3g.40gb`` or ``-*+me``; None for empty text (advertise every profile).

        Raises :class:`ProfileFilterError` for an entry that matches no catalog profile."""
        include: list[str] = []
        exclude: list[str] = []
        known = catalog.all_profile_names()
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            pattern = entry.removeprefix("-").strip()
            if not pattern:
                raise ProfileFilterError(f"profile entry {entry!r} excludes nothing")
            if not any(fnmatchcase(name, pattern) for name in known):
                close = difflib.get_close_matches(pattern, known, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ProfileFilterError(
                    f"profile {pattern!r} is not a MIG profile of any GPU model "
                    f"('gpu-slicer catalog' lists them){hint}"
                )
            (exclude if entry.startswith("-") else include).append(pattern)
        if not include and not exclude:
            return None
        return cls(tuple(include), tuple(exclude))

    def allows(self, profile: str) -> bool:
        """Whether devices of ``profile`` are advertised."""
        if self.include and not any(fnmatchcase(profile, p) for p in self.include):
            return False
        return not any(fnmatchcase(profile, p) for p in self.exclude)

    def kept(self, model: GpuModel) -> list[str]:
        """``model``'s profiles this filter keeps, in catalog order."""
        return [p.name for p in model.profiles if self.allows(p.name)]

    def check(self, models: Sequence[GpuModel | None]) -> None:
        """Refuse a filter that leaves one of the node's MIG-capable models no profile (its
        GPUs would advertise the whole GPU only, which is what ``--mode full`` is for)."""
        for model in _distinct(models):
            if model.profiles and not self.kept(model):
                offered = ", ".join(p.name for p in model.profiles)
                raise ProfileFilterError(
                    f"--profiles {self.text()!r} leaves no MIG profile on this node's "
                    f"{model.key} GPUs; its profiles are {offered}"
                )

    def text(self) -> str:
        """The setting as the admin would write it."""
        return ",".join([*self.include, *(f"-{p}" for p in self.exclude)])


def _distinct(models: Iterable[GpuModel | None]) -> list[GpuModel]:
    seen: dict[str, GpuModel] = {}
    for model in models:
        if model is not None:
            seen.setdefault(model.key, model)
    return list(seen.values())
