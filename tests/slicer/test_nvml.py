"""The NVML backend makes the right pynvml calls, with the right shapes, and maps NVML's errors."""

from __future__ import annotations

from pathlib import Path

import pynvml as real
import pytest

from gpu_slicer.slicer.backend import HealthEvent, model_of
from gpu_slicer.slicer.errors import (
    BackendError,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    InsufficientResources,
    NoPermission,
    NotSupported,
    ResetRequired,
)
from gpu_slicer.slicer.nvml import NvmlBackend
from tests.support.fake_pynvml import CI_ID_OFFSET, GI_ID_OFFSET, FakeGpu, FakeNvml


def backend_for(tmp_path: Path, *gpus: FakeGpu) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml(list(gpus))
    return NvmlBackend(nvml=fake, root=tmp_path), fake


def slice_on(backend: NvmlBackend, gpu: int, profile: str, start: int) -> tuple[int, int]:
    gi = backend.create_gpu_instance(gpu, profile, start)
    mig = backend.create_compute_instance(gpu, gi)
    assert mig.ci_id is not None
    return gi, mig.ci_id


# --- start-up and discovery ----------------------------------------------------------------


def test_nvml_starts_once_on_first_use_and_handles_are_cached(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("H100-80GB"), FakeGpu("H100-80GB"))
    assert fake.calls == []
    backend.gpus()
    backend.gpus()
    backend.instances(1)
    assert fake.names().count("nvmlInit") == 1
    assert fake.names().count("nvmlDeviceGetHandleByIndex") == 2


def test_a_driver_that_is_not_loaded_is_a_backend_error_naming_the_step(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"))
    fake.fail("nvmlInit", real.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendError, match="initialise NVML") as info:
        backend.gpus()
    assert isinstance(info.value.__cause__, real.NVMLError_DriverNotLoaded)


def test_gpus_report_catalog_models_and_canonical_pci_addresses(tmp_path: Path) -> None:
    backend, _ = backend_for(
        tmp_path,
        FakeGpu("H100-80GB", mig_current=False, mig_pending=False, bus_id="00000000:3B:00.0"),
        FakeGpu("A100-80GB", minor=5),
    )
    h100, a100 = backend.gpus()
    assert (h100.model, h100.product_name, h100.pci_bus_id) == (
        "H100-80GB",
        "NVIDIA H100 80GB HBM3",
        "0000:3b:00.0",
    )
    assert (h100.architecture, h100.cuda_compute_capability) == ("Hopper", "9.0")
    assert (h100.mig_enabled, a100.mig_enabled) == (False, True)
    assert a100.minor == 5 and a100.index == 1
    assert h100.driver_version == "580.65.06"
    assert h100.uuid.startswith("GPU-")


def test_the_pcie_root_comes_from_sysfs_or_else_the_gpu_s_own_bus(tmp_path: Path) -> None:
    devices = tmp_path / "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    devices.mkdir(parents=True)
    links = tmp_path / "sys/bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:3b:00.0").symlink_to(devices)
    backend, _ = backend_for(
        tmp_path,
        FakeGpu("A30", bus_id="00000000:3B:00.0"),
        FakeGpu("A30", bus_id="00000000:86:00.0"),
    )
    assert [g.pcie_root for g in backend.gpus()] == ["pci0000:3a", "pci0000:86"]


def test_a_model_is_found_by_product_name_when_the_pci_id_is_unknown(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, FakeGpu("H200", pci_device_id=0xFFFF10DE))
    assert [g.model for g in backend.gpus()] == ["H200-141GB"]


def test_gpus_without_mig_are_offered_whole(tmp_path: Path) -> None:
    backend, _ = backend_for(
        tmp_path,
        FakeGpu("A30", name="Tesla V100-SXM2-16GB", pci_device_id=0x1DB110DE, mig_capable=False),
        FakeGpu("A30"),
    )
    v100, a30 = backend.gpus()
    assert (v100.product_name, v100.mig_model, v100.mig_enabled) == (
        "Tesla V100-SXM2-16GB",
        None,
        False,
    )
    assert model_of(v100) is None and model_of(a30) is not None
    assert backend.instances(0) == []
    with pytest.raises(NotSupported, match="has no MIG"):
        backend.create_gpu_instance(0, "1g.6gb", 0)


