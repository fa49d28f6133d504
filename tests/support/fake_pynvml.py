"""A fake of the ``pynvml`` module for testing ``slicer.nvml.NvmlBackend`` without a GPU.

It offers only the functions the backend is meant to call, under pynvml's exact names, and
takes constants, ctypes structs and ``NVMLError`` classes from the real ``pynvml`` (importable
without a driver), so a misspelt name or a wrong struct fails here as it would on a node. It
checks argument shapes where NVML's C signature demands them (placements and counts passed by
reference) and behaves like a device whose profile ids are *not* the usual ones, so ids must be
looked up by constant. Every call is recorded in ``calls`` as ``(name, args)``.

Its GPUs report profile facts that differ from the catalog (:func:`drifted`: more memory, fewer
multiprocessors, as a newer driver might), so code that publishes the catalog's values instead
of NVML's fails the tests. A GPU can also be given a model the catalog does not have at all.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pynvml as real

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.slicer.simulated import placement_gi_id

GI_ID_OFFSET = 100
"""This fake numbers GI profiles 100 + the constant's value (real ids are device-specific)."""
CI_ID_OFFSET = 200

_BYREF_TYPE = type(ctypes.byref(ctypes.c_uint()))


def drifted(model: gpu_model.GpuModel) -> gpu_model.GpuModel:
    """``model`` as a GPU whose driver reports other figures than the catalog's.

    Every profile gets 128 MiB more memory per memory slice and one multiprocessor fewer per
    compute slice; placements, counts and engines stay.
    """
    profiles = tuple(
        replace(
            p,
            memory_bytes=p.memory_bytes + 128 * gpu_model.MIB * p.memory_slices,
            multiprocessors=p.multiprocessors - p.compute_slices,
        )
        for p in model.profiles
    )
    return replace(model, profiles=profiles)


_ARCHITECTURES = {"Ampere": 7, "Hopper": 9, "Blackwell": 10}


@dataclass
class FakeGpu:
    """One GPU as the fake reports it."""

    model: str
    """Catalog key of the GPU (or any label when ``hardware`` describes it)."""
    hardware: gpu_model.GpuModel | None = None
    """The profile facts the GPU reports; default: the catalog model, :func:`drifted`."""
    mig_current: bool = True
    mig_pending: bool = True
    uuid: str = ""
    minor: int = 0
    bus_id: str = ""
    name: str = ""
    pci_device_id: int = 0
    fabric: tuple[bytes, int] | None = None
    """(clusterUuid, cliqueId) when the GPU is in a completed NVLink fabric."""
    links: list[tuple[int, str]] | None = None
    """Active NVLinks as (remote device type, remote NVML bus id); None: NVLink unsupported."""
    activation_status: int = real.NVML_SUCCESS
    lost: bool = False
    pids: list[int] = field(default_factory=list)
    mig_capable: bool = True
    """False: a GPU without MIG (MIG calls answer NOT_SUPPORTED)."""


@dataclass
class _Ci:
    ci_id: int
    handle: int
    mig_handle: int
    profile_value: int
    uuid: str
    pids: list[int] = field(default_factory=list)


@dataclass
class _Gi:
    gi_id: int
    handle: int
    profile: gpu_model.Profile
    start: int
    cis: dict[int, _Ci] = field(default_factory=dict)


def _key(handle: Any) -> int:
    value = handle.value if isinstance(handle, ctypes.c_void_p) else handle
    return int(value or 0)


def _fails(code: int) -> real.NVMLError:
    return real.NVMLError(code)


