"""Reading ResourceClaims: which devices the scheduler gave a claim on this node.

The kubelet sends only claim references (namespace, name, uid); the allocation is in the claim's
``status.allocation.devices.results``. :func:`our_results` picks the results whose driver is one
of gpu-slicer's names (the current one, or the one of a release before, whose claims an upgraded
agent still serves) and whose pool is this node (pure). :class:`ClaimCache` keeps every claim in
a watch-backed cache so that prepare does not wait on the apiserver, falling back to a GET on a
miss (a claim created a moment ago), and gives the reconciler its view of the API
(:meth:`ClaimCache.allocated`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpu_slicer.core.identity import DRIVER, DRIVERS, RESOURCE_API
from gpu_slicer.kube import errors as kerrors
from gpu_slicer.kube.api import KubeApi, Obj
from gpu_slicer.kube.watch_cache import WatchCache

KIND = "ResourceClaim"


class ClaimError(Exception):
    """The claim cannot be prepared as asked (gone, replaced, not allocated to us)."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result for our driver on this node."""

    request: str
    """As the scheduler wrote it: ``<request>`` or ``<request>/<subrequest>``."""
    device: str
    pool: str
    driver: str = DRIVER
    """The name the device was allocated under (a legacy one for a claim of an older pool)."""


def our_results(
    claim: Obj, *, pool: str, drivers: tuple[str, ...] = DRIVERS
) -> list[AllocatedDevice]:
    """Allocation results of ``claim`` for any of ``drivers`` in ``pool`` (empty if
    unallocated)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results")) or []
    return [
        AllocatedDevice(str(r.get("request", "")), str(r["device"]), pool, str(r["driver"]))
        for r in results
        if r.get("driver") in drivers and r.get("pool") == pool and r.get("device")
    ]


class ClaimCache:
    """Every ResourceClaim, kept current by a watch (:class:`kube.watch_cache.WatchCache`);
    GET on a miss.

    ``synced`` is False until the first list succeeded and whenever the watch is broken; the
    reconciler only acts on "this claim is gone" while it is True (an apiserver that cannot be
    reached is not evidence that claims vanished).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        pool: str,
        drivers: tuple[str, ...] = DRIVERS,
        on_change: Callable[[], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        watch_timeout_s: float = 300.0,
    ) -> None:
        self._api = api
        self._pool = pool
        self._drivers = drivers
        self._cache: WatchCache[Obj] = WatchCache(
            api,
            RESOURCE_API,
            KIND,
            lambda claim: claim,
            watch_timeout_s=watch_timeout_s,
            backoff_s=backoff_s,
            on_change=on_change,
            on_error=on_error,
        )

    # --- reading --------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._cache.current

    @property
    def api_failures(self) -> int:
        """Consecutive failed list/watch attempts (0 while the API answers)."""
        return self._cache.failures

    @property
    def last_error(self) -> str | None:
        return self._cache.last_error

    def get(self, namespace: str, name: str, uid: str) -> Obj:
        """The claim with this uid; a GET when the cache lacks it or holds an older object.

        Raises ClaimError when the claim is gone or was replaced by another with a new uid,
        and kube.errors.Unavailable when the apiserver cannot be reached.
        """
        cached = self._cache.get(name, namespace)
        usable = (
            cached is not None
            and cached["metadata"].get("uid") == uid
            and our_results(cached, pool=self._pool, drivers=self._drivers)
        )
        if usable and self.synced:
            assert cached is not None
            return cached  # an unallocated cached copy may just lag behind: GET it
        try:
            claim = self._api.get(RESOURCE_API, KIND, name, namespace)
        except kerrors.Unavailable:
            if usable:  # the watch is down too; an allocation never changes under its uid
                assert cached is not None
                return cached
            raise
        except kerrors.NotFound as exc:
            raise ClaimError(f"ResourceClaim {namespace}/{name} does not exist (any more)") from exc
        if claim["metadata"].get("uid") != uid:
            raise ClaimError(
                f"ResourceClaim {namespace}/{name} has uid {claim['metadata'].get('uid')}, "
                f"not {uid}: the claim the kubelet asked about was deleted and replaced"
            )
        return self._cache.store(claim)

    def claims(self) -> list[Obj]:
        """Every claim the cache holds."""
        return self._cache.values()

    def allocated(self) -> dict[str, Obj]:
        """Claims (by uid) with at least one allocation result for our driver in our pool."""
        return {
            str(c["metadata"]["uid"]): c
            for c in self._cache.values()
            if our_results(c, pool=self._pool, drivers=self._drivers)
        }

    def lookup_uid(self, namespace: str, name: str, uid: str) -> Obj | None:
        """The claim if it still exists with this uid, None if it is gone (GET on a miss).

        Raises kube.errors.KubeError when the API cannot answer.
        """
        try:
            return self.get(namespace, name, uid)
        except ClaimError:
            return None

    # --- keeping current ------------------------------------------------------------------

    def start(self) -> None:
        self._cache.start()

    def stop(self) -> None:
        """Stop watching. The thread is a daemon blocked in a watch that may run for minutes:
        wait only briefly for it rather than hold up a shutdown."""
        self._cache.stop(timeout_s=1)

    def sync_once(self) -> None:
        """List every claim and replace the cache (without the watch thread)."""
        self._cache.relist()
