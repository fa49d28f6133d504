"""A watch-backed cache of one kind: list, then follow the watch, list again when it breaks.

Both components keep cluster state this way: the webhook its namespaces, DeviceClasses and
quotas (admission answers from memory), the agent its claims and the claim templates whose
profiles it advertises. ``extract`` reduces each object to what the caller needs, once per
event. A watch that ends is resumed from the last resourceVersion; 410 Expired or any other
failure lists again (after a pause that doubles up to a cap). ``synced`` turns true after the
first successful list; a kind the apiserver does not serve (``absent_ok``) counts as synced
and empty, and is looked for again much later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from gpu_slicer.kube.api import KubeApi, Obj
from gpu_slicer.kube.errors import ApiError, KubeError, NotFound

log = logging.getLogger(__name__)

T = TypeVar("T")


class Lock(Protocol):
    """What the cache needs of a lock (``threading.Lock``, or the webhook's OS lock under
    gevent)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *args: Any) -> Any: ...


class WatchCache(Generic[T]):
    """Objects of one kind (those ``field_selector`` selects, if given), reduced by ``extract``
    and keyed by (namespace, name), kept current."""

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
        on_error: Callable[[str], None] | None = None,
        absent_ok: bool = False,
        lock: Lock | None = None,
        field_selector: str | None = None,
    ) -> None:
        self.api = api
        self._field_selector = field_selector
        self._absent_ok = absent_ok
        self.api_version = api_version
        self.kind = kind
        self._extract = extract
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff_s
        self._on_change = on_change
        self._on_error = on_error
        self._items: dict[tuple[str, str], T] = {}
        self._lock = lock or threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resource_version: str | None = None
        self.failures = 0
        """Consecutive failed lists and watches (0 while the API answers)."""
        self.last_error: str | None = None

    @property
    def synced(self) -> bool:
        """Listed at least once: the cache holds the kind, if perhaps a little stale."""
        return self._synced.is_set()

    @property
    def current(self) -> bool:
        """Listed, and no list or watch has failed since: only then is "not in the cache"
        evidence that an object does not exist (an apiserver out of reach is not)."""
        return self._synced.is_set() and self.failures == 0

    def get(self, name: str, namespace: str = "") -> T | None:
        with self._lock:
            return self._items.get((namespace, name))

    def values(self) -> list[T]:
        with self._lock:
            return list(self._items.values())

    def items(self) -> list[tuple[tuple[str, str], T]]:
        """((namespace, name), value) of every object kept."""
        with self._lock:
            return list(self._items.items())

    def store(self, obj: Obj) -> T:
        """Keep ``obj`` (read by the caller, say on a miss) until the watch says otherwise."""
        value = self._extract(obj)
        with self._lock:
            self._items[object_key(obj)] = value
        return value

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
            except Exception as exc:  # never let the watch thread die
                log.exception("watch crashed; listing again", extra={"kind": self.kind})
                delay = self._pause(delay, exc)

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
        self.failures += 1
        self.last_error = str(exc)
        if self._on_error is not None:
            self._on_error(str(exc))
        log.warning(
            "watch failed; listing again after a pause",
            extra={
                "kind": self.kind,
                "error": str(exc),
                "retry_in_s": delay,
                "failures": self.failures,
            },
        )
        self._resource_version = None
        self._stop.wait(delay)
        return min(delay * 2, self._backoff[1])

    def relist(self) -> None:
        """Replaces the contents with a fresh list (also usable without the thread)."""
        listed = self.api.list(self.api_version, self.kind, field_selector=self._field_selector)
        items = {object_key(obj): self._extract(obj) for obj in listed.items}
        with self._lock:
            self._items = items
        self._resource_version = listed.resource_version
        self.failures = 0
        self.last_error = None
        self._synced.set()
        self._changed()

    def follow(self) -> None:
        """Applies watch events until the watch ends (timeout, stop)."""
        for event in self.api.watch(
            self.api_version,
            self.kind,
            resource_version=self._resource_version,
            field_selector=self._field_selector,
            timeout_s=self._watch_timeout_s,
        ):
            if self._stop.is_set():
                return
            rv = event.object.get("metadata", {}).get("resourceVersion")
            if event.type == "BOOKMARK":
                self._resource_version = rv or self._resource_version
                continue
            key = object_key(event.object)
            if event.type == "DELETED":
                with self._lock:
                    self._items.pop(key, None)
            else:
                value = self._extract(event.object)
                with self._lock:
                    self._items[key] = value
            self._resource_version = rv or self._resource_version
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:  # a caller's bug must not stop the cache
                log.exception("watch change callback failed", extra={"kind": self.kind})


def object_key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return (meta.get("namespace") or "", meta.get("name") or "")
