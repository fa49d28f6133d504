"""The real GPU backend: a thin layer over NVML through ``pynvml`` (nvidia-ml-py).

Thin on purpose: geometry decisions live in the catalog and the agent; this module only turns a
``GpuBackend`` call into the NVML calls that do it, and NVML's errors into
``slicer.errors.BackendError`` subclasses (``raise ... from`` the ``NVMLError``). Rules it keeps:

* ``nvmlInit`` runs once, on first use; device handles are looked up once and cached (an
  uncached look-up can take seconds on a loaded node).
* Profile ids differ between devices, so they are never hard-coded: each is looked up with
  ``nvmlDeviceGetGpuInstanceProfileInfo(handle, <catalog nvml_constant>)`` and cached per GPU.
* GPU instances are always created at an explicit placement, passed by reference
  (``byref(c_nvmlGpuInstancePlacement_t(start, size))``): NVML's own choice depends on the order
  of creation and would not match what the scheduler allocated.
* The compute instance spans the GPU instance (shared engines). Its profile is the one the GPU
  offers for that GPU instance with all its compute slices, read from NVML, never assumed: the
  catalog's ``ci_nvml_constant`` only breaks a tie (users of NVIDIA's driver saw a full-size
  GPU instance whose full compute profile was not the expected constant). Its MIG UUID comes
  from the compute instance's own device handle, not from walking every MIG device.
* Capability minors are read from ``<root>/proc/driver/nvidia/capabilities/gpu<minor>/mig/...``
  and the boot id from ``<root>/proc/sys/kernel/random/boot_id``; ``root`` is injectable so
  tests can lay out those files, and so can the ``pynvml`` module itself (``nvml=``).
* ``instances`` of a GPU whose MIG mode is off is an empty list, as in the simulated backend.
  Of a GPU instance with several compute instances (made by someone else), the one with the
  lowest id is reported.
* Facts come from the GPU, not the catalog: at discovery every GPU-instance profile is read with
  ``nvmlDeviceGetGpuInstanceProfileInfo`` (memory, multiprocessors, engines, instance count,
  compute slices, name) and its placements with ``nvmlDeviceGetGpuInstancePossiblePlacements``;
  :mod:`slicer.hardware` turns them into the GPU's model (``GpuInfo.mig_model``), and where the
  catalog disagrees each difference is logged and listed in ``GpuInfo.catalog_differences``. A
  GPU the catalog does not know (GB200, B300, RTX PRO 6000, ...) is advertised from those facts.
  Only when NVML reports no profile (MIG mode off on a driver that needs it on) does a catalog
  GPU fall back to the catalog's model; the facts are read again once MIG mode is on.
* A GPU with neither a catalog entry nor MIG profiles (an L4 or L40S beside H100s: NVML answers
  NOT_SUPPORTED to its MIG calls) is reported with MIG off and no MIG model, so the agent offers
  it whole; leaving it out would hide a usable GPU from the cluster.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from ctypes import byref, c_uint, c_void_p, cast
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from slicer import catalog, hardware
from slicer.backend import GpuInfo, HealthEvent
from slicer.devices import MigInstance
from slicer.errors import (
    BackendError,
    CatalogError,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    InsufficientResources,
    NoPermission,
    NotSupported,
    ResetRequired,
)

log = logging.getLogger(__name__)

_ERRORS: dict[str, tuple[type[BackendError], str]] = {
    "NVML_ERROR_IN_USE": (GpuInUse, "processes or compute instances still use it; retry later"),
    "NVML_ERROR_INSUFFICIENT_RESOURCES": (
        InsufficientResources,
        "the placement overlaps an instance or a budget is exhausted",
    ),
    "NVML_ERROR_NOT_FOUND": (GpuNotFound, "it does not exist (any more)"),
    "NVML_ERROR_NOT_SUPPORTED": (NotSupported, "this GPU or driver cannot do it"),
    "NVML_ERROR_NO_PERMISSION": (
        NoPermission,
        "the agent needs root or CAP_SYS_ADMIN and access to /dev/nvidia-caps",
    ),
    "NVML_ERROR_RESET_REQUIRED": (ResetRequired, "the GPU must be reset first"),
    "NVML_ERROR_GPU_IS_LOST": (GpuLost, "the GPU needs a reset or a reboot"),
}

# NVML answers for profiles a device does not offer.
_ABSENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND")

_XID_FELL_OFF_THE_BUS = 79

_PLACEMENTS_CAPACITY = 64

ARCHITECTURES = {7: "Ampere", 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin"}
"""``nvmlDeviceGetArchitecture`` values of MIG-era GPUs -> names."""

BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
"""``nvmlDeviceGetBrand`` values -> the names NVIDIA's DRA driver publishes as ``brand``."""


