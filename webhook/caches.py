"""Watch-backed caches of the cluster state the admission hot path needs.

Admission must answer in milliseconds, so nothing that can be cached is fetched per request:

- :class:`NamespaceModes`: each namespace's mode from its label ``gpu-slicer.io/migration``
  (``enabled``, ``audit``, anything else or absent: ``disabled``). The webhook configuration's
  namespaceSelector is the first line of defence; this is the second, so a namespace whose label
  was removed is admitted unchanged even if the selector lags.
- :class:`NamespaceQuotas`: the GPU lines of each namespace's ResourceQuotas
  (:mod:`webhook.quota`), so that a converted pod does not escape a legacy GPU quota.
- :class:`ExtendedResourceNames`: the legacy names (``nvidia.com/gpu``) that a DeviceClass already
  serves through ``spec.extendedResourceName`` (KEP-5004), which the policy may defer to.

Both sit on :class:`WatchCache`: list, then watch from the list's resourceVersion, re-watch when
a watch ends, list again on 410 Expired or any error (with backoff). ``synced`` turns true after
the first successful list and feeds ``/readyz``. The ``Static*`` twins serve ``--dev`` and tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from kube.api import KubeApi, Obj
from kube.errors import ApiError, KubeError, NotFound
from slicer.identity import MIGRATION_LABEL, RESOURCE_API, NamespaceMode
from webhook.errors import WebhookError
from webhook.extended import ExtendedClass, extended_class
from webhook.locks import memory_lock
from webhook.quota import NO_QUOTA, NamespaceQuota, read_quotas

log = logging.getLogger(__name__)

T = TypeVar("T")


class CacheError(WebhookError):
    """A cache could not answer and the API could not either (HTTP 500; failurePolicy decides)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def mode_from_labels(labels: object) -> NamespaceMode:
    """The namespace mode that a namespace's labels give."""
    value = labels.get(MIGRATION_LABEL) if isinstance(labels, dict) else None
    if value == "enabled":
        return "enabled"
    if value == "audit":
        return "audit"
    return "disabled"


class NamespaceModeSource(Protocol):
    def mode(self, namespace: str) -> NamespaceMode: ...

    @property
    def synced(self) -> bool: ...


class ExtendedNameSource(Protocol):
    def names(self) -> frozenset[str]: ...

    def classes(self) -> tuple[ExtendedClass, ...]: ...

    @property
    def synced(self) -> bool: ...


class WatchCache(Generic[T]):
    """Objects of one kind, reduced by ``extract`` and keyed by (namespace, name), kept current."""

    def __init__(
        self,
        api: KubeApi,
        api_version: str,
        kind: str,
        extract: Callable[[Obj], T],
        *,
        watch_timeout_s: float = 240.0,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        on_change: Callable[[], None] | None = None,
        absent_ok: bool = False,
    ) -> None:
        self.api = api
        self._absent_ok = absent_ok
        self.api_version = api_version
        self.kind = kind
        self._extract = extract
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff_s
        self._on_change = on_change
        self._items: dict[tuple[str, str], T] = {}
        self._lock = memory_lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resource_version: str | None = None

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    def get(self, name: str, namespace: str = "") -> T | None:
        with self._lock:
            return self._items.get((namespace, name))

    def values(self) -> list[T]:
        with self._lock:
            return list(self._items.values())

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        """Lists and watches in a daemon thread until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name=f"watch-{self.kind}", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 0.0) -> None:
        """Ends the loop at its next event or watch timeout; waits ``timeout_s`` for it."""
        self._stop.set()
        if self._thread is not None and timeout_s > 0:
            self._thread.join(timeout_s)

    def run(self) -> None:
        delay = self._backoff[0]
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self.relist()
                self.follow()
                delay = self._backoff[0]
            except KubeError as exc:
                if self._stop.is_set():
                    return  # stopping: the API closing under the watch is not a failure
                delay = self._after_failure(exc, delay)

    def _after_failure(self, exc: KubeError, delay: float) -> float:
        """What to do after a failed list or watch; the pause before the next try."""
        if isinstance(exc, NotFound) and self._absent_ok:
            # The API group is not served at all: nothing of this kind exists. Count as
            # synced and empty, and look again much later (the cluster may be upgraded).
            with self._lock:
                self._items = {}
            self._synced.set()
            self._changed()
            self._resource_version = None
            self._stop.wait(self._backoff[1] * 10)
            return delay
        if isinstance(exc, ApiError) and exc.status == 410:
            self._resource_version = None  # history gone: start again from a fresh list
            return delay
        return self._pause(delay, exc)

    def _pause(self, delay: float, exc: Exception) -> float:
        log.warning(
            "watch failed; listing again after a pause",
            extra={"kind": self.kind, "error": str(exc), "retry_in_s": delay},
        )
        self._resource_version = None
        self._stop.wait(delay)
        return min(delay * 2, self._backoff[1])

    def relist(self) -> None:
        """Replaces the contents with a fresh list (also usable without the thread)."""
        listed = self.api.list(self.api_version, self.kind)
        items = {_key(obj): self._extract(obj) for obj in listed.items}
        with self._lock:
            self._items = items
        self._resource_version = listed.resource_version
        self._synced.set()
        self._changed()

    def follow(self) -> None:
        """Applies watch events until the watch ends (timeout, stop)."""
        for event in self.api.watch(
            self.api_version,
            self.kind,
            resource_version=self._resource_version,
            timeout_s=self._watch_timeout_s,
        ):
            if self._stop.is_set():
                return
            rv = event.object.get("metadata", {}).get("resourceVersion")
            if event.type == "BOOKMARK":
                self._resource_version = rv or self._resource_version
                continue
            with self._lock:
                if event.type == "DELETED":
                    self._items.pop(_key(event.object), None)
                else:
                    self._items[_key(event.object)] = self._extract(event.object)
            self._resource_version = rv or self._resource_version
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


class _OnWatchCache:
    """A source kept by one :class:`WatchCache`: ready once it listed, started and stopped
    with it."""

    cache: WatchCache[Any]

    @property
    def synced(self) -> bool:
        return self.cache.synced

    def start(self) -> None:
        self.cache.start()

    def stop(self) -> None:
        self.cache.stop()


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return (meta.get("namespace") or "", meta.get("name") or "")


class NamespaceModes(_OnWatchCache):
    """Namespace -> mode, from a watch of Namespaces.

    A namespace the cache has not seen yet (created a moment ago, watch lagging) is looked up
    once with a GET and the answer kept for ``miss_ttl_s``; if the API cannot answer either, a
    :class:`CacheError` lets failurePolicy decide.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        miss_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        watch_timeout_s: float = 240.0,
    ) -> None:
        self.api = api
        self.cache: WatchCache[NamespaceMode] = WatchCache(
            api,
            "v1",
            "Namespace",
            lambda ns: mode_from_labels(ns.get("metadata", {}).get("labels")),
            watch_timeout_s=watch_timeout_s,
        )
        self._miss_ttl_s = miss_ttl_s
        self._clock = clock
        self._misses: dict[str, tuple[NamespaceMode, float]] = {}
        self._lock = memory_lock()

    def mode(self, namespace: str) -> NamespaceMode:
        cached = self.cache.get(namespace)
        if cached is not None:
            return cached
        now = self._clock()
        with self._lock:
            miss = self._misses.get(namespace)
        if miss is not None and miss[1] > now:
            return miss[0]
        try:
            found = mode_from_labels(
                self.api.get("v1", "Namespace", namespace).get("metadata", {}).get("labels")
            )
        except NotFound:
            found = "disabled"
        except KubeError as exc:
            raise CacheError(
                f"cannot tell whether namespace {namespace!r} opted in: {exc}"
            ) from exc
        with self._lock:
            if len(self._misses) > 10_000:
                self._misses.clear()
            self._misses[namespace] = (found, now + self._miss_ttl_s)
        return found


