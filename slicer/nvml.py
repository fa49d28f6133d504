"""The real GPU backend: a thin layer over NVML through ``pynvml`` (nvidia-ml-py), in one module.

Thin on purpose: geometry decisions live in the catalog and the agent; this module only turns a
``GpuBackend`` call into the NVML calls that do it, and NVML's errors into
``slicer.errors.BackendError`` subclasses (``raise ... from`` the ``NVMLError``). Its sections,
in the order a reader walks them:

* **session**: ``nvmlInit`` once, on first use; device handles looked up once and cached (an
  uncached look-up can take seconds on a loaded node); NVML's errors as ours.
* **discovery**: each GPU's facts. Facts come from the GPU, not the catalog: every GPU-instance
  profile is read (memory, multiprocessors, engines, instance count, compute slices, name) with
  its placements; :mod:`slicer.hardware` turns them into the GPU's model
  (``GpuInfo.mig_model``), and where the catalog disagrees each difference is logged and listed
  in ``GpuInfo.catalog_differences``. A GPU the catalog does not know (GB200, B300, RTX PRO
  6000, ...) is advertised from those facts. Only when NVML reports no profile (MIG mode off on a
  driver that needs it on) does a catalog GPU fall back to the catalog's model; the facts are
  read again once MIG mode is on. A GPU with neither a catalog entry nor MIG profiles (an L4 or
  L40S beside H100s: NVML answers NOT_SUPPORTED to its MIG calls) is reported with MIG off and
  no MIG model, so the agent offers it whole; leaving it out would hide a usable GPU. Profile ids
  differ between devices, so they are never hard-coded: each is looked up by the catalog's
  ``nvml_constant`` and cached per GPU.
* **topology**: NVLink domains (fabric clique, else NVLink-connected groups).
* **instances**: MIG mode, GPU and compute instances, processes and capability minors. GPU
  instances are always created at an explicit placement, passed by reference
  (``byref(c_nvmlGpuInstancePlacement_t(start, size))``). ``instances`` of a GPU whose MIG mode
  is off is an empty list, as in the simulated backend.
* **events**: Xid critical errors and lost GPUs.
* **backend**: ``NvmlBackend``, the ``GpuBackend`` over those parts.

Capability minors are read from ``<root>/proc/driver/nvidia/capabilities/gpu<minor>/mig/...``
and the boot id from ``<root>/proc/sys/kernel/random/boot_id``; ``root`` is injectable so tests
can lay out those files, and so can the ``pynvml`` module itself (``nvml=``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from ctypes import byref, c_uint, c_void_p, cast
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import MigInstance
from gpu_slicer.core.errors import CatalogError
from gpu_slicer.slicer import errors, hardware
from gpu_slicer.slicer.backend import GpuInfo, HealthEvent
from gpu_slicer.slicer.errors import (
    BackendError,
    GpuLost,
    GpuNotFound,
    NoPermission,
    NotSupported,
    ResetRequired,
)

# --- session -------------------------------------------------------------------------------------
# The NVML session: initialised once, device handles looked up once, NVML's errors as ours.  Every
# other part of the backend calls NVML through :meth:`NvmlSession.call`, so an ``NVMLError``
# always becomes a :class:`slicer.errors.BackendError` subclass (raised ``from`` the
# ``NVMLError``) whose message says what the agent was doing and what to do about it.

_ERRORS: dict[str, tuple[type[BackendError], str]] = {
    "NVML_ERROR_IN_USE": (
        errors.GpuInUse,
        "processes or compute instances still use it; retry later",
    ),
    "NVML_ERROR_INSUFFICIENT_RESOURCES": (
        errors.InsufficientResources,
        "the placement overlaps an instance or a budget is exhausted",
    ),
    "NVML_ERROR_NOT_FOUND": (GpuNotFound, "it does not exist (any more)"),
    "NVML_ERROR_NOT_SUPPORTED": (NotSupported, "this GPU or driver cannot do it"),
    "NVML_ERROR_NO_PERMISSION": (
        errors.NoPermission,
        "the agent needs root or CAP_SYS_ADMIN and access to /dev/nvidia-caps",
    ),
    "NVML_ERROR_RESET_REQUIRED": (errors.ResetRequired, "the GPU must be reset first"),
    "NVML_ERROR_GPU_IS_LOST": (errors.GpuLost, "the GPU needs a reset or a reboot"),
}
"""NVML's errors -> ours, with what to do about each."""

ABSENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND")
"""NVML's answers for a profile a device does not offer."""


