"""Publishing the node's pool: the I/O edge between the inventory and the Kubernetes API.

:class:`SlicePublisher` turns GPU states into the pool's ResourceSlices (:mod:`slicer.inventory`)
and makes the API hold exactly those:

* nothing changed (same names, specs and labels): no writes at all;
* otherwise the pool generation goes up by one and every slice is written with it (update in
  place, create what is new), then slices of the pool that are no longer wanted are deleted. The
  scheduler ignores a pool until all ``resourceSliceCount`` slices of its newest generation are
  there, so it never mixes an old pool with a new one;
* with a :class:`slicer.ordering.RepublishLimiter`, a change that can wait is debounced and
  rate-limited: a new device order alone (the ``best-fit`` policy reacting to allocations), or
  devices left out because allocations beside them took their counters
  (:func:`slicer.inventory.beside_claims`). The call returns ``deferred_s`` and the caller
  publishes again after that long. A device listed again once its neighbour is freed is
  written at once: until then no pod can have it;
* Conflict (someone wrote in between) and Unavailable are retried with exponential backoff
  (waiting on the publisher's :class:`slicer.clock.Clock`); other API errors raise
  :class:`slicer.errors.PublishError`;
* what was written is read back from each write's reply (the object as stored). An apiserver
  without partitionable devices drops ``sharedCounters`` and ``consumesCounters`` silently;
  then overlapping slices would look independent and the scheduler could hand out two of
  them. The publisher therefore switches to the static layout (only existing instances, no
  counters), republishes, and says so: a warning log, a Warning Event on the Node and the
  metrics ``gpu_slicer_slices_counters_dropped`` and ``gpu_slicer_slices_static_layout``;
* every ``recheck_interval_s`` (10 minutes by default) the publisher re-reads the apiserver's
  version (a new version may pack the pool into slices differently), and, while it is in the
  fallback, probes whether partitionable devices work now: a server-side dry-run create of the
  slices of partitionable devices that carry counters. Nothing is stored, so the scheduler never
  sees devices without their counters; when the counters survive the dry run the publisher
  switches back, writes partitionable devices again (whose read-back is checked as always) and
  says so (info log, a Normal Event ``PartitionableDevicesAvailable``,
  ``gpu_slicer_slices_static_layout`` 0, ``gpu_slicer_slices_partitionable_restored_total``). A
  switch back that the real write then contradicts doubles the wait before the next probe (up to
  a day), so a server whose dry run and writes disagree cannot make the pool flap. A static
  layout the caller asked for is never probed away.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from gpu_slicer.core.devices import DeviceSpec, SliceSpec, parse_device_name
from gpu_slicer.core.errors import DeviceNameError
from gpu_slicer.core.identity import DOMAIN, DRIVERS, RESOURCE_API
from gpu_slicer.kube import errors as kerr
from gpu_slicer.kube.api import KubeApi, event_for
from gpu_slicer.slicer import scaling
from gpu_slicer.slicer.agent_metrics import PublisherMetrics
from gpu_slicer.slicer.clock import SYSTEM_CLOCK, Clock
from gpu_slicer.slicer.demand import Advertised
from gpu_slicer.slicer.device_attributes import DeviceAttributes
from gpu_slicer.slicer.errors import PublishError
from gpu_slicer.slicer.inventory import (
    ADVERTISED_ANNOTATION,
    GpuState,
    PoolPlan,
    plan_pool,
)
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.slicer.ordering import DeviceOrder, RepublishLimiter, order_fingerprint
from gpu_slicer.slicer.profile_filter import ProfileChoice, ProfileFilter
from gpu_slicer.slicer.retry import RetrySettings, retrying

Obj = dict[str, Any]
T = TypeVar("T")
KIND = "ResourceSlice"
REPORTING_CONTROLLER = f"{DOMAIN}/node-agent"
FALLBACK_REASON = "PartitionableDevicesUnavailable"
RESTORED_REASON = "PartitionableDevicesAvailable"
PROBE_NAME_PREFIX = "gpu-slicer-io-probe-"
"""``generateName`` of the dry-run probe slices (never stored)."""
MAX_PROBE_BACKOFF = 144
"""The probe interval grows at most this many times (10 minutes -> one day)."""
NODE_LOOK_AGAIN_S = 10.0
"""How often a pass looks for a Node that was not found (deleted; its kubelet registers it
again under a new uid when it restarts), to write the slices again for it."""

log = logging.getLogger("gpu_slicer.slicer.publisher")


class AdvertiseState(enum.Enum):
    """What the pool advertises (partitionable devices, or the static MIG layout), and why;
    :class:`SlicePublisher` lists the moves. Named for ``agent run --advertise``."""

    PARTITIONABLE = "partitionable"
    """Every slice the GPUs can host, with counters; each write's read-back is checked."""
    STATIC = "static"
    """The caller asked for the static layout: never checked, probed or left."""
    FELL_BACK = "fell-back"
    """Static because the apiserver dropped counters; a due recheck probes whether it still does."""
    RESTORED = "restored"
    """A probe found counters kept; the next write's read-back confirms that or falls back."""

    @property
    def static(self) -> bool:
        """Only existing instances, without counters, are advertised in this state."""
        return self in (AdvertiseState.STATIC, AdvertiseState.FELL_BACK)


