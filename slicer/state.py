"""Prepare and unprepare: turning a claim's allocation into MIG instances and back, crash-safely.

Two steps, kept apart (as in the reference DRA example driver):

* :func:`plan_claim` (pure): from the allocation results for our driver and pool, which devices
  to prepare, with the request names each serves. Deterministic; no I/O.
* :class:`DeviceState` (acting): records ``PrepareStarted`` in the checkpoint, creates the GPU
  instance at exactly the allocated placement and its compute instance (or makes the GPU's MIG
  mode fit a whole-GPU device), writes the CDI spec, records ``PrepareCompleted``.

Crash safety rests on three rules:

1. The checkpoint names a placement (``PrepareStarted``) *before* anything is created there, and
   a placement that is already occupied when a claim is first recorded is refused (it belongs to
   someone else). So an instance at a placement named by a checkpoint entry is ours, even when
   the agent died before learning its GI id: a retried prepare adopts it, a rollback destroys it.
2. An entry is removed only after its instances are gone, so nothing the agent made is ever
   forgotten while it exists.
3. Every destroy checks for processes first and refuses (InstanceBusy) while any run; GpuNotFound
   counts as already destroyed, so unprepare resumes after a failure at any step.

Operations on one GPU are serialised by a per-GPU lock; different GPUs proceed in parallel. A
per-claim lock makes concurrent calls for the same claim queue up instead of racing.

Recovery (a reboot, a pending rebuild after an unusable checkpoint, abandoned entries) is owned
here too: the reconciler only decides when; the operations below the "recovery" line act.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from gpu_slicer.core.devices import (
    DeviceSpec,
    DeviceTaint,
    MigInstance,
    SliceSpec,
    parse_device_name,
)
from gpu_slicer.core.errors import DeviceNameError, GpuSlicerError
from gpu_slicer.core.identity import DRIVER, UNHEALTHY_TAINT
from gpu_slicer.slicer import cdi
from gpu_slicer.slicer.agent_metrics import AgentMetrics
from gpu_slicer.slicer.backend import GpuBackend, GpuInfo
from gpu_slicer.slicer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointStore,
    ClaimEntry,
    PreparedDevice,
)
from gpu_slicer.slicer.claim_cache import AllocatedDevice
from gpu_slicer.slicer.errors import GpuLost, GpuNotFound, SlicerError
from gpu_slicer.slicer.keyed_locks import KeyedLocks
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.slicer.mig_mode import MigModeManager

log = logging.getLogger(__name__)


class PrepareError(SlicerError):
    """A claim could not be prepared; the message becomes that claim's error for the kubelet."""


class InstanceBusy(SlicerError):
    """Processes still run on an instance the agent was asked to destroy; retry later."""


class RecoveryPending(SlicerError):
    """The checkpoint was unusable and not yet rebuilt: an unknown claim may still own an
    instance, so its unprepare must wait for the rebuild (the kubelet retries)."""


@dataclass(frozen=True)
class PlannedDevice:
    """A device to prepare for a claim, with every request (or subrequest) it serves."""

    request_names: tuple[str, ...]
    device_name: str
    spec: DeviceSpec


def plan_claim(results: list[AllocatedDevice]) -> list[PlannedDevice]:
    """What to prepare for these allocation results (pure; raises PrepareError on bad names).

    A device listed by several results (several requests sharing it) is prepared once and
    reports all their request names. Order follows the results.
    """
    by_name: dict[str, PlannedDevice] = {}
    for result in results:
        try:
            spec = parse_device_name(result.device)
        except DeviceNameError as exc:
            raise PrepareError(f"allocation names an unknown device: {exc}") from exc
        known = by_name.get(result.device)
        names = (known.request_names if known else ()) + (result.request,)
        by_name[result.device] = PlannedDevice(tuple(dict.fromkeys(names)), result.device, spec)
    return list(by_name.values())