class NvmlSession:
    """The ``pynvml`` module (or a fake of it), its one ``nvmlInit`` and the GPUs' handles.

    ``root`` is where ``/proc`` and ``/sys`` are read from, injectable so tests can lay them out.
    """

    def __init__(self, nvml: Any, root: Path) -> None:
        self.nvml = nvml
        self.root = root
        self.lock = threading.RLock()
        self.started = False
        self.handles: list[Any] = []

    def start(self) -> None:
        """``nvmlInit`` and the device handles, once (an uncached look-up can take seconds)."""
        with self.lock:
            if self.started:
                return
            self.call(None, "nvmlInit", doing="initialise NVML (is the driver loaded?)")
            count = int(self.call(None, "nvmlDeviceGetCount"))
            self.handles = [self.call(i, "nvmlDeviceGetHandleByIndex", i) for i in range(count)]
            self.started = True

    def shutdown(self) -> None:
        self.nvml.nvmlShutdown()
        self.started = False

    def handle(self, gpu_index: int) -> Any:
        self.start()
        if not 0 <= gpu_index < len(self.handles):
            raise GpuNotFound(f"no GPU {gpu_index}: NVML sees {len(self.handles)}", gpu=gpu_index)
        return self.handles[gpu_index]

    def mig_mode(self, gpu_index: int) -> tuple[bool, bool]:
        """(current, pending); a GPU without MIG (NVML: NOT_SUPPORTED) is off and stays so."""
        try:
            current, pending = self.call(gpu_index, "nvmlDeviceGetMigMode", self.handles[gpu_index])
        except NotSupported:
            return False, False
        return bool(current), bool(pending)

    def call(self, gpu: int | None, name: str, *args: Any, doing: str = "") -> Any:
        """``pynvml.<name>(*args)``, its ``NVMLError`` raised as a ``BackendError``."""
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as exc:
            raise self.error(gpu, doing or name, exc) from exc

    def error(self, gpu: int | None, doing: str, exc: Any) -> BackendError:
        code = getattr(exc, "value", None)
        where = f" on GPU {gpu}" if gpu is not None else ""
        for constant, (kind, hint) in _ERRORS.items():
            if code == getattr(self.nvml, constant, object()):
                return kind(f"{doing}{where}: {exc}; {hint}", gpu=gpu)
        return BackendError(f"{doing}{where}: {exc} (NVML error {code})", gpu=gpu)

    def is_error(self, exc: BackendError, *constants: str) -> bool:
        """Whether the NVML error behind ``exc`` is one of ``constants`` (by name)."""
        code = getattr(exc.__cause__, "value", None)
        return any(code == getattr(self.nvml, c, object()) for c in constants)

    def list(
        self, gpu: int, name: str, parent: Any, profile_id: int, item_type: Any, capacity: int
    ) -> list[Any]:
        """Call an NVML list function that fills a caller-sized array and a count."""
        array = (item_type * max(1, int(capacity)))()
        count = c_uint(len(array))
        self.call(gpu, name, parent, profile_id, array, byref(count))
        return [array[k] for k in range(count.value)]

    def constants(self, prefix: str) -> dict[int, str]:
        """The bindings' ``<prefix>*`` constants by value, ``<prefix>COUNT`` left out."""
        return {
            int(getattr(self.nvml, n)): n
            for n in dir(self.nvml)
            if n.startswith(prefix) and n != f"{prefix}COUNT"
        }


def text(value: Any) -> str:
    """NVML's strings arrive as bytes from the C library, as str from some bindings."""
    return value.decode() if isinstance(value, bytes) else str(value)


def canonical_bus_id(nvml_bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML) -> ``0000:3b:00.0`` (sysfs and Kubernetes)."""
    domain, bus, device_function = nvml_bus_id.strip().split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{device_function.lower()}"


def address(handle: Any) -> int | None:
    """A device handle's pointer value, to find which of ours NVML handed back."""
    try:
        return cast(handle, c_void_p).value
    except Exception:  # not a ctypes pointer (a fake's handle): compare by identity
        return id(handle)


# --- discovery -----------------------------------------------------------------------------------
# What each GPU is: its static facts, its MIG model from NVML's profile facts, and NVML's profile
# ids for that model.  Facts come from the GPU, not the catalog: every GPU-instance profile is
# read with ``nvmlDeviceGetGpuInstanceProfileInfo`` and its placements with
# ``nvmlDeviceGetGpuInstancePossiblePlacements``; :mod:`slicer.hardware` turns them into the GPU's
# model, and where the catalog disagrees each difference is logged and kept. Profile ids differ
# between devices, so they are looked up per GPU and cached here, never hard-coded.

