"""What a device is: the two faces of a MIG slice (the abstract spec the scheduler allocates,
and the live instance), the mode a GPU is offered in, and the taints its devices carry.

A ``SliceSpec`` (parent GPU index, profile, placement start) is what a ResourceSlice advertises and
a claim's allocation names; a ``MigInstance`` is what exists on the GPU once it is created (GI and
CI ids, MIG UUID). Device names are canonical and round-trip through :func:`parse_device_name`:

* ``gpu-<index>`` for a whole GPU;
* ``gpu-<index>-mig-<profile token>-<start>``, e.g. ``gpu-0-mig-1g10gb-6``: the profile without
  dots, its variant suffix spelled as a DNS-label token (``+me`` -> ``me``, ``+me.all`` ->
  ``meall``, ``-me`` -> ``nome``, ``+gfx`` -> ``gfx``; Blackwell added the last three).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from gpu_slicer.core.errors import DeviceNameError

SUFFIX_TOKENS: dict[str, str] = {
    "": "",
    "+me": "me",
    "+me.all": "meall",
    "-me": "nome",
    "+gfx": "gfx",
}
"""Profile variant suffix -> its token in device names (a bijection, so names round-trip)."""
_SUFFIXES = {token: suffix for suffix, token in SUFFIX_TOKENS.items()}
_PROFILE_RE = re.compile(r"^(?P<c>\d+)g\.(?P<m>\d+)gb(?P<suffix>[-+.a-z]*)$")
_WHOLE_RE = re.compile(r"^gpu-(?P<gpu>0|[1-9]\d*)$")
_MIG_RE = re.compile(
    r"^gpu-(?P<gpu>0|[1-9]\d*)-mig-(?P<c>\d+)g(?P<m>\d+)gb(?P<token>[a-z]*)"
    r"-(?P<start>0|[1-9]\d*)$"
)


def profile_token(profile: str) -> str:
    """``1g.10gb+me`` -> ``1g10gbme``: the profile as it appears in a device name."""
    match = _PROFILE_RE.match(profile)
    if not match or match["suffix"] not in SUFFIX_TOKENS:
        raise DeviceNameError(
            f"{profile!r} is not a MIG profile name gpu-slicer can name a device after; expected "
            "<n>g.<m>gb followed by nothing or one of " + ", ".join(sorted(SUFFIX_TOKENS)[1:])
        )
    return f"{match['c']}g{match['m']}gb" + SUFFIX_TOKENS[match["suffix"]]


@dataclass(frozen=True, order=True)
class WholeGpu:
    """A whole GPU, advertised as one device."""

    gpu_index: int

    @property
    def device_name(self) -> str:
        return f"gpu-{self.gpu_index}"


@dataclass(frozen=True, order=True)
class SliceSpec:
    """A MIG slice as the scheduler sees it: where it would live, not whether it exists."""

    gpu_index: int
    profile: str
    start: int

    @property
    def device_name(self) -> str:
        return f"gpu-{self.gpu_index}-mig-{profile_token(self.profile)}-{self.start}"


DeviceSpec = WholeGpu | SliceSpec


def parse_device_name(name: str) -> DeviceSpec:
    """Inverse of ``device_name``; raises DeviceNameError for names that are not ours."""
    whole = _WHOLE_RE.match(name)
    if whole:
        return WholeGpu(int(whole["gpu"]))
    mig = _MIG_RE.match(name)
    if mig and mig["token"] in _SUFFIXES:
        profile = f"{mig['c']}g.{mig['m']}gb" + _SUFFIXES[mig["token"]]
        return SliceSpec(int(mig["gpu"]), profile, int(mig["start"]))
    raise DeviceNameError(
        f"{name!r} is not a gpu-slicer device name; expected gpu-<index> or "
        "gpu-<index>-mig-<profile>-<start> (e.g. gpu-0-mig-1g10gb-6)"
    )


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance that exists on a GPU, with its compute instance when it has one.

    ``ci_id`` and ``uuid`` are None for a GPU instance whose compute instance is not (or no
    longer) there: a half-created or half-destroyed slice that cleanup must finish.
    """

    gpu_index: int
    profile: str
    start: int
    size: int
    gi_id: int
    ci_id: int | None
    uuid: str | None

    @property
    def spec(self) -> SliceSpec:
        return SliceSpec(self.gpu_index, self.profile, self.start)

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.size)


Mode = Literal["dynamic", "mig", "full"]
"""How a GPU is offered: ``dynamic`` (MIG slices made on demand), ``mig`` (the static layout's
instances) or ``full`` (the whole GPU)."""
MODES: tuple[Mode, ...] = ("dynamic", "mig", "full")


@dataclass(frozen=True)
class DeviceTaint:
    """A taint on every device of a GPU (health: ``gpu-slicer.io/unhealthy``)."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "NoExecute", "None"] = "NoSchedule"

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out
