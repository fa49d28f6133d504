"""What the cluster's claims ask of this node's GPUs, and so which MIG profiles it advertises.

Every device a node advertises costs every DRA pod the scheduler filters on that node, gpu-slicer's
and every other driver's (docs/resourceslices.md), yet a cluster runs a few MIG shapes at a time.
So the agent advertises, per GPU, the placements of the profiles that the cluster's claims and
claim templates can ask for, plus an admin's floor (``--always-advertise``), not every profile of
the catalog. Pure: the watches that feed it are :mod:`slicer.demand_watch`.

Reading a claim (:func:`read_claim_spec`): every request, and every alternative of a
``firstAvailable`` chain, that names gpu-slicer's MIG DeviceClass is evaluated with the
scheduler's CEL (:mod:`kube.device_cel`) against every device this node's GPU models can
advertise; the profiles of the devices it accepts are what it asks for. A hand-written claim
counts as much as one the webhook or ``convert`` wrote, and an older webhook's templates read the
same as a newer one's: nothing depends on how the selector is spelled.

Two ways of asking:

* **asked**: the profiles a claim or template names. They are published: the first pod of a new
  shape waits only for the agents to republish.
* **selectable**: everything any alternative of a live claim could be given. The memory tiers of
  a ``gpu-slicer.io/gpu-memory`` chain after its first (the smallest profile that fits) are only
  selectable: they follow what is published instead of bringing back every larger profile. A
  selectable profile is never withdrawn while a claim could still be given it, since the
  scheduler may be placing that claim at this moment.

A profile nobody asks for any more stays advertised for ``withdraw_after_s`` (30 minutes by
default), so that a Job's next run or a Deployment scaled down and up again finds its slices at
once. Devices that are allocated, prepared or held by the agent's instances are published
whatever their profile (:func:`slicer.inventory.advertise_gpu` keeps them), so a withdrawal never
takes a device from under a claim.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from gpu_slicer.core.devices import SliceSpec
from gpu_slicer.core.identity import DRIVER, MEMORY_CAPACITY, MIG_CLASS
from gpu_slicer.kube.device_cel import DeviceView, SelectorError, matches
from gpu_slicer.slicer.backend import GpuInfo, model_of
from gpu_slicer.slicer.device_attributes import DeviceAttributes, device_body
from gpu_slicer.slicer.deviceclasses import MIG_SELECTOR
from gpu_slicer.slicer.inventory import GpuState, advertise_gpu
from gpu_slicer.slicer.profile_filter import ProfileFilter

Obj = dict[str, Any]

AdvertisedProfiles = Literal["asked", "all"]
ADVERTISED_PROFILES_CHOICES: tuple[AdvertisedProfiles, ...] = get_args(AdvertisedProfiles)
"""``agent run --advertised-profiles``: the profiles the cluster asks for (the default), or every
profile of the catalog (as before; each device costs every DRA pod)."""

DEFAULT_WITHDRAW_AFTER_S = 1800.0
"""How long a profile nobody asks for any more stays advertised (``--withdraw-after``)."""

Reason = Literal["asked", "recent", "floor", "all"]
REASONS: tuple[Reason, ...] = get_args(Reason)


@dataclass(frozen=True)
class ClaimAsks:
    """What one claim or template asks of this node's GPUs (profile names)."""

    asked: frozenset[str] = frozenset()
    selectable: frozenset[str] = frozenset()

    def __or__(self, other: ClaimAsks) -> ClaimAsks:
        return ClaimAsks(self.asked | other.asked, self.selectable | other.selectable)


NOTHING = ClaimAsks()