log = logging.getLogger(__name__)

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


class Discovery:
    """Each GPU's ``GpuInfo`` and MIG model, discovered once and refreshed when MIG comes on."""

    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._models: dict[int, gpu_model.GpuModel] = {}
        self._infos: dict[int, GpuInfo] = {}
        self._profile_info: dict[tuple[int, str], Any] = {}
        self._domains_known = False

    def gpus(self) -> list[GpuInfo]:
        """Every GPU with its current MIG mode (a lost GPU keeps its last known facts)."""
        session = self._session
        session.start()
        found: list[GpuInfo] = []
        for index in range(len(session.handles)):
            try:
                info = self._infos.get(index) or self.discover(index)
            except GpuLost as exc:
                log.warning("GPU %d is lost before it could be discovered: %s", index, exc)
                continue
            try:
                current, pending = session.mig_mode(index)
            except GpuLost:
                found.append(info)
                continue
            if current and not info.mig_enabled and info.mig_model is None:
                info = self._refresh_facts(info)
            info = replace(info, mig_enabled=bool(current), mig_pending=bool(pending))
            self._infos[index] = info
            found.append(info)
        if not self._domains_known:
            domains = nvlink_domains(session, found)
            for gpu in found:
                self._infos[gpu.index] = replace(
                    self._infos[gpu.index], nvlink_domain=domains[gpu.index]
                )
            self._domains_known = True
        return [self._infos[i.index] for i in found]

    def info(self, index: int) -> GpuInfo:
        """The GPU's facts, discovered on first use."""
        return self._infos.get(index) or self.discover(index)

    def model(self, gpu_index: int) -> gpu_model.GpuModel:
        """The GPU's MIG model; ``NotSupported`` for a GPU offered whole only."""
        self._session.handle(gpu_index)
        if gpu_index not in self._models and gpu_index not in self._infos:
            self.discover(gpu_index)
        model = self._models.get(gpu_index)
        if model is None:
            name = self._infos[gpu_index].product_name
            raise NotSupported(
                f"GPU {gpu_index} ({name}) has no MIG: neither the catalog nor NVML knows a MIG "
                "profile of it; it is offered whole only",
                gpu=gpu_index,
            )
        return model

    def gi_profile(self, gpu: int, profile: gpu_model.Profile, *, missing_ok: bool = False) -> Any:
        """NVML's profile info (id, instanceCount) for a catalog profile, by its constant."""
        key = (gpu, profile.name)
        if key in self._profile_info:
            return self._profile_info[key]
        session = self._session
        constant = getattr(session.nvml, profile.nvml_constant, None)
        if constant is None:
            if missing_ok:
                return None
            raise NotSupported(f"this NVML binding has no {profile.nvml_constant}", gpu=gpu)
        try:
            info = session.call(
                gpu,
                "nvmlDeviceGetGpuInstanceProfileInfo",
                session.handle(gpu),
                constant,
                doing=f"look up profile {profile.name} ({profile.nvml_constant})",
            )
        except BackendError as exc:
            if missing_ok and session.is_error(exc, *ABSENT):
                info = None
            else:
                raise
        with session.lock:
            self._profile_info[key] = info
        return info

    def profile_by_id(self, gpu: int, profile_id: int) -> gpu_model.Profile:
        """The catalog profile behind one of this GPU's NVML profile ids."""
        for profile in self.model(gpu).profiles:
            info = self.gi_profile(gpu, profile, missing_ok=True)
            if info is not None and int(info.id) == profile_id:
                return profile
        raise NotSupported(
            f"GPU {gpu} has a GPU instance of profile id {profile_id}, which matches no "
            f"{self.model(gpu).key} profile in the catalog",
            gpu=gpu,
        )

    def discover(self, index: int) -> GpuInfo:
        """Static facts of one GPU (one without MIG has no MIG model)."""
        session = self._session
        handle = session.handle(index)
        name = text(session.call(index, "nvmlDeviceGetName", handle))
        pci = session.call(index, "nvmlDeviceGetPciInfo", handle)
        known = _catalog_model(int(pci.pciDeviceId), name)
        bus_id = canonical_bus_id(text(pci.busId))
        major, minor_cc = session.call(index, "nvmlDeviceGetCudaComputeCapability", handle)
        memory = int(session.call(index, "nvmlDeviceGetMemoryInfo", handle).total)
        architecture = (
            known.architecture
            if known
            else self._named(index, "nvmlDeviceGetArchitecture", ARCHITECTURES)
        )
        current, pending = session.mig_mode(index)
        info = GpuInfo(
            index=index,
            minor=int(session.call(index, "nvmlDeviceGetMinorNumber", handle)),
            uuid=text(session.call(index, "nvmlDeviceGetUUID", handle)),
            model=known.key if known else hardware.model_key(name),
            product_name=name,
            memory_bytes=memory,
            pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id),
            architecture=architecture,
            cuda_compute_capability=f"{major}.{minor_cc}",
            driver_version=text(session.call(index, "nvmlSystemGetDriverVersion")),
            mig_enabled=bool(current),
            mig_pending=bool(pending),
            nvlink_domain=None,
            brand=self._named(index, "nvmlDeviceGetBrand", BRANDS),
            cuda_driver_version=self._cuda_driver_version(),
        )
        hw_model, differences = self._hardware_model(info, known)
        info = replace(info, mig_model=hw_model, catalog_differences=tuple(differences))
        if known is None and hw_model is None:
            log.info(
                "GPU %d (%s, PCI device %#010x) is not in the catalog and NVML reports no MIG "
                "profile for it (no MIG, or MIG mode off on a driver that lists profiles only "
                "with MIG on): offering it whole",
                index,
                name,
                int(pci.pciDeviceId),
            )
        model = hw_model or known
        with session.lock:
            if model is not None:
                self._models[index] = model
            self._infos[index] = info
        return info

    def _hardware_model(
        self, info: GpuInfo, base: gpu_model.GpuModel | None
    ) -> tuple[gpu_model.GpuModel | None, list[str]]:
        """The GPU's model from its own profile facts, and where the catalog disagrees."""
        index = info.index
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
            key=info.model,
            product_name=info.product_name,
            architecture=info.architecture,
            cuda_compute_capability=info.cuda_compute_capability,
            memory_bytes=info.memory_bytes,
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
                info.product_name,
                len(model.profiles),
            )
        if model is not None:
            with self._session.lock:
                for f in facts:
                    self._profile_info[(index, hardware.profile_name(f))] = _ProfileRef(
                        f.profile_id, f.instance_count
                    )
        return model, differences

    def _refresh_facts(self, info: GpuInfo) -> GpuInfo:
        """MIG mode came on: read the profile facts NVML did not report while it was off."""
        model, differences = self._hardware_model(info, self._models.get(info.index))
        if model is None:
            return info
        with self._session.lock:
            self._models[info.index] = model
        return replace(info, mig_model=model, catalog_differences=tuple(differences))

    def _profile_facts(self, index: int) -> list[hardware.ProfileFacts]:
        """Every GPU-instance profile NVML reports for the GPU, with its placements."""
        session = self._session
        nvml = session.nvml
        handle = session.handle(index)
        prefix = "NVML_GPU_INSTANCE_PROFILE_"
        count = int(getattr(nvml, f"{prefix}COUNT", 0))
        names = session.constants(prefix)
        found: list[hardware.ProfileFacts] = []
        for value in range(count):
            constant = names.get(value, f"{prefix}{value}")
            try:
                info = session.call(
                    index,
                    "nvmlDeviceGetGpuInstanceProfileInfo",
                    handle,
                    value,
                    doing=f"read MIG profile {constant}",
                )
            except BackendError as exc:
                if session.is_error(exc, *ABSENT):
                    continue
                raise
            if not int(info.instanceCount):
                continue
            array = (nvml.c_nvmlGpuInstancePlacement_t * _PLACEMENTS_CAPACITY)()
            placed = c_uint(len(array))
            session.call(
                index,
                "nvmlDeviceGetGpuInstancePossiblePlacements",
                handle,
                int(info.id),
                array,
                byref(placed),
                doing=f"list the placements of {constant}",
            )
            placements = tuple(
                (int(array[k].start), int(array[k].size)) for k in range(placed.value)
            )
            found.append(_facts(constant, info, placements))
        return found

    def _named(self, index: int, call: str, names: dict[int, str]) -> str:
        """An enumerated fact (architecture, brand) by name; "" where NVML cannot say."""
        session = self._session
        try:
            value = int(session.call(index, call, session.handle(index)))
        except BackendError:
            return ""
        return names.get(value, "")

    def _cuda_driver_version(self) -> str:
        try:
            value = int(self._session.call(None, "nvmlSystemGetCudaDriverVersion"))
        except BackendError:
            return ""
        return f"{value // 1000}.{value % 1000 // 10}"

    def _pcie_root(self, bus_id: str) -> str:
        """The ``pciDDDD:BB`` root complex above the GPU in sysfs, else its own bus."""
        device = self._session.root / "sys/bus/pci/devices" / bus_id
        try:
            parts = device.resolve(strict=True).parts
        except OSError:
            parts = ()
        for part in parts:
            if part.startswith("pci") and ":" in part:
                return part
        domain, bus, _ = bus_id.split(":")
        return f"pci{domain}:{bus}"


