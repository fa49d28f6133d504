"""MIG instances' lifecycle on NVML: MIG mode, GPU and compute instances, their processes and
capability minors.

GPU instances are always created at an explicit placement, passed by reference: NVML's own
choice depends on the order of creation and would not match what the scheduler allocated. The
compute instance spans the GPU instance (shared engines); its profile is the one the GPU offers
with all the GPU instance's compute slices, read from NVML, never assumed (the catalog's
``ci_nvml_constant`` only breaks a tie). Its MIG UUID comes from the compute instance's own
device handle, not from walking every MIG device.
"""

from __future__ import annotations

import logging
from ctypes import byref
from pathlib import Path
from typing import Any

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import MigInstance
from gpu_slicer.core.errors import CatalogError
from gpu_slicer.slicer.errors import (
    BackendError,
    GpuNotFound,
    NoPermission,
    NotSupported,
    ResetRequired,
)
from gpu_slicer.slicer.nvml.discovery import Discovery
from gpu_slicer.slicer.nvml.session import ABSENT, NvmlSession, text

log = logging.getLogger(__name__)

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