def test_the_nvlink_domain_is_the_fabric_clique_when_there_is_one(tmp_path: Path) -> None:
    cluster = bytes(range(1, 17))
    backend, _ = backend_for(
        tmp_path, FakeGpu("H100-80GB", fabric=(cluster, 7)), FakeGpu("H100-80GB")
    )
    first, second = backend.gpus()
    assert first.nvlink_domain == "01020304-0506-0708-090a-0b0c0d0e0f10.7"
    assert second.nvlink_domain is None


def test_gpus_joined_by_nvlink_share_a_domain(tmp_path: Path) -> None:
    gpu = real.NVML_NVLINK_DEVICE_TYPE_GPU
    switch = real.NVML_NVLINK_DEVICE_TYPE_SWITCH
    backend, _ = backend_for(
        tmp_path,
        FakeGpu("H100-NVL", bus_id="00000000:18:00.0", links=[(gpu, "00000000:28:00.0")]),
        FakeGpu("H100-NVL", bus_id="00000000:28:00.0", links=[(gpu, "00000000:18:00.0")]),
        FakeGpu("H100-NVL", bus_id="00000000:38:00.0", links=[]),
        FakeGpu("H100-80GB", bus_id="00000000:48:00.0", links=[(switch, "00000000:F0:00.0")]),
        FakeGpu("H100-80GB", bus_id="00000000:58:00.0", links=[(switch, "00000000:F1:00.0")]),
        FakeGpu("A30", bus_id="00000000:68:00.0"),
    )
    domains = [g.nvlink_domain for g in backend.gpus()]
    assert domains[0] == domains[1] is not None
    assert domains[3] == domains[4] is not None
    assert domains[0] != domains[3]
    assert domains[2] is None and domains[5] is None


def test_the_boot_id_is_read_under_the_injected_root(tmp_path: Path) -> None:
    path = tmp_path / "proc/sys/kernel/random/boot_id"
    path.parent.mkdir(parents=True)
    path.write_text("0b9c5c47-1111-4aa8-9c0e-2c9d8b6f0e7a\n")
    backend, _ = backend_for(tmp_path)
    assert backend.boot_id() == "0b9c5c47-1111-4aa8-9c0e-2c9d8b6f0e7a"
    with pytest.raises(BackendError, match="boot id"):
        NvmlBackend(nvml=FakeNvml([]), root=tmp_path / "elsewhere").boot_id()


# --- creating ------------------------------------------------------------------------------


def test_a_gpu_instance_is_created_at_its_placement_passed_by_reference(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("H100-80GB"))
    gi_id = backend.create_gpu_instance(0, "3g.40gb", 4)
    handle = fake.device_handles[0]
    constant = real.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    assert ("nvmlDeviceGetGpuInstanceProfileInfo", (handle, constant)) in fake.calls
    [(_, (device, profile_id, _placement))] = [
        c for c in fake.calls if c[0] == "nvmlDeviceCreateGpuInstanceWithPlacement"
    ]
    assert device == handle
    assert profile_id == GI_ID_OFFSET + constant  # looked up, not the usual id 9
    # The fake, like NVML, takes the placement only by reference and creates it where it says.
    created = [m for m in backend.instances(0) if m.gi_id == gi_id]
    assert [(m.profile, m.start, m.size) for m in created] == [("3g.40gb", 4, 4)]