def _catalog_model(pci_device_id: int, product_name: str) -> gpu_model.GpuModel | None:
    """The catalog's model by PCI device id, else by product name, else None."""
    try:
        return catalog.model_by_pci_device_id(pci_device_id)
    except CatalogError:
        try:
            return catalog.model_by_product_name(product_name)
        except CatalogError:
            return None


def _facts(
    constant: str, info: Any, placements: tuple[tuple[int, int], ...]
) -> hardware.ProfileFacts:
    """NVML's profile info for one GPU-instance profile as :mod:`slicer.hardware` reads it."""
    return hardware.ProfileFacts(
        constant=constant,
        profile_id=int(info.id),
        name=text(getattr(info, "name", b"")),
        slice_count=int(info.sliceCount),
        instance_count=int(info.instanceCount),
        multiprocessors=int(info.multiprocessorCount),
        engines=gpu_model.Engines(
            int(info.copyEngineCount),
            int(info.decoderCount),
            int(info.encoderCount),
            int(info.jpegCount),
            int(info.ofaCount),
        ),
        memory_mib=int(info.memorySizeMB),
        placements=placements,
    )


# --- topology ------------------------------------------------------------------------------------
# NVLink topology: which GPUs of a node share an NVLink domain (published as an attribute so a
# workload can ask for GPUs that talk over NVLink).  The fabric clique (``clusterUuid.cliqueId``)
# where NVML reports one (NVLink fabrics such as GB200 NVL72), else the groups joined by active
# NVLinks, directly or through an NVSwitch, named by a digest of their members' UUIDs so a group
# keeps its name across agent restarts.


