"""Keeps three views in agreement: the API's claims, the agent's checkpoint, the GPUs' instances.

One pass (:meth:`Reconciler.reconcile_once`), run periodically and whenever something changes:

1. **Reboot**: the backend's boot id differs from the checkpoint's -> no instance survived;
   every entry and CDI spec is cleared (the kubelet prepares again as pods restart).
2. **Unusable checkpoint** (first pass after recovery): claims the API says are allocated here
   whose instances exist at exactly the allocated placements are adopted as prepared; every
   other instance counts as foreign (left alone) since nothing proves it is the agent's.
3. **Stale PrepareStarted** entries older than ``stale_after_s`` (a prepare that crashed and
   was never retried) are rolled back: their instances destroyed, CDI spec and entry removed.
4. **Vanished claims**: entries whose claim is deleted, replaced (new uid) or no longer allocated
   to these devices are unprepared, as the kubelet would have done had it called (force
   delete, node reboot, kubelet state loss). Acted on only while the claim watch is in sync:
   an unreachable apiserver is not evidence that claims vanished.
5. **Instances**: instances backing an entry are the agent's; the rest are foreign and never
   touched (the ResourceSlices stop advertising what overlaps them). Entries whose instance is
   missing are drift (reported).
6. **Republish** when instances, ownership, MIG modes, health or allocations (which drive the
   best device order) differ from what was last published. The republish callable may answer
   "call me again in N seconds" (a device-order change the rate limiter held back, the
   publisher's periodic version check and fallback probe): the loop then wakes after that long
   and hands over the current view even if nothing changed.

The reconciler observes and decides; :class:`slicer.state.DeviceState` owns the recovery state
and carries out every repair (:meth:`~slicer.state.DeviceState.clear_if_rebooted`,
:meth:`~slicer.state.DeviceState.adopt`, :meth:`~slicer.state.DeviceState.release_abandoned`).
Nothing with running processes is ever destroyed: every release refuses busy instances; they are
retried on the next pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from gpu_slicer.core.devices import DeviceSpec, MigInstance, parse_device_name
from gpu_slicer.core.errors import DeviceNameError, GpuSlicerError
from gpu_slicer.core.identity import DRIVER
from gpu_slicer.kube import errors as kerrors
from gpu_slicer.slicer.backend import GpuInfo, model_of
from gpu_slicer.slicer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimEntry,
    PreparedDevice,
)
from gpu_slicer.slicer.claim_cache import ClaimCache, our_results
from gpu_slicer.slicer.errors import BackendError, GpuLost
from gpu_slicer.slicer.health import HealthTracker
from gpu_slicer.slicer.observe import NodeView, ObservedGpu, observe_node
from gpu_slicer.slicer.state import (
    STALE_PREPARE,
    VANISHED_CLAIM,
    DeviceState,
    InstanceBusy,
    instance_at,
)

log = logging.getLogger(__name__)


Republish = Callable[[NodeView], float | None]
"""Publishes a view; returns None when done, or the seconds after which it wants to be called
again with the then-current view even if that did not change (a held-back order change)."""

MIN_RECALL_S = 0.05
"""Floor for a requested re-call, so that a callable answering 0 cannot make the loop spin."""


@dataclass
class ReconcileReport:
    """What one pass found and did (for logs, metrics and tests)."""

    rebooted: bool = False
    adopted: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    orphans_destroyed: int = 0
    busy: list[str] = field(default_factory=list)
    foreign: list[MigInstance] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    republished: bool = False
    recall_in: float | None = None
    """The republish callable asked to be called again after this many seconds."""
    api_synced: bool = False


class Reconciler:
    """Runs reconcile passes over a :class:`DeviceState`."""

    def __init__(
        self,
        state: DeviceState,
        claims: ClaimCache | None,
        *,
        pool: str,
        health: HealthTracker | None = None,
        republish: Republish | None = None,
        stale_after_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        wake: threading.Event | None = None,
        publish_key: Callable[[], Hashable] | None = None,
    ) -> None:
        """``wake`` is set by whatever wants a pass soon; given, it can be handed to the parts
        before the reconciler exists (slicer.agent). ``publish_key``: what else the pool
        depends on besides the node's view (the profiles the cluster asks for): a republish is
        due whenever it changes."""
        self.state = state
        self.claims = claims
        self.pool = pool
        self.health = health
        self.republish = republish
        self.stale_after_s = stale_after_s
        self._published: tuple[str, Hashable] | None = None
        self._publish_key = publish_key
        self.clock = clock
        """Monotonic clock for re-calls of the republish callable."""
        self._recall_at: float | None = None
        if claims is None:
            state.finish_recovery()  # nothing to adopt from: unknown claims are simply unknown
        self._wake = wake if wake is not None else threading.Event()
        self._wake.clear()  # a change before now is moot: the first pass sees it anyway
        self._pass_lock = threading.Lock()
        self._drift_seen: set[str] = set()
        self.last_report: ReconcileReport | None = None

    def nudge(self) -> None:
        """Ask for a pass soon (after a prepare, a health change, a claim event)."""
        self._wake.set()

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Reconcile every ``interval_s`` and whenever nudged, until ``stop`` is set."""
        while not stop.is_set():
            try:
                self.reconcile_once()
            except Exception:
                log.exception("reconcile pass failed")
                self.state.metrics.reconciles.labels("error").inc()
            self._wake.wait(self._next_wait(interval_s))
            self._wake.clear()

    def _next_wait(self, interval_s: float) -> float:
        """The periodic interval, or less when the republish callable asked to be called back."""
        recall_at = self._recall_at
        if recall_at is None:
            return interval_s
        return min(interval_s, max(MIN_RECALL_S, recall_at - self.clock()))

    # --- one pass -------------------------------------------------------------------------

    def reconcile_once(self) -> ReconcileReport:
        with self._pass_lock:
            report = ReconcileReport()
            report.api_synced = self.claims is not None and self.claims.synced
            self.state.metrics.api_reachable.set(1 if report.api_synced else 0)
            self._check_boot(report)
            if self.state.recovering and report.api_synced:
                self._adopt(report)
            self._roll_back_stale(report)
            if report.api_synced:
                self._unprepare_vanished(report)
            self.state.remove_stray_cdi_specs()
            view = self._observe(report)
            self._maybe_republish(view, report)
            outcome = "error" if report.errors else "ok"
            self.state.metrics.reconciles.labels(outcome).inc()
            if report.rolled_back or report.vanished or report.drift or report.rebooted:
                log.info(
                    "reconciled",
                    extra={
                        "rolled_back": report.rolled_back,
                        "vanished": report.vanished,
                        "orphans_destroyed": report.orphans_destroyed,
                        "drift": report.drift,
                        "busy": report.busy,
                        "rebooted": report.rebooted,
                    },
                )
            self.last_report = report
            return report

    def _check_boot(self, report: ReconcileReport) -> None:
        try:
            report.rebooted = self.state.clear_if_rebooted() is not None
        except BackendError as exc:
            report.errors.append(f"boot id: {exc}")

    def _adopt(self, report: ReconcileReport) -> None:
        assert self.claims is not None
        for uid, claim in self.claims.allocated().items():
            meta = claim["metadata"]
            try:
                if self.state.adopt(
                    uid, meta.get("namespace", ""), meta["name"], our_results(claim, pool=self.pool)
                ):
                    report.adopted.append(uid)
            except (OSError, GpuSlicerError) as exc:
                report.errors.append(f"adopt {uid}: {exc}")
                return  # try again next pass
        self.state.finish_recovery(adopted=len(report.adopted))

    def _roll_back_stale(self, report: ReconcileReport) -> None:
        for entry in self.state.stale_entries(self.stale_after_s):
            if self._release(entry, report, cause=STALE_PREPARE, why="stale PrepareStarted"):
                report.rolled_back.append(entry.uid)

    def _unprepare_vanished(self, report: ReconcileReport) -> None:
        assert self.claims is not None
        allocated = self.claims.allocated()
        for uid, entry in self.state.entries().items():
            claim = allocated.get(uid)
            if claim is None:
                try:
                    claim = self.claims.lookup_uid(entry.namespace, entry.name, uid)
                except kerrors.KubeError as exc:
                    report.errors.append(f"claim {entry.namespace}/{entry.name}: {exc}")
                    self.state.metrics.api_errors.labels("get-claim").inc()
                    continue
            if claim is not None and _still_allocated(claim, entry, self.pool):
                continue
            if entry.state == PREPARE_STARTED and claim is not None:
                continue  # a prepare in progress for a changed allocation: it undoes itself
            if self._release(entry, report, cause=VANISHED_CLAIM, why="claim vanished"):
                report.vanished.append(uid)

    def _release(self, entry: ClaimEntry, report: ReconcileReport, *, cause: str, why: str) -> bool:
        try:
            present = self.state.release_abandoned(entry, cause=cause)
            if present is None:
                return False  # changed meanwhile (completed or unprepared): next pass decides
        except InstanceBusy as exc:
            report.busy.append(entry.uid)
            log.warning(
                "not destroying busy instance",
                extra={"claim": entry.uid, "why": why, "error": str(exc)},
            )
            return False
        except (OSError, GpuSlicerError) as exc:
            report.errors.append(f"release {entry.uid} ({why}): {exc}")
            return False
        report.orphans_destroyed += present
        log.info(
            "released claim", extra={"claim": entry.uid, "why": why, "instances_destroyed": present}
        )
        return True

    def _observe(self, report: ReconcileReport) -> NodeView:
        """The node as it is now (:func:`slicer.observe.observe_node`: the checkpoint's devices
        decide which instances are the agent's), setting the instance metrics on the way, and
        the devices the API allocated here."""
        metrics = self.state.metrics
        entries = self.state.entries()
        try:
            infos = self.state.backend.gpus()
        except BackendError as exc:
            report.errors.append(f"gpus: {exc}")
            infos = []
        observed = [self._observe_gpu(info, entries, report) for info in infos]
        prepared = [d for e in entries.values() for d in e.devices]
        view = observe_node(observed, prepared, *self._allocated())
        metrics.instances.clear()
        counts: dict[tuple[str, str], int] = {}
        for gpu in view.gpus:
            for inst in gpu.instances:
                owner = "agent" if inst.spec in gpu.owned else "foreign"
                if owner == "foreign":
                    report.foreign.append(inst)
                counts[(inst.profile, owner)] = counts.get((inst.profile, owner), 0) + 1
        for (profile, owner), n in counts.items():
            metrics.instances.labels(profile, owner).set(n)
        return view

    def _observe_gpu(
        self, info: GpuInfo, entries: dict[str, ClaimEntry], report: ReconcileReport
    ) -> ObservedGpu:
        """One GPU: its instances (drift when an entry's is missing), its mode, its taints."""
        listed = self._instances(info, report)
        instances = listed or []
        if listed is not None:
            devices = [
                d
                for e in entries.values()
                for d in e.devices
                if d.gpu_index == info.index and d.is_mig
            ]
            self._report_missing(devices, entries, listed, report)
        self.state.metrics.free_memory_slices.labels(str(info.index)).set(
            _free_memory_slices(info, instances)
        )
        taints = self.health.taints(info.index) if self.health is not None else ()
        taints += self.state.taints(info.index)
        return ObservedGpu(
            info=info,
            mode=self.state.mig.mode(info.index),
            instances=tuple(instances),
            taints=taints,
        )

    def _report_missing(
        self,
        devices: list[PreparedDevice],
        entries: dict[str, ClaimEntry],
        instances: list[MigInstance],
        report: ReconcileReport,
    ) -> None:
        """Drift: a completed prepare's instance is gone (reported every pass, counted once)."""
        completed = [d for e in entries.values() if e.state == PREPARE_COMPLETED for d in e.devices]
        for device in devices:
            if any(d is device for d in completed) and instance_at(instances, device) is None:
                report.drift.append(f"{device.device_name}: instance missing")
                key = f"{device.device_name}/{device.gi_id}"
                if key not in self._drift_seen:
                    self._drift_seen.add(key)
                    self.state.metrics.drift.labels("missing-instance").inc()

    def _allocated(self) -> tuple[tuple[DeviceSpec, ...], tuple[DeviceSpec, ...]]:
        """The devices the API allocated in this pool under the current driver name, and those
        allocated under an earlier one, each in a stable order (names that are not ours to
        parse are left out)."""
        current: list[DeviceSpec] = []
        earlier: list[DeviceSpec] = []
        if self.claims is not None:
            for claim in self.claims.allocated().values():
                for result in our_results(claim, pool=self.pool):
                    try:
                        spec = parse_device_name(result.device)
                    except DeviceNameError:
                        continue
                    (current if result.driver == DRIVER else earlier).append(spec)
        return tuple(sorted(current, key=repr)), tuple(sorted(earlier, key=repr))

    def _instances(self, info: GpuInfo, report: ReconcileReport) -> list[MigInstance] | None:
        """The GPU's instances; None when they cannot be listed (a lost GPU)."""
        if not info.mig_enabled:
            return []
        try:
            with self.state.gpu_lock(info.index):
                return self.state.backend.instances(info.index)
        except GpuLost as exc:
            report.errors.append(f"GPU {info.index}: {exc}")
        except BackendError as exc:
            report.errors.append(f"instances of GPU {info.index}: {exc}")
        return None

    def _maybe_republish(self, view: NodeView, report: ReconcileReport) -> None:
        if self.republish is None:
            return
        fingerprint = (view.fingerprint(), self._publish_key() if self._publish_key else None)
        recall_due = self._recall_at is not None and self.clock() >= self._recall_at
        if fingerprint == self._published and not recall_due:
            return
        try:
            again = self.republish(view)
        except Exception as exc:  # the API may be down: prepared claims keep working
            report.errors.append(f"republish: {exc}")
            self.state.metrics.republishes.labels("error").inc()
            log.warning("republish failed; retrying next pass", extra={"error": str(exc)})
            return
        self._published = fingerprint
        if isinstance(again, (int, float)) and not isinstance(again, bool):
            report.recall_in = max(MIN_RECALL_S, float(again))
            self._recall_at = self.clock() + report.recall_in
        else:
            self._recall_at = None
        report.republished = True
        self.state.metrics.republishes.labels("ok").inc()


def _still_allocated(claim: dict[str, object], entry: ClaimEntry, pool: str) -> bool:
    meta = claim.get("metadata")
    if not isinstance(meta, dict) or meta.get("uid") != entry.uid:
        return False
    devices = {r.device for r in our_results(claim, pool=pool)}
    return all(d.device_name in devices for d in entry.devices)


def _free_memory_slices(info: GpuInfo, instances: list[MigInstance]) -> int:
    model = model_of(info)
    if model is None:
        return 0
    total = model.memory_slices
    if not info.mig_enabled:
        return total
    used = {s for i in instances for s in i.memory_slices}
    return total - len(used)


__all__ = ["NodeView", "ReconcileReport", "Reconciler", "Republish"]
