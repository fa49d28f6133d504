"""A GPU backend without GPUs: follows the catalog's geometry exactly as NVML enforces it.

Tests and the simulator use :class:`SimulatedBackend` wherever the node agent would use
``slicer.nvml.NvmlBackend``. It refuses what NVML refuses, with the same error types
(``slicer.errors.BackendError`` subclasses), so agent code that works here works there:

* ``create_gpu_instance`` accepts a placement exactly when :func:`core.catalog.is_valid` holds
  for the instances already on the GPU plus the new one. An unknown profile or an illegal start
  raises ``NotSupported`` (NVML's answer for a profile or placement the device does not offer);
  an overlap, an exhausted count, compute budget or a second ``+me`` raises
  ``InsufficientResources``; a GPU whose MIG mode is off raises ``NotSupported``.
* GI ids follow the placement, as NVML's do: the memory slices form a binary tree numbered
  breadth-first (on an 8-slice GPU: 0 for the whole GPU, 1-2 for the halves, 3-6 for quarters,
  7-14 for single slices), so an instance at the same placement gets the same id again. The
  numbering is inferred from NVML's behaviour; callers may only rely on ids being unique among
  the live instances of a GPU. The one compute instance of a GI spans it and gets CI id 0, as
  NVML gives the first CI.
* Destroys raise ``GpuInUse`` while processes run (and a GI destroy while its CI remains) and
  ``GpuNotFound`` once the instance is gone, so cleanup code can be resumed after any step.
* MIG mode: Ampere models start with MIG enabled, Hopper and newer with it disabled (full GPU);
  ``mig_enabled`` overrides that. Hopper and newer switch at once; Ampere records the pending mode
  and raises ``ResetRequired`` unless ``auto_reset=True`` simulates the GPU reset that follows
  (or a test calls :meth:`SimulatedBackend.reset_gpu`). A change is refused with ``GpuInUse`` while
  instances or processes exist or a blocking client (DCGM, persistenced) is set.
* Identities are deterministic: ``GPU-<uuid5(node, index)>``, MIG UUIDs ``MIG-<uuid5(...)>``
  that change on every re-creation, PCI bus ids with two GPUs per PCIe root, capability minors
  laid out as the driver's ``mig-minors`` table (``3 + 135*gpu + 9*gi`` for the GI access cap,
  ``+ 1 + ci`` for the CI's).
* NVLink: with ``nvlink=True`` (the default) every GPU of an NVLink model on the node shares one
  ``nvlink_domain`` (an HGX board), except H100 NVL cards, which are bridged in pairs of
  consecutive indices; the PCIe-only A30 has none. ``nvlink=False`` gives no GPU a domain.

GPUs without MIG (an L4 or L40S beside MIG GPUs) are models without profiles
(:func:`core.gpu_model.whole_only_model`): they report no MIG facts, so the agent offers them
whole, and ``set_mig_mode`` on them raises ``NotSupported`` as NVML does. No NVLink for them.

Instances made by someone else (a person running ``nvidia-smi``, mig-parted) are simulated by
calling ``create_gpu_instance`` / ``create_compute_instance`` directly, outside the agent.

Test hooks: :meth:`attach_process` / :meth:`detach_process`, :meth:`set_blocking_client`,
:meth:`require_reset` (a GPU whose MIG mode changes wait for a reset, as on cloud VMs),
:meth:`lose_gpu` / :meth:`recover_gpu` / :meth:`inject_xid` (queue health events),
:meth:`inject_fault` (the next calls of a method raise or stall), :meth:`reset_gpu`,
:meth:`reboot`, and :attr:`calls`, the log of every backend call. All state sits under one lock:
the agent calls in from several threads.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import MigInstance
from gpu_slicer.core.errors import CatalogError
from gpu_slicer.core.gpuspec import parse_gpu_spec
from gpu_slicer.slicer.backend import GpuInfo, HealthEvent
from gpu_slicer.slicer.errors import (
    BackendError,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    InsufficientResources,
    NotSupported,
    ResetRequired,
)

BACKEND_METHODS = frozenset(
    {
        "boot_id",
        "gpus",
        "instances",
        "create_gpu_instance",
        "create_compute_instance",
        "destroy_compute_instance",
        "destroy_gpu_instance",
        "processes",
        "set_mig_mode",
        "capability_minors",
        "health_events",
    }
)
"""The GpuBackend methods that :meth:`SimulatedBackend.inject_fault` can target."""

_NAMESPACE = uuid.UUID("5f0c6b8e-4d1a-5c3e-9b7f-2a6d8e1c4b30")

# Models whose simulated GPUs have no NVLink (PCIe cards), and those bridged in pairs.
_PCIE_ONLY = frozenset({"A30-24GB"})
_NVLINK_PAIRS = frozenset({"H100-NVL-94GB"})

# The driver's capability-minor layout: config 1, monitor 2, then per GPU 15 GIs of 9 minors
# (the GI access cap and 8 CI access caps).
_CAP_FIRST = 3
_CAP_PER_GI = 9
_CAP_PER_GPU = 15 * _CAP_PER_GI

ErrorSpec = BackendError | type[BackendError] | None


def capability_minor_range(gpu_index: int) -> range:
    """Every capability minor the simulated driver may hand out on GPU ``gpu_index`` (GI and CI
    access caps of its 15 GIs): the device nodes a node needs for any instance of that GPU."""
    first = _CAP_FIRST + _CAP_PER_GPU * gpu_index
    return range(first, first + _CAP_PER_GPU)


def _uuid(*parts: object) -> str:
    return str(uuid.uuid5(_NAMESPACE, "/".join(str(p) for p in parts)))


@dataclass
class _GpuInstance:
    gi_id: int
    profile: gpu_model.Profile
    start: int
    ci_id: int | None = None
    uuid: str | None = None
    pids: set[int] = field(default_factory=set)


@dataclass
class _Gpu:
    index: int
    model: gpu_model.GpuModel
    uuid: str
    pci_bus_id: str
    pcie_root: str
    nvlink_domain: str | None
    mig_current: bool
    mig_pending: bool
    instances: dict[int, _GpuInstance] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    """Processes on the whole GPU (full mode)."""
    lost: bool = False
    blocking_client: str | None = None
    cannot_reset: bool = False
    """MIG mode changes wait for a reset nothing on the node can do (a cloud VM)."""

    def all_pids(self) -> set[int]:
        found = set(self.pids)
        for gi in self.instances.values():
            found |= gi.pids
        return found


@dataclass
class _Fault:
    method: str
    error: ErrorSpec
    times: int
    delay_s: float
    gpu: int | None


class SimulatedBackend:
    """An in-memory ``GpuBackend`` for one node; see the module docstring for its rules."""

    def __init__(
        self,
        spec_or_models: str | Sequence[gpu_model.GpuModel | str],
        *,
        node_name: str = "node",
        boot_id: str | None = None,
        driver_version: str = "580.65.06",
        cuda_driver_version: str = "13.0",
        nvlink: bool = True,
        mig_enabled: bool | Sequence[bool] | None = None,
        auto_reset: bool = False,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if isinstance(spec_or_models, str):
            models = parse_gpu_spec(spec_or_models)
        else:
            models = [
                m if isinstance(m, gpu_model.GpuModel) else catalog.get_model(m)
                for m in spec_or_models
            ]
        if isinstance(mig_enabled, Sequence) and len(mig_enabled) != len(models):
            raise ValueError(f"mig_enabled lists {len(mig_enabled)} values for {len(models)} GPUs")
        self._node_name = node_name
        self._driver_version = driver_version
        self._cuda_driver_version = cuda_driver_version
        self._auto_reset = auto_reset
        self._sleep = sleep
        self._lock = threading.RLock()
        self._events_ready = threading.Condition(self._lock)
        self._events: list[HealthEvent] = []
        self._faults: list[_Fault] = []
        self._boots = 0
        self._boot_id = boot_id or _uuid(node_name, "boot", 0)
        self._serial = 0
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        """Every backend call as ``(method, args)``, in order, failed ones included."""
        self._violations = catalog.KnownViolations()
        """The catalog's rules, once per set of instances: a GPU steps between few sets, and a
        simulated cluster creates instances by the tens of thousands."""
        self._gpus: list[_Gpu] = []
        for index, model in enumerate(models):
            if not model.profiles:
                enabled = False
            elif mig_enabled is None:
                enabled = not model.supports_dynamic_mig
            elif isinstance(mig_enabled, bool):
                enabled = mig_enabled
            else:
                enabled = bool(mig_enabled[index])
            bus_id, root = _pci_address(index)
            self._gpus.append(
                _Gpu(
                    index=index,
                    model=model,
                    uuid="GPU-" + _uuid(node_name, "gpu", index),
                    pci_bus_id=bus_id,
                    pcie_root=root,
                    nvlink_domain=_nvlink_domain(node_name, model, index, models)
                    if nvlink and model.profiles
                    else None,
                    mig_current=enabled,
                    mig_pending=enabled,
                )
            )

    # --- GpuBackend ------------------------------------------------------------------------

    def boot_id(self) -> str:
        self._enter("boot_id", None)
        with self._lock:
            return self._boot_id

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, lost ones included (their static facts are still known)."""
        self._enter("gpus", None)
        with self._lock:
            return [
                GpuInfo(
                    index=g.index,
                    minor=g.index,
                    uuid=g.uuid,
                    model=g.model.key,
                    product_name=g.model.product_names[0],
                    memory_bytes=g.model.memory_bytes,
                    pci_bus_id=g.pci_bus_id,
                    pcie_root=g.pcie_root,
                    architecture=g.model.architecture,
                    cuda_compute_capability=g.model.cuda_compute_capability,
                    driver_version=self._driver_version,
                    mig_enabled=g.mig_current,
                    mig_pending=g.mig_pending,
                    nvlink_domain=g.nvlink_domain,
                    brand="Nvidia",
                    cuda_driver_version=self._cuda_driver_version,
                    # A model that is not the catalog's (a test's own GPU) is reported as the
                    # NVML backend reports facts read off the GPU.
                    mig_model=None if _in_catalog(g.model) or not g.model.profiles else g.model,
                )
                for g in self._gpus
            ]

    def instances(self, gpu_index: int) -> list[MigInstance]:
        """Every GPU instance, ordered by placement start; none when MIG mode is off."""
        self._enter("instances", gpu_index, gpu_index)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            return [
                MigInstance(
                    gpu_index=gpu_index,
                    profile=gi.profile.name,
                    start=gi.start,
                    size=gi.profile.memory_slices,
                    gi_id=gi.gi_id,
                    ci_id=gi.ci_id,
                    uuid=gi.uuid,
                )
                for gi in sorted(gpu.instances.values(), key=lambda gi: (gi.start, gi.gi_id))
            ]

    def placements(self, gpu_index: int) -> list[tuple[str, int]]:
        """(profile, start) of every GPU instance, sorted: what the simulator checks its
        instances against after each prepare. Not an NVML call: neither recorded in
        :attr:`calls` nor subject to injected faults."""
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            return sorted((gi.profile.name, gi.start) for gi in gpu.instances.values())

    def create_gpu_instance(self, gpu_index: int, profile: str, start: int) -> int:
        self._enter("create_gpu_instance", gpu_index, gpu_index, profile, start)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            if not gpu.mig_current:
                raise NotSupported(
                    f"MIG mode is disabled on GPU {gpu_index}; enable it before creating "
                    "GPU instances",
                    gpu=gpu_index,
                )
            try:
                prof = catalog.check_placement(gpu.model, profile, start)
            except CatalogError as exc:
                raise NotSupported(str(exc), gpu=gpu_index) from exc
            present = [(gi.profile.name, gi.start) for gi in gpu.instances.values()]
            problems = self._violations(gpu.model, [*present, (profile, start)])
            if problems:
                raise InsufficientResources(
                    f"cannot create {profile} at memory slice {start} on GPU {gpu_index}: "
                    + "; ".join(problems),
                    gpu=gpu_index,
                )
            gi_id = placement_gi_id(gpu.model, prof, start)
            gpu.instances[gi_id] = _GpuInstance(gi_id=gi_id, profile=prof, start=start)
            return gi_id

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> MigInstance:
        self._enter("create_compute_instance", gpu_index, gpu_index, gi_id)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            gi = self._gi(gpu, gi_id)
            if gi.ci_id is not None:
                raise InsufficientResources(
                    f"GPU instance {gi_id} on GPU {gpu_index} already has compute instance "
                    f"{gi.ci_id}, which spans all of it",
                    gpu=gpu_index,
                )
            self._serial += 1
            gi.ci_id = 0
            gi.uuid = "MIG-" + _uuid(
                self._node_name, self._boot_id, gpu_index, gi_id, gi.ci_id, self._serial
            )
            return MigInstance(
                gpu_index=gpu_index,
                profile=gi.profile.name,
                start=gi.start,
                size=gi.profile.memory_slices,
                gi_id=gi_id,
                ci_id=gi.ci_id,
                uuid=gi.uuid,
            )

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        self._enter("destroy_compute_instance", gpu_index, gpu_index, gi_id, ci_id)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            gi = self._gi_with_ci(gpu, gi_id, ci_id)
            if gi.pids:
                raise GpuInUse(
                    f"compute instance {ci_id} of GPU instance {gi_id} on GPU {gpu_index} runs "
                    f"processes {sorted(gi.pids)}; wait for them to exit",
                    gpu=gpu_index,
                )
            gi.ci_id = None
            gi.uuid = None

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        self._enter("destroy_gpu_instance", gpu_index, gpu_index, gi_id)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            gi = self._gi(gpu, gi_id)
            if gi.pids:
                raise GpuInUse(
                    f"GPU instance {gi_id} on GPU {gpu_index} runs processes "
                    f"{sorted(gi.pids)}; wait for them to exit",
                    gpu=gpu_index,
                )
            if gi.ci_id is not None:
                raise GpuInUse(
                    f"GPU instance {gi_id} on GPU {gpu_index} still has compute instance "
                    f"{gi.ci_id}; destroy it first",
                    gpu=gpu_index,
                )
            del gpu.instances[gi_id]

    def processes(self, gpu_index: int, gi_id: int | None = None) -> list[int]:
        self._enter("processes", gpu_index, gpu_index, gi_id)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            if gi_id is None:
                return sorted(gpu.all_pids())
            return sorted(self._gi(gpu, gi_id).pids)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        self._enter("set_mig_mode", gpu_index, gpu_index, enabled)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            if not gpu.model.profiles:
                raise NotSupported(f"GPU {gpu_index} ({gpu.model.key}) has no MIG", gpu=gpu_index)
            if gpu.mig_current == enabled and gpu.mig_pending == enabled:
                return
            if gpu.instances:
                raise GpuInUse(
                    f"GPU {gpu_index} still has {len(gpu.instances)} MIG instance(s); destroy "
                    "them before changing MIG mode",
                    gpu=gpu_index,
                )
            if gpu.all_pids():
                raise GpuInUse(
                    f"GPU {gpu_index} runs processes {sorted(gpu.all_pids())}; MIG mode can "
                    "change only on an idle GPU",
                    gpu=gpu_index,
                )
            if gpu.blocking_client:
                raise GpuInUse(
                    f"{gpu.blocking_client} holds GPU {gpu_index}; stop it to change MIG mode",
                    gpu=gpu_index,
                )
            gpu.mig_pending = enabled
            if gpu.mig_current == enabled:
                return  # a pending change was taken back: nothing waits for a reset any more
            if (gpu.model.supports_dynamic_mig or self._auto_reset) and not gpu.cannot_reset:
                gpu.mig_current = enabled
                return
            raise ResetRequired(
                f"MIG mode {'enable' if enabled else 'disable'} on GPU {gpu_index} "
                f"({gpu.model.key}) is pending until the GPU is reset",
                gpu=gpu_index,
            )

    def capability_minors(self, gpu_index: int, gi_id: int, ci_id: int) -> tuple[int, int]:
        self._enter("capability_minors", gpu_index, gpu_index, gi_id, ci_id)
        with self._lock:
            gpu = self._live_gpu(gpu_index)
            self._gi_with_ci(gpu, gi_id, ci_id)  # refuses an unknown instance
            gi_minor = _CAP_FIRST + _CAP_PER_GPU * gpu.index + _CAP_PER_GI * gi_id
            return gi_minor, gi_minor + 1 + ci_id

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        self._enter("health_events", None, timeout_s)
        with self._events_ready:
            if not self._events and timeout_s > 0:
                self._events_ready.wait(timeout_s)
            events, self._events = self._events, []
            return events

    # --- state that outlives the process ---------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """What a real GPU keeps while the agent restarts: MIG modes and instances.

        Processes, faults and health events are not part of it.
        """
        with self._lock:
            return {
                "bootId": self._boot_id,
                "serial": self._serial,
                "gpus": [
                    {
                        "index": gpu.index,
                        "model": gpu.model.key,
                        "migCurrent": gpu.mig_current,
                        "migPending": gpu.mig_pending,
                        "instances": [
                            {
                                "giId": gi.gi_id,
                                "profile": gi.profile.name,
                                "start": gi.start,
                                "ciId": gi.ci_id,
                                "uuid": gi.uuid,
                            }
                            for gi in sorted(gpu.instances.values(), key=lambda g: g.gi_id)
                        ],
                    }
                    for gpu in self._gpus
                ],
            }

    def restore(self, state: dict[str, Any]) -> None:
        """Takes over a :meth:`snapshot` of the same GPUs (a ValueError names a mismatch)."""
        with self._lock:
            gpus = state.get("gpus") or []
            models = [g.get("model") for g in gpus]
            if models != [gpu.model.key for gpu in self._gpus]:
                raise ValueError(
                    f"the saved GPUs {models} are not these GPUs "
                    f"{[gpu.model.key for gpu in self._gpus]}"
                )
            self._boot_id = str(state["bootId"])
            self._serial = int(state["serial"])
            for gpu, saved in zip(self._gpus, gpus, strict=True):
                gpu.mig_current = bool(saved["migCurrent"])
                gpu.mig_pending = bool(saved["migPending"])
                gpu.instances = {}
                for item in saved["instances"]:
                    profile = catalog.check_placement(gpu.model, item["profile"], item["start"])
                    gpu.instances[item["giId"]] = _GpuInstance(
                        gi_id=item["giId"],
                        profile=profile,
                        start=item["start"],
                        ci_id=item["ciId"],
                        uuid=item["uuid"],
                    )

    # --- test hooks ------------------------------------------------------------------------

    def attach_process(self, gpu_index: int, gi_id: int | None, pid: int) -> None:
        """Start a process on a MIG instance (``gi_id``) or, in full mode, on the whole GPU."""
        with self._lock:
            gpu = self._gpu(gpu_index)
            if gi_id is None:
                if gpu.mig_current:
                    raise NotSupported(
                        f"GPU {gpu_index} is in MIG mode; a process needs a MIG instance",
                        gpu=gpu_index,
                    )
                gpu.pids.add(pid)
                return
            gi = self._gi(gpu, gi_id)
            if gi.ci_id is None:
                raise GpuNotFound(
                    f"GPU instance {gi_id} on GPU {gpu_index} has no compute instance to run on",
                    gpu=gpu_index,
                )
            gi.pids.add(pid)

    def detach_process(self, gpu_index: int, pid: int) -> None:
        """The process exits."""
        with self._lock:
            gpu = self._gpu(gpu_index)
            holders = [gpu.pids, *(gi.pids for gi in gpu.instances.values())]
            for pids in holders:
                if pid in pids:
                    pids.discard(pid)
                    return
            raise GpuNotFound(f"no process {pid} on GPU {gpu_index}", gpu=gpu_index)

    def set_blocking_client(self, gpu_index: int, client: str | None) -> None:
        """A client such as ``nvidia-dcgm`` that keeps MIG mode from changing (None clears)."""
        with self._lock:
            self._gpu(gpu_index).blocking_client = client

    def require_reset(self, gpu_index: int, required: bool = True) -> None:
        """MIG mode changes on the GPU stay pending until a reset the node cannot do, as on a
        cloud VM with the GPU passed through: ``set_mig_mode`` raises ResetRequired even on
        Hopper and newer, and ``auto_reset`` does not apply."""
        with self._lock:
            self._gpu(gpu_index).cannot_reset = required

    def lose_gpu(self, gpu_index: int) -> None:
        """The GPU falls off the bus: calls on it raise GpuLost; a gpu-lost event is queued."""
        with self._lock:
            self._gpu(gpu_index).lost = True
            self._queue(HealthEvent(gpu_index, "gpu-lost", message="GPU has fallen off the bus"))

    def inject_xid(self, gpu_index: int, xid: int) -> None:
        """Queue an Xid event (the GPU keeps working; the agent decides what is critical)."""
        with self._lock:
            self._gpu(gpu_index)
            self._queue(HealthEvent(gpu_index, "xid", xid=xid, message=f"Xid {xid}"))

    def recover_gpu(self, gpu_index: int) -> None:
        """The lost GPU was reset: it answers again, empty, and a recovered event is queued."""
        with self._lock:
            self._reset(self._gpu(gpu_index))
            self._queue(HealthEvent(gpu_index, "recovered", message="GPU answers again"))

    def reset_gpu(self, gpu_index: int) -> None:
        """A GPU reset: instances and processes vanish and a pending MIG mode takes effect."""
        with self._lock:
            gpu = self._gpu(gpu_index)
            was_lost = gpu.lost
            self._reset(gpu)
            if was_lost:
                self._queue(HealthEvent(gpu_index, "recovered", message="GPU answers again"))

    def reboot(self) -> None:
        """The node reboots: every instance and process is gone and the boot id changes.

        Hopper and newer come back with MIG disabled (the mode does not persist); Ampere keeps
        its mode, with a pending change applied. Lost GPUs answer again (a recovered event is
        queued for each). Faults, blocking clients and the call log are kept.
        """
        with self._lock:
            self._boots += 1
            self._boot_id = _uuid(self._node_name, "boot", self._boots)
            for gpu in self._gpus:
                was_lost = gpu.lost
                self._reset(gpu)
                if gpu.model.supports_dynamic_mig:
                    gpu.mig_current = gpu.mig_pending = False
                if was_lost:
                    self._queue(HealthEvent(gpu.index, "recovered", message="node rebooted"))

    def inject_fault(
        self,
        method_name: str,
        error: ErrorSpec = None,
        *,
        times: int = 1,
        delay_s: float = 0.0,
        gpu: int | None = None,
    ) -> None:
        """Make the next ``times`` calls of ``method_name`` (on ``gpu``, if given) misbehave.

        Each such call first sleeps ``delay_s`` (outside the lock, so other threads go on) and
        then raises ``error`` (an instance, or a class instantiated with a message) if given.
        Faults queue up in the order they were injected.
        """
        if method_name not in BACKEND_METHODS:
            raise ValueError(
                f"{method_name!r} is not a GpuBackend method; one of {sorted(BACKEND_METHODS)}"
            )
        if times < 1:
            raise ValueError(f"times must be >= 1, not {times}")
        if error is None and delay_s <= 0:
            raise ValueError("a fault needs an error, a delay, or both")
        with self._lock:
            self._faults.append(_Fault(method_name, error, times, delay_s, gpu))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    # --- internals -------------------------------------------------------------------------

    def _enter(self, method: str, gpu_index: int | None, *args: object) -> None:
        """Log the call and play an injected fault, if one is due."""
        with self._lock:
            self.calls.append((method, args))
            fault = self._take_fault(method, gpu_index)
        if fault is None:
            return
        if fault.delay_s > 0:
            self._sleep(fault.delay_s)
        if isinstance(fault.error, BackendError):
            raise fault.error
        if fault.error is not None:
            raise fault.error(f"injected {fault.error.__name__} in {method}", gpu=gpu_index)

    def _take_fault(self, method: str, gpu_index: int | None) -> _Fault | None:
        for fault in self._faults:
            if fault.method == method and (fault.gpu is None or fault.gpu == gpu_index):
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _gpu(self, gpu_index: int) -> _Gpu:
        if not 0 <= gpu_index < len(self._gpus):
            raise GpuNotFound(
                f"no GPU {gpu_index} on node {self._node_name}; it has {len(self._gpus)}",
                gpu=gpu_index,
            )
        return self._gpus[gpu_index]

    def _live_gpu(self, gpu_index: int) -> _Gpu:
        gpu = self._gpu(gpu_index)
        if gpu.lost:
            raise GpuLost(
                f"GPU {gpu_index} ({gpu.uuid}) is lost; it needs a reset or a reboot",
                gpu=gpu_index,
            )
        return gpu

    @staticmethod
    def _gi(gpu: _Gpu, gi_id: int) -> _GpuInstance:
        try:
            return gpu.instances[gi_id]
        except KeyError:
            raise GpuNotFound(
                f"no GPU instance {gi_id} on GPU {gpu.index}", gpu=gpu.index
            ) from None

    @classmethod
    def _gi_with_ci(cls, gpu: _Gpu, gi_id: int, ci_id: int) -> _GpuInstance:
        """The GPU instance ``gi_id``, which must hold compute instance ``ci_id``."""
        gi = cls._gi(gpu, gi_id)
        if gi.ci_id != ci_id:
            raise GpuNotFound(
                f"GPU instance {gi_id} on GPU {gpu.index} has no compute instance {ci_id}",
                gpu=gpu.index,
            )
        return gi

    def _reset(self, gpu: _Gpu) -> None:
        gpu.instances.clear()
        gpu.pids.clear()
        gpu.lost = False
        gpu.mig_current = gpu.mig_pending

    def _queue(self, event: HealthEvent) -> None:
        self._events.append(event)
        self._events_ready.notify_all()


def placement_gi_id(model: gpu_model.GpuModel, profile: gpu_model.Profile, start: int) -> int:
    """The GI id of an instance at ``start``: its node in the breadth-first slice tree.

    Instances that may coexist never overlap, so they never share a node (an id).
    """
    per_node = profile.memory_slices
    return model.memory_slices // per_node - 1 + start // per_node


def _pci_address(index: int) -> tuple[str, str]:
    """Bus id and PCIe root of simulated GPU ``index``: two GPUs per root, eight per domain."""
    domain, slot = divmod(index, 8)
    root_bus = 0x10 + 0x20 * (slot // 2)
    bus = root_bus + 1 + 0x08 * (slot % 2)
    return f"{domain:04x}:{bus:02x}:00.0", f"pci{domain:04x}:{root_bus:02x}"


def _nvlink_domain(
    node_name: str, model: gpu_model.GpuModel, index: int, models: Sequence[gpu_model.GpuModel]
) -> str | None:
    if model.key in _PCIE_ONLY:
        return None
    group = ""
    if model.key in _NVLINK_PAIRS:
        position = sum(1 for m in models[:index] if m.key == model.key)
        group = f"/pair-{position // 2}"
    digest = hashlib.sha256(f"{node_name}/{model.key}{group}".encode()).hexdigest()
    return f"nvlink-{digest[:16]}"


def _in_catalog(model: gpu_model.GpuModel) -> bool:
    try:
        return catalog.get_model(model.key) is model
    except CatalogError:
        return False