def nvlink_domains(session: NvmlSession, gpus: list[GpuInfo]) -> dict[int, str | None]:
    """Each GPU's NVLink domain by index; None for a GPU on no NVLink."""
    domains: dict[int, str | None] = {}
    for info in gpus:
        domains[info.index] = _fabric_domain(session, info.index)
    unassigned = [i.index for i in gpus if domains[i.index] is None]
    if unassigned:
        domains.update(_peer_domains(session, unassigned, gpus))
    return domains


def _fabric_domain(session: NvmlSession, index: int) -> str | None:
    nvml = session.nvml
    struct_type = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    if struct_type is None:
        return None
    fabric = struct_type()
    try:
        nvml.nvmlDeviceGetGpuFabricInfoV(session.handles[index], byref(fabric))
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


def _peer_domains(
    session: NvmlSession, indices: list[int], gpus: list[GpuInfo]
) -> dict[int, str | None]:
    """Group GPUs joined by active NVLinks (directly, or through an NVSwitch)."""
    nvml = session.nvml
    by_bus = {i.pci_bus_id: i.index for i in gpus}
    parent = {i: i for i in indices}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    linked: set[int] = set()
    switched: list[int] = []
    for index in indices:
        handle = session.handles[index]
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
            peer = by_bus.get(canonical_bus_id(text(remote.busId)))
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


# --- instances -----------------------------------------------------------------------------------
# MIG instances' lifecycle on NVML: MIG mode, GPU and compute instances, their processes and
# capability minors.  GPU instances are always created at an explicit placement, passed by
# reference: NVML's own choice depends on the order of creation and would not match what the
# scheduler allocated. The compute instance spans the GPU instance (shared engines); its profile
# is the one the GPU offers with all the GPU instance's compute slices, read from NVML, never
# assumed (the catalog's ``ci_nvml_constant`` only breaks a tie). Its MIG UUID comes from the
# compute instance's own device handle, not from walking every MIG device.

_CI_PREFIX = "NVML_COMPUTE_INSTANCE_PROFILE_"


