"""An apiserver in memory: the KubeApi every test and the simulator use instead of a cluster.

It keeps what callers rely on from the real apiserver: one global, monotonically increasing
``resourceVersion``; ``uid``, ``creationTimestamp`` and ``generation``; optimistic concurrency
(Conflict on a stale ``resourceVersion``); label and field selectors; merge and JSON patches;
finalizers; watches that replay history after a version, turn label changes into ADDED/DELETED
for filtered watchers, and answer 410 Expired once that history is gone. Test hooks inject
errors (:meth:`InMemoryKubeApi.fail_next`), record every call (:attr:`InMemoryKubeApi.calls`,
the raw material for RBAC rules) and model an apiserver with a feature gate off that silently
drops fields (:meth:`InMemoryKubeApi.drop_fields`).

Approximations (also in docs/kube-api.md): server-side apply merges the given fields over the
stored object (maps recursively, lists replaced whole) without field ownership; a strategic
merge patch is applied as a JSON merge patch; field selectors work on any dotted path;
``update`` writes ``status`` too (no status subresource); no admission, defaulting or schema
validation.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import jsonpatch

from gpu_slicer.kube.api import (
    JsonPatch,
    Obj,
    ObjectList,
    PatchType,
    Resource,
    WatchEvent,
    resource_for,
)
from gpu_slicer.kube.errors import AlreadyExists, ApiError, Conflict, Invalid, KubeError, NotFound
from gpu_slicer.kube.selectors import Selector

VERBS: tuple[str, ...] = (
    "get",
    "list",
    "watch",
    "create",
    "update",
    "apply",
    "patch",
    "delete",
    "server_version",
)

# The RBAC verb each KubeApi verb needs (server-side apply is a PATCH).
RBAC_VERB: dict[str, str] = {
    "get": "get",
    "list": "list",
    "watch": "watch",
    "create": "create",
    "update": "update",
    "apply": "patch",
    "patch": "patch",
    "delete": "delete",
}

_MANAGED = ("uid", "creationTimestamp", "resourceVersion", "generation", "deletionTimestamp")
_GENERATE_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


class Call(NamedTuple):
    """One recorded KubeApi call; compares equal to a plain 5-tuple."""

    verb: str
    api_version: str
    kind: str
    namespace: str | None
    name: str | None


@dataclass
class _Injection:
    verb: str
    error: KubeError
    times: int
    kind: str | None


@dataclass(frozen=True)
class _Event:
    rv: int
    key: tuple[str, str]
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    obj: Obj
    old: Obj | None


def copy_obj(value: Any) -> Any:
    """Deep copy of JSON-shaped data (dicts, lists, scalars); several times faster than deepcopy."""
    if isinstance(value, dict):
        return {k: copy_obj(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_obj(v) for v in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, ``null`` deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy_obj(patch)
    result: dict[str, Any] = copy_obj(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _apply_merge(target: Any, given: Any) -> Any:
    """Server-side apply, approximated: maps merge recursively, lists and scalars replace."""
    if isinstance(target, dict) and isinstance(given, dict):
        result = {k: (copy_obj(v) if k not in given else None) for k, v in target.items()}
        for key, value in given.items():
            result[key] = _apply_merge(target.get(key), value)
        return result
    return copy_obj(given)


def _drop_path(obj: Any, path: list[str]) -> None:
    """Remove ``path`` (``a.b[].c``: ``[]`` means every list element) from ``obj`` in place."""
    if not path or not isinstance(obj, dict):
        return
    step, rest = path[0], path[1:]
    each = step.endswith("[]")
    name = step[:-2] if each else step
    if name not in obj:
        return
    if not rest and not each:
        del obj[name]
        return
    child = obj[name]
    if each:
        if isinstance(child, list):
            for item in child:
                _drop_path(item, rest)
    else:
        _drop_path(child, rest)


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _comparable(obj: Obj) -> Obj:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


class InMemoryKubeApi:
    """A thread-safe, in-memory :class:`kube.api.KubeApi` with test hooks.

    ``history`` bounds the events kept for watches: a watch that starts (or falls) further
    behind gets ApiError 410 "Expired", as from a real apiserver whose watch cache moved on.
    ``require_namespaces`` makes namespaced creates fail with NotFound until the Namespace
    exists, as in a real cluster (off by default so tests need not create namespaces).
    """

    def __init__(
        self,
        server_version: tuple[int, int] = (1, 36),
        *,
        history: int = 10_000,
        require_namespaces: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._version = server_version
        self._clock = clock or (lambda: datetime.now(UTC))
        self._require_namespaces = require_namespaces
        self._cond = threading.Condition(threading.RLock())
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._rv = 0
        self._history = max(1, history)
        self._events: list[_Event] = []  # consecutive resourceVersions, oldest first
        self._expired_through = 0  # highest resourceVersion whose event is no longer kept
        self._injections: list[_Injection] = []
        self._drops: dict[str, list[list[str]]] = {}
        self._closed = False
        self.calls: list[Call] = []

    # ----------------------------------------------------------------- test hooks
    def fail_next(
        self, verb: str, error: KubeError, times: int = 1, *, kind: str | None = None
    ) -> None:
        """Make the next ``times`` calls of ``verb`` (on ``kind``, if given) raise ``error``."""
        if verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}; use one of {', '.join(VERBS)}")
        with self._cond:
            self._injections.append(_Injection(verb, error, times, kind))

    def set_server_version(self, major: int, minor: int) -> None:
        with self._cond:
            self._version = (major, minor)

    def drop_fields(self, kind: str, paths: list[str]) -> None:
        """Silently drop these fields of ``kind`` on every write, like a disabled feature gate.

        Paths are dotted, ``[]`` meaning every list element, e.g. ``spec.sharedCounters`` and
        ``spec.devices[].consumesCounters`` for a ResourceSlice without partitionable devices.
        """
        with self._cond:
            self._drops.setdefault(kind, []).extend(p.split(".") for p in paths)

    def stop_dropping(self, kind: str) -> None:
        """Keep every field of ``kind`` again, like a feature gate that was turned on."""
        with self._cond:
            self._drops.pop(kind, None)

    def clear_calls(self) -> None:
        with self._cond:
            self.calls.clear()

    def rbac_verbs(self) -> dict[tuple[str, str], set[str]]:
        """RBAC verbs the recorded calls needed, keyed by (API group, resource plural)."""
        needed: dict[tuple[str, str], set[str]] = {}
        with self._cond:
            calls = list(self.calls)
        for call in calls:
            if call.verb not in RBAC_VERB:
                continue
            res = resource_for(call.api_version, call.kind)
            needed.setdefault((res.group, res.plural), set()).add(RBAC_VERB[call.verb])
        return needed

    def close(self) -> None:
        """End every open watch (they return as if their timeout had passed)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        with self._cond:
            return str(self._rv)

    def objects(self, api_version: str, kind: str) -> list[Obj]:
        """Every stored object of a kind (copies), without recording a call: for assertions."""
        with self._cond:
            return [copy_obj(o) for o in self._objects.get((api_version, kind), {}).values()]

    # ----------------------------------------------------------------- KubeApi
    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj:
        res = resource_for(api_version, kind)
        ns = self._ns(res, namespace)
        with self._cond:
            self._enter("get", res, ns, name)
            stored = self._bucket(res).get((ns, name))
            if stored is None:
                raise self._not_found(res, ns, name)
            return copy_obj(stored)  # type: ignore[no-any-return]

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        res = resource_for(api_version, kind)
        ns = namespace if res.namespaced else None
        selector = Selector.parse(label_selector, field_selector)
        with self._cond:
            self._enter("list", res, ns, None)
            matched = [
                (key, obj)
                for key, obj in self._bucket(res).items()
                if (ns is None or key[0] == ns) and selector.matches(obj)
            ]
            matched.sort(key=lambda pair: pair[0])  # namespace, then name, as the apiserver
            items = [copy_obj(obj) for _, obj in matched]
            return ObjectList(items=items, resource_version=str(self._rv))

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[WatchEvent]:
        """Events after ``resource_version``; without one (or "0"), first an ADDED per object.

        The starting point is fixed when the call returns, so nothing written between the call
        and the first ``next`` is missed. 410 Expired is raised by the call, or during iteration
        when a slow reader falls out of the kept history; wrap the call and the loop.
        """
        res = resource_for(api_version, kind)
        ns = namespace if res.namespaced else None
        selector = Selector.parse(label_selector, field_selector)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._watch(res, ns, selector, resource_version, deadline)

    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        res, ns, name = self._identify(obj, allow_generate=True)
        with self._cond:
            self._enter("create", res, ns, name)
            return self._create(res, ns, name, copy_obj(obj), dry_run=dry_run)

    def update(self, obj: Obj) -> Obj:
        res, ns, name = self._identify(obj)
        with self._cond:
            self._enter("update", res, ns, name)
            stored = self._existing(res, ns, name)
            meta = obj.get("metadata", {})
            self._check_rv(res, ns, name, stored, meta.get("resourceVersion"))
            if meta.get("uid") and meta["uid"] != stored["metadata"]["uid"]:
                raise Conflict(
                    f"{self._describe(res, ns, name)} was deleted and created again (uid "
                    f"{meta['uid']} is now {stored['metadata']['uid']}); read it again"
                )
            return self._write(res, ns, name, stored, copy_obj(obj))

    def apply(self, obj: Obj, *, field_manager: str, force: bool = False) -> Obj:
        if not field_manager:
            raise Invalid("apply needs a field_manager (the name of the writer that owns fields)")
        res, ns, name = self._identify(obj)
        with self._cond:
            self._enter("apply", res, ns, name)
            stored = self._bucket(res).get((ns, name))
            if stored is None:
                new = copy_obj(obj)
                new.setdefault("metadata", {}).pop("resourceVersion", None)
                return self._create(res, ns, name, new, dry_run=False)
            self._check_rv(res, ns, name, stored, obj.get("metadata", {}).get("resourceVersion"))
            merged = _apply_merge(stored, obj)
            return self._write(res, ns, name, stored, merged)

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Obj | JsonPatch,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
    ) -> Obj:
        res = resource_for(api_version, kind)
        ns = self._ns(res, namespace)
        with self._cond:
            self._enter("patch", res, ns, name)
            stored = self._existing(res, ns, name)
            if patch_type in ("merge", "strategic"):
                if not isinstance(patch, dict):
                    raise Invalid(f"a {patch_type} patch must be a JSON object, not {patch!r}")
                new = merge_patch(stored, patch)
            elif patch_type == "json":
                if not isinstance(patch, list):
                    raise Invalid(f"a json patch must be a list of operations, not {patch!r}")
                try:
                    new = jsonpatch.JsonPatch(patch).apply(copy_obj(stored))
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                    raise Invalid(
                        f"json patch on {self._describe(res, ns, name)} failed: {exc}"
                    ) from exc
            else:
                raise ValueError(f"unknown patch_type {patch_type!r}; use merge, json, strategic")
            if not isinstance(new, dict):
                raise Invalid(f"patch on {self._describe(res, ns, name)} did not leave an object")
            patched_rv = new.get("metadata", {}).get("resourceVersion")
            self._check_rv(res, ns, name, stored, patched_rv)
            return self._write(res, ns, name, stored, new)

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
    ) -> None:
        res = resource_for(api_version, kind)
        ns = self._ns(res, namespace)
        with self._cond:
            self._enter("delete", res, ns, name)
            stored = self._existing(res, ns, name)
            self._check_rv(res, ns, name, stored, resource_version)
            if stored["metadata"].get("finalizers"):
                if not stored["metadata"].get("deletionTimestamp"):
                    marked = copy_obj(stored)
                    marked["metadata"]["deletionTimestamp"] = self._now()
                    self._store(res, ns, name, marked, "MODIFIED", stored)
                return
            self._remove(res, ns, name, stored)

    def server_version(self) -> tuple[int, int]:
        with self._cond:
            self._enter("server_version", None, None, None)
            return self._version

    # ----------------------------------------------------------------- internals
    def _create(self, res: Resource, ns: str, name: str, new: Obj, *, dry_run: bool) -> Obj:
        meta = new.setdefault("metadata", {})
        if meta.get("resourceVersion"):
            raise Invalid(
                f"{res.kind} {name or meta.get('generateName')}: metadata.resourceVersion "
                "must not be set on create; drop it (or use update)"
            )
        if self._require_namespaces and ns:
            if ("", ns) not in self._bucket(resource_for("v1", "Namespace")):
                raise NotFound(f'namespaces "{ns}" not found')
        if not name:
            name = self._generate_name(res, ns, meta["generateName"])
            meta["name"] = name
        if (ns, name) in self._bucket(res):
            raise AlreadyExists(self._describe(res, ns, name) + " already exists")
        if res.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self._now()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        self._drop(res, new)
        if dry_run:
            return new
        return self._store(res, ns, name, new, "ADDED", None)

    def _enter(self, verb: str, res: Resource | None, ns: str | None, name: str | None) -> None:
        """Record the call and raise an injected error if one is due (lock held)."""
        if res is not None:
            self.calls.append(Call(verb, res.api_version, res.kind, ns or None, name))
        for injection in self._injections:
            if injection.verb == verb and (
                injection.kind is None or (res is not None and injection.kind == res.kind)
            ):
                injection.times -= 1
                if injection.times <= 0:
                    self._injections.remove(injection)
                raise injection.error

    def _bucket(self, res: Resource) -> dict[tuple[str, str], Obj]:
        return self._objects.setdefault((res.api_version, res.kind), {})

    @staticmethod
    def _ns(res: Resource, namespace: str | None) -> str:
        if not res.namespaced:
            return ""
        if not namespace:
            raise Invalid(f"{res.kind} is namespaced: pass the namespace")
        return namespace

    def _identify(self, obj: Obj, *, allow_generate: bool = False) -> tuple[Resource, str, str]:
        if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
            raise Invalid("the object needs apiVersion and kind")
        res = resource_for(obj["apiVersion"], obj["kind"])
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        if not name and not (allow_generate and meta.get("generateName")):
            raise Invalid(f"{res.kind}: metadata.name (or generateName on create) is required")
        ns = meta.get("namespace") or ""
        if res.namespaced and not ns:
            raise Invalid(f"{res.kind} {name}: metadata.namespace is required (namespaced kind)")
        return res, (ns if res.namespaced else ""), name

    def _generate_name(self, res: Resource, ns: str, prefix: str) -> str:
        bucket = self._bucket(res)
        while True:
            suffix = "".join(
                _GENERATE_SUFFIX[b % len(_GENERATE_SUFFIX)] for b in uuid.uuid4().bytes[:5]
            )
            if (ns, prefix + suffix) not in bucket:
                return prefix + suffix

    def _existing(self, res: Resource, ns: str, name: str) -> Obj:
        stored = self._bucket(res).get((ns, name))
        if stored is None:
            raise self._not_found(res, ns, name)
        return stored

    def _check_rv(
        self, res: Resource, ns: str, name: str, stored: Obj, resource_version: str | None
    ) -> None:
        current = stored["metadata"]["resourceVersion"]
        if resource_version and resource_version != current:
            raise Conflict(
                f"Operation cannot be fulfilled on {self._describe(res, ns, name)}: the object "
                f"has been modified (resourceVersion {resource_version} is stale, now {current}); "
                "read it again and retry"
            )

    def _write(self, res: Resource, ns: str, name: str, stored: Obj, new: Obj) -> Obj:
        """Store ``new`` in place of ``stored``, keeping server-managed metadata."""
        meta = new.setdefault("metadata", {})
        old_meta = stored["metadata"]
        for key in _MANAGED:
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["name"] = name
        if res.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        self._drop(res, new)
        if _spec_part(new) != _spec_part(stored):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        if _comparable(new) == _comparable(stored):
            return copy_obj(stored)  # type: ignore[no-any-return]  # no-op: no new version
        if old_meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(res, ns, name, new)
            return copy_obj(new)  # type: ignore[no-any-return]
        return self._store(res, ns, name, new, "MODIFIED", stored)

    def _store(
        self,
        res: Resource,
        ns: str,
        name: str,
        obj: Obj,
        type_: Literal["ADDED", "MODIFIED"],
        old: Obj | None,
    ) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._bucket(res)[(ns, name)] = obj
        self._record(_Event(self._rv, (res.api_version, res.kind), type_, obj, old))
        return copy_obj(obj)  # type: ignore[no-any-return]

    def _remove(self, res: Resource, ns: str, name: str, last: Obj) -> None:
        del self._bucket(res)[(ns, name)]
        self._rv += 1
        gone = copy_obj(last)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._record(_Event(self._rv, (res.api_version, res.kind), "DELETED", gone, last))

    def _record(self, event: _Event) -> None:
        self._events.append(event)
        if len(self._events) > self._history + self._history // 2:
            # Trim in batches so that a write stays O(1) amortised.
            cut = len(self._events) - self._history
            self._expired_through = self._events[cut - 1].rv
            del self._events[:cut]
        self._cond.notify_all()

    def _drop(self, res: Resource, obj: Obj) -> None:
        for path in self._drops.get(res.kind, ()):
            _drop_path(obj, path)

    def _now(self) -> str:
        return self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    @staticmethod
    def _describe(res: Resource, ns: str, name: str) -> str:
        where = f' in namespace "{ns}"' if ns else ""
        return f'{res.plural}.{res.group or "core"} "{name}"{where}'

    def _not_found(self, res: Resource, ns: str, name: str) -> NotFound:
        return NotFound(self._describe(res, ns, name) + " not found")

    def _expired(self, since: int) -> ApiError:
        return ApiError(
            f"too old resource version: {since} (oldest kept is {self._expired_through + 1}); "
            "list again and watch from the list's resourceVersion",
            status=410,
            reason="Expired",
        )

    def _watch(
        self,
        res: Resource,
        ns: str | None,
        selector: Selector,
        resource_version: str | None,
        deadline: float | None,
    ) -> Iterator[WatchEvent]:
        key = (res.api_version, res.kind)

        def visible(obj: Obj | None) -> bool:
            if obj is None:
                return False
            if ns is not None and obj["metadata"].get("namespace") != ns:
                return False
            return selector.matches(obj)

        pending: list[WatchEvent] = []
        with self._cond:
            self._enter("watch", res, ns, None)
            if resource_version in (None, "", "0"):
                cursor = self._rv
                matched = [(k, obj) for k, obj in self._bucket(res).items() if visible(obj)]
                matched.sort(key=lambda pair: pair[0])
                pending = [WatchEvent("ADDED", copy_obj(obj)) for _, obj in matched]
            else:
                try:
                    cursor = int(str(resource_version))
                except ValueError:
                    raise Invalid(f"resourceVersion {resource_version!r} is not valid") from None
                if cursor < self._expired_through:
                    raise self._expired(cursor)
        return self._follow(key, visible, cursor, pending, deadline)

    def _follow(
        self,
        key: tuple[str, str],
        visible: Callable[[Obj | None], bool],
        cursor: int,
        pending: Sequence[WatchEvent],
        deadline: float | None,
    ) -> Iterator[WatchEvent]:
        yield from pending
        while True:
            batch: list[WatchEvent] = []
            with self._cond:
                while True:
                    if cursor < self._expired_through:
                        raise self._expired(cursor)
                    start = cursor - self._expired_through  # events hold rv+1, rv+2, ...
                    for event in self._events[max(0, start) :]:
                        cursor = event.rv
                        if event.key != key:
                            continue
                        translated = self._translate(event, visible)
                        if translated is not None:
                            batch.append(translated)
                    if batch:
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if self._closed or (remaining is not None and remaining <= 0):
                        return
                    self._cond.wait(remaining)
            yield from batch

    @staticmethod
    def _translate(event: _Event, visible: Callable[[Obj | None], bool]) -> WatchEvent | None:
        """What a filtered watcher sees: leaving the selection is DELETED, entering is ADDED."""
        now = visible(event.obj)
        before = visible(event.old) if event.type == "MODIFIED" else False
        if event.type == "DELETED":
            return WatchEvent("DELETED", copy_obj(event.obj)) if now or visible(event.old) else None
        if now and before:
            return WatchEvent("MODIFIED", copy_obj(event.obj))
        if now:
            return WatchEvent("ADDED", copy_obj(event.obj))
        if before:
            return WatchEvent("DELETED", copy_obj(event.obj))
        return None