def planned_entry(
    uid: str,
    namespace: str,
    name: str,
    planned: list[PlannedDevice],
    now: float,
    results: Sequence[AllocatedDevice] = (),
) -> ClaimEntry:
    """The PrepareStarted entry for a plan (pure), with the driver name ``results`` were
    allocated under (the current one if they mix names: the format an older agent refuses)."""
    devices = []
    for p in planned:
        profile = p.spec.profile if isinstance(p.spec, SliceSpec) else None
        start = p.spec.start if isinstance(p.spec, SliceSpec) else None
        devices.append(
            PreparedDevice(
                request_names=p.request_names,
                device_name=p.device_name,
                gpu_index=p.spec.gpu_index,
                profile=profile,
                start=start,
                cdi_device_id=cdi.device_id(uid, p.device_name),
            )
        )
    drivers = {r.driver for r in results}
    driver = drivers.pop() if len(drivers) == 1 else DRIVER
    return ClaimEntry(uid, namespace, name, PREPARE_STARTED, now, tuple(devices), driver)


def instance_at(instances: list[MigInstance], device: PreparedDevice) -> MigInstance | None:
    """The live instance backing ``device``: same placement and, when recorded, same GI id."""
    for inst in instances:
        if (inst.profile, inst.start) != (device.profile, device.start):
            continue
        if device.gi_id is not None and inst.gi_id != device.gi_id:
            continue
        return inst
    return None