class Instances:
    """Creates, lists and destroys MIG instances at the placements the agent chose."""

    def __init__(self, session: NvmlSession, discovery: Discovery) -> None:
        self._session = session
        self._discovery = discovery
        self._ci_profile_info: dict[tuple[int, str, str], Any] = {}
        self._ci_constants: dict[int, str] | None = None

    def instances(self, gpu_index: int) -> list[MigInstance]:
        """The GPU's instances by placement; none while MIG mode is off. Of a GPU instance with
        several compute instances (made by someone else), the one with the lowest id."""
        session = self._session
        handle = session.handle(gpu_index)
        current, _ = session.mig_mode(gpu_index)
        if not current:
            return []
        found: list[MigInstance] = []
        for profile in self._discovery.model(gpu_index).profiles:
            info = self._discovery.gi_profile(gpu_index, profile, missing_ok=True)
            if info is None:
                continue
            for gi in session.list(
                gpu_index,
                "nvmlDeviceGetGpuInstances",
                handle,
                info.id,
                session.nvml.c_nvmlGpuInstance_t,
                info.instanceCount,
            ):
                gi_info = session.call(gpu_index, "nvmlGpuInstanceGetInfo", gi)
                cis = self._compute_instances(gpu_index, gi, profile)
                ci_id, uuid = (None, None)
                if cis:
                    ci_id, ci_info = cis[0]
                    uuid = text(session.call(gpu_index, "nvmlDeviceGetUUID", ci_info.device))
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
        session = self._session
        model = self._discovery.model(gpu_index)
        try:
            prof = catalog.check_placement(model, profile, start)
        except CatalogError as exc:
            raise NotSupported(str(exc), gpu=gpu_index) from exc
        info = self._discovery.gi_profile(gpu_index, prof)
        placement = session.nvml.c_nvmlGpuInstancePlacement_t(start, prof.memory_slices)
        gi = session.call(
            gpu_index,
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            session.handle(gpu_index),
            info.id,
            byref(placement),
            doing=f"create {profile} at memory slice {start}",
        )
        return int(session.call(gpu_index, "nvmlGpuInstanceGetInfo", gi).id)

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> MigInstance:
        session = self._session
        gi = self._gpu_instance(gpu_index, gi_id)
        gi_info = session.call(gpu_index, "nvmlGpuInstanceGetInfo", gi)
        profile = self._discovery.profile_by_id(gpu_index, int(gi_info.profileId))
        ci_profile = self._full_ci_profile(gpu_index, gi, profile)
        ci = session.call(
            gpu_index,
            "nvmlGpuInstanceCreateComputeInstance",
            gi,
            ci_profile.id,
            doing=f"create the compute instance of GPU instance {gi_id}",
        )
        ci_info = session.call(gpu_index, "nvmlComputeInstanceGetInfo", ci)
        uuid = text(session.call(gpu_index, "nvmlDeviceGetUUID", ci_info.device))
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
        ci = self._session.call(
            gpu_index,
            "nvmlGpuInstanceGetComputeInstanceById",
            gi,
            ci_id,
            doing=f"find compute instance {ci_id} of GPU instance {gi_id}",
        )
        self._session.call(
            gpu_index,
            "nvmlComputeInstanceDestroy",
            ci,
            doing=f"destroy compute instance {ci_id} of GPU instance {gi_id}",
        )

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        gi = self._gpu_instance(gpu_index, gi_id)
        self._session.call(
            gpu_index, "nvmlGpuInstanceDestroy", gi, doing=f"destroy GPU instance {gi_id}"
        )

    def processes(self, gpu_index: int, gi_id: int | None = None) -> list[int]:
        session = self._session
        handle = session.handle(gpu_index)
        if gi_id is None:
            procs = session.call(gpu_index, "nvmlDeviceGetComputeRunningProcesses", handle)
            return sorted({int(p.pid) for p in procs})
        gi = self._gpu_instance(gpu_index, gi_id)
        profile = self._discovery.profile_by_id(
            gpu_index, int(session.call(gpu_index, "nvmlGpuInstanceGetInfo", gi).profileId)
        )
        pids: set[int] = set()
        for _, ci_info in self._compute_instances(gpu_index, gi, profile):
            procs = session.call(gpu_index, "nvmlDeviceGetComputeRunningProcesses", ci_info.device)
            pids.update(int(p.pid) for p in procs)
        return sorted(pids)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        session = self._session
        nvml = session.nvml
        handle = session.handle(gpu_index)
        mode = nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
        doing = f"{'enable' if enabled else 'disable'} MIG mode"
        status = session.call(gpu_index, "nvmlDeviceSetMigMode", handle, mode, doing=doing)
        if status != nvml.NVML_SUCCESS:
            # The call itself succeeded, but the activation did not: NVML reports that in the
            # returned status rather than by failing.
            failure = nvml.NVMLError(status)
            raise session.error(gpu_index, f"{doing} (activation status)", failure) from failure
        current, pending = session.call(gpu_index, "nvmlDeviceGetMigMode", handle)
        if bool(current) != enabled:
            raise ResetRequired(
                f"MIG mode {doing.split()[0]} on GPU {gpu_index} is pending (current "
                f"{bool(current)}, pending {bool(pending)}) until the GPU is reset",
                gpu=gpu_index,
            )

    def capability_minors(self, gpu_index: int, gi_id: int, ci_id: int) -> tuple[int, int]:
        """The GI's and CI's ``/dev/nvidia-caps`` minors, from the driver's ``/proc`` files."""
        self._session.handle(gpu_index)
        info = self._discovery.info(gpu_index)
        minor = info.minor if info else gpu_index
        base = self._session.root / f"proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi_id}"
        return (
            _read_minor(base / "access", gpu_index),
            _read_minor(base / f"ci{ci_id}" / "access", gpu_index),
        )

    def _ci_profile(
        self,
        gpu: int,
        gi: Any,
        profile: gpu_model.Profile,
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
        session = self._session
        if value is None:
            value = getattr(session.nvml, constant, None)
        info = None
        if value is not None:
            try:
                info = session.call(
                    gpu,
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gi,
                    value,
                    session.nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    doing=f"look up compute profile {constant} in {profile.name}",
                )
            except BackendError as exc:
                if not (missing_ok and session.is_error(exc, *ABSENT)):
                    raise
        elif not missing_ok:
            raise NotSupported(f"this NVML binding has no {constant}", gpu=gpu)
        with session.lock:
            self._ci_profile_info[key] = info
        return info

    def _ci_profiles_offered(
        self, gpu: int, gi: Any, profile: gpu_model.Profile
    ) -> list[tuple[str, Any]]:
        """(constant, info) of every compute-instance profile the GPU offers in ``profile``."""
        count = int(getattr(self._session.nvml, f"{_CI_PREFIX}COUNT", 0))
        if self._ci_constants is None:  # once: dir() of the bindings is long for a hot path
            self._ci_constants = self._session.constants(_CI_PREFIX)
        offered = []
        for value in range(count):
            constant = self._ci_constants.get(value, f"{_CI_PREFIX}{value}")
            info = self._ci_profile(gpu, gi, profile, constant, value=value, missing_ok=True)
            if info is not None:
                offered.append((constant, info))
        return offered

    def _full_ci_profile(self, gpu: int, gi: Any, profile: gpu_model.Profile) -> Any:
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
        self, gpu: int, gi: Any, profile: gpu_model.Profile
    ) -> list[tuple[int, Any]]:
        """(CI id, CI info) of every compute instance of a GI, of any profile, lowest id first."""
        session = self._session
        found: dict[int, Any] = {}
        for _, info in self._ci_profiles_offered(gpu, gi, profile):
            for ci in session.list(
                gpu,
                "nvmlGpuInstanceGetComputeInstances",
                gi,
                info.id,
                session.nvml.c_nvmlComputeInstance_t,
                info.instanceCount,
            ):
                ci_info = session.call(gpu, "nvmlComputeInstanceGetInfo", ci)
                found[int(ci_info.id)] = ci_info
        return sorted(found.items(), key=lambda item: item[0])

    def _gpu_instance(self, gpu: int, gi_id: int) -> Any:
        return self._session.call(
            gpu,
            "nvmlDeviceGetGpuInstanceById",
            self._session.handle(gpu),
            gi_id,
            doing=f"find GPU instance {gi_id}",
        )


