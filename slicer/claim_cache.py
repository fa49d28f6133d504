"""Reading ResourceClaims: which devices the scheduler gave a claim on this node.

The kubelet sends only claim references (namespace, name, uid); the allocation is in the claim's
``status.allocation.devices.results``. :func:`our_results` picks the results whose driver is ours
and whose pool is this node (pure). :class:`ClaimCache` keeps every claim in a watch-backed cache
so that prepare does not wait on the apiserver, falling back to a GET on a miss (a claim created
a moment ago), and gives the reconciler its view of the API (:meth:`ClaimCache.allocated`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kube import errors as kerrors
from kube.api import KubeApi, Obj
from slicer.identity import DRIVER, RESOURCE_API

KIND = "ResourceClaim"

log = logging.getLogger(__name__)


class ClaimError(Exception):
    """The claim cannot be prepared as asked (gone, replaced, not allocated to us)."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result for our driver on this node."""

    request: str
    """As the scheduler wrote it: ``<request>`` or ``<request>/<subrequest>``."""
    device: str
    pool: str


def our_results(claim: Obj, *, pool: str, driver: str = DRIVER) -> list[AllocatedDevice]:
    """Allocation results of ``claim`` for ``driver`` in ``pool`` (empty if unallocated)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results")) or []
    return [
        AllocatedDevice(request=str(r.get("request", "")), device=str(r["device"]), pool=pool)
        for r in results
        if r.get("driver") == driver and r.get("pool") == pool and r.get("device")
    ]


def claim_key(claim: Obj) -> tuple[str, str]:
    meta = claim.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class ClaimCache:
    """Every ResourceClaim, kept current by a watch; GET on a miss.

    ``synced`` is False until the first list succeeded and whenever the watch is broken; the
    reconciler only acts on "this claim is gone" while it is True (an apiserver that cannot be
    reached is not evidence that claims vanished).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        pool: str,
        driver: str = DRIVER,
        on_change: Callable[[], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        watch_timeout_s: float = 300.0,
    ) -> None:
        self._api = api
        self._pool = pool
        self._driver = driver
        self._on_change = on_change
        self._on_error = on_error
        self._backoff = backoff_s
        self._watch_timeout = watch_timeout_s
        self._lock = threading.Lock()
        self._claims: dict[tuple[str, str], Obj] = {}
        self._synced = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.api_failures = 0
        """Consecutive failed list/watch attempts (0 while the API answers)."""
        self.last_error: str | None = None

    # --- reading --------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced

    def get(self, namespace: str, name: str, uid: str) -> Obj:
        """The claim with this uid; a GET when the cache lacks it or holds an older object.

        Raises ClaimError when the claim is gone or was replaced by another with a new uid,
        and kube.errors.Unavailable when the apiserver cannot be reached.
        """
        with self._lock:
            cached = self._claims.get((namespace, name))
        usable = (
            cached is not None
            and cached["metadata"].get("uid") == uid
            and our_results(cached, pool=self._pool, driver=self._driver)
        )
        if usable and self._synced:
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
        self._store(claim)
        return claim

    def allocated(self) -> dict[str, Obj]:
        """Claims (by uid) with at least one allocation result for our driver in our pool."""
        with self._lock:
            claims = list(self._claims.values())
        return {
            str(c["metadata"]["uid"]): c
            for c in claims
            if our_results(c, pool=self._pool, driver=self._driver)
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
        self._thread = threading.Thread(target=self._run, name="claim-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching. The thread is a daemon blocked in a watch that may run for minutes:
        wait only briefly for it rather than hold up a shutdown."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)

    def sync_once(self) -> str:
        """List every claim and replace the cache; returns the list's resourceVersion."""
        listed = self._api.list(RESOURCE_API, KIND)
        with self._lock:
            self._claims = {claim_key(c): c for c in listed.items}
            self._synced = True
        self.api_failures = 0
        self.last_error = None
        self._changed()
        return listed.resource_version

    def _run(self) -> None:
        """List, then follow the watch from the list's resourceVersion until stopped. After a
        failure, wait (twice as long each time, up to the cap) and list again: events missed
        meanwhile are lost, a fresh list is not."""
        delay = self._backoff[0]
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self.sync_once()
                rv = self._watch(rv)
                if rv is None:
                    return
            except kerrors.KubeError as exc:
                rv = None
                if isinstance(exc, kerrors.ApiError) and exc.status == 410:
                    continue  # history gone: list again
                self._watch_failed(exc, delay)
            except Exception:  # never let the watch thread die
                log.exception("claim watch crashed; restarting")
                self._synced = False
                rv = None
            else:
                self.api_failures = 0
                self.last_error = None
                delay = self._backoff[0]
                if self._stop.wait(0):
                    return
                time.sleep(0)
                continue
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self._backoff[1])

    def _watch(self, rv: str) -> str | None:
        """Apply the watch's events until it ends; the resourceVersion to resume from, or None
        when told to stop meanwhile."""
        for event in self._api.watch(
            RESOURCE_API, KIND, resource_version=rv, timeout_s=self._watch_timeout
        ):
            if self._stop.is_set():
                return None
            rv = str(event.object.get("metadata", {}).get("resourceVersion") or rv)
            if event.type == "DELETED":
                with self._lock:
                    self._claims.pop(claim_key(event.object), None)
            elif event.type in ("ADDED", "MODIFIED"):
                self._store(event.object)
            self._changed()
        return rv

    def _watch_failed(self, exc: kerrors.KubeError, delay: float) -> None:
        """The cache may be stale from now on: say so (synced, failures, metrics, log)."""
        self._synced = False
        self.api_failures += 1
        self.last_error = str(exc)
        if self._on_error is not None:
            self._on_error(str(exc))
        log.warning(
            "claim watch failed; retrying",
            extra={"error": str(exc), "retry_in_s": delay, "failures": self.api_failures},
        )

    def _store(self, claim: Obj) -> None:
        with self._lock:
            self._claims[claim_key(claim)] = claim

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                log.exception("claim change callback failed")
