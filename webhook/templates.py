"""Making sure the ResourceClaimTemplates that converted pods name exist, and removing stale ones.

A converted pod names a content-addressed template ``gpu-slicer-<hash>`` in its namespace; the
kube-controller-manager creates the pod's claim from it, so the template must exist before the
pod is admitted. :class:`ApiTemplates` creates it (AlreadyExists is success) and remembers which
templates exist, so a busy namespace costs one API call per template per ``ttl_s`` rather than
one per pod. An API failure raises :class:`TemplateError`: the server answers HTTP 500 and the
webhook's failurePolicy decides. A dryRun request never creates anything.

Garbage collection (:class:`TemplateCollector`) deletes the templates the webhook made that no
pod has referenced for ``policy.template_gc_after_s``. Templates ``gpu-slicer convert`` wrote
carry ``gpu-slicer.io/origin: convert``: Git owns them, and a suspended CronJob or a Deployment
scaled to zero still needs its template when it runs again, so they are never collected. It is
safe with any number of replicas running it at once, without leader election:

1. Every create, and every cache miss that finds the template already there, stamps the
   annotation ``gpu-slicer.io/last-referenced`` with the current time. A replica only trusts
   its cache for ``ttl_s <= gc_after_s / 2``, so a pod admitted from the cache at time t implies
   a stamp no older than ``t - ttl_s``: the collector, which waits ``gc_after_s`` after the
   stamp, cannot have deleted the template the pod names.
2. The collector stamps templates it sees referenced by a pod, so long-lived pods keep theirs.
3. Before deleting, the collector lists the namespace's pods again and deletes with the
   template's resourceVersion as a precondition: a stamp written meanwhile by any replica
   changes the resourceVersion, the delete fails with Conflict and the template stays.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from gpu_slicer.core.identity import MANAGED_BY, MANAGED_BY_LABEL, RESOURCE_API
from gpu_slicer.kube.api import KubeApi, Obj
from gpu_slicer.kube.errors import AlreadyExists, Conflict, Forbidden, KubeError, NotFound
from gpu_slicer.webhook.errors import TemplateError
from gpu_slicer.webhook.locks import memory_lock

log = logging.getLogger(__name__)

KIND = "ResourceClaimTemplate"
LAST_REFERENCED = "gpu-slicer.io/last-referenced"
ORIGIN_LABEL = "gpu-slicer.io/origin"
"""Who wrote a template: the webhook (collected once unused) or ``convert`` (Git owns it)."""
ORIGIN_WEBHOOK = "webhook"
ORIGIN_CONVERT = "convert"
COLLECTABLE = f"{MANAGED_BY_LABEL}={MANAGED_BY},{ORIGIN_LABEL}!={ORIGIN_CONVERT}"
"""The collector's selector: gpu-slicer's templates, except those ``convert`` wrote for Git
(templates the webhook made before the origin label existed have none, and are collected)."""
KNOWN_MAX = 50_000
"""Templates remembered as existing (or reported) per process; past this the memory starts over
(a busy cluster has far fewer: one per namespace and distinct GPU request)."""

Action = Callable[[str], None]


def _noop(action: str) -> None:
    """Default for the ``on_action`` hook."""


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


class TemplateEnsurer(Protocol):
    """What the admission engine needs: make these templates exist (or say why not)."""

    def ensure(self, templates: Sequence[Obj], *, dry_run: bool) -> None: ...


class ApiTemplates:
    """Creates templates through the Kubernetes API, remembering those known to exist."""

    def __init__(
        self,
        api: KubeApi,
        *,
        ttl_s: float = 600.0,
        gc_after_s: Callable[[], int] = lambda: 86400,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_action: Action = _noop,
    ) -> None:
        self.api = api
        self._ttl_s = ttl_s
        self._gc_after_s = gc_after_s
        self._clock = clock
        self._wall = wall_clock
        self._on_action = on_action
        self._known: dict[tuple[str, str], float] = {}
        """(namespace, name) -> when the template was last confirmed (``clock``). The trust
        window is applied at lookup, so a policy reload that shortens the GC delay also
        shortens it for templates confirmed before the reload."""
        self._lock = memory_lock()

    def ttl_s(self) -> float:
        """How long a known template is trusted: never more than half the GC delay."""
        gc_after = self._gc_after_s()
        return self._ttl_s if gc_after <= 0 else min(self._ttl_s, gc_after / 2)

    def is_known(self, namespace: str, name: str) -> bool:
        with self._lock:
            confirmed = self._known.get((namespace, name))
        return confirmed is not None and self._clock() - confirmed < self.ttl_s()

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._known.pop((namespace, name), None)

    def ensure(self, templates: Sequence[Obj], *, dry_run: bool) -> None:
        if dry_run:
            return
        for template in templates:
            meta = template.get("metadata", {})
            namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            if self.is_known(namespace, name):
                continue
            self._ensure_one(template, namespace, name)
            with self._lock:
                if len(self._known) > KNOWN_MAX:
                    self._known.clear()
                self._known[(namespace, name)] = self._clock()

    def _ensure_one(self, template: Obj, namespace: str, name: str) -> None:
        stamp = _rfc3339(self._wall())
        where = f"ResourceClaimTemplate {namespace}/{name}"
        try:
            for _attempt in range(2):
                try:
                    self.api.create(_stamped(template, stamp))
                    self._on_action("created")
                    log.info("created template", extra={"template": f"{namespace}/{name}"})
                    return
                except AlreadyExists:
                    pass
                try:
                    existing = self.api.patch(
                        RESOURCE_API,
                        KIND,
                        name,
                        {"metadata": {"annotations": {LAST_REFERENCED: stamp}}},
                        namespace=namespace,
                    )
                except NotFound:
                    continue  # deleted between our create and patch: create it again
                self._on_action("existed")
                labels = existing.get("metadata", {}).get("labels") or {}
                if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
                    log.warning(
                        "a template with gpu-slicer's name is not managed by gpu-slicer",
                        extra={"template": f"{namespace}/{name}"},
                    )
                return
            raise TemplateError(f"{where} kept disappearing while being created; retry")
        except Forbidden as exc:
            self._on_action("failed")
            raise TemplateError(
                f"not allowed to create {where}: give the webhook's service account create and "
                f"patch on resourceclaimtemplates ({exc})"
            ) from exc
        except KubeError as exc:
            self._on_action("failed")
            raise TemplateError(f"cannot create {where}: {exc}") from exc


def _stamped(template: Obj, stamp: str) -> Obj:
    obj = copy.deepcopy(template)
    meta = obj.setdefault("metadata", {})
    labels = meta.setdefault("labels", {})
    labels.setdefault(MANAGED_BY_LABEL, MANAGED_BY)
    labels.setdefault(ORIGIN_LABEL, ORIGIN_WEBHOOK)
    meta.setdefault("annotations", {})[LAST_REFERENCED] = stamp
    return obj


@dataclass
class ReportingTemplates:
    """``--dev``: no cluster, so templates are only reported (logged, counted and remembered),
    each once per namespace and name, as a cluster creates each once and then knows it: the
    replicas of a workload do not log and count the same template again."""

    on_action: Action = _noop
    reported: list[str] = field(default_factory=list)
    """The first 1,000 reported, in order (for tests and ``--dev`` sessions)."""
    _seen: set[str] = field(default_factory=set)

    def ensure(self, templates: Sequence[Obj], *, dry_run: bool) -> None:
        if dry_run:
            return
        for template in templates:
            meta = template.get("metadata", {})
            ref = f"{meta.get('namespace')}/{meta.get('name')}"
            if ref in self._seen:
                continue
            if len(self._seen) >= KNOWN_MAX:
                self._seen.clear()
            self._seen.add(ref)
            log.info("would create template (dev mode: no cluster)", extra={"template": ref})
            self.on_action("reported")
            if len(self.reported) < 1000:
                self.reported.append(ref)


@dataclass
class SweepResult:
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    stamped: list[str] = field(default_factory=list)


class TemplateCollector:
    """Deletes managed templates that no pod has referenced for ``gc_after_s``."""

    def __init__(
        self,
        api: KubeApi,
        *,
        gc_after_s: Callable[[], int],
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        forget: Callable[[str, str], None] = lambda namespace, name: None,
        on_action: Action = _noop,
    ) -> None:
        self.api = api
        self._gc_after_s = gc_after_s
        self._wall = wall_clock
        self._forget = forget
        self._on_action = on_action

    def _referenced(self, namespace: str) -> set[str]:
        names: set[str] = set()
        for pod in self.api.list("v1", "Pod", namespace).items:
            for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
                if isinstance(claim, dict) and claim.get("resourceClaimTemplateName"):
                    names.add(str(claim["resourceClaimTemplateName"]))
        return names

    def sweep(self) -> SweepResult:
        """One pass over every managed template; raises ``KubeError`` if a list fails."""
        result = SweepResult()
        gc_after = self._gc_after_s()
        if gc_after <= 0:
            return result
        now = self._wall()
        stamp = _rfc3339(now)
        templates = self.api.list(RESOURCE_API, KIND, label_selector=COLLECTABLE).items
        referenced: dict[str, set[str]] = {}
        for template in templates:
            meta = template["metadata"]
            namespace, name = meta.get("namespace", ""), meta["name"]
            ref = f"{namespace}/{name}"
            if namespace not in referenced:
                referenced[namespace] = self._referenced(namespace)
            last = _parse_time((meta.get("annotations") or {}).get(LAST_REFERENCED)) or (
                _parse_time(meta.get("creationTimestamp")) or now
            )
            age = (now - last).total_seconds()
            if name in referenced[namespace]:
                if age >= gc_after / 4:  # keep the stamp fresh without writing every sweep
                    self._stamp(namespace, name, stamp)
                    result.stamped.append(ref)
                result.kept.append(ref)
                continue
            if age < gc_after or name in self._referenced(namespace):
                result.kept.append(ref)
                continue
            try:
                self.api.delete(
                    RESOURCE_API,
                    KIND,
                    name,
                    namespace,
                    resource_version=meta.get("resourceVersion"),
                )
            except (Conflict, NotFound):
                result.kept.append(ref)  # stamped or deleted by someone else meanwhile
                continue
            self._forget(namespace, name)
            self._on_action("deleted")
            result.deleted.append(ref)
            log.info("deleted unused template", extra={"template": ref, "unused_s": int(age)})
        return result

    def _stamp(self, namespace: str, name: str, stamp: str) -> None:
        try:
            self.api.patch(
                RESOURCE_API,
                KIND,
                name,
                {"metadata": {"annotations": {LAST_REFERENCED: stamp}}},
                namespace=namespace,
            )
        except NotFound:
            pass


class CollectorLoop:
    """Runs :meth:`TemplateCollector.sweep` every ``interval_s`` in a daemon thread.

    ``may_run`` lets only one of several gunicorn workers sweep (a file lock); several
    replicas sweeping at once are safe by construction (see the module docstring).
    """

    def __init__(
        self,
        collector: TemplateCollector,
        *,
        interval_s: float,
        may_run: Callable[[], bool] = lambda: True,
    ) -> None:
        self.collector = collector
        self.interval_s = interval_s
        self._may_run = may_run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="template-gc", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop and wait for a sweep in progress, so nothing runs (or logs) after shutdown."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._may_run():
                continue
            try:
                result = self.collector.sweep()
            except KubeError as exc:
                log.warning("template garbage collection failed", extra={"error": str(exc)})
                continue
            if result.deleted:
                log.info("template garbage collection", extra={"deleted": len(result.deleted)})