def _read_minor(path: Path, gpu: int) -> int:
    try:
        content = path.read_text()
    except FileNotFoundError as exc:
        raise GpuNotFound(f"{path} does not exist: the instance is gone", gpu=gpu) from exc
    except PermissionError as exc:
        raise NoPermission(f"cannot read {path}: {exc}", gpu=gpu) from exc
    except OSError as exc:
        raise BackendError(f"cannot read {path}: {exc}", gpu=gpu) from exc
    for line in content.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value)
    raise BackendError(f"{path} has no 'DeviceFileMinor: <n>' line", gpu=gpu)


# --- events --------------------------------------------------------------------------------------
# Health events from NVML: Xid critical errors and lost GPUs, best effort.  A GPU that cannot
# register for events is skipped with a warning; if NVML cannot create an event set at all, that
# error is raised (every call) so the caller can fall back to polling.

_XID_FELL_OFF_THE_BUS = 79


class HealthWatch:
    """One NVML event set for every GPU, and which GPUs are known lost."""

    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._event_set: Any = None
        self._lost: set[int] = set()

    def events(self, timeout_s: float) -> list[HealthEvent]:
        """What happened within ``timeout_s`` (the first event waits, the rest are drained)."""
        nvml = self._session.nvml
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

    def free(self) -> None:
        """Free the event set, if one was made (the caller holds the session's lock)."""
        nvml = self._session.nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as exc:
                log.warning("freeing the NVML event set failed: %s", exc)
            self._event_set = None

    def _events(self) -> Any:
        session = self._session
        nvml = session.nvml
        session.start()
        with session.lock:
            if self._event_set is None:
                event_set = session.call(None, "nvmlEventSetCreate")
                for index, handle in enumerate(session.handles):
                    try:
                        nvml.nvmlDeviceRegisterEvents(
                            handle, nvml.nvmlEventTypeXidCriticalError, event_set
                        )
                    except nvml.NVMLError as exc:
                        log.warning("GPU %d reports no Xid events: %s", index, exc)
                self._event_set = event_set
            return self._event_set

    def _index_of(self, device: Any) -> int | None:
        nvml = self._session.nvml
        try:
            return int(nvml.nvmlDeviceGetIndex(device))
        except nvml.NVMLError:
            wanted = address(device)
            for index, handle in enumerate(self._session.handles):
                if address(handle) == wanted:
                    return index
            return None

    def _probe_lost(self) -> list[HealthEvent]:
        """NVML said a GPU is lost without saying which: ask each one."""
        nvml = self._session.nvml
        events: list[HealthEvent] = []
        for index, handle in enumerate(self._session.handles):
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


