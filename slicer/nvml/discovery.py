"""What each GPU is: its static facts, its MIG model from NVML's profile facts, and NVML's
profile ids for that model.

Facts come from the GPU, not the catalog: every GPU-instance profile is read with
``nvmlDeviceGetGpuInstanceProfileInfo`` and its placements with
``nvmlDeviceGetGpuInstancePossiblePlacements``; :mod:`slicer.hardware` turns them into the GPU's
model, and where the catalog disagrees each difference is logged and kept. Profile ids differ
between devices, so they are looked up per GPU and cached here, never hard-coded.
"""

from __future__ import annotations

import logging
from ctypes import byref, c_uint
from dataclasses import replace
from typing import Any, NamedTuple

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.errors import CatalogError
from gpu_slicer.slicer import hardware
from gpu_slicer.slicer.backend import GpuInfo
from gpu_slicer.slicer.errors import BackendError, GpuLost, NotSupported
from gpu_slicer.slicer.nvml.session import ABSENT, NvmlSession, canonical_bus_id, text
from gpu_slicer.slicer.nvml.topology import nvlink_domains

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