def test_profile_ids_are_looked_up_once_per_gpu(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A100-80GB"))
    backend.create_gpu_instance(0, "1g.10gb", 0)
    backend.create_gpu_instance(0, "1g.10gb", 1)
    # Discovery reads every profile constant once; creating instances reads none again.
    asked = [c[1][1] for c in fake.calls if c[0] == "nvmlDeviceGetGpuInstanceProfileInfo"]
    assert sorted(asked) == list(range(real.NVML_GPU_INSTANCE_PROFILE_COUNT))


def test_an_illegal_placement_is_refused_before_nvml_is_asked(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A100-80GB"))
    with pytest.raises(NotSupported, match="legal starts"):
        backend.create_gpu_instance(0, "2g.20gb", 1)
    with pytest.raises(NotSupported, match="no MIG profile"):
        backend.create_gpu_instance(0, "2g.24gb", 0)
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in fake.names()


def test_an_overlap_is_insufficient_resources_from_nvml(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, FakeGpu("A30"))
    backend.create_gpu_instance(0, "2g.12gb", 0)
    with pytest.raises(InsufficientResources, match="create 1g.6gb at memory slice 1") as info:
        backend.create_gpu_instance(0, "1g.6gb", 1)
    assert isinstance(info.value.__cause__, real.NVMLError_InsufficientResources)
    assert info.value.gpu == 0


def test_the_compute_instance_spans_the_gpu_instance_and_its_uuid_comes_from_its_handle(
    tmp_path: Path,
) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("H100-80GB"))
    gi_id = backend.create_gpu_instance(0, "2g.20gb", 2)
    mig = backend.create_compute_instance(0, gi_id)
    # Every compute profile the GPU instance offers is read; the one spanning it is used.
    lookups = [c for c in fake.calls if c[0] == "nvmlGpuInstanceGetComputeInstanceProfileInfo"]
    assert [args[1:] for _, args in lookups] == [
        (value, real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        for value in range(real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
    ]
    [(_, (_, ci_profile_id))] = [
        c for c in fake.calls if c[0] == "nvmlGpuInstanceCreateComputeInstance"
    ]
    assert ci_profile_id == CI_ID_OFFSET + real.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE
    info_index = fake.names().index("nvmlComputeInstanceGetInfo")
    assert fake.names()[info_index + 1] == "nvmlDeviceGetUUID"
    assert (mig.profile, mig.start, mig.size, mig.gi_id, mig.ci_id) == ("2g.20gb", 2, 2, gi_id, 0)
    assert mig.uuid is not None and mig.uuid.startswith("MIG-")


def test_instances_lists_gpu_instances_with_and_without_compute_instances(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, FakeGpu("A100-40GB"))
    whole_gi, _ = slice_on(backend, 0, "3g.20gb", 4)
    half_gi = backend.create_gpu_instance(0, "1g.5gb", 0)
    listed = backend.instances(0)
    assert [(m.profile, m.start, m.size, m.gi_id) for m in listed] == [
        ("1g.5gb", 0, 1, half_gi),
        ("3g.20gb", 4, 4, whole_gi),
    ]
    assert listed[0].ci_id is None and listed[0].uuid is None
    assert listed[1].ci_id == 0 and listed[1].uuid is not None


def test_a_gpu_in_full_mode_has_no_instances_and_nothing_is_listed(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("H100-80GB", mig_current=False))
    assert backend.instances(0) == []
    assert "nvmlDeviceGetGpuInstances" not in fake.names()


def test_a_foreign_gpu_instance_split_into_smaller_compute_instances_is_listed(
    tmp_path: Path,
) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A100-80GB"))
    gi_id = backend.create_gpu_instance(0, "3g.40gb", 0)
    gi = fake.nvmlDeviceGetGpuInstanceById(fake.device_handles[0], gi_id)
    one_slice = CI_ID_OFFSET + real.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    for _ in range(3):
        fake.nvmlGpuInstanceCreateComputeInstance(gi, one_slice)
    [listed] = backend.instances(0)
    assert (listed.profile, listed.ci_id) == ("3g.40gb", 0)


# --- destroying ----------------------------------------------------------------------------


def test_cleanup_destroys_the_compute_instance_before_the_gpu_instance(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("H100-80GB"))
    gi, ci = slice_on(backend, 0, "1g.10gb", 3)
    with pytest.raises(GpuInUse, match="destroy GPU instance"):
        backend.destroy_gpu_instance(0, gi)
    backend.destroy_compute_instance(0, gi, ci)
    backend.destroy_gpu_instance(0, gi)
    destroys = [n for n in fake.names() if n.endswith("Destroy")]
    assert destroys == [
        "nvmlGpuInstanceDestroy",
        "nvmlComputeInstanceDestroy",
        "nvmlGpuInstanceDestroy",
    ]
    assert fake.gi_ids(0) == []
    with pytest.raises(GpuNotFound):
        backend.destroy_gpu_instance(0, gi)
    with pytest.raises(GpuNotFound):
        backend.destroy_compute_instance(0, gi, ci)


def test_a_compute_instance_with_processes_is_in_use(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"))
    gi, ci = slice_on(backend, 0, "1g.6gb", 2)
    fake.run_process(0, 321, gi, ci)
    assert backend.processes(0, gi) == [321]
    assert backend.processes(0) == [321]
    with pytest.raises(GpuInUse) as info:
        backend.destroy_compute_instance(0, gi, ci)
    assert isinstance(info.value.__cause__, real.NVMLError_InUse)
    fake.stop_process(0, 321)
    backend.destroy_compute_instance(0, gi, ci)
    assert backend.processes(0, gi) == []


def test_processes_of_a_gpu_instance_are_asked_of_its_mig_device(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"))
    gi, ci = slice_on(backend, 0, "2g.12gb", 0)
    other_gi, other_ci = slice_on(backend, 0, "2g.12gb", 2)
    fake.run_process(0, 1, gi, ci)
    fake.run_process(0, 2, other_gi, other_ci)
    assert backend.processes(0, other_gi) == [2]
    asked = [args[0] for name, args in fake.calls if name == "nvmlDeviceGetComputeRunningProcesses"]
    assert asked and fake.device_handles[0] not in asked


# --- MIG mode ------------------------------------------------------------------------------


def test_hopper_mig_mode_switches_and_is_checked_afterwards(tmp_path: Path) -> None:
    backend, fake = backend_for(
        tmp_path, FakeGpu("H100-80GB", mig_current=False, mig_pending=False)
    )
    backend.set_mig_mode(0, True)
    assert ("nvmlDeviceSetMigMode", (fake.device_handles[0], real.NVML_DEVICE_MIG_ENABLE)) in (
        fake.calls
    )
    assert fake.names()[-1] == "nvmlDeviceGetMigMode"
    assert backend.gpus()[0].mig_enabled


def test_an_ampere_mode_change_that_waits_for_a_reset_is_reset_required(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, FakeGpu("A100-80GB"))
    with pytest.raises(ResetRequired, match="pending"):
        backend.set_mig_mode(0, False)
    [gpu] = backend.gpus()
    assert gpu.mig_enabled and not gpu.mig_pending


def test_a_failed_activation_status_is_an_error_even_though_nvml_did_not_raise(
    tmp_path: Path,
) -> None:
    backend, _ = backend_for(
        tmp_path,
        FakeGpu(
            "H100-80GB",
            mig_current=False,
            mig_pending=False,
            activation_status=real.NVML_ERROR_IN_USE,
        ),
    )
    with pytest.raises(GpuInUse, match="activation status") as info:
        backend.set_mig_mode(0, True)
    assert isinstance(info.value.__cause__, real.NVMLError_InUse)


def test_a_mode_change_under_instances_is_in_use(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, FakeGpu("H100-80GB"))
    backend.create_gpu_instance(0, "7g.80gb", 0)
    with pytest.raises(GpuInUse):
        backend.set_mig_mode(0, False)


# --- capability minors ---------------------------------------------------------------------


def write_cap(tmp_path: Path, relative: str, text: str) -> None:
    path = tmp_path / "proc/driver/nvidia/capabilities" / relative / "access"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_capability_minors_are_read_from_the_driver_s_proc_files(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, FakeGpu("A30"), FakeGpu("A30", minor=4))
    write_cap(tmp_path, "gpu4/mig/gi5", "DeviceFileMinor: 588\nDeviceFileMode: 292\n")
    write_cap(tmp_path, "gpu4/mig/gi5/ci0", "DeviceFileMinor: 589\nDeviceFileMode: 292\n")
    backend.gpus()
    assert backend.capability_minors(1, 5, 0) == (588, 589)


def test_missing_or_malformed_capability_files_are_reported(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, FakeGpu("A30"))
    with pytest.raises(GpuNotFound, match="gi3/access"):
        backend.capability_minors(0, 3, 0)
    write_cap(tmp_path, "gpu0/mig/gi3", "DeviceFileMinor: 30\n")
    write_cap(tmp_path, "gpu0/mig/gi3/ci0", "garbage\n")
    with pytest.raises(BackendError, match="DeviceFileMinor"):
        backend.capability_minors(0, 3, 0)


# --- health --------------------------------------------------------------------------------


def test_xid_events_are_registered_for_every_gpu_and_reported(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"), FakeGpu("A30"))
    fake.events.append(fake.xid_event(1, 48))
    assert backend.health_events(0.5) == [HealthEvent(1, "xid", xid=48, message="Xid 48")]
    assert fake.registered == [
        (0, real.nvmlEventTypeXidCriticalError),
        (1, real.nvmlEventTypeXidCriticalError),
    ]
    waits = [args for name, args in fake.calls if name == "nvmlEventSetWait"]
    assert waits[0][1] == 500
    assert backend.health_events(0) == []
    assert fake.names().count("nvmlEventSetCreate") == 1


def test_a_lost_gpu_is_found_by_asking_each_gpu(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"), FakeGpu("A30"))
    backend.gpus()
    fake.gpus[1].lost = True
    fake.events.append(real.NVML_ERROR_GPU_IS_LOST)
    [event] = backend.health_events(0)
    assert (event.gpu_index, event.kind) == (1, "gpu-lost")
    with pytest.raises(GpuLost):
        backend.instances(1)
    assert [g.index for g in backend.gpus()] == [0, 1]
    fake.gpus[1].lost = False
    fake.events.append(real.NVML_ERROR_GPU_IS_LOST)
    assert [e.kind for e in backend.health_events(0)] == ["recovered"]


def test_a_gpu_lost_before_discovery_is_left_out_of_the_list(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"), FakeGpu("A30"))
    fake.gpus[0].lost = True
    assert [g.index for g in backend.gpus()] == [1]


def test_xid_79_makes_the_backend_check_which_gpu_fell_off_the_bus(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"))
    fake.gpus[0].lost = True
    fake.events.append(fake.xid_event(0, 79))
    kinds = [(e.kind, e.xid) for e in backend.health_events(0)]
    assert kinds == [("xid", 79), ("gpu-lost", None)]


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (real.NVML_ERROR_IN_USE, GpuInUse),
        (real.NVML_ERROR_INSUFFICIENT_RESOURCES, InsufficientResources),
        (real.NVML_ERROR_NOT_FOUND, GpuNotFound),
        (real.NVML_ERROR_NOT_SUPPORTED, NotSupported),
        (real.NVML_ERROR_NO_PERMISSION, NoPermission),
        (real.NVML_ERROR_RESET_REQUIRED, ResetRequired),
        (real.NVML_ERROR_GPU_IS_LOST, GpuLost),
        (real.NVML_ERROR_UNKNOWN, BackendError),
    ],
    ids=[
        "in-use",
        "insufficient",
        "not-found",
        "not-supported",
        "no-permission",
        "reset-required",
        "gpu-lost",
        "unknown",
    ],
)
def test_nvml_errors_map_to_slicer_errors_chained_to_the_nvml_error(
    tmp_path: Path, code: int, error: type[BackendError]
) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"))
    fake.fail("nvmlDeviceGetGpuInstanceById", code)
    with pytest.raises(BackendError) as info:
        backend.destroy_gpu_instance(0, 3)
    assert type(info.value) is error
    assert info.value.gpu == 0
    assert "GPU instance 3" in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, real.NVMLError) and cause.value == code


def test_close_frees_the_event_set_and_shuts_nvml_down(tmp_path: Path) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"))
    backend.health_events(0)
    backend.close()
    assert fake.names()[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]
    assert fake.initialised == 0


# --- facts from NVML, not from the catalog -------------------------------------------------


def _capacity(device: dict[str, object], name: str) -> str:
    capacity = device["capacity"]
    assert isinstance(capacity, dict)
    return str(capacity[f"gpu-slicer.io/{name}"]["value"])


def test_published_profile_facts_are_nvml_s_and_differences_from_the_catalog_are_listed(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gpu_slicer.core import catalog
    from gpu_slicer.kube.quantity import format_bytes
    from gpu_slicer.slicer.inventory import GpuState, advertise_gpu

    backend, fake = backend_for(tmp_path, FakeGpu("A100-80GB"))
    (info,) = backend.gpus()
    reported = fake.gpus[0].hardware
    assert reported is not None and info.mig_model is not None
    listed = catalog.get_model("A100-80GB")
    devices = {d.name: d.body for d in advertise_gpu(GpuState(info, mode="mig")).devices}
    slice_20gb = devices["gpu-0-mig-2g20gb-0"]
    # The fake's driver reports 128 MiB more per memory slice and fewer SMs than the catalog.
    assert _capacity(slice_20gb, "memory") == format_bytes(reported.profile("2g.20gb").memory_bytes)
    assert _capacity(slice_20gb, "memory") != format_bytes(listed.profile("2g.20gb").memory_bytes)
    assert _capacity(slice_20gb, "multiprocessors") == "26"
    assert _capacity(slice_20gb, "decoders") == "1"
    assert any(
        "2g.20gb: memory 19.50 GiB in the catalog, 19.75 GiB on the GPU" in d
        for d in info.catalog_differences
    )
    assert "catalog and GPU disagree" in caplog.text
    assert info.mig_model.source == "nvml"
    assert info.mig_model.profile("1g.10gb").starts == (0, 1, 2, 3, 4, 5, 6)
    placements = [c for c in fake.calls if c[0] == "nvmlDeviceGetGpuInstancePossiblePlacements"]
    assert len(placements) == len(reported.profiles)


def test_a_gpu_the_catalog_does_not_know_is_advertised_from_what_nvml_reports(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from gpu_slicer.core import catalog
    from gpu_slicer.slicer.inventory import GpuState, advertise_gpu

    base = catalog.get_model("B200")
    future = replace(
        base,
        key="future",
        product_names=("NVIDIA Z900 Ultra",),
        pci_device_ids=(0x9999,),
        profiles=tuple(replace(p, name=p.name.replace("gb", "0gb", 1)) for p in base.profiles),
    )
    backend, _ = backend_for(tmp_path, FakeGpu("future", hardware=future))
    (info,) = backend.gpus()
    assert (info.model, info.architecture) == ("Z900-Ultra", "Blackwell")
    assert info.catalog_differences == ()
    assert info.mig_model is not None
    assert "1g.230gb" in {p.name for p in info.mig_model.profiles}
    names = {d.name for d in advertise_gpu(GpuState(info, mode="dynamic")).devices}
    assert {"gpu-0", "gpu-0-mig-1g230gb-6", "gpu-0-mig-7g1800gb-0"} <= names
    backend.set_mig_mode(0, True)
    gi = backend.create_gpu_instance(0, "3g.900gb", 4)
    assert backend.create_compute_instance(0, gi).profile == "3g.900gb"


def test_brand_and_cuda_driver_version_are_read_for_the_nvidia_compatible_attributes(
    tmp_path: Path,
) -> None:
    from gpu_slicer.slicer.inventory import GpuState, advertise_gpu

    backend, _ = backend_for(tmp_path, FakeGpu("H100-80GB"))
    (info,) = backend.gpus()
    assert (info.brand, info.cuda_driver_version) == ("Nvidia", "13.0")
    attributes = advertise_gpu(GpuState(info)).devices[0].body["attributes"]
    assert attributes["gpu-slicer.io/brand"] == {"string": "Nvidia"}
    assert attributes["gpu-slicer.io/cudaDriverVersion"] == {"version": "13.0.0"}


def test_without_profile_facts_a_catalog_gpu_falls_back_to_the_catalog(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("A30"))
    fake.fail("nvmlDeviceGetGpuInstanceProfileInfo", real.NVML_ERROR_NOT_SUPPORTED, times=64)
    (info,) = backend.gpus()
    assert info.mig_model is None and info.model == "A30-24GB"
    assert "using the catalog's values" in caplog.text


def test_a_gpu_instance_no_compute_profile_spans_fails_with_what_the_gpu_offers(
    tmp_path: Path,
) -> None:
    backend, fake = backend_for(tmp_path, FakeGpu("H100-80GB"))
    gi_id = backend.create_gpu_instance(0, "7g.80gb", 0)
    # The GPU offers every compute profile but the 7-slice one.
    fake.fail(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        real.NVML_ERROR_NOT_SUPPORTED,
        times=real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    )
    with pytest.raises(NotSupported, match="no compute-instance profile spanning a 7g.80gb"):
        backend.create_compute_instance(0, gi_id)