class DeviceState:
    """The agent's prepared claims: checkpoint, instances and CDI specs kept in step."""

    def __init__(
        self,
        backend: GpuBackend,
        store: CheckpointStore,
        cdi_dir: cdi.CdiDirectory,
        *,
        mig: MigModeManager,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] | None = None,
        static_layout: StaticLayout | None = None,
    ) -> None:
        self.backend = backend
        self.static_layout = static_layout
        """Instances it names that already exist are lent to claims, never destroyed."""
        self.store = store
        self.cdi = cdi_dir
        self.mig = mig
        self.metrics = metrics or AgentMetrics()
        self.clock = clock
        self._on_change = on_change
        self._lock = threading.RLock()  # guards the checkpoint (memory and file)
        self._gpu_locks = KeyedLocks[int]()
        self.claim_locks = KeyedLocks[str]()
        """Held while one claim is prepared or unprepared."""
        self._rollback_failed: dict[int, str] = {}
        """GPU -> claim uid whose failed prepare left an instance the rollback could not destroy."""
        boot_id = backend.boot_id()
        self.checkpoint, self.load_problem = store.load_or_recover(boot_id)
        if self.load_problem is not None:
            log.error(
                "checkpoint unusable; recovering by reconciling",
                extra={"problem": self.load_problem},
            )
            self.metrics.checkpoint_problems.inc()
        self._recovering = self.load_problem is not None
        self.rebooted = False
        """Whether this agent found the node rebooted since the checkpoint was written."""
        if self.checkpoint.boot_id != boot_id:
            self._clear_after_reboot(boot_id)

    # --- views ----------------------------------------------------------------------------

    def entries(self) -> dict[str, ClaimEntry]:
        with self._lock:
            return dict(self.checkpoint.claims)

    def entry(self, uid: str) -> ClaimEntry | None:
        with self._lock:
            return self.checkpoint.claims.get(uid)

    @property
    def recovering(self) -> bool:
        """True after an unusable checkpoint until :meth:`finish_recovery`: an unknown claim
        may still own an instance."""
        return self._recovering

    def taints(self, gpu_index: int) -> tuple[DeviceTaint, ...]:
        """``unhealthy=rollback-failed`` while a failed prepare's leftover instance remains on
        the GPU: nothing new is scheduled onto what may still be occupied."""
        with self._lock:
            if gpu_index not in self._rollback_failed:
                return ()
        return (DeviceTaint(UNHEALTHY_TAINT, ROLLBACK_FAILED, "NoSchedule"),)

    # --- prepare --------------------------------------------------------------------------

    def prepare(
        self,
        uid: str,
        namespace: str,
        name: str,
        results: list[AllocatedDevice] | Callable[[], list[AllocatedDevice]],
    ) -> list[PreparedDevice]:
        """Prepare a claim's devices (idempotent); PrepareError says why it failed.

        ``results`` may be a callable, called only when the claim is not prepared yet: a
        prepared claim is answered from the checkpoint, without reading the claim from an
        apiserver that may be unreachable. What the callable raises reaches the caller as is.
        """
        began = time.perf_counter()
        with self.claim_locks.held(uid):
            entry = self.entry(uid)
            if entry is not None and entry.state == PREPARE_COMPLETED:
                self.metrics.prepares.labels("already").inc()
                return list(entry.devices)
            allocated = results() if callable(results) else results
            try:
                devices = self._prepare(uid, namespace, name, allocated, entry)
            except PrepareError:
                self.metrics.prepares.labels("error").inc()
                raise
            self.metrics.prepares.labels("ok").inc()
            self.metrics.prepare_seconds.observe(time.perf_counter() - began)
            return devices

    def _prepare(
        self,
        uid: str,
        namespace: str,
        name: str,
        results: list[AllocatedDevice],
        entry: ClaimEntry | None,
    ) -> list[PreparedDevice]:
        planned = plan_claim(results)
        if not planned:
            raise PrepareError(
                f"ResourceClaim {namespace}/{name} has no device of gpu-slicer's driver "
                "allocated on this node"
            )
        if entry is not None and [d.device_name for d in entry.devices] != [
            p.device_name for p in planned
        ]:
            # An unfinished attempt for a different allocation: undo it before starting over.
            self._release_or_fail(entry, "an earlier, different allocation of the claim")
            entry = None
        try:
            gpus = {g.index: g for g in self.backend.gpus()}
            if entry is None:
                entry = planned_entry(uid, namespace, name, planned, self.clock(), results)
                entry = self._refuse_occupied(entry, gpus)
                self._put(entry)  # durable, with which instances were there before the claim
        except (OSError, GpuSlicerError) as exc:
            raise PrepareError(f"cannot prepare claim {namespace}/{name}: {exc}") from exc
        try:
            done: list[PreparedDevice] = []
            edits: list[cdi.DeviceEdits] = []
            for device in entry.devices:
                info = gpus.get(device.gpu_index)
                if info is None:
                    raise PrepareError(f"GPU {device.gpu_index} does not exist on this node")
                with self.gpu_lock(device.gpu_index):
                    prepared, edit = self._prepare_device(device, info)
                done.append(prepared)
                edits.append(edit)
            self.cdi.write(uid, edits)
            completed = entry.completed(tuple(done))
            # Not fsynced (atomic rename only): losing it needs an OS crash, i.e. a reboot, which
            # clears every entry anyway; docs/agent.md has the argument. PrepareStarted is durable.
            self._put(completed, durable=False)
        except (OSError, GpuSlicerError) as exc:
            cleanup = self._undo_failed(entry)
            raise PrepareError(f"cannot prepare claim {namespace}/{name}: {exc}{cleanup}") from exc
        self._lift_rollback_taint(uid)
        self._changed()
        log.info("claim prepared", extra={"claim": uid, "devices": [d.device_name for d in done]})
        return done

    def _refuse_occupied(self, entry: ClaimEntry, gpus: dict[int, GpuInfo]) -> ClaimEntry:
        """A placement that holds an instance before we recorded it is someone else's.

        Unless the static layout names it: such an instance is lent to the claim (the entry
        comes back with those devices marked ``provided``), and its release leaves it.

        A placement still named by another claim's entry (a claim deleted without unprepare,
        not yet released by the reconciler) is refused too: that entry's release destroys
        whatever sits at the placement, which would be this claim's new instance. Likewise a
        whole GPU and any device of another entry on that GPU: the error names the claim to
        wait for instead of an instance or a MIG switch to undo by hand.
        """
        others = [e for e in self.entries().values() if e.uid != entry.uid]
        for device in entry.devices:
            other = next(
                (
                    e
                    for e in others
                    for held in e.devices
                    if held.gpu_index == device.gpu_index
                    # the same slice, or a whole GPU against anything on it
                    and (
                        held.device_name == device.device_name
                        or not held.is_mig
                        or not device.is_mig
                    )
                ),
                None,
            )
            if other is not None:
                raise PrepareError(
                    f"{device.device_name} is still held by ResourceClaim {other.namespace}/"
                    f"{other.name} (uid {other.uid}), which was not unprepared yet; the agent "
                    "releases it once that claim is gone and the kubelet's retry then succeeds"
                )
        devices = list(entry.devices)
        for position, device in enumerate(entry.devices):
            info = gpus.get(device.gpu_index)
            if not device.is_mig or info is None or not info.mig_enabled:
                continue
            with self.gpu_lock(device.gpu_index):
                existing = self.backend.instances(device.gpu_index)
            found = instance_at(existing, device)
            if found is not None and self._provided(device, found):
                devices[position] = replace(device, provided=True)
            elif found is not None:
                if self.recovering:
                    raise PrepareError(
                        f"{device.device_name} already holds a MIG instance and the checkpoint "
                        "is being rebuilt (it was unusable): the instance may be this claim's "
                        "own. The kubelet's retry succeeds once the rebuild has adopted it (it "
                        "needs the apiserver); do not destroy the instance"
                    )
                raise PrepareError(
                    f"{device.device_name} is occupied by a MIG instance gpu-slicer did not "
                    "create; it will not be touched. Destroy it by hand if it is not needed"
                )
        return replace(entry, devices=tuple(devices))

    def _prepare_device(
        self, device: PreparedDevice, info: GpuInfo
    ) -> tuple[PreparedDevice, cdi.DeviceEdits]:
        if device.is_mig != info.mig_enabled:
            # A switch looks needed: re-read under the GPU lock, another claim may have done it.
            info = next((g for g in self.backend.gpus() if g.index == info.index), info)
        if not device.is_mig:
            self.mig.ensure_for_whole(info)
            return (
                replace(device, uuid=info.uuid),
                cdi.DeviceEdits(device.device_name, info.minor, info.uuid),
            )
        assert device.profile is not None and device.start is not None
        self.mig.ensure_for_slice(info)
        gpu = device.gpu_index
        inst = instance_at(self.backend.instances(gpu), device)
        if device.provided and inst is None:
            raise PrepareError(
                f"{device.device_name}: the static layout's instance it was lent is gone from "
                f"GPU {gpu}; recreate the layout (mig-parted) or let the scheduler choose again"
            )
        if inst is None:
            gi_id = self.backend.create_gpu_instance(gpu, device.profile, device.start)
            self.metrics.mig_created.labels(device.profile).inc()
            inst = self.backend.create_compute_instance(gpu, gi_id)
        elif inst.ci_id is None:  # adopted after a crash between the two creates
            inst = self.backend.create_compute_instance(gpu, inst.gi_id)
        assert inst.ci_id is not None and inst.uuid is not None
        minors = self.backend.capability_minors(gpu, inst.gi_id, inst.ci_id)
        return (
            replace(device, gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid),
            cdi.DeviceEdits(device.device_name, info.minor, inst.uuid, minors),
        )

    def _provided(self, device: PreparedDevice, inst: MigInstance) -> bool:
        """A complete instance the static layout names: lent to the claim as it is."""
        if self.static_layout is None or inst.ci_id is None or inst.uuid is None:
            return False
        named = self.static_layout.for_gpu(device.gpu_index) or ()
        return (device.profile, device.start) in named

    def _undo_failed(self, entry: ClaimEntry) -> str:
        """Roll back a failed prepare; returns a note for the error message.

        A GPU instance whose compute instance could not be made is destroyed here. When that
        fails too, the GPU's devices are tainted (:meth:`taints`) until a later prepare or
        release of the claim gets rid of it, and the note tells an admin what to do.
        """
        current = self.entry(entry.uid) or entry
        try:
            self._release(current)
        except (OSError, GpuSlicerError) as exc:
            gpus = sorted({d.gpu_index for d in current.devices if d.is_mig and not d.provided})
            with self._lock:
                for gpu in gpus:
                    self._rollback_failed[gpu] = entry.uid
            log.error(
                "rollback of failed prepare failed; GPU devices tainted",
                extra={"claim": entry.uid, "gpus": gpus, "error": str(exc)},
            )
            self._changed()
            return f"; rolling it back failed too: {exc}. " + _rollback_advice(gpus)
        return ""

    def _lift_rollback_taint(self, uid: str) -> None:
        """The claim's leftover instance is in use again or destroyed: untaint its GPUs."""
        with self._lock:
            lifted = [g for g, owner in self._rollback_failed.items() if owner == uid]
            for gpu in lifted:
                del self._rollback_failed[gpu]
        if lifted:
            log.info("rollback finished; GPU devices untainted", extra={"gpus": lifted})

    def _release_or_fail(self, entry: ClaimEntry, what: str) -> None:
        try:
            self._release(entry)
        except (OSError, GpuSlicerError) as exc:
            raise PrepareError(f"cannot undo {what}: {exc}") from exc

    # --- unprepare ------------------------------------------------------------------------

    def unprepare(self, uid: str) -> bool:
        """Release a claim (idempotent); False when there was nothing to release.

        Raises InstanceBusy while processes run on one of its instances, BackendError or
        OSError when a step failed; calling again resumes where it stopped.
        """
        with self.claim_locks.held(uid):
            entry = self.entry(uid)
            if entry is None and self.recovering:
                self.metrics.unprepares.labels("error").inc()
                raise RecoveryPending(
                    "the checkpoint was unusable and the agent has not yet rebuilt it from the "
                    "apiserver's claims and the GPUs' instances, so it cannot tell whether this "
                    "claim still has an instance; the kubelet's retry succeeds once the rebuild "
                    "is done (it needs the apiserver)"
                )
            if entry is None:
                self.cdi.remove(uid)
                self.metrics.unprepares.labels("absent").inc()
                return False
            try:
                self._release(entry)
            except InstanceBusy:
                self.metrics.unprepares.labels("busy").inc()
                raise
            except (OSError, GpuSlicerError):
                self.metrics.unprepares.labels("error").inc()
                raise
            self.metrics.unprepares.labels("ok").inc()
            log.info("claim unprepared", extra={"claim": uid})
            return True

    def release_entry(self, uid: str, *, only_if: ClaimEntry | None = None) -> bool:
        """Release under the claim lock without counting an unprepare (reconciler rollbacks).

        With ``only_if``, nothing happens unless the entry is still exactly that one: a
        reconciler decision taken on a snapshot must not undo a prepare that completed since.
        """
        with self.claim_locks.held(uid):
            entry = self.entry(uid)
            if entry is None or (only_if is not None and entry != only_if):
                return False
            self._release(entry)
            return True

    def _release(self, entry: ClaimEntry) -> None:
        """Destroy the entry's instances, remove its CDI spec, then forget it."""
        destroyed = False
        for device in entry.devices:
            if not device.is_mig or device.provided:
                continue  # a provided instance stays for the next claim the layout serves
            with self.gpu_lock(device.gpu_index):
                destroyed |= self._destroy_device(device)
        self.cdi.remove(entry.uid)
        self._drop(entry.uid)
        self._lift_rollback_taint(entry.uid)
        if destroyed or entry.devices:
            self._changed()

    def _destroy_device(self, device: PreparedDevice) -> bool:
        """Destroy the instance backing ``device``: CI then GI; False when already gone."""
        gpu = device.gpu_index
        try:
            listed = self.backend.instances(gpu)
        except GpuLost as exc:
            # Only a GPU reset or a reboot brings a lost GPU back, and either wipes every MIG
            # instance on it: there is nothing left to destroy, and refusing would keep the
            # kubelet retrying (the pod stuck terminating) until someone resets the GPU.
            log.warning(
                "GPU lost; its instance goes with the reset it needs",
                extra={"device": device.device_name, "gpu": gpu, "error": str(exc)},
            )
            return False
        except GpuNotFound:
            if self.gpu_exists(gpu):
                raise
            # The GPU is gone from the node (unbound, removed) without a reboot: so is every
            # instance it held. Keeping the entry would fail the claim's unprepare forever.
            log.warning(
                "GPU no longer on the node; nothing left to destroy",
                extra={"device": device.device_name, "gpu": gpu},
            )
            return False
        inst = instance_at(listed, device)
        if inst is None:
            return False
        pids = self.backend.processes(gpu, inst.gi_id)
        if pids:
            self.metrics.busy_refusals.inc()
            log.warning(
                "instance busy; not destroying",
                extra={"device": device.device_name, "gpu": gpu, "gi": inst.gi_id, "pids": pids},
            )
            raise InstanceBusy(
                f"{device.device_name} (GPU {gpu}, GPU instance {inst.gi_id}) still runs "
                f"processes {pids}; it is destroyed once they exit (the kubelet retries)"
            )
        if inst.ci_id is not None:
            try:
                self.backend.destroy_compute_instance(gpu, inst.gi_id, inst.ci_id)
            except GpuNotFound:
                pass
        try:
            self.backend.destroy_gpu_instance(gpu, inst.gi_id)
        except GpuNotFound:
            pass
        else:
            self.metrics.mig_destroyed.labels(device.profile or "").inc()
        return True

    def gpu_exists(self, gpu_index: int) -> bool:
        """Whether the backend still lists this GPU (lost ones included)."""
        return any(g.index == gpu_index for g in self.backend.gpus())

    # --- recovery -------------------------------------------------------------------------

    def clear_if_rebooted(self) -> list[str] | None:
        """After a reboot no instance survived: clear every entry and CDI spec, counted as
        drift. The claim uids cleared, None when the node did not reboot. Raises
        BackendError when the boot id cannot be read."""
        boot_id = self.backend.boot_id()
        with self._lock:
            if boot_id == self.checkpoint.boot_id:
                return None
            cleared = self._clear_after_reboot(boot_id)
        self.metrics.drift.labels("reboot").inc(max(1, len(cleared)))
        return cleared

    def _clear_after_reboot(self, boot_id: str) -> list[str]:
        """The node rebooted: no instance survived, so every entry and CDI spec goes."""
        with self._lock:
            uids = list(self.checkpoint.claims)
            for uid in uids:
                self.cdi.remove(uid)
            fresh = Checkpoint(boot_id=boot_id)
            self.store.save(fresh)
            self.checkpoint = fresh
        self.rebooted = True
        log.warning(
            "node rebooted since the checkpoint was written; prepared state cleared",
            extra={"claims": uids},
        )
        return uids

    def adopt(self, uid: str, namespace: str, name: str, results: list[AllocatedDevice]) -> bool:
        """Record a claim as prepared when every device's instance already exists.

        Used after an unusable checkpoint: claims that the API says are allocated here and whose
        instances exist at exactly the allocated placements are taken back, so that their later
        unprepare destroys the instances. False (nothing recorded) when any device is missing.
        """
        with self.claim_locks.held(uid):
            if self.entry(uid) is not None:
                return False
            planned = plan_claim(results)
            entry = planned_entry(uid, namespace, name, planned, self.clock(), results)
            gpus = {g.index: g for g in self.backend.gpus()}
            done: list[PreparedDevice] = []
            edits: list[cdi.DeviceEdits] = []
            for device in entry.devices:
                info = gpus.get(device.gpu_index)
                if info is None:
                    return False
                if not device.is_mig:
                    if info.mig_enabled:
                        return False
                    done.append(replace(device, uuid=info.uuid))
                    edits.append(cdi.DeviceEdits(device.device_name, info.minor, info.uuid))
                    continue
                if not info.mig_enabled:
                    return False
                inst = instance_at(self.backend.instances(device.gpu_index), device)
                if inst is None or inst.ci_id is None or inst.uuid is None:
                    return False
                minors = self.backend.capability_minors(device.gpu_index, inst.gi_id, inst.ci_id)
                done.append(replace(device, gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid))
                edits.append(cdi.DeviceEdits(device.device_name, info.minor, inst.uuid, minors))
            self.cdi.write(uid, edits)
            self._put(entry.completed(tuple(done)))
            return True

    def finish_recovery(self, adopted: int = 0) -> None:
        """The rebuild after an unusable checkpoint is over (``adopted`` claims taken back, or
        no apiserver to adopt from): a claim the checkpoint does not know now owns nothing."""
        self._recovering = False
        if adopted:
            self.metrics.drift.labels("adopted").inc(adopted)

    def stale_entries(self, older_than_s: float) -> list[ClaimEntry]:
        """PrepareStarted entries at least this old: prepares that crashed and were not retried."""
        now = self.clock()
        return [
            e
            for e in self.entries().values()
            if e.state == PREPARE_STARTED and now - e.started_at >= older_than_s
        ]

    def release_abandoned(self, entry: ClaimEntry, *, cause: str) -> int | None:
        """Release an entry no unprepare will come for (``cause``: :data:`STALE_PREPARE` or
        :data:`VANISHED_CLAIM`, counted as drift), if it is still exactly ``entry``.

        The number of its instances destroyed; None when the entry changed meanwhile (a
        decision taken on a snapshot must not undo a prepare that completed since). Raises
        InstanceBusy, BackendError or OSError as :meth:`unprepare` does.
        """
        present = self.instances_present(entry)
        if not self.release_entry(entry.uid, only_if=entry):
            return None
        self.metrics.orphans_destroyed.inc(present)
        self.metrics.drift.labels(cause).inc()
        return present

    def instances_present(self, entry: ClaimEntry) -> int:
        """How many of the entry's MIG instances exist now (none on a lost or departed GPU:
        their instances are gone with it)."""
        count = 0
        by_gpu: dict[int, list[MigInstance]] = {}
        for device in entry.devices:
            if not device.is_mig:
                continue
            if device.gpu_index not in by_gpu:
                try:
                    by_gpu[device.gpu_index] = self.backend.instances(device.gpu_index)
                except GpuLost:
                    by_gpu[device.gpu_index] = []  # the reset it needs wipes its instances
                except GpuNotFound:
                    if self.gpu_exists(device.gpu_index):
                        raise
                    by_gpu[device.gpu_index] = []  # the GPU left the node, its instances too
            count += instance_at(by_gpu[device.gpu_index], device) is not None
        return count

    def remove_stray_cdi_specs(self) -> set[str]:
        """Remove CDI specs of claims the checkpoint does not know; their uids.

        The specs are listed before the entries are read: a prepare records its entry before
        it writes its spec, so a spec being written is never taken for a stray one.
        """
        try:
            on_disk = self.cdi.claim_uids()
        except OSError:
            return set()
        stray = on_disk - set(self.entries())
        for uid in stray:
            self.cdi.remove(uid)
        if stray:
            log.info("removed stray CDI specs", extra={"claims": sorted(stray)})
        return stray

    # --- plumbing -------------------------------------------------------------------------

    def gpu_lock(self, gpu_index: int) -> AbstractContextManager[None]:
        """Held while one GPU's instances change (prepare, unprepare, the reconciler's repairs)."""
        return self._gpu_locks.held(gpu_index)

    def _put(self, entry: ClaimEntry, *, durable: bool = True) -> None:
        """Record an entry; the in-memory state changes only if the file write succeeded.

        An entry equal to the recorded one is not written again.
        """
        with self._lock:
            if self.checkpoint.claims.get(entry.uid) == entry:
                return
            claims = dict(self.checkpoint.claims)
            claims[entry.uid] = entry
            updated = Checkpoint(self.checkpoint.boot_id, claims)
            self.store.save(updated, durable=durable)
            self.checkpoint = updated

    def _drop(self, uid: str) -> None:
        with self._lock:
            if uid not in self.checkpoint.claims:
                return
            claims = {k: v for k, v in self.checkpoint.claims.items() if k != uid}
            updated = Checkpoint(self.checkpoint.boot_id, claims)
            self.store.save(updated)
            self.checkpoint = updated

    def _changed(self) -> None:
        """Wake whoever republishes (the reconciler)."""
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                log.exception("state change callback failed")