@dataclass(frozen=True, kw_only=True)
class PublishResult:
    """What a :meth:`SlicePublisher.publish` call did."""

    changed: bool
    generation: int
    slices: tuple[str, ...]
    deleted: tuple[str, ...]
    static: bool
    fell_back: bool
    """True when this call found counters dropped and switched to the static layout."""
    plan: PoolPlan
    deferred_s: float | None = None
    """Only the device order changed and the limiter held it back: publish again after this."""


class SlicePublisher:
    """Keeps one node's pool in the API equal to what its GPUs offer.

    Whether counters are published is a small state machine (:class:`AdvertiseState`). It starts in
    STATIC when the caller asks for the static layout, else in PARTITIONABLE, and moves thus:

    ==============  =========================================  =================================
    from            on                                         to
    ==============  =========================================  =================================
    PARTITIONABLE   a write's read-back lacks counters         FELL_BACK
    FELL_BACK       a due recheck's dry-run probe keeps them   RESTORED
    RESTORED        a write's read-back keeps counters         PARTITIONABLE, probe interval x1
    RESTORED        a write's read-back lacks counters         FELL_BACK, probe interval x2
    STATIC          nothing (asked for, so never probed away)  STATIC
    ==============  =========================================  =================================

    Entering FELL_BACK warns (log, Warning Event, metrics) and the same :meth:`publish` call
    writes again in the static layout; entering RESTORED says so (log, Normal Event, metrics)
    before that call writes partitionable devices. Only FELL_BACK stretches the recheck
    interval (by the probe interval factor, at most ``MAX_PROBE_BACKOFF``); a new apiserver
    version resets the factor to one.
    """

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        *,
        device_order: DeviceOrder | str = "best-fit",
        server_version: tuple[int, int] | None = None,
        static: bool = False,
        static_layout: StaticLayout | None = None,
        profiles: ProfileFilter | None = None,
        attributes: DeviceAttributes = "full",
        metrics: PublisherMetrics | None = None,
        retry: RetrySettings | None = None,
        limiter: RepublishLimiter | None = None,
        recheck_interval_s: float | None = 600.0,
        clock: Clock = SYSTEM_CLOCK,
        report_scaling: bool = True,
    ) -> None:
        self._api = api
        self._node = node_name
        self._device_order = device_order
        self._version = server_version
        self._static_layout = static_layout
        self._profiles = profiles
        self._attributes: DeviceAttributes = attributes
        self.metrics = metrics or PublisherMetrics()
        self._retry = retry or RetrySettings()
        self._limiter = limiter
        self._pinned_version = server_version is not None
        """A version given by the caller is never re-read."""
        self._state = AdvertiseState.STATIC if static else AdvertiseState.PARTITIONABLE
        self._recheck_s = recheck_interval_s if recheck_interval_s else None
        self._clock = clock
        self._next_check: float | None = None
        self._probe_backoff = 1
        """The FELL_BACK recheck interval's factor: doubles each time a probe proves wrong."""
        self._version_stale = False
        """A write was Invalid: re-read the version at the next publish, due or not."""
        self._node_seen = False
        """The Node was read once: a later 404 means it was deleted, not that none exists here
        (an API without Nodes: tests, the simulator)."""
        self._node_missing = False
        """The Node, seen before, was not found at the last pass: its kubelet may register it
        again (with a new uid) without anything else changing, so passes come every
        NODE_LOOK_AGAIN_S."""
        self._owner: Obj | None = None
        """The owner reference last read from the Node (None: none could be had)."""
        self._generation = 0
        """The highest generation written, so a pool that emptied out never goes back in time."""
        self._warned_release: tuple[int, int] | None = None
        """The release last warned about for quadratic scheduling (once per release)."""
        self._report_scaling = report_scaling
        """False where no real scheduler reads the pool (the simulator)."""
        self._chosen: ProfileChoice | None = None
        """The profiles the current :meth:`publish` call advertises (None: ``profiles``)."""
        self.metrics.static_layout.set(1 if static else 0)

    @property
    def state(self) -> AdvertiseState:
        """Where the publisher is in the fallback state machine (see the class docstring)."""
        return self._state

    @property
    def static(self) -> bool:
        """True when only existing instances are advertised (configured, or after a fallback)."""
        return self._state.static

    @property
    def fell_back(self) -> bool:
        """True while in the static layout because the apiserver dropped counters."""
        return self._state is AdvertiseState.FELL_BACK

    def recheck_in(self) -> float | None:
        """Seconds until the next version check (and, in the fallback, probe); None: never.

        The caller should publish again after this long even if nothing changed.
        """
        waits = [NODE_LOOK_AGAIN_S] if self._node_missing else []
        if self._recheck_s is not None:
            if self._next_check is None:
                waits.append(self._interval())
            else:
                waits.append(max(0.0, self._next_check - self._clock.monotonic()))
        return min(waits) if waits else None

    def published_profiles(self) -> set[str]:
        """The MIG profiles this node's pool holds in the API now: its devices', and those its
        annotation says were chosen (on busy GPUs, allocations may leave all of a profile's
        devices out)."""
        found: set[str] = set()
        for obj in self._existing().values():
            chosen = (obj.get("metadata", {}).get("annotations") or {}).get(ADVERTISED_ANNOTATION)
            if chosen:
                found.update(Advertised.parse(chosen).reasons)
            for device in obj.get("spec", {}).get("devices") or ():
                with contextlib.suppress(DeviceNameError):
                    spec = parse_device_name(str(device.get("name", "")))
                    if isinstance(spec, SliceSpec):
                        found.add(spec.profile)
        return found

    def server_version(self) -> tuple[int, int]:
        if self._version is None:
            try:
                self._version = self._api.server_version()
            except kerr.KubeError as exc:
                raise PublishError(f"cannot read the apiserver version: {exc}") from exc
        return self._version

    def plan(
        self,
        gpus: Sequence[GpuState],
        *,
        allocated: Sequence[DeviceSpec] = (),
        generation: int = 1,
        profiles: ProfileChoice | None = None,
    ) -> PoolPlan:
        """The slices this publisher would write (pure apart from the cached server version);
        ``profiles``: this time, these profiles (what the cluster asks for) rather than the
        admin's ``--profiles``."""
        return plan_pool(
            self._node,
            gpus,
            server_version=self.server_version(),
            generation=generation,
            device_order=self._device_order,
            allocated=allocated,
            static=self._state.static,
            static_layout=self._static_layout,
            profiles=profiles or self._profiles,
            attributes=self._attributes,
        )

    def publish(
        self,
        gpus: Sequence[GpuState],
        *,
        allocated: Sequence[DeviceSpec] = (),
        profiles: ProfileChoice | None = None,
    ) -> PublishResult:
        """Make the API hold this pool; see the module docstring for the steps. ``profiles``:
        the MIG profiles to advertise this time (:class:`slicer.demand.Advertised`)."""
        self._chosen = profiles
        try:
            return self._publish(gpus, allocated)
        except PublishError:
            self.metrics.publishes.labels("error").inc()
            raise

    # --- steps ---------------------------------------------------------------------------------

    def _publish(self, gpus: Sequence[GpuState], allocated: Sequence[DeviceSpec]) -> PublishResult:
        """Passes until one does not fall back: the static layout needs a write of its own."""
        result = self._publish_pass(gpus, allocated)
        if not result.fell_back:
            return result
        deleted: set[str] = set()
        while result.fell_back:
            deleted.update(result.deleted)
            result = self._publish_pass(gpus, allocated)
        return PublishResult(
            changed=result.changed,
            generation=result.generation,
            slices=result.slices,
            deleted=tuple(sorted({*deleted, *result.deleted})),
            static=True,
            fell_back=True,
            plan=result.plan,
        )

    def _note_scaling(self) -> None:
        """Say so (a warning once per release, a gauge) while counters go to a release whose
        scheduler pays for them with the square of the node count."""
        if not self._report_scaling:
            return
        version = self.server_version()
        quadratic = not self._state.static and not scaling.partitionable_scales(version)
        self.metrics.quadratic_scheduling.set(1 if quadratic else 0)
        if quadratic and self._warned_release != version:
            self._warned_release = version
            log.warning(scaling.quadratic_warning(version), extra={"node": self._node})

    def _publish_pass(
        self, gpus: Sequence[GpuState], allocated: Sequence[DeviceSpec]
    ) -> PublishResult:
        """Recheck when due, then write the pool unless it is unchanged or held back."""
        self._recheck(gpus, allocated)
        self._note_scaling()
        existing = self._existing()
        # An emptied pool has no slice to read its generation from: it is the last one written.
        current = max(
            (s["spec"]["pool"].get("generation", 0) for s in existing.values()),
            default=self._generation,
        )
        plan = self.plan(
            gpus, allocated=allocated, generation=max(current, 1), profiles=self._chosen
        )
        owner = self._owner
        if owner is None or not existing or not _owned_by(existing, owner):
            # Read only when the pool does not already name it: a deleted Node takes its
            # slices along (the garbage collector), so a pool still owned by it is current.
            owner = self._owner = self._owner_reference()
        owned = _owned_by(existing, owner)
        if owned and self._same(existing, plan.slices):
            self.metrics.publishes.labels("unchanged").inc()
            self._record(plan, current)
            return self._unwritten(existing, current, plan)
        fingerprint = order_fingerprint(plan.order)
        wait = self._held_back(existing, plan, fingerprint) if owned else None
        if wait:
            self.metrics.publishes.labels("deferred").inc()
            return self._unwritten(existing, current, plan, deferred_s=wait)
        return self._write_pool(plan, existing, current, fingerprint, owner)

    def _unwritten(
        self,
        existing: dict[str, Obj],
        generation: int,
        plan: PoolPlan,
        *,
        deferred_s: float | None = None,
    ) -> PublishResult:
        """The pool stays as it is: unchanged, or held back for ``deferred_s``."""
        return PublishResult(
            changed=False,
            generation=generation,
            slices=tuple(existing),
            deleted=(),
            static=self._state.static,
            fell_back=False,
            plan=plan,
            deferred_s=deferred_s,
        )

    def _held_back(
        self, existing: dict[str, Obj], plan: PoolPlan, fingerprint: str
    ) -> float | None:
        """Seconds the limiter holds back a change that can wait (0 or None: not held)."""
        if self._limiter is None or not existing or not self._deferrable(existing, plan):
            return None
        self._limiter.observe(fingerprint)
        return self._limiter.due_in()

    def _write_pool(
        self,
        plan: PoolPlan,
        existing: dict[str, Obj],
        current: int,
        fingerprint: str,
        owner: Obj | None,
    ) -> PublishResult:
        """Write the pool at a new generation, delete what it no longer has, check the read-back.

        ``plan`` was made at the current generation to compare with what is published; only its
        slices' pool generation changes (planning again for it was the same work twice)."""
        generation = max(current, self._generation) + 1
        self._generation = generation
        kept: list[Obj] = []
        for obj in plan.slices:
            obj["spec"]["pool"]["generation"] = generation
            if owner is not None:
                obj["metadata"]["ownerReferences"] = [owner]
            kept.append(self._write(obj, existing.get(obj["metadata"]["name"])))
        wanted = {obj["metadata"]["name"] for obj in plan.slices}
        stale = tuple(sorted(name for name in existing if name not in wanted))
        for name in stale:
            self._delete(name)
        self.metrics.publishes.labels("written").inc()
        if self._limiter is not None:
            self._limiter.published(fingerprint)
        self._record(plan, generation)
        log.info(
            "published ResourceSlices",
            extra={
                "node": self._node,
                "generation": generation,
                "slices": len(plan.slices),
                "deleted": len(stale),
                "split": plan.split,
                "static": plan.static,
                "device_order": plan.device_order,
                "devices": len(plan.order),
            },
        )
        fell_back = self._follow_read_back(plan.slices, kept)
        return PublishResult(
            changed=True,
            generation=generation,
            slices=tuple(sorted(wanted)),
            deleted=stale,
            static=self._state.static,
            fell_back=fell_back,
            plan=plan,
        )

    def _follow_read_back(self, written: Sequence[Obj], kept: Sequence[Obj]) -> bool:
        """The read-back's transitions (PARTITIONABLE or RESTORED); True when it fell back."""
        if self._state.static:
            return False
        if self._counters_dropped(written, kept):
            contradicted = self._state is AdvertiseState.RESTORED
            self._fall_back()
            if contradicted:
                # A probe said counters are kept, the real write says otherwise: probe less often.
                self._probe_backoff = min(self._probe_backoff * 2, MAX_PROBE_BACKOFF)
                self._next_check = self._clock.monotonic() + self._interval()
            return True
        if self._state is AdvertiseState.RESTORED:
            self._state = AdvertiseState.PARTITIONABLE
            self._probe_backoff = 1  # the switch back held
        return False

    def _existing(self) -> dict[str, Obj]:
        """This node's slices under any of gpu-slicer's driver names: those of an earlier name
        (an older release's pool) are never desired, so the next write deletes them."""
        try:
            listed = self._api.list(
                RESOURCE_API, KIND, field_selector=f"spec.nodeName={self._node}"
            )
        except kerr.KubeError as exc:
            raise PublishError(
                f"cannot list the ResourceSlices of node {self._node}: {exc}"
            ) from exc
        return {
            obj["metadata"]["name"]: obj
            for obj in listed.items
            if obj.get("spec", {}).get("driver") in DRIVERS
            and obj.get("spec", {}).get("pool", {}).get("name") == self._node
        }

    @staticmethod
    def _same(existing: dict[str, Obj], desired: Sequence[Obj]) -> bool:
        if set(existing) != {obj["metadata"]["name"] for obj in desired}:
            return False
        for obj in desired:
            have = existing[obj["metadata"]["name"]]
            if have.get("spec") != obj["spec"]:
                return False
            if have.get("metadata", {}).get("labels") != obj["metadata"].get("labels"):
                return False
        return True

    @staticmethod
    def _deferrable(existing: dict[str, Obj], plan: PoolPlan) -> bool:
        """Does ``plan`` only reorder the published devices, or leave out some that allocations
        beside them made impossible? Either can wait: the scheduler decides the same on both
        pools. Anything it lists that is not published (a device freed again) cannot."""

        def content(slices: Iterable[Obj]) -> tuple[dict[str, str], list[str]]:
            devices: dict[str, str] = {}
            sets: list[str] = []
            for obj in slices:
                spec = obj.get("spec", {})
                for d in spec.get("devices") or []:
                    devices[d["name"]] = json.dumps(d, sort_keys=True)
                sets += [json.dumps(c, sort_keys=True) for c in spec.get("sharedCounters") or []]
            return devices, sorted(sets)

        published, published_sets = content(existing.values())
        desired, desired_sets = content(plan.slices)
        if published_sets != desired_sets:
            return False
        if any(published.get(name) != body for name, body in desired.items()):
            return False
        return all(name in desired or name in plan.ruled_out for name in published)

    def _owner_reference(self) -> Obj | None:
        """Slices belong to the Node, so they go when the Node is deleted; a Node registered
        again under the same name is another owner (a new uid), and the slices are written
        again for it (:func:`_owned_by`)."""
        self._node_missing = False
        try:
            node = self._api.get("v1", "Node", self._node)
        except kerr.NotFound:
            self._node_missing = self._node_seen  # deleted, not back yet: look again soon
            return None
        except kerr.Forbidden:
            return None  # not ours to read: slices without an owner
        except kerr.KubeError as exc:
            raise PublishError(f"cannot read Node {self._node}, its slices' owner: {exc}") from exc
        self._node_seen = True
        uid = node.get("metadata", {}).get("uid")
        if not uid:
            return None
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self._node,
            "uid": uid,
            "controller": True,
        }

    def _retrying(self, call: Callable[[], T], **how: Any) -> T:
        """:func:`slicer.retry.retrying` with this publisher's settings, clock and metric."""
        return retrying(
            call, self._retry, sleep=self._clock.sleep, on_backoff=self.metrics.conflicts.inc, **how
        )

    def _write(self, obj: Obj, current: Obj | None) -> Obj:
        name = obj["metadata"]["name"]

        def attempt() -> Obj:
            try:
                if current is None:
                    return self._api.create(obj)
                version = current["metadata"].get("resourceVersion")
                return self._api.update(
                    {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
                )
            except kerr.Invalid:
                self._version_stale = True  # the slices may no longer fit the server
                raise

        def again(exc: kerr.KubeError) -> None:
            nonlocal current
            current = None if isinstance(exc, kerr.NotFound) else self._get(name)

        def gave_up(last: kerr.KubeError | None) -> PublishError:
            error = PublishError(
                f"gave up writing ResourceSlice {name} after {self._retry.attempts} attempts: "
                f"{last}"
            )
            error.__cause__ = last  # as ``raise ... from last``
            return error

        return self._retrying(
            attempt,
            doing=f"write ResourceSlice {name}",
            backoff_on=(kerr.Conflict, kerr.Unavailable),
            again_on=(kerr.AlreadyExists, kerr.NotFound),
            on_again=again,
            gave_up=gave_up,
        )

    def _get(self, name: str) -> Obj | None:
        def attempt() -> Obj | None:
            try:
                return self._api.get(RESOURCE_API, KIND, name)
            except kerr.NotFound:
                return None

        return self._retrying(
            attempt,
            doing=f"read ResourceSlice {name}",
            backoff_on=(kerr.Unavailable,),
            gave_up=lambda _last: PublishError(
                f"cannot read ResourceSlice {name}: the apiserver stays unavailable"
            ),
        )

    def _delete(self, name: str) -> None:
        def attempt() -> None:
            with contextlib.suppress(kerr.NotFound):  # already gone
                self._api.delete(RESOURCE_API, KIND, name)

        self._retrying(
            attempt,
            doing=f"delete stale ResourceSlice {name}",
            backoff_on=(kerr.Conflict, kerr.Unavailable),
            gave_up=lambda _last: PublishError(f"gave up deleting stale ResourceSlice {name}"),
        )

    def _counters_dropped(self, desired: Sequence[Obj], kept: Sequence[Obj]) -> bool:
        """Compare what was sent with what the apiserver kept: each write's reply is the object
        as stored, after the apiserver dropped the fields of a gate that is off. (A read of each
        slice again cost as much as its write's reply, and could find the pool another writer
        of the node had written since, whose missing devices looked like dropped counters.)"""
        dropped = False
        taints_dropped = False
        for sent, back in zip(desired, kept, strict=True):
            counters, taints = self._dropped(sent, back)
            dropped |= counters
            taints_dropped |= taints
        if taints_dropped:
            log.warning(
                "the apiserver dropped device taints (DRADeviceTaints off); unhealthy devices "
                "stay schedulable",
                extra={"node": self._node},
            )
        return dropped

    @staticmethod
    def _dropped(sent: Obj, back: Obj) -> tuple[bool, bool]:
        """(counters dropped, taints dropped) between a slice sent and what the server kept."""
        spec = back.get("spec", {})
        counters = bool(sent["spec"].get("sharedCounters")) and not spec.get("sharedCounters")
        taints = False
        kept = {d.get("name"): d for d in spec.get("devices") or []}
        for device in sent["spec"].get("devices") or []:
            got = kept.get(device["name"], {})
            if device.get("consumesCounters") and not got.get("consumesCounters"):
                counters = True
            if device.get("taints") and not got.get("taints"):
                taints = True
        return counters, taints

    def _fall_back(self) -> None:
        self._state = AdvertiseState.FELL_BACK
        self.metrics.counters_dropped.inc()
        self.metrics.static_layout.set(1)
        if self._recheck_s is not None and self._next_check is None:
            self._next_check = self._clock.monotonic() + self._interval()
        again = (
            f"gpu-slicer probes again every {self._interval():g} s and switches back by "
            "itself once the gate is on"
            if self._recheck_s is not None
            else "enable the gate and restart the agent"
        )
        note = (
            "The apiserver dropped sharedCounters/consumesCounters from this node's "
            "ResourceSlices (partitionable devices, feature gate DRAPartitionableDevices, are "
            "not enabled). gpu-slicer now advertises only MIG instances that exist (static "
            f"layout); to get on-demand MIG slices, {again}."
        )
        log.warning(note, extra={"node": self._node, "reason": FALLBACK_REASON})
        self._event(FALLBACK_REASON, note, "Warning")

    def _interval(self) -> float:
        assert self._recheck_s is not None
        return self._recheck_s * (
            self._probe_backoff if self._state is AdvertiseState.FELL_BACK else 1
        )

    def _recheck(self, gpus: Sequence[GpuState], allocated: Sequence[DeviceSpec]) -> None:
        """When due: re-read the server version and, in the fallback, probe for counters."""
        now = self._clock.monotonic()
        due = self._version_stale
        if self._recheck_s is not None:
            if self._next_check is None:
                self._next_check = now + self._interval()
            due = due or now >= self._next_check
        if not due:
            return
        self._version_stale = False
        changed = self._refresh_version()
        if changed:
            self._probe_backoff = 1  # another server: give it a fresh chance
        if self._recheck_s is not None:
            self._next_check = now + self._interval()
        if self._state is AdvertiseState.FELL_BACK and self._probe(
            gpus, allocated, version_changed=changed
        ):
            self._restore()

    def _refresh_version(self) -> bool:
        """Re-read the server version (unless pinned); True when it changed."""
        if self._pinned_version:
            return False
        old = self._version
        try:
            self._version = self._api.server_version()
        except kerr.KubeError as exc:
            log.warning(
                "cannot re-read the apiserver version; keeping the last one",
                extra={"error": str(exc), "version": old},
            )
            return False
        if old is not None and self._version != old:
            log.info(
                "apiserver version changed; the pool layout follows it",
                extra={
                    "node": self._node,
                    "from": ".".join(map(str, old)),
                    "to": ".".join(map(str, self._version)),
                },
            )
            return True
        return False

    def _probe(
        self, gpus: Sequence[GpuState], allocated: Sequence[DeviceSpec], *, version_changed: bool
    ) -> bool:
        """Would the apiserver keep counters now? A dry-run create stores nothing."""
        try:
            plan = plan_pool(
                self._node,
                gpus,
                server_version=self.server_version(),
                generation=max(self._generation, 1),
                device_order=self._device_order,
                allocated=allocated,
                static=False,
                static_layout=self._static_layout,
                profiles=self._profiles,
                attributes=self._attributes,
            )
        except PublishError:
            return False
        sets = [obj for obj in plan.slices if obj["spec"].get("sharedCounters")]
        users = [
            obj
            for obj in plan.slices
            if any(d.get("consumesCounters") for d in obj["spec"].get("devices") or [])
        ]
        probes = sets[:1] + [obj for obj in users[:1] if obj not in sets[:1]]
        if not probes:
            return False  # nothing carries counters: nothing to learn
        for obj in probes:
            body = {
                **obj,
                "metadata": {
                    "generateName": PROBE_NAME_PREFIX,
                    "labels": obj["metadata"].get("labels", {}),
                },
            }
            try:
                back = self._api.create(body, dry_run=True)
            except kerr.KubeError as exc:
                self.metrics.probes.labels("error").inc()
                log.warning(
                    "partitionable-devices probe failed; trying again later",
                    extra={"node": self._node, "error": str(exc)},
                )
                return False
            if self._dropped(obj, back)[0]:
                self.metrics.probes.labels("dropped").inc()
                log.info(
                    "partitionable devices still unavailable; staying on the static layout",
                    extra={
                        "node": self._node,
                        "version_changed": version_changed,
                        "next_probe_s": self._interval(),
                    },
                )
                return False
        self.metrics.probes.labels("kept").inc()
        return True

    def _restore(self) -> None:
        self._state = AdvertiseState.RESTORED
        self.metrics.static_layout.set(0)
        self.metrics.restored.inc()
        note = (
            "The apiserver now keeps sharedCounters/consumesCounters (partitionable devices "
            "enabled): gpu-slicer advertises every MIG slice the GPUs can host again."
        )
        log.info(note, extra={"node": self._node, "reason": RESTORED_REASON})
        self._event(RESTORED_REASON, note, "Normal")

    def _event(self, reason: str, note: str, type_: Literal["Normal", "Warning"]) -> None:
        try:
            node = self._api.get("v1", "Node", self._node)
        except kerr.KubeError:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self._node}}
        event = event_for(
            node,
            reason=reason,
            note=note,
            type_=type_,
            reporting_controller=REPORTING_CONTROLLER,
            reporting_instance=f"{REPORTING_CONTROLLER}-{self._node}"[:128],
            action="PublishResourceSlices",
            event_time=self._clock.wall().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )
        try:
            self._api.create(event)
        except kerr.KubeError as exc:
            log.warning("could not record the Event", extra={"error": str(exc), "reason": reason})

    def _record(self, plan: PoolPlan, generation: int) -> None:
        self.metrics.devices.set(len(plan.order))
        self.metrics.generation.set(generation)


def _owned_by(existing: dict[str, Obj], owner: Obj | None) -> bool:
    """Whether every published slice names ``owner`` as its only owner (none, when the Node
    cannot be read): a slice still owned by a deleted Node would be collected with it."""
    wanted = [owner] if owner is not None else None
    return all(
        (obj.get("metadata", {}).get("ownerReferences") or None) == wanted
        for obj in existing.values()
    )