class DeviceMenu:
    """Every MIG device this node's GPU models can advertise, as the scheduler's CEL sees it:
    what a selector is read against. One GPU per model stands for all GPUs of that model (a
    selector that tells GPUs of one model apart asks for the same profiles on each)."""

    def __init__(self, gpus: Iterable[GpuInfo], attributes: DeviceAttributes = "full") -> None:
        views: list[tuple[str, DeviceView]] = []
        seen: set[str] = set()
        for info in gpus:
            model = model_of(info)
            if model is None or not model.profiles or model.key in seen:
                continue
            seen.add(model.key)
            advert = advertise_gpu(GpuState(info, mode="mig"))
            for device in advert.devices:
                if isinstance(device.candidate.spec, SliceSpec):
                    body = device_body(device.body, attributes)
                    views.append((device.candidate.spec.profile, DeviceView(DRIVER, body)))
        self._views = tuple(views)
        self.profiles = frozenset(profile for profile, _ in views)
        """Every profile this node's GPUs offer."""

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one menu per agent, kept for its life)
    def profiles_matching(self, selectors: tuple[str, ...]) -> frozenset[str]:
        """Profiles of the devices every selector accepts (and the MIG class's own selector).
        A selector the scheduler could not run on a device accepts nothing there, as in the
        scheduler, where the claim then fails to allocate."""
        found: set[str] = set()
        expressions = (MIG_SELECTOR, *selectors)
        for profile, view in self._views:
            if profile in found:
                continue
            try:
                if all(matches(e, view) for e in expressions):
                    found.add(profile)
            except SelectorError:
                continue
        return frozenset(found)