class FakeNvml:
    """Stands in for the ``pynvml`` module; pass it as ``NvmlBackend(nvml=FakeNvml(...))``."""

    # ctypes arrays of these hold the fake's integer handles.
    c_nvmlGpuInstance_t = ctypes.c_void_p
    c_nvmlComputeInstance_t = ctypes.c_void_p

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.initialised = 0
        self.failures: dict[str, list[int]] = {}
        self.events: list[Any] = []
        self.registered: list[tuple[int, int]] = []
        self._next_handle = 0x1000
        self._objects: dict[int, tuple[Any, ...]] = {}
        self._gis: list[dict[int, _Gi]] = [{} for _ in gpus]
        self._serial = 0
        for index, gpu in enumerate(gpus):
            model = gpu.hardware or drifted(catalog.get_model(gpu.model))
            gpu.hardware = model
            gpu.uuid = gpu.uuid or f"GPU-00000000-0000-0000-0000-{index:012x}"
            gpu.minor = gpu.minor or index
            gpu.bus_id = gpu.bus_id or f"00000000:{0x18 + 0x10 * index:02X}:00.0"
            gpu.name = gpu.name or model.product_names[0]
            pci_id = model.pci_device_ids[0] if model.pci_device_ids else 0xFFFF
            gpu.pci_device_id = gpu.pci_device_id or (pci_id << 16 | 0x10DE)
        self.device_handles = [self._new_handle("gpu", i) for i in range(len(gpus))]

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlEventType")):
            return getattr(real, name)
        raise AttributeError(f"the fake pynvml has no {name!r} (does real pynvml?)")

    # --- test controls ---------------------------------------------------------------------

    def fail(self, name: str, code: int, times: int = 1) -> None:
        """The next ``times`` calls of ``name`` raise ``NVMLError(code)``."""
        self.failures.setdefault(name, []).extend([code] * times)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def run_process(self, gpu: int, pid: int, gi_id: int | None = None, ci_id: int = 0) -> None:
        if gi_id is None:
            self.gpus[gpu].pids.append(pid)
        else:
            self._gis[gpu][gi_id].cis[ci_id].pids.append(pid)

    def stop_process(self, gpu: int, pid: int) -> None:
        self.gpus[gpu].pids = [p for p in self.gpus[gpu].pids if p != pid]
        for gi in self._gis[gpu].values():
            for ci in gi.cis.values():
                ci.pids = [p for p in ci.pids if p != pid]

    def gi_ids(self, gpu: int) -> list[int]:
        return sorted(self._gis[gpu])

    # --- plumbing --------------------------------------------------------------------------

    def _new_handle(self, *what: Any) -> int:
        self._next_handle += 0x10
        self._objects[self._next_handle] = what
        return self._next_handle

    def _enter(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        pending = self.failures.get(name)
        if pending:
            raise _fails(pending.pop(0))
        if name != "nvmlInit" and not self.initialised:
            raise _fails(real.NVML_ERROR_UNINITIALIZED)

    def _object(self, handle: Any, kind: str) -> tuple[Any, ...]:
        value = _key(handle)
        found = self._objects.get(value)
        if found is None or found[0] != kind:
            raise _fails(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[found[1]]
        if gpu.lost:
            raise _fails(real.NVML_ERROR_GPU_IS_LOST)
        return found

    def _gpu(self, handle: Any) -> tuple[int, FakeGpu]:
        _, index = self._object(handle, "gpu")
        return index, self.gpus[index]

    def _gi(self, handle: Any) -> tuple[int, _Gi]:
        _, index, gi_id = self._object(handle, "gi")
        gi = self._gis[index].get(gi_id)
        if gi is None:
            raise _fails(real.NVML_ERROR_INVALID_ARGUMENT)
        return index, gi

    def _ci(self, handle: Any) -> tuple[int, _Gi, _Ci]:
        _, index, gi_id, ci_id = self._object(handle, "ci")
        gi = self._gis[index].get(gi_id)
        if gi is None or ci_id not in gi.cis:
            raise _fails(real.NVML_ERROR_INVALID_ARGUMENT)
        return index, gi, gi.cis[ci_id]

    @staticmethod
    def _by_ref(arg: Any, ctype: type) -> Any:
        target = getattr(arg, "_obj", None)
        if not isinstance(arg, _BYREF_TYPE) or not isinstance(target, ctype):
            raise TypeError(f"expected byref({ctype.__name__}(...)), got {arg!r}")
        return target

    def _model(self, index: int) -> gpu_model.GpuModel:
        model = self.gpus[index].hardware
        assert model is not None
        return model

    def _gi_profile_by_value(self, index: int, value: int) -> gpu_model.Profile:
        for profile in self._model(index).profiles:
            if getattr(real, profile.nvml_constant) == value:
                return profile
        raise _fails(real.NVML_ERROR_NOT_SUPPORTED)

    def _gi_profile_by_id(self, index: int, profile_id: int) -> gpu_model.Profile:
        return self._gi_profile_by_value(index, profile_id - GI_ID_OFFSET)

    @staticmethod
    def _ci_slices(value: int) -> int:
        for n in (1, 2, 3, 4, 6, 7, 8):
            if getattr(real, f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE") == value:
                return n
        raise _fails(real.NVML_ERROR_NOT_SUPPORTED)

    @staticmethod
    def _fill(array: Any, count_ref: Any, handles: list[int]) -> None:
        count = FakeNvml._by_ref(count_ref, ctypes.c_uint)
        if len(array) < len(handles):
            count.value = len(handles)
            raise _fails(real.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, handle in enumerate(handles):
            array[k] = handle
        count.value = len(handles)

    # --- pynvml API: system and devices ----------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "580.65.06"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return 13000

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetBrand", handle)
        self._gpu(handle)
        return int(real.NVML_BRAND_NVIDIA)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetArchitecture", handle)
        index, _ = self._gpu(handle)
        return _ARCHITECTURES.get(self._model(index).architecture, 0xFFFFFFFF)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise _fails(real.NVML_ERROR_INVALID_ARGUMENT)
        return self.device_handles[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return self._gpu(handle)[0]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return self._gpu(handle)[1].name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        value = _key(handle)
        found = self._objects.get(value)
        if found and found[0] == "mig":
            _, index, gi_id, ci_id = found
            if self.gpus[index].lost:
                raise _fails(real.NVML_ERROR_GPU_IS_LOST)
            return str(self._gis[index][gi_id].cis[ci_id].uuid)
        return self._gpu(handle)[1].uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetPciInfo", handle)
        gpu = self._gpu(handle)[1]
        info = real.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        info.pciDeviceId = gpu.pci_device_id
        return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetMinorNumber", handle)
        return self._gpu(handle)[1].minor

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        index, _ = self._gpu(handle)
        total = self._model(index).memory_bytes
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", handle)
        index, _ = self._gpu(handle)
        major, minor = self._model(index).cuda_compute_capability.split(".")
        return int(major), int(minor)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        gpu = self._gpu(handle)[1]
        if not gpu.mig_capable:
            raise _fails(real.NVML_ERROR_NOT_SUPPORTED)
        return [int(gpu.mig_current), int(gpu.mig_pending)]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        self._enter("nvmlDeviceSetMigMode", handle, mode)
        index, gpu = self._gpu(handle)
        if self._gis[index] or gpu.pids:
            raise _fails(real.NVML_ERROR_IN_USE)
        if gpu.activation_status != real.NVML_SUCCESS:
            return int(gpu.activation_status)
        gpu.mig_pending = bool(mode)
        if self._model(index).supports_dynamic_mig:
            gpu.mig_current = bool(mode)
        return int(real.NVML_SUCCESS)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        value = _key(handle)
        found = self._objects.get(value)
        if found and found[0] == "mig":
            _, index, gi_id, ci_id = found
            pids = [(p, gi_id, ci_id) for p in self._gis[index][gi_id].cis[ci_id].pids]
        else:
            index, gpu = self._gpu(handle)
            pids = [(p, 0xFFFFFFFF, 0xFFFFFFFF) for p in gpu.pids] + [
                (p, gi.gi_id, ci.ci_id)
                for gi in self._gis[index].values()
                for ci in gi.cis.values()
                for p in ci.pids
            ]
        return [
            SimpleNamespace(pid=p, usedGpuMemory=1 << 20, gpuInstanceId=g, computeInstanceId=c)
            for p, g, c in pids
        ]

    # --- pynvml API: MIG -------------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int) -> Any:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile)
        index, gpu = self._gpu(handle)
        if not gpu.mig_capable:
            raise _fails(real.NVML_ERROR_NOT_SUPPORTED)
        prof = self._gi_profile_by_value(index, profile)
        info = real.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = GI_ID_OFFSET + profile
        info.sliceCount = prof.compute_slices
        info.instanceCount = prof.max_count
        info.multiprocessorCount = prof.multiprocessors
        info.copyEngineCount = prof.engines.copy
        info.decoderCount = prof.engines.decoders
        info.encoderCount = prof.engines.encoders
        info.jpegCount = prof.engines.jpeg
        info.ofaCount = prof.engines.ofa
        info.memorySizeMB = prof.memory_bytes // gpu_model.MIB
        info.name = f"MIG {prof.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        self._enter(
            "nvmlDeviceGetGpuInstancePossiblePlacements", handle, profile_id, array, count_ref
        )
        index, _ = self._gpu(handle)
        prof = self._gi_profile_by_id(index, profile_id)
        count = self._by_ref(count_ref, ctypes.c_uint)
        if count.value < len(prof.starts) or len(array) < count.value:
            count.value = len(prof.starts)
            raise _fails(real.NVML_ERROR_INSUFFICIENT_SIZE)
        if not isinstance(array[0], real.c_nvmlGpuInstancePlacement_t):
            raise TypeError("placements must be an array of c_nvmlGpuInstancePlacement_t")
        for k, start in enumerate(prof.starts):
            array[k].start = start
            array[k].size = prof.memory_slices
        count.value = len(prof.starts)
        return int(real.NVML_SUCCESS)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: int, placement: Any
    ) -> int:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, placement)
        index, gpu = self._gpu(handle)
        where = self._by_ref(placement, real.c_nvmlGpuInstancePlacement_t)
        if not gpu.mig_current:
            raise _fails(real.NVML_ERROR_NOT_SUPPORTED)
        prof = self._gi_profile_by_id(index, profile_id)
        if where.size != prof.memory_slices or where.start not in prof.starts:
            raise _fails(real.NVML_ERROR_INVALID_ARGUMENT)
        model = self._model(index)
        present = [(gi.profile.name, gi.start) for gi in self._gis[index].values()]
        if not catalog.is_valid(model, [*present, (prof.name, where.start)]):
            raise _fails(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = placement_gi_id(model, prof, where.start)
        gi = _Gi(gi_id, self._new_handle("gi", index, gi_id), prof, where.start)
        self._gis[index][gi_id] = gi
        return gi.handle

    def nvmlGpuInstanceGetInfo(self, handle: Any) -> Any:
        self._enter("nvmlGpuInstanceGetInfo", handle)
        index, gi = self._gi(handle)
        return SimpleNamespace(
            device=self.device_handles[index],
            id=gi.gi_id,
            profileId=GI_ID_OFFSET + getattr(real, gi.profile.nvml_constant),
            placement=SimpleNamespace(start=gi.start, size=gi.profile.memory_slices),
        )

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        self._enter("nvmlDeviceGetGpuInstances", handle, profile_id, array, count_ref)
        index, _ = self._gpu(handle)
        prof = self._gi_profile_by_id(index, profile_id)
        handles = [gi.handle for _, gi in sorted(self._gis[index].items()) if gi.profile is prof]
        self._fill(array, count_ref, handles)
        return int(real.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> int:
        self._enter("nvmlDeviceGetGpuInstanceById", handle, gi_id)
        index, _ = self._gpu(handle)
        gi = self._gis[index].get(gi_id)
        if gi is None:
            raise _fails(real.NVML_ERROR_NOT_FOUND)
        return gi.handle

    def nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        self._enter("nvmlGpuInstanceDestroy", handle)
        index, gi = self._gi(handle)
        if gi.cis:
            raise _fails(real.NVML_ERROR_IN_USE)
        del self._gis[index][gi.gi_id]
        return int(real.NVML_SUCCESS)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, handle: Any, profile: int, eng_profile: int
    ) -> Any:
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo", handle, profile, eng_profile)
        _, gi = self._gi(handle)
        if eng_profile != real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _fails(real.NVML_ERROR_INVALID_ARGUMENT)
        slices = self._ci_slices(profile)
        if slices > gi.profile.compute_slices:
            raise _fails(real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(
            id=CI_ID_OFFSET + profile,
            sliceCount=slices,
            instanceCount=gi.profile.compute_slices // slices,
        )

    def nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile_id: int) -> int:
        self._enter("nvmlGpuInstanceCreateComputeInstance", handle, profile_id)
        index, gi = self._gi(handle)
        slices = self._ci_slices(profile_id - CI_ID_OFFSET)
        used = sum(self._ci_slices(ci.profile_value) for ci in gi.cis.values())
        if used + slices > gi.profile.compute_slices:
            raise _fails(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = 0
        while ci_id in gi.cis:
            ci_id += 1
        self._serial += 1
        ci = _Ci(
            ci_id=ci_id,
            handle=self._new_handle("ci", index, gi.gi_id, ci_id),
            mig_handle=self._new_handle("mig", index, gi.gi_id, ci_id),
            profile_value=profile_id - CI_ID_OFFSET,
            uuid=f"MIG-{self._serial:08x}-0000-0000-0000-{index:04x}{gi.gi_id:04x}{ci_id:04x}",
        )
        gi.cis[ci_id] = ci
        return ci.handle

    def nvmlGpuInstanceGetComputeInstances(
        self, handle: Any, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        self._enter("nvmlGpuInstanceGetComputeInstances", handle, profile_id, array, count_ref)
        _, gi = self._gi(handle)
        handles = [
            ci.handle
            for _, ci in sorted(gi.cis.items())
            if ci.profile_value == profile_id - CI_ID_OFFSET
        ]
        self._fill(array, count_ref, handles)
        return int(real.NVML_SUCCESS)

    def nvmlGpuInstanceGetComputeInstanceById(self, handle: Any, ci_id: int) -> int:
        self._enter("nvmlGpuInstanceGetComputeInstanceById", handle, ci_id)
        _, gi = self._gi(handle)
        if ci_id not in gi.cis:
            raise _fails(real.NVML_ERROR_NOT_FOUND)
        return gi.cis[ci_id].handle

    def nvmlComputeInstanceGetInfo(self, handle: Any) -> Any:
        self._enter("nvmlComputeInstanceGetInfo", handle)
        index, gi, ci = self._ci(handle)
        return SimpleNamespace(
            device=ci.mig_handle,
            gpuInstance=gi.handle,
            id=ci.ci_id,
            profileId=CI_ID_OFFSET + ci.profile_value,
        )

    def nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        self._enter("nvmlComputeInstanceDestroy", handle)
        _, gi, ci = self._ci(handle)
        if ci.pids:
            raise _fails(real.NVML_ERROR_IN_USE)
        del gi.cis[ci.ci_id]
        return int(real.NVML_SUCCESS)

    # --- pynvml API: topology and events ---------------------------------------------------

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> int:
        self._enter("nvmlDeviceGetGpuFabricInfoV", handle, info_ref)
        gpu = self._gpu(handle)[1]
        info = self._by_ref(info_ref, real.c_nvmlGpuFabricInfoV_t)
        if gpu.fabric is None:
            raise _fails(real.NVML_ERROR_NOT_SUPPORTED)
        cluster, clique = gpu.fabric
        ctypes.memmove(info.clusterUuid, cluster, len(cluster))
        info.status = real.NVML_SUCCESS
        info.cliqueId = clique
        info.state = real.NVML_GPU_FABRIC_STATE_COMPLETED
        return int(real.NVML_SUCCESS)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", handle, link)
        links = self._gpu(handle)[1].links
        if links is None:
            raise _fails(real.NVML_ERROR_NOT_SUPPORTED)
        if link >= 18:
            raise _fails(real.NVML_ERROR_INVALID_ARGUMENT)
        return int(link < len(links))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        links = self._gpu(handle)[1].links or []
        return links[link][0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        links = self._gpu(handle)[1].links or []
        info = real.nvmlPciInfo_t()
        info.busId = links[link][1].encode()
        return info

    def nvmlEventSetCreate(self) -> str:
        self._enter("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle, event_types, event_set)
        index, _ = self._gpu(handle)
        self.registered.append((index, event_types))

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait", event_set, timeout_ms)
        if not self.events:
            raise _fails(real.NVML_ERROR_TIMEOUT)
        event = self.events.pop(0)
        if isinstance(event, int):
            raise _fails(event)
        return event

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree", event_set)

    def xid_event(self, gpu: int, xid: int) -> Any:
        """An event as nvmlEventSetWait returns it (queue it with ``events.append``)."""
        return SimpleNamespace(
            device=self.device_handles[gpu],
            eventType=real.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
