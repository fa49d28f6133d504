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

Each sits on :class:`kube.watch_cache.WatchCache` (list, then watch; ``synced`` after the first
list feeds ``/readyz``), with the OS lock of :mod:`webhook.locks`. The ``Static*`` twins serve
``--dev`` and tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpu_slicer.core.identity import MIGRATION_LABEL, RESOURCE_API, NamespaceMode
from gpu_slicer.kube.api import KubeApi, Obj
from gpu_slicer.kube.errors import KubeError, NotFound
from gpu_slicer.kube.watch_cache import WatchCache
from gpu_slicer.webhook.errors import WebhookError
from gpu_slicer.webhook.extended import ExtendedClass, extended_class
from gpu_slicer.webhook.locks import memory_lock
from gpu_slicer.webhook.quota import NO_QUOTA, NamespaceQuota, read_quotas

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
            lock=memory_lock(),
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
            lock=memory_lock(),
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
            lock=memory_lock(),
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
