"""The cluster's demand as one agent follows it: claim templates through a watch, claims through
the claim cache, read against this node's GPUs (:mod:`slicer.demand`).

Every ResourceClaimTemplate counts, whoever wrote it (the webhook, ``convert``, a user): a
template is how a workload asks again whenever it scales. Every ResourceClaim counts while it
exists, allocated or not. A claim's spec never changes, so each is read once (by uid); a
template is read once per version, when the watch delivers it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpu_slicer.core.identity import RESOURCE_API
from gpu_slicer.kube.api import KubeApi
from gpu_slicer.kube.watch_cache import WatchCache
from gpu_slicer.slicer.claim_cache import ClaimCache
from gpu_slicer.slicer.clock import Clock
from gpu_slicer.slicer.demand import (
    NOTHING,
    Advertised,
    ClaimAsks,
    Demand,
    DeviceMenu,
    read_claim,
    read_template,
)

TEMPLATE_KIND = "ResourceClaimTemplate"


@dataclass
class NodeDemand:
    """What this node advertises now, from what the cluster's claims and templates ask."""

    api: KubeApi
    claims: ClaimCache
    menu: DeviceMenu
    demand: Demand
    clock: Clock
    on_change: Callable[[], None] | None = None
    on_error: Callable[[str], None] | None = None
    _templates: WatchCache[ClaimAsks] = field(init=False)
    _read: dict[str, ClaimAsks] = field(init=False, default_factory=dict)
    """Each live claim's asks, by uid."""

    def __post_init__(self) -> None:
        menu = self.menu
        self._templates = WatchCache(
            self.api,
            RESOURCE_API,
            TEMPLATE_KIND,
            lambda template: read_template(template, menu),
            on_change=self.on_change,
            on_error=self.on_error,
        )

    @property
    def synced(self) -> bool:
        """Both the templates and the claims are listed: the demand is complete."""
        return self._templates.synced and self.claims.synced

    def asks(self) -> ClaimAsks:
        """Everything every template and claim asks right now."""
        asked: set[str] = set()
        selectable: set[str] = set()
        read: dict[str, ClaimAsks] = {}
        for claim in self.claims.claims():
            uid = str(claim.get("metadata", {}).get("uid", ""))
            asks = self._read.get(uid)
            if asks is None:
                asks = read_claim(claim, self.menu)
            read[uid] = asks
            if asks is not NOTHING:
                asked |= asks.asked
                selectable |= asks.selectable
        self._read = read
        for asks in self._templates.values():
            asked |= asks.asked
        return ClaimAsks(frozenset(asked), frozenset(selectable))

    def advertised(self) -> Advertised:
        """What to advertise now (observing the cluster's asks first)."""
        now = self.clock.monotonic()
        self.demand.observe(self.asks(), now)
        self.demand.forget_withdrawn(now)
        return self.demand.advertised(now)

    def key(self) -> frozenset[tuple[str, str]]:
        """The profiles advertised now and why: a republish is due whenever this changes (a
        profile that is only "recent" now needs the publisher to say when it goes)."""
        chosen = self.advertised()
        return frozenset((p, r) for p, r in chosen.reasons.items() if chosen.allows(p))

    def adopt(self, published: Iterable[str]) -> None:
        """See :meth:`slicer.demand.Demand.adopt`."""
        self.demand.adopt(published, self.clock.monotonic())

    def next_withdrawal_in(self) -> float | None:
        return self.demand.next_withdrawal_in(self.clock.monotonic())

    def start(self) -> None:
        self._templates.start()

    def stop(self) -> None:
        self._templates.stop(timeout_s=1)

    def sync_once(self) -> None:
        """List the templates once (without the watch thread): tests and the simulator."""
        self._templates.relist()