class ExtendedResourceNames(_OnWatchCache):
    """Legacy extended-resource names served natively by some DeviceClass (KEP-5004).

    An apiserver without ``resource.k8s.io/v1`` answers the list with NotFound; that means no
    DeviceClass serves anything, so the cache counts as synced and empty and looks again later.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        watch_timeout_s: float = 240.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._names: frozenset[str] = frozenset()
        self._classes: tuple[ExtendedClass, ...] = ()
        self._on_change = on_change
        self.cache: WatchCache[ExtendedClass | None] = WatchCache(
            api,
            RESOURCE_API,
            "DeviceClass",
            extended_class,
            watch_timeout_s=watch_timeout_s,
            on_change=self._recompute,
            absent_ok=True,
        )

    def _recompute(self) -> None:
        self._classes = tuple(v for v in self.cache.values() if v)
        self._names = frozenset(c.resource for c in self._classes)
        if self._on_change is not None:
            self._on_change()

    def classes(self) -> tuple[ExtendedClass, ...]:
        """Every DeviceClass that claims an extended resource (for the report)."""
        return self._classes

    def names(self) -> frozenset[str]:
        return self._names


class NamespaceQuotas(_OnWatchCache):
    """Namespace -> the GPU lines of its ResourceQuotas, from a watch of every ResourceQuota."""

    def __init__(self, api: KubeApi, *, watch_timeout_s: float = 240.0) -> None:
        self._by_namespace: dict[str, NamespaceQuota] = {}
        self.cache: WatchCache[tuple[str, Obj]] = WatchCache(
            api,
            "v1",
            "ResourceQuota",
            lambda q: (str(q.get("metadata", {}).get("namespace") or ""), q),
            watch_timeout_s=watch_timeout_s,
            on_change=self._recompute,
        )

    def _recompute(self) -> None:
        grouped: dict[str, list[Obj]] = {}
        for namespace, quota in self.cache.values():
            grouped.setdefault(namespace, []).append(quota)
        found = {ns: read_quotas(quotas) for ns, quotas in grouped.items()}
        self._by_namespace = {ns: q for ns, q in found.items() if q.limits_gpus}

    def quota(self, namespace: str) -> NamespaceQuota:
        return self._by_namespace.get(namespace, NO_QUOTA)


class StaticQuotas:
    """No quotas: ``--dev`` has no cluster."""

    synced = True

    def quota(self, namespace: str) -> NamespaceQuota:
        return NO_QUOTA


class StaticNamespaceModes:
    """Every namespace in one mode: ``--dev`` has no cluster to read labels from."""

    def __init__(self, mode: NamespaceMode = "enabled") -> None:
        self._mode: NamespaceMode = mode
        self.synced = True

    def mode(self, namespace: str) -> NamespaceMode:
        return self._mode


class StaticExtendedNames:
    def __init__(self, classes: tuple[ExtendedClass, ...] = ()) -> None:
        self._classes = classes
        self._names = frozenset(c.resource for c in classes)
        self.synced = True

    def names(self) -> frozenset[str]:
        return self._names

    def classes(self) -> tuple[ExtendedClass, ...]:
        return self._classes