# --- backend -------------------------------------------------------------------------------------
# ``NvmlBackend``: the ``GpuBackend`` protocol over the NVML session and its parts.  Each call
# goes to the part that owns it: ``Discovery`` (what the GPUs are), ``Instances`` (MIG mode and
# instances), ``HealthWatch`` (health); the session is shared by all, so ``nvmlInit`` runs once.


class NvmlBackend:
    """``GpuBackend`` over NVML. ``nvml`` is the ``pynvml`` module (or a fake of it)."""

    def __init__(self, nvml: Any = None, *, root: str | Path = "/") -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._session = NvmlSession(nvml, Path(root))
        self._discovery = Discovery(self._session)
        self._instances = Instances(self._session, self._discovery)
        self._health = HealthWatch(self._session)

    def boot_id(self) -> str:
        path = self._session.root / "proc/sys/kernel/random/boot_id"
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise BackendError(f"cannot read the boot id from {path}: {exc}") from exc

    def gpus(self) -> list[GpuInfo]:
        """Every GPU with its current MIG mode (a lost GPU keeps its last known facts)."""
        return self._discovery.gpus()

    def instances(self, gpu_index: int) -> list[MigInstance]:
        return self._instances.instances(gpu_index)

    def create_gpu_instance(self, gpu_index: int, profile: str, start: int) -> int:
        return self._instances.create_gpu_instance(gpu_index, profile, start)

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> MigInstance:
        return self._instances.create_compute_instance(gpu_index, gi_id)

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        self._instances.destroy_compute_instance(gpu_index, gi_id, ci_id)

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        self._instances.destroy_gpu_instance(gpu_index, gi_id)

    def processes(self, gpu_index: int, gi_id: int | None = None) -> list[int]:
        return self._instances.processes(gpu_index, gi_id)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        self._instances.set_mig_mode(gpu_index, enabled)

    def capability_minors(self, gpu_index: int, gi_id: int, ci_id: int) -> tuple[int, int]:
        return self._instances.capability_minors(gpu_index, gi_id, ci_id)

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        """Xid critical errors and lost GPUs, best effort: a GPU without events is skipped.

        The first call creates the event set; if NVML cannot create one at all, that error is
        raised (every call) so the caller can fall back to polling.
        """
        return self._health.events(timeout_s)

    def close(self) -> None:
        """Free the event set and shut NVML down (the agent calls it on exit)."""
        session = self._session
        with session.lock:
            if not session.started:
                return
            self._health.free()
            session.shutdown()


__all__ = ["NvmlBackend"]