STALE_PREPARE = "stale-prepare"
"""Drift cause: a PrepareStarted entry nobody retried (the prepare crashed)."""
VANISHED_CLAIM = "vanished-claim"
"""Drift cause: an entry whose claim was deleted, replaced or deallocated without unprepare."""

ROLLBACK_FAILED = "rollback-failed"
"""The ``gpu-slicer.io/unhealthy`` taint's value on a GPU holding an instance a failed prepare
left behind."""


def _rollback_advice(gpus: list[int]) -> str:
    """What an admin does about an instance the agent could not destroy."""
    where = ", ".join(str(g) for g in gpus)
    first = gpus[0] if gpus else 0
    return (
        f"The devices of GPU {where} are tainted {UNHEALTHY_TAINT}={ROLLBACK_FAILED} (NoSchedule) "
        "so nothing new lands on them; the kubelet's retry of this claim reuses the instance, "
        "and deleting the claim retries the cleanup, either lifting the taint. If it persists, "
        f"list the instances ('nvidia-smi mig -lgi -i {first}'), destroy the claim's "
        f"('nvidia-smi mig -dci -gi <id> -i {first}' then 'nvidia-smi mig -dgi -gi <id> -i "
        f"{first}') or reset the GPU"
    )


__all__ = [
    "ROLLBACK_FAILED",
    "STALE_PREPARE",
    "VANISHED_CLAIM",
    "DeviceState",
    "InstanceBusy",
    "PlannedDevice",
    "PrepareError",
    "RecoveryPending",
    "instance_at",
    "plan_claim",
    "planned_entry",
]
