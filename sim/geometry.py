"""MIG geometry the baselines and the metrics need, on top of the catalog (cached: it is hot).

* :func:`pack` finds placements for a multiset of profiles on one GPU, if any exist: what an
  oracle that may repack a GPU can host, and how a static layout is laid out.
* :func:`resolve_profile` turns a profile name or a size kind (``1g``, ``2g``, ``3g``, ``4g``,
  ``7g``) into the profile of a given model, so that one layout or one request works on a cluster
  of mixed models.
* :func:`free_placements` lists what can still be created next to instances that exist.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from gpu_slicer.core import catalog
from gpu_slicer.core.catalog import Placement
from gpu_slicer.core.gpu_model import GpuModel, Profile

_KIND = re.compile(r"^(?P<c>\d)g$")


def resolve_profile(model: GpuModel, name: str) -> Profile | None:
    """The model's profile called ``name``, or for a kind like ``3g`` its smallest-memory
    profile with that many compute slices (never ``+me``); None when the model has none."""
    if model.has_profile(name):
        return model.profile(name)
    match = _KIND.match(name)
    if not match:
        return None
    compute = int(match["c"])
    found = [p for p in model.profiles if p.compute_slices == compute and not p.media_exclusive]
    found.sort(key=lambda p: p.memory_slices)
    return found[0] if found else None


@lru_cache(maxsize=65536)
def pack(model: GpuModel, profiles: tuple[str, ...]) -> tuple[Placement, ...] | None:
    """Placements for all of ``profiles`` (sorted tuple) on an empty GPU, or None.

    Larger profiles are placed first, each at the first legal start that leaves a solution
    (backtracking), so the result is deterministic.
    """
    ordered = sorted(
        profiles, key=lambda n: (-model.profile(n).memory_slices, -model.profile(n).compute_slices)
    )
    if sum(model.profile(n).compute_slices for n in ordered) > model.compute_slices:
        return None
    placed: list[Placement] = []

    def place(i: int) -> bool:
        if i == len(ordered):
            return True
        profile = model.profile(ordered[i])
        for start in profile.starts:
            candidate = (profile.name, start)
            if catalog.is_valid(model, [*placed, candidate]):
                placed.append(candidate)
                if place(i + 1):
                    return True
                placed.pop()
        return False

    return tuple(placed) if place(0) else None


def can_pack(model: GpuModel, profiles: Sequence[str]) -> bool:
    return pack(model, tuple(sorted(profiles))) is not None


@lru_cache(maxsize=65536)
def free_placements(model: GpuModel, present: tuple[Placement, ...]) -> tuple[Placement, ...]:
    """Placements that could be created next to ``present`` (sorted tuple) without moving it."""
    return tuple(catalog.remaining_placements(model, list(present)))


def fits_next_to(model: GpuModel, present: Sequence[Placement], profile: str) -> bool:
    """Whether one more ``profile`` can be created without moving what is ``present``."""
    return any(p[0] == profile for p in free_placements(model, tuple(sorted(present))))
