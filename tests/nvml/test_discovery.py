"""Discovery through the real bindings: the facts the agent publishes are the mock GPU's, and a
node publishes the same ResourceSlices as the simulated backend does for the same model."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.identity import qualified
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.kube.quantity import parse_bytes
from gpu_slicer.slicer.errors import BackendError, NoPermission
from gpu_slicer.slicer.nvml import NvmlBackend
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support import nvml_mock
from tests.support.agent_fixtures import Agent, allocate_claim, devices_by_name, node_slices
from tests.support.nvml_mock import MockNvml

# Attributes that identify one GPU or node (the mock's UUIDs are random, its driver version and
# PCI layout its own); everything else in a slice follows from the model.
IDENTITY = {
    *(
        qualified(name)
        for name in ("uuid", "parentUUID", "driverVersion", "nvlinkDomain", "productName")
    ),
    "resource.kubernetes.io/pcieRoot",
    "resource.kubernetes.io/pciBusID",
}


def test_facts_are_the_gpus_as_nvml_reports_them(mock: MockNvml, backend: NvmlBackend) -> None:
    described = mock.describe()["gpus"]
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 1]
    for info, mine in zip(gpus, described, strict=True):
        assert info.uuid == mine["uuid"]
        assert info.model == "H100-80GB"
        assert info.product_name == "NVIDIA H100 80GB HBM3"
        assert info.pci_bus_id == f"0000:{info.index:02x}:00.0"
        assert info.minor == info.index
        assert info.architecture == "Hopper"
        assert info.cuda_compute_capability == "9.0"
        assert info.brand == "Nvidia"
        assert info.driver_version == "580.95.05"
        assert info.cuda_driver_version == "13.0"
        assert info.memory_bytes == 80 * gpu_model.GIB
        assert (info.mig_enabled, info.mig_pending) == (False, False)
        assert info.mig_model is not None and info.mig_model.source == "nvml"
    # Every GPU of the board reaches the others through the NVSwitches.
    assert gpus[0].nvlink_domain is not None
    assert gpus[0].nvlink_domain == gpus[1].nvlink_domain


def test_profiles_come_from_the_gpu_and_differences_from_the_catalog_are_listed(
    backend: NvmlBackend,
) -> None:
    info = backend.gpus()[0]
    assert info.mig_model is not None
    three = info.mig_model.profile("3g.40gb")
    # The mock's figures (48 SMs, 40 GiB), not the catalog's (60 SMs, 39.5 GiB).
    assert (three.multiprocessors, three.memory_bytes) == (48, 40 * gpu_model.GIB)
    assert three.starts == (0, 4) and three.memory_slices == 4
    differences = info.catalog_differences
    assert any("3g.40gb: multiprocessors 60 in the catalog, 48" in d for d in differences)


def _comparable(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Slice specs without the identity attributes, and without a whole GPU's memory capacity:
    the simulated GPU has its model's memory, the real one what NVML reports, which is less
    than the profiles add up to on the mock's H200 (2 x 3g.71gb = 142 GiB of 141 GiB)."""
    out = []
    for piece in slices:
        spec = dict(piece["spec"])
        devices = []
        for device in spec.get("devices", []):
            attrs = {k: v for k, v in device["attributes"].items() if k not in IDENTITY}
            capacity = dict(device.get("capacity", {}))
            if attrs[qualified("type")] == {"string": "gpu"}:
                capacity.pop(qualified("memory"), None)
            devices.append({**device, "attributes": attrs, "capacity": capacity})
        spec["devices"] = devices
        out.append(spec)
    return out


@pytest.mark.parametrize("spec", ["h100:2", "h200:1", "b200:1", "a100-sxm4-80gb:1", "a30:1"])
def test_same_resource_slices_as_the_simulated_backend_for_the_same_model(
    mock: MockNvml, make_backend: Callable[[], NvmlBackend], node_root: Any, spec: str
) -> None:
    mock.reset(spec, root=node_root)
    backend = make_backend()
    infos = backend.gpus()
    models = [i.mig_model for i in infos]
    assert all(m is not None for m in models)
    simulated = SimulatedBackend([m for m in models if m is not None], node_name="node-a")
    ours, theirs = node_slices(backend), node_slices(simulated)
    assert _comparable(ours) == _comparable(theirs)
    devices = {d["name"]: d for s in ours for d in s["spec"].get("devices", [])}
    for info in infos:
        if f"gpu-{info.index}" in devices:  # Ampere runs MIG slices only: no whole GPU
            whole = devices[f"gpu-{info.index}"]["capacity"]["gpu-slicer.io/memory"]["value"]
            assert parse_bytes(whole) == info.memory_bytes
    names = list(devices)
    assert any(re.fullmatch(r"gpu-0-mig-[47]g\d+gb-0", n) for n in names), names