def _selectors(alternative: Mapping[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for selector in alternative.get("selectors") or ():
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            out.append(expression)
    return tuple(out)


def _memory_sized(selectors: Sequence[str]) -> bool:
    """A tier of a memory-sized chain: it compares the device's memory capacity."""
    return any(f".{MEMORY_CAPACITY}" in s and "device.capacity" in s for s in selectors)


def read_claim_spec(spec: object, menu: DeviceMenu) -> ClaimAsks:
    """What a ResourceClaimSpec (``{devices: {requests: [...]}}``) asks of this node."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    asked: set[str] = set()
    selectable: set[str] = set()
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, Mapping):
            continue
        chain = request.get("firstAvailable")
        exactly = request.get("exactly")
        alternatives = chain if isinstance(chain, list) else [exactly]
        for position, alternative in enumerate(alternatives):
            if not isinstance(alternative, Mapping):
                continue
            if alternative.get("deviceClassName") != MIG_CLASS:
                continue
            selectors = _selectors(alternative)
            found = menu.profiles_matching(selectors)
            selectable |= found
            if position == 0 or not _memory_sized(selectors):
                asked |= found
    return ClaimAsks(frozenset(asked), frozenset(selectable))


def read_template(template: Obj, menu: DeviceMenu) -> ClaimAsks:
    """A ResourceClaimTemplate's claim spec, read as :func:`read_claim_spec` reads a claim's.
    A template asks but holds nothing: only live claims make profiles selectable."""
    spec = template.get("spec")
    inner = spec.get("spec") if isinstance(spec, Mapping) else None
    return replace(read_claim_spec(inner, menu), selectable=frozenset())


def read_claim(claim: Obj, menu: DeviceMenu) -> ClaimAsks:
    """A ResourceClaim: what it asks, and what it could be given while it lives."""
    return read_claim_spec(claim.get("spec"), menu)


@dataclass(frozen=True)
class Advertised:
    """The profiles a node advertises now, and why (``gpu-slicer status`` shows the reasons).

    ``allows`` is what :func:`slicer.inventory.advertise_gpu` asks of it; the admin's
    ``--profiles`` (``limit``) still bounds everything."""

    reasons: Mapping[str, Reason] = field(default_factory=dict)
    limit: ProfileFilter | None = None
    every: bool = False
    """``--advertised-profiles all``: every profile (within ``limit``)."""

    def allows(self, profile: str) -> bool:
        if self.limit is not None and not self.limit.allows(profile):
            return False
        return self.every or profile in self.reasons

    def text(self) -> str:
        """``1g.10gb=asked,3g.40gb=floor``: the annotation the publisher writes."""
        if self.every:
            return "all"
        kept = {p: r for p, r in self.reasons.items() if self.allows(p)}
        return ",".join(f"{p}={r}" for p, r in sorted(kept.items()))

    @classmethod
    def parse(cls, text: str) -> Advertised:
        """The annotation read back (``gpu-slicer status``); an entry it cannot read is left
        out, since a newer agent may write reasons this release does not know."""
        if text.strip() == "all":
            return EVERY_PROFILE
        reasons: dict[str, Reason] = {}
        for entry in text.split(","):
            profile, _, reason = entry.strip().partition("=")
            if profile and reason in REASONS:
                reasons[profile] = reason
        return cls(reasons)


EVERY_PROFILE = Advertised(every=True)


def asked_for(
    text: str, gpus: Iterable[GpuInfo], *, limit: ProfileFilter | None = None
) -> Advertised:
    """What a node with ``gpus`` advertises when the cluster's claims ask for the profiles
    ``text`` names (``1g.10gb,3g.40gb``; patterns as in ``--profiles``): ``gpu-slicer slices
    --demand``. Text that names nothing (``''``) is a cluster whose claims ask for no profile:
    what an idle node publishes. Raises :class:`slicer.profile_filter.ProfileFilterError` for a
    name that is no catalog profile."""
    wanted = ProfileFilter.parse(text)
    offered = DeviceMenu(gpus).profiles
    demand = Demand(offered, limit=limit)
    chosen = {p for p in offered if wanted.allows(p)} if wanted is not None else set()
    demand.observe(ClaimAsks(frozenset(chosen)), 0.0)
    return demand.advertised(0.0)


@dataclass
class Demand:
    """The profiles asked of a node over time: what it advertises now, and when the next one
    that nobody asks for any more is due to be withdrawn. Times are the agent's monotonic
    clock."""

    offered: frozenset[str]
    """Every profile this node's GPUs offer (:attr:`DeviceMenu.profiles`)."""
    floor: ProfileFilter | None = None
    """``--always-advertise``: profiles advertised whether or not anyone asks."""
    limit: ProfileFilter | None = None
    """``--profiles``: the admin's bound on what is ever advertised."""
    withdraw_after_s: float = DEFAULT_WITHDRAW_AFTER_S
    asked: frozenset[str] = frozenset()
    selectable: frozenset[str] = frozenset()
    last_asked: dict[str, float] = field(default_factory=dict)
    """When each profile was last asked for, or selectable while advertised."""
    shown: frozenset[str] = frozenset()
    """The profiles :meth:`advertised` gave last."""

    def observe(self, asks: ClaimAsks, now: float) -> None:
        """What every claim and template asks right now."""
        self.asked = asks.asked & self.offered
        self.selectable = asks.selectable & self.offered
        for profile in self.asked:
            self.last_asked[profile] = now
        for profile in self.selectable:
            # Kept while a claim could be given it, never brought back by such a claim alone.
            if profile in self.shown:
                self.last_asked[profile] = now

    def adopt(self, published: Iterable[str], now: float) -> None:
        """Profiles found published when the agent starts count as asked a moment ago: a
        restart withdraws nothing before the delay, whatever its caches know yet."""
        for profile in published:
            if profile in self.offered:
                self.last_asked.setdefault(profile, now)

    def _floor(self) -> set[str]:
        if self.floor is None:
            return set()
        return {p for p in self.offered if self.floor.allows(p)}

    def advertised(self, now: float) -> Advertised:
        reasons: dict[str, Reason] = {}
        for profile, when in self.last_asked.items():
            if now - when < self.withdraw_after_s:
                reasons[profile] = "recent"
        for profile in self._floor():
            reasons[profile] = "floor"
        for profile in self.asked:
            reasons[profile] = "asked"
        self.shown = frozenset(reasons)
        return Advertised(reasons, self.limit)

    def next_withdrawal_in(self, now: float) -> float | None:
        """Seconds until a profile now only "recent" is due to go (publish again then)."""
        keep = self.asked | self.selectable | self._floor()
        due = [
            when + self.withdraw_after_s - now
            for profile, when in self.last_asked.items()
            if profile not in keep and now - when < self.withdraw_after_s
        ]
        return max(0.0, min(due)) if due else None

    def forget_withdrawn(self, now: float) -> None:
        """Drop the memory of profiles already withdrawn (keeps ``last_asked`` small)."""
        for profile, when in list(self.last_asked.items()):
            if now - when >= self.withdraw_after_s:
                del self.last_asked[profile]


__all__ = [
    "ADVERTISED_PROFILES_CHOICES",
    "DEFAULT_WITHDRAW_AFTER_S",
    "EVERY_PROFILE",
    "NOTHING",
    "Advertised",
    "AdvertisedProfiles",
    "ClaimAsks",
    "Demand",
    "DeviceMenu",
    "asked_for",
    "read_claim",
    "read_claim_spec",
    "read_template",
]