class _ProfileRef(NamedTuple):
    """The two fields of NVML's profile info the backend needs later, under NVML's names."""

    id: int
    instanceCount: int  # noqa: N815 (NVML's field name)


class NvmlBackend:
    """``GpuBackend`` over NVML. ``nvml`` is the ``pynvml`` module (or a fake of it)."""

    def __init__(self, nvml: Any = None, *, root: str | Path = "/") -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._root = Path(root)
        self._lock = threading.RLock()
        self._started = False
        self._handles: list[Any] = []
        self._models: dict[int, catalog.GpuModel] = {}
        self._infos: dict[int, GpuInfo] = {}
        self._profile_info: dict[tuple[int, str], Any] = {}
        self._ci_profile_info: dict[tuple[int, str, str], Any] = {}
        self._ci_constants: dict[int, str] | None = None
        self._domains_known = False
        self._event_set: Any = None
        self._lost: set[int] = set()

    # --- GpuBackend ------------------------------------------------------------------------

    def boot_id(self) -> str:
        path = self._root / "proc/sys/kernel/random/boot_id"
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise BackendError(f"cannot read the boot id from {path}: {exc}") from exc

    def gpus(self) -> list[GpuInfo]:
        """Every GPU with its current MIG mode (a lost GPU keeps its last known facts)."""
        self._start()
        found: list[GpuInfo] = []
        for index in range(len(self._handles)):
            try:
                info = self._infos.get(index) or self._discover(index)
            except GpuLost as exc:
                log.warning("GPU %d is lost before it could be discovered: %s", index, exc)
                continue
            try:
                current, pending = self._mig_mode(index)
            except GpuLost:
                found.append(info)
                continue
            if current and not info.mig_enabled and info.mig_model is None:
                info = self._refresh_facts(info)
            info = replace(info, mig_enabled=bool(current), mig_pending=bool(pending))
            self._infos[index] = info
            found.append(info)
        if not self._domains_known:
            self._assign_nvlink_domains(found)
            self._domains_known = True
        return [self._infos[i.index] for i in found]

    def instances(self, gpu_index: int) -> list[MigInstance]:
        handle = self._handle(gpu_index)
        current, _ = self._mig_mode(gpu_index)
        if not current:
            return []
        found: list[MigInstance] = []
        for profile in self._model(gpu_index).profiles:
            info = self._gi_profile(gpu_index, profile, missing_ok=True)
            if info is None:
                continue
            for gi in self._list(
                gpu_index,
                "nvmlDeviceGetGpuInstances",
                handle,
                info.id,
                self._nvml.c_nvmlGpuInstance_t,
                info.instanceCount,
            ):
                gi_info = self._call(gpu_index, "nvmlGpuInstanceGetInfo", gi)
                cis = self._compute_instances(gpu_index, gi, profile)
                ci_id, uuid = (None, None)
                if cis:
                    ci_id, ci_info = cis[0]
                    uuid = _text(self._call(gpu_index, "nvmlDeviceGetUUID", ci_info.device))
                found.append(
                    MigInstance(
                        gpu_index=gpu_index,
                        profile=profile.name,
                        start=int(gi_info.placement.start),
                        size=int(gi_info.placement.size),
                        gi_id=int(gi_info.id),
                        ci_id=ci_id,
                        uuid=uuid,
                    )
                )
        return sorted(found, key=lambda m: (m.start, m.gi_id))

    def create_gpu_instance(self, gpu_index: int, profile: str, start: int) -> int:
        model = self._model(gpu_index)
        try:
            prof = catalog.check_placement(model, profile, start)
        except CatalogError as exc:
            raise NotSupported(str(exc), gpu=gpu_index) from exc
        info = self._gi_profile(gpu_index, prof)
        placement = self._nvml.c_nvmlGpuInstancePlacement_t(start, prof.memory_slices)
        gi = self._call(
            gpu_index,
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            self._handle(gpu_index),
            info.id,
            byref(placement),
            doing=f"create {profile} at memory slice {start}",
        )
        return int(self._call(gpu_index, "nvmlGpuInstanceGetInfo", gi).id)

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> MigInstance:
        gi = self._gpu_instance(gpu_index, gi_id)
        gi_info = self._call(gpu_index, "nvmlGpuInstanceGetInfo", gi)
        profile = self._profile_by_id(gpu_index, int(gi_info.profileId))
        ci_profile = self._full_ci_profile(gpu_index, gi, profile)
        ci = self._call(
            gpu_index,
            "nvmlGpuInstanceCreateComputeInstance",
            gi,
            ci_profile.id,
            doing=f"create the compute instance of GPU instance {gi_id}",
        )
        ci_info = self._call(gpu_index, "nvmlComputeInstanceGetInfo", ci)
        uuid = _text(self._call(gpu_index, "nvmlDeviceGetUUID", ci_info.device))
        return MigInstance(
            gpu_index=gpu_index,
            profile=profile.name,
            start=int(gi_info.placement.start),
            size=int(gi_info.placement.size),
            gi_id=gi_id,
            ci_id=int(ci_info.id),
            uuid=uuid,
        )

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        gi = self._gpu_instance(gpu_index, gi_id)
        ci = self._call(
            gpu_index,
            "nvmlGpuInstanceGetComputeInstanceById",
            gi,
            ci_id,
            doing=f"find compute instance {ci_id} of GPU instance {gi_id}",
        )
        self._call(
            gpu_index,
            "nvmlComputeInstanceDestroy",
            ci,
            doing=f"destroy compute instance {ci_id} of GPU instance {gi_id}",
        )

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        gi = self._gpu_instance(gpu_index, gi_id)
        self._call(gpu_index, "nvmlGpuInstanceDestroy", gi, doing=f"destroy GPU instance {gi_id}")

    def processes(self, gpu_index: int, gi_id: int | None = None) -> list[int]:
        handle = self._handle(gpu_index)
        if gi_id is None:
            procs = self._call(gpu_index, "nvmlDeviceGetComputeRunningProcesses", handle)
            return sorted({int(p.pid) for p in procs})
        gi = self._gpu_instance(gpu_index, gi_id)
        profile = self._profile_by_id(
            gpu_index, int(self._call(gpu_index, "nvmlGpuInstanceGetInfo", gi).profileId)
        )
        pids: set[int] = set()
        for _, ci_info in self._compute_instances(gpu_index, gi, profile):
            procs = self._call(gpu_index, "nvmlDeviceGetComputeRunningProcesses", ci_info.device)
            pids.update(int(p.pid) for p in procs)
        return sorted(pids)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        nvml = self._nvml
        handle = self._handle(gpu_index)
        mode = nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
        doing = f"{'enable' if enabled else 'disable'} MIG mode"
        status = self._call(gpu_index, "nvmlDeviceSetMigMode", handle, mode, doing=doing)
        if status != nvml.NVML_SUCCESS:
            # The call itself succeeded, but the activation did not: NVML reports that in the
            # returned status rather than by failing.
            failure = nvml.NVMLError(status)
            raise self._error(gpu_index, f"{doing} (activation status)", failure) from failure
        current, pending = self._call(gpu_index, "nvmlDeviceGetMigMode", handle)
        if bool(current) != enabled:
            raise ResetRequired(
                f"MIG mode {doing.split()[0]} on GPU {gpu_index} is pending (current "
                f"{bool(current)}, pending {bool(pending)}) until the GPU is reset",
                gpu=gpu_index,
            )

    def capability_minors(self, gpu_index: int, gi_id: int, ci_id: int) -> tuple[int, int]:
        self._handle(gpu_index)
        info = self._infos.get(gpu_index) or self._discover(gpu_index)
        minor = info.minor if info else gpu_index
        base = self._root / f"proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi_id}"
        return (
            _read_minor(base / "access", gpu_index),
            _read_minor(base / f"ci{ci_id}" / "access", gpu_index),
        )

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        """Xid critical errors and lost GPUs, best effort: a GPU without events is skipped.

        The first call creates the event set; if NVML cannot create one at all, that error is
        raised (every call) so the caller can fall back to polling.
        """
        nvml = self._nvml
        event_set = self._events()
        events: list[HealthEvent] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = nvml.nvmlEventSetWait(event_set, timeout_ms)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                    events.extend(self._probe_lost())
                elif exc.value != nvml.NVML_ERROR_TIMEOUT:
                    log.warning("waiting for NVML events failed: %s", exc)
                break
            index = self._index_of(data.device)
            if index is not None and data.eventType & nvml.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                events.append(HealthEvent(index, "xid", xid=xid, message=f"Xid {xid}"))
                if xid == _XID_FELL_OFF_THE_BUS:
                    events.extend(self._probe_lost())
            timeout_ms = 0
        return events

    def close(self) -> None:
        """Free the event set and shut NVML down (the agent calls it on exit)."""
        with self._lock:
            if not self._started:
                return
            if self._event_set is not None:
                try:
                    self._nvml.nvmlEventSetFree(self._event_set)
                except self._nvml.NVMLError as exc:
                    log.warning("freeing the NVML event set failed: %s", exc)
                self._event_set = None
            self._nvml.nvmlShutdown()
            self._started = False

    # --- NVML plumbing ---------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._call(None, "nvmlInit", doing="initialise NVML (is the driver loaded?)")
            count = int(self._call(None, "nvmlDeviceGetCount"))
            self._handles = [self._call(i, "nvmlDeviceGetHandleByIndex", i) for i in range(count)]
            self._started = True

    def _mig_mode(self, gpu_index: int) -> tuple[bool, bool]:
        """(current, pending); a GPU without MIG (NVML: NOT_SUPPORTED) is off and stays so."""
        try:
            current, pending = self._call(
                gpu_index, "nvmlDeviceGetMigMode", self._handles[gpu_index]
            )
        except NotSupported:
            return False, False
        return bool(current), bool(pending)

    def _handle(self, gpu_index: int) -> Any:
        self._start()
        if not 0 <= gpu_index < len(self._handles):
            raise GpuNotFound(f"no GPU {gpu_index}: NVML sees {len(self._handles)}", gpu=gpu_index)
        return self._handles[gpu_index]

    def _call(self, gpu: int | None, name: str, *args: Any, doing: str = "") -> Any:
        try:
            return getattr(self._nvml, name)(*args)
        except self._nvml.NVMLError as exc:
            raise self._error(gpu, doing or name, exc) from exc

    def _error(self, gpu: int | None, doing: str, exc: Any) -> BackendError:
        code = getattr(exc, "value", None)
        where = f" on GPU {gpu}" if gpu is not None else ""
        for constant, (kind, hint) in _ERRORS.items():
            if code == getattr(self._nvml, constant, object()):
                return kind(f"{doing}{where}: {exc}; {hint}", gpu=gpu)
        return BackendError(f"{doing}{where}: {exc} (NVML error {code})", gpu=gpu)

    def _is(self, exc: BackendError, *constants: str) -> bool:
        cause = exc.__cause__
        code = getattr(cause, "value", None)
        return any(code == getattr(self._nvml, c, object()) for c in constants)

    def _list(
        self, gpu: int, name: str, parent: Any, profile_id: int, item_type: Any, capacity: int
    ) -> list[Any]:
        """Call an NVML list function that fills a caller-sized array and a count."""
        array = (item_type * max(1, int(capacity)))()
        count = c_uint(len(array))
        self._call(gpu, name, parent, profile_id, array, byref(count))
        return [array[k] for k in range(count.value)]

    def _model(self, gpu_index: int) -> catalog.GpuModel:
        self._handle(gpu_index)
        if gpu_index not in self._models and gpu_index not in self._infos:
            self._discover(gpu_index)
        model = self._models.get(gpu_index)
        if model is None:
            name = self._infos[gpu_index].product_name
            raise NotSupported(
                f"GPU {gpu_index} ({name}) has no MIG: neither the catalog nor NVML knows a MIG "
                "profile of it; it is offered whole only",
                gpu=gpu_index,
            )
        return model

    def _discover(self, index: int) -> GpuInfo:
        """Static facts of one GPU (one without MIG has no MIG model)."""
        handle = self._handle(index)
        name = _text(self._call(index, "nvmlDeviceGetName", handle))
        pci = self._call(index, "nvmlDeviceGetPciInfo", handle)
        known: catalog.GpuModel | None
        try:
            known = catalog.model_by_pci_device_id(int(pci.pciDeviceId))
        except CatalogError:
            try:
                known = catalog.model_by_product_name(name)
            except CatalogError:
                known = None
        bus_id = _canonical_bus_id(_text(pci.busId))
        major, minor_cc = self._call(index, "nvmlDeviceGetCudaComputeCapability", handle)
        memory = int(self._call(index, "nvmlDeviceGetMemoryInfo", handle).total)
        architecture = known.architecture if known else self._architecture(index)
        key = known.key if known else hardware.model_key(name)
        hw_model, differences = self._hardware_model(
            index,
            key=key,
            product_name=name,
            architecture=architecture,
            cc=f"{major}.{minor_cc}",
            memory=memory,
            base=known,
        )
        if known is None and hw_model is None:
            log.info(
                "GPU %d (%s, PCI device %#010x) is not in the catalog and NVML reports no MIG "
                "profile for it (no MIG, or MIG mode off on a driver that lists profiles only "
                "with MIG on): offering it whole",
                index,
                name,
                int(pci.pciDeviceId),
            )
        current, pending = self._mig_mode(index)
        info = GpuInfo(
            index=index,
            minor=int(self._call(index, "nvmlDeviceGetMinorNumber", handle)),
            uuid=_text(self._call(index, "nvmlDeviceGetUUID", handle)),
            model=key,
            product_name=name,
            memory_bytes=memory,
            pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id),
            architecture=architecture,
            cuda_compute_capability=f"{major}.{minor_cc}",
            driver_version=_text(self._call(index, "nvmlSystemGetDriverVersion")),
            mig_enabled=bool(current),
            mig_pending=bool(pending),
            nvlink_domain=None,
            brand=self._brand(index),
            cuda_driver_version=self._cuda_driver_version(),
            mig_model=hw_model,
            catalog_differences=tuple(differences),
        )
        model = hw_model or known
        with self._lock:
            if model is not None:
                self._models[index] = model
            self._infos[index] = info
        return info

    def _hardware_model(
        self,
        index: int,
        *,
        key: str,
        product_name: str,
        architecture: str,
        cc: str,
        memory: int,
        base: catalog.GpuModel | None,
    ) -> tuple[catalog.GpuModel | None, list[str]]:
        """The GPU's model from its own profile facts, and where the catalog disagrees."""
        facts = self._profile_facts(index)
        if not facts:
            if base is not None:
                log.warning(
                    "GPU %d (%s): NVML reports no MIG profile facts (MIG mode off?); "
                    "using the catalog's values until it does",
                    index,
                    base.key,
                )
            return None, []
        model, skipped = hardware.model_from_facts(
            facts,
            key=key,
            product_name=product_name,
            architecture=architecture,
            cuda_compute_capability=cc,
            memory_bytes=memory,
            base=base,
        )
        for line in skipped:
            log.warning("GPU %d: %s", index, line)
        differences = hardware.differences(base, model) if base and model else []
        for line in differences:
            log.warning(
                "GPU %d: catalog and GPU disagree: %s (publishing the GPU's value)", index, line
            )
        if base is None and model is not None:
            log.info(
                "GPU %d (%s) is not in the catalog; advertising the %d MIG profiles NVML reports",
                index,
                product_name,
                len(model.profiles),
            )
        if model is not None:
            with self._lock:
                for f in facts:
                    self._profile_info[(index, hardware.profile_name(f))] = _ProfileRef(
                        f.profile_id, f.instance_count
                    )
        return model, differences

    def _refresh_facts(self, info: GpuInfo) -> GpuInfo:
        """MIG mode came on: read the profile facts NVML did not report while it was off."""
        base = self._models.get(info.index)
        model, differences = self._hardware_model(
            info.index,
            key=info.model,
            product_name=info.product_name,
            architecture=info.architecture,
            cc=info.cuda_compute_capability,
            memory=info.memory_bytes,
            base=base,
        )
        if model is None:
            return info
        with self._lock:
            self._models[info.index] = model
        return replace(info, mig_model=model, catalog_differences=tuple(differences))

    def _profile_facts(self, index: int) -> list[hardware.ProfileFacts]:
        """Every GPU-instance profile NVML reports for the GPU, with its placements."""
        nvml = self._nvml
        handle = self._handle(index)
        count = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))
        names = {
            int(getattr(nvml, n)): n
            for n in dir(nvml)
            if n.startswith("NVML_GPU_INSTANCE_PROFILE_") and n != "NVML_GPU_INSTANCE_PROFILE_COUNT"
        }
        found: list[hardware.ProfileFacts] = []
        for value in range(count):
            constant = names.get(value, f"NVML_GPU_INSTANCE_PROFILE_{value}")
            try:
                info = self._call(
                    index,
                    "nvmlDeviceGetGpuInstanceProfileInfo",
                    handle,
                    value,
                    doing=f"read MIG profile {constant}",
                )
            except BackendError as exc:
                if self._is(exc, *_ABSENT):
                    continue
                raise
            if not int(info.instanceCount):
                continue
            array = (nvml.c_nvmlGpuInstancePlacement_t * _PLACEMENTS_CAPACITY)()
            placed = c_uint(len(array))
            self._call(
                index,
                "nvmlDeviceGetGpuInstancePossiblePlacements",
                handle,
                int(info.id),
                array,
                byref(placed),
                doing=f"list the placements of {constant}",
            )
            found.append(
                hardware.ProfileFacts(
                    constant=constant,
                    profile_id=int(info.id),
                    name=_text(getattr(info, "name", b"")),
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    multiprocessors=int(info.multiprocessorCount),
                    engines=catalog.Engines(
                        int(info.copyEngineCount),
                        int(info.decoderCount),
                        int(info.encoderCount),
                        int(info.jpegCount),
                        int(info.ofaCount),
                    ),
                    memory_mib=int(info.memorySizeMB),
                    placements=tuple(
                        (int(array[k].start), int(array[k].size)) for k in range(placed.value)
                    ),
                )
            )
        return found

    def _architecture(self, index: int) -> str:
        try:
            value = int(self._call(index, "nvmlDeviceGetArchitecture", self._handle(index)))
        except BackendError:
            return ""
        return ARCHITECTURES.get(value, "")

    def _brand(self, index: int) -> str:
        try:
            value = int(self._call(index, "nvmlDeviceGetBrand", self._handle(index)))
        except BackendError:
            return ""
        return BRANDS.get(value, "")

    def _cuda_driver_version(self) -> str:
        try:
            value = int(self._call(None, "nvmlSystemGetCudaDriverVersion"))
        except BackendError:
            return ""
        return f"{value // 1000}.{value % 1000 // 10}"

    def _pcie_root(self, bus_id: str) -> str:
        """The ``pciDDDD:BB`` root complex above the GPU in sysfs, else its own bus."""
        device = self._root / "sys/bus/pci/devices" / bus_id
        try:
            parts = device.resolve(strict=True).parts
        except OSError:
            parts = ()
        for part in parts:
            if part.startswith("pci") and ":" in part:
                return part
        domain, bus, _ = bus_id.split(":")
        return f"pci{domain}:{bus}"

    def _assign_nvlink_domains(self, gpus: list[GpuInfo]) -> None:
        """Fabric clique (clusterUuid.cliqueId) where NVML has one, else NVLink-connected groups."""
        domains: dict[int, str | None] = {}
        for info in gpus:
            domains[info.index] = self._fabric_domain(info.index)
        unassigned = [i.index for i in gpus if domains[i.index] is None]
        if unassigned:
            domains.update(self._peer_domains(unassigned, gpus))
        for info in gpus:
            self._infos[info.index] = replace(
                self._infos[info.index], nvlink_domain=domains[info.index]
            )

    def _fabric_domain(self, index: int) -> str | None:
        nvml = self._nvml
        struct_type = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
        if struct_type is None:
            return None
        fabric = struct_type()
        try:
            nvml.nvmlDeviceGetGpuFabricInfoV(self._handles[index], byref(fabric))
        except (nvml.NVMLError, AttributeError):
            return None
        cluster = bytes(fabric.clusterUuid)
        if (
            fabric.state != nvml.NVML_GPU_FABRIC_STATE_COMPLETED
            or fabric.status != nvml.NVML_SUCCESS
            or not any(cluster)
        ):
            return None
        h = cluster.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}.{int(fabric.cliqueId)}"

    def _peer_domains(self, indices: list[int], gpus: list[GpuInfo]) -> dict[int, str | None]:
        """Group GPUs joined by active NVLinks (directly, or through an NVSwitch)."""
        nvml = self._nvml
        by_bus = {i.pci_bus_id: i.index for i in gpus}
        parent = {i: i for i in indices}

        def root(i: int) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        linked: set[int] = set()
        switched: list[int] = []
        for index in indices:
            handle = self._handles[index]
            for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                        continue
                    remote_type = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                    remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                except nvml.NVMLError:
                    break
                if remote_type == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                    switched.append(index)
                    linked.add(index)
                    continue
                peer = by_bus.get(_canonical_bus_id(_text(remote.busId)))
                if peer is not None and peer in parent:
                    parent[root(index)] = root(peer)
                    linked.update((index, peer))
        for a, b in zip(switched, switched[1:], strict=False):
            parent[root(a)] = root(b)
        uuids = {i.index: i.uuid for i in gpus}
        domains: dict[int, str | None] = {}
        for index in indices:
            if index not in linked:
                domains[index] = None
                continue
            members = sorted(uuids[i] for i in indices if root(i) == root(index))
            digest = hashlib.sha256("/".join(members).encode()).hexdigest()
            domains[index] = f"nvlink-{digest[:16]}"
        return domains

    def _gi_profile(self, gpu: int, profile: catalog.Profile, *, missing_ok: bool = False) -> Any:
        """NVML's profile info (id, instanceCount) for a catalog profile, by its constant."""
        key = (gpu, profile.name)
        if key in self._profile_info:
            return self._profile_info[key]
        constant = getattr(self._nvml, profile.nvml_constant, None)
        if constant is None:
            if missing_ok:
                return None
            raise NotSupported(f"this NVML binding has no {profile.nvml_constant}", gpu=gpu)
        try:
            info = self._call(
                gpu,
                "nvmlDeviceGetGpuInstanceProfileInfo",
                self._handle(gpu),
                constant,
                doing=f"look up profile {profile.name} ({profile.nvml_constant})",
            )
        except BackendError as exc:
            if missing_ok and self._is(exc, *_ABSENT):
                info = None
            else:
                raise
        with self._lock:
            self._profile_info[key] = info
        return info

    def _profile_by_id(self, gpu: int, profile_id: int) -> catalog.Profile:
        for profile in self._model(gpu).profiles:
            info = self._gi_profile(gpu, profile, missing_ok=True)
            if info is not None and int(info.id) == profile_id:
                return profile
        raise NotSupported(
            f"GPU {gpu} has a GPU instance of profile id {profile_id}, which matches no "
            f"{self._model(gpu).key} profile in the catalog",
            gpu=gpu,
        )

    def _ci_profile(
        self,
        gpu: int,
        gi: Any,
        profile: catalog.Profile,
        constant: str,
        *,
        value: int | None = None,
        missing_ok: bool = False,
    ) -> Any:
        """NVML's info on one compute-instance profile (by constant, or by ``value``) in a GI of
        ``profile``; None when the GPU does not offer it and ``missing_ok``."""
        key = (gpu, profile.name, constant)
        if key in self._ci_profile_info:
            return self._ci_profile_info[key]
        if value is None:
            value = getattr(self._nvml, constant, None)
        info = None
        if value is not None:
            try:
                info = self._call(
                    gpu,
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gi,
                    value,
                    self._nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    doing=f"look up compute profile {constant} in {profile.name}",
                )
            except BackendError as exc:
                if not (missing_ok and self._is(exc, *_ABSENT)):
                    raise
        elif not missing_ok:
            raise NotSupported(f"this NVML binding has no {constant}", gpu=gpu)
        with self._lock:
            self._ci_profile_info[key] = info
        return info

    def _ci_profiles_offered(
        self, gpu: int, gi: Any, profile: catalog.Profile
    ) -> list[tuple[str, Any]]:
        """(constant, info) of every compute-instance profile the GPU offers in ``profile``."""
        prefix = "NVML_COMPUTE_INSTANCE_PROFILE_"
        count = int(getattr(self._nvml, f"{prefix}COUNT", 0))
        if self._ci_constants is None:  # once: dir() of the bindings is long for a hot path
            self._ci_constants = {
                int(getattr(self._nvml, n)): n
                for n in dir(self._nvml)
                if n.startswith(prefix) and n != f"{prefix}COUNT"
            }
        offered = []
        for value in range(count):
            constant = self._ci_constants.get(value, f"{prefix}{value}")
            info = self._ci_profile(gpu, gi, profile, constant, value=value, missing_ok=True)
            if info is not None:
                offered.append((constant, info))
        return offered

    def _full_ci_profile(self, gpu: int, gi: Any, profile: catalog.Profile) -> Any:
        """The compute-instance profile spanning all compute slices of a ``profile`` GPU
        instance, as this GPU offers it (the catalog's constant preferred among equals)."""
        offered = self._ci_profiles_offered(gpu, gi, profile)
        full = [(c, i) for c, i in offered if int(i.sliceCount) == profile.compute_slices]
        if not full:
            listed = ", ".join(f"{c} ({int(i.sliceCount)} slices)" for c, i in offered)
            raise NotSupported(
                f"GPU {gpu} offers no compute-instance profile spanning a {profile.name} GPU "
                f"instance ({profile.compute_slices} compute slices); it offers: "
                f"{listed or 'none'}. Report the GPU model and driver version to gpu-slicer",
                gpu=gpu,
            )
        chosen = next((f for f in full if f[0] == profile.ci_nvml_constant), full[0])
        if chosen[0] != profile.ci_nvml_constant:
            log.info(
                "GPU %d: the full compute profile of %s is %s (catalog: %s)",
                gpu,
                profile.name,
                chosen[0],
                profile.ci_nvml_constant,
            )
        return chosen[1]

    def _compute_instances(
        self, gpu: int, gi: Any, profile: catalog.Profile
    ) -> list[tuple[int, Any]]:
        """(CI id, CI info) of every compute instance of a GI, of any profile, lowest id first."""
        found: dict[int, Any] = {}
        for _, info in self._ci_profiles_offered(gpu, gi, profile):
            for ci in self._list(
                gpu,
                "nvmlGpuInstanceGetComputeInstances",
                gi,
                info.id,
                self._nvml.c_nvmlComputeInstance_t,
                info.instanceCount,
            ):
                ci_info = self._call(gpu, "nvmlComputeInstanceGetInfo", ci)
                found[int(ci_info.id)] = ci_info
        return sorted(found.items(), key=lambda item: item[0])

    def _gpu_instance(self, gpu: int, gi_id: int) -> Any:
        return self._call(
            gpu,
            "nvmlDeviceGetGpuInstanceById",
            self._handle(gpu),
            gi_id,
            doing=f"find GPU instance {gi_id}",
        )

    def _events(self) -> Any:
        nvml = self._nvml
        self._start()
        with self._lock:
            if self._event_set is None:
                event_set = self._call(None, "nvmlEventSetCreate")
                for index, handle in enumerate(self._handles):
                    try:
                        nvml.nvmlDeviceRegisterEvents(
                            handle, nvml.nvmlEventTypeXidCriticalError, event_set
                        )
                    except nvml.NVMLError as exc:
                        log.warning("GPU %d reports no Xid events: %s", index, exc)
                self._event_set = event_set
            return self._event_set

    def _index_of(self, device: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except self._nvml.NVMLError:
            wanted = _address(device)
            for index, handle in enumerate(self._handles):
                if _address(handle) == wanted:
                    return index
            return None

    def _probe_lost(self) -> list[HealthEvent]:
        """NVML said a GPU is lost without saying which: ask each one."""
        nvml = self._nvml
        events: list[HealthEvent] = []
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceGetMigMode(handle)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_GPU_IS_LOST and index not in self._lost:
                    self._lost.add(index)
                    events.append(HealthEvent(index, "gpu-lost", message=str(exc)))
                continue
            if index in self._lost:
                self._lost.discard(index)
                events.append(HealthEvent(index, "recovered", message="GPU answers again"))
        return events


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _canonical_bus_id(nvml_bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML) -> ``0000:3b:00.0`` (sysfs and Kubernetes)."""
    domain, bus, device_function = nvml_bus_id.strip().split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{device_function.lower()}"


def _read_minor(path: Path, gpu: int) -> int:
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise GpuNotFound(f"{path} does not exist: the instance is gone", gpu=gpu) from exc
    except PermissionError as exc:
        raise NoPermission(f"cannot read {path}: {exc}", gpu=gpu) from exc
    except OSError as exc:
        raise BackendError(f"cannot read {path}: {exc}", gpu=gpu) from exc
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value)
    raise BackendError(f"{path} has no 'DeviceFileMinor: <n>' line", gpu=gpu)


def _address(handle: Any) -> int | None:
    try:
        return cast(handle, c_void_p).value
    except Exception:  # not a ctypes pointer (a fake's handle): compare by identity
        return id(handle)