def test_gpus_the_catalog_does_not_recognise_are_advertised_from_their_facts(
    mock: MockNvml, make_backend: Callable[[], NvmlBackend], node_root: Any
) -> None:
    """The mock's H200 and B200 carry PCI ids (0x2333, 0x2B00) and names ("NVIDIA H200 141GB
    HBM3e") the catalog does not list: the agent publishes them from what NVML reports."""
    mock.reset("h200,b200", root=node_root)
    h200, b200 = make_backend().gpus()
    assert (h200.model, b200.model) == ("H200-141GB-HBM3e", "B200-180GB-HBM3e")
    assert h200.catalog_differences == () and b200.catalog_differences == ()
    assert h200.mig_model is not None and b200.mig_model is not None
    assert h200.mig_model.profile("3g.71gb").starts == (0, 4)
    assert b200.mig_model.profile("7g.180gb").memory_slices == 8


def test_the_mock_models_have_the_catalogs_geometry(
    mock: MockNvml, make_backend: Callable[[], NvmlBackend], node_root: Any
) -> None:
    """Profile names, placements and counts of every mock model agree with the catalog (the
    figures may differ: those are listed as catalog differences and docs/agent.md says which)."""
    keys = ["A100-40GB", "A100-80GB", "A30", "H100-80GB", "H200-141GB", "B200-180GB"]
    mock.reset("a100-sxm4-40gb,a100-sxm4-80gb,a30,h100,h200,b200", root=node_root)
    problems = []
    for info, key in zip(make_backend().gpus(), keys, strict=True):
        ours = catalog.get_model(key)
        theirs = info.mig_model
        assert theirs is not None, info.model
        for p in ours.profiles:
            if not theirs.has_profile(p.name):
                problems.append(f"{info.model}: {p.name} not offered by the mock")
                continue
            q = theirs.profile(p.name)
            if (p.starts, p.memory_slices, p.max_count) != (q.starts, q.memory_slices, q.max_count):
                problems.append(
                    f"{info.model} {p.name}: starts, size, count {p.starts} {p.memory_slices} "
                    f"{p.max_count} in the catalog, {q.starts} {q.memory_slices} {q.max_count}"
                )
        extra = {q.name for q in theirs.profiles} - {p.name for p in ours.profiles}
        problems += [f"{info.model}: the mock offers {n}, the catalog does not" for n in extra]
    assert problems == [], "\n".join(problems)


def test_gpus_in_one_fabric_clique_share_an_nvlink_domain(
    mock: MockNvml, make_backend: Callable[[], NvmlBackend], node_root: Any
) -> None:
    """The fabric info struct goes through the real bindings (their v2 layout, NVML's check of
    its version); a GPU whose fabric probe is not complete falls back to its NVLinks."""
    mock.reset("b200:3", root=node_root)
    cluster = bytes(range(16))
    mock.set_fabric(0, cluster, 7)
    mock.set_fabric(1, cluster, 7)
    mock.set_fabric(2, cluster, 8, complete=False)
    first, second, third = make_backend().gpus()
    assert first.nvlink_domain == "00010203-0405-0607-0809-0a0b0c0d0e0f.7"
    assert second.nvlink_domain == first.nvlink_domain
    assert third.nvlink_domain is not None and third.nvlink_domain.startswith("nvlink-")


def test_a_driver_without_profiles_while_mig_is_off_gets_the_gpus_facts_once_it_is_on(
    mock: MockNvml, make_agent: Callable[..., Agent], api: InMemoryKubeApi
) -> None:
    """Until MIG is on the catalog's model stands in; the first slice switches MIG on, and from
    then on the agent publishes the GPU's own profile facts."""
    mock.profiles_need_mig(0)
    agent = make_agent()
    before = agent.backend.gpus()[0]
    assert before.mig_model is None and before.model == "H100-80GB"
    names = devices_by_name(node_slices(agent.backend))
    assert "gpu-0-mig-3g40gb-4" in names, "the catalog's slices are offered meanwhile"
    claim = allocate_claim(api, ["gpu-0-mig-3g40gb-4"])
    [device] = agent.prepare(claim)
    after = agent.backend.gpus()[0]
    assert after.mig_enabled and after.mig_model is not None
    assert after.mig_model.profile("3g.40gb").multiprocessors == 48, "the GPU's figure"
    [gi] = mock.instances(0)
    assert (gi["start"], gi["size"], gi["id"]) == (4, 4, device.gi_id)
    assert agent.unprepare(claim) and mock.instances(0) == []


def test_an_nvml_that_cannot_start_fails_discovery_with_what_nvml_said(
    mock: MockNvml, backend: NvmlBackend
) -> None:
    """The versioned entry points the bindings resolve are the ones a fault is injected into."""
    mock.fail("nvmlInitWithFlags", nvml_mock.NO_PERMISSION)
    with pytest.raises(NoPermission, match="initialise NVML"):
        backend.gpus()
    mock.fail("nvmlDeviceGetCount_v2", nvml_mock.UNKNOWN)
    with pytest.raises(BackendError, match="nvmlDeviceGetCount"):
        backend.gpus()
    assert len(backend.gpus()) == 2
