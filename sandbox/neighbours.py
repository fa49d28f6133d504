"""The DRA drivers a GPU node runs beside gpu-slicer, as the scheduler sees them: for the
scheduler benchmark's hollow nodes and the end-to-end tier.

* **NVIDIA's DynamicMIG layout** (its gpu-kubelet-plugin with the ``DynamicMIG`` gate), the peer
  gpu-slicer is measured against, written here from what that driver publishes (docs/
  resourceslices.md has the facts): per GPU, one device per MIG profile per possible
  placement, every profile of the model (``+me`` variants included), the whole GPU too from
  Hopper on; names ``gpu-<minor>-mig-<profile, dots dropped, + as ->-<GI profile id>-<start>``;
  twelve or thirteen attributes and seven capacities per device; one counter set per GPU
  (``gpu-<minor>-counter-set``: the seven engine and memory budgets and ``memory-slice-<i>``),
  every device consuming all seven budgets and its memory slices. From 1.35 the eight counter
  sets go in one slice of their own and each GPU's devices in another; on 1.34 one slice per
  GPU holds both. Classes ``gpu.nvidia.com`` and ``mig.nvidia.com``.
* **An RDMA NIC driver**: the SR-IOV driver's virtual functions
  (``sriovnetwork.k8snetworkplumbingwg.io``), eight per node as beside eight GPUs, no counters,
  a handful of attributes each. Its name sorts after ``gpu.nvidia.com`` and ``gpu-slicer.io``:
  the scheduler walks a node's pools in driver-name order, so its pods pass every GPU device
  first (docs/resourceslices.md, "what every pod pays").
"""

from __future__ import annotations

import re
from typing import Any

from gpu_slicer.core import catalog
from gpu_slicer.core.gpu_model import GpuModel, Profile
from gpu_slicer.core.identity import RESOURCE_API
from gpu_slicer.slicer.backend import GpuInfo
from gpu_slicer.slicer.inventory import semver
from gpu_slicer.slicer.simulated import SimulatedBackend

Obj = dict[str, Any]

NVIDIA_DRIVER = "gpu.nvidia.com"
NVIDIA_GPU_CLASS = "gpu.nvidia.com"
NVIDIA_MIG_CLASS = "mig.nvidia.com"
NIC_DRIVER = "sriovnetwork.k8snetworkplumbingwg.io"
"""The SR-IOV DRA driver (RDMA-capable VFs of the NICs beside a node's GPUs)."""
NICS_PER_NODE = 8


def _budgets(multiprocessors: int, engines: Any, memory_bytes: int) -> dict[str, int]:
    return {
        "multiprocessors": multiprocessors,
        "copyEngines": engines.copy,
        "decoders": engines.decoders,
        "encoders": engines.encoders,
        "jpegEngines": engines.jpeg,
        "ofaEngines": engines.ofa,
        "memory": memory_bytes,
    }


def _attributes(info: GpuInfo, kind: str, profile: Profile | None) -> Obj:
    attrs: Obj = {
        "type": {"string": kind},
        "productName": {"string": info.product_name},
        "brand": {"string": info.brand or "Nvidia"},
        "architecture": {"string": info.architecture},
        "resource.kubernetes.io/pciBusID": {"string": info.pci_bus_id},
        "resource.kubernetes.io/pcieRoot": {"string": info.pcie_root},
        "resource.kubernetes.io/numaNode": {"int": 0},
    }
    if profile is None:
        attrs["uuid"] = {"string": info.uuid}
    else:
        attrs["profile"] = {"string": profile.name}
        attrs["parentUUID"] = {"string": info.uuid}
    for name, raw in (
        ("cudaComputeCapability", info.cuda_compute_capability),
        ("driverVersion", info.driver_version),
        ("cudaDriverVersion", info.cuda_driver_version or "12.8"),
    ):
        version = semver(raw)
        if version is not None:
            attrs[name] = {"version": version}
    return attrs


def _counters(budgets: dict[str, int], slices: range | tuple[int, ...]) -> Obj:
    """Counter names are DNS labels (``copy-engines``), unlike capacity names (``copyEngines``)."""
    kebab = {k: re.sub(r"([A-Z])", lambda m: "-" + m.group(1).lower(), k) for k in budgets}
    counters = {kebab[k]: {"value": str(v)} for k, v in budgets.items()}
    return counters | {f"memory-slice-{i}": {"value": "1"} for i in slices}


def _capacity(budgets: dict[str, int]) -> Obj:
    return {name: {"value": str(value)} for name, value in budgets.items()}


def _device(info: GpuInfo, model: GpuModel, profile: Profile | None, start: int) -> Obj:
    set_name = f"gpu-{info.minor}-counter-set"
    if profile is None:
        budgets = _budgets(model.multiprocessors, model.engines, model.memory_bytes)
        slices = range(model.memory_slices)
        name = f"gpu-{info.minor}"
    else:
        budgets = _budgets(profile.multiprocessors, profile.engines, profile.memory_bytes)
        slices = profile.covers(start)
        token = profile.name.replace(".", "").replace("+", "-")
        name = f"gpu-{info.minor}-mig-{token}-{profile.typical_id}-{start}"
    consumed = _counters(budgets, slices)
    return {
        "name": name,
        "attributes": _attributes(info, "gpu" if profile is None else "mig", profile),
        "capacity": _capacity(budgets),
        "consumesCounters": [{"counterSet": set_name, "counters": consumed}],
    }


def _counter_set(info: GpuInfo, model: GpuModel) -> Obj:
    budgets = _budgets(model.multiprocessors, model.engines, model.memory_bytes)
    counters = _counters(budgets, range(model.memory_slices))
    return {"name": f"gpu-{info.minor}-counter-set", "counters": counters}


def dynamic_mig_devices(info: GpuInfo) -> list[Obj]:
    """One GPU's devices in NVIDIA's DynamicMIG layout (Ampere: MIG devices only)."""
    model = catalog.get_model(info.model)
    devices = [_device(info, model, None, 0)] if model.supports_dynamic_mig else []
    for profile in model.profiles:
        devices += [_device(info, model, profile, start) for start in profile.starts]
    return devices


def dynamic_mig_slices(node: str, gpus: str, server_version: tuple[int, int]) -> list[Obj]:
    """The ResourceSlices NVIDIA's driver publishes in its DynamicMIG layout on ``node`` with
    simulated ``gpus`` (``A100-80GB:8``)."""
    infos = SimulatedBackend(gpus, node_name=node).gpus()
    models = [catalog.get_model(info.model) for info in infos]
    specs: list[Obj]
    if server_version >= (1, 35):
        specs = [
            {"sharedCounters": [_counter_set(i, m) for i, m in zip(infos, models, strict=True)]}
        ]
        specs += [{"devices": dynamic_mig_devices(info)} for info in infos]
    else:
        specs = [
            {"sharedCounters": [_counter_set(i, m)], "devices": dynamic_mig_devices(i)}
            for i, m in zip(infos, models, strict=True)
        ]
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{NVIDIA_DRIVER}-{seq}"},
            "spec": {
                "driver": NVIDIA_DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": len(specs)},
                **spec,
            },
        }
        for seq, spec in enumerate(specs)
    ]


def nvidia_device_classes() -> list[Obj]:
    """NVIDIA's ``gpu.nvidia.com`` and ``mig.nvidia.com`` classes, selecting by type."""

    def device_class(name: str, kind: str) -> Obj:
        expression = (
            f"device.driver == '{NVIDIA_DRIVER}' && "
            f"device.attributes['{NVIDIA_DRIVER}'].type == '{kind}'"
        )
        return {
            "apiVersion": RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    return [device_class(NVIDIA_GPU_CLASS, "gpu"), device_class(NVIDIA_MIG_CLASS, "mig")]


def nic_slices(node: str, count: int = NICS_PER_NODE, driver: str = NIC_DRIVER) -> list[Obj]:
    """``count`` RDMA-capable virtual functions on ``node``, one per GPU's NIC."""
    devices = [
        {
            "name": f"0000-{0x18 + 0x10 * i:02x}-00-1",
            "attributes": {
                "vendor": {"string": "15b3"},
                "deviceID": {"string": "101e"},
                "pfName": {"string": f"ens{i + 1}f0np0"},
                "rdma": {"bool": True},
                "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + 0x10 * i:02x}:00.1"},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + 0x10 * i:02x}"},
                "resource.kubernetes.io/numaNode": {"int": i // 4},
            },
        }
        for i in range(count)
    ]
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
    ]


def nic_device_class(driver: str = NIC_DRIVER) -> Obj:
    """The NIC driver's class, named after the driver as the SR-IOV driver names its own."""
    expression = f'device.driver == "{driver}"'
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def nic_claim_spec(driver: str = NIC_DRIVER) -> Obj:
    """A claim for one RDMA virtual function."""
    selector = {"cel": {"expression": f'device.attributes["{driver}"].rdma == true'}}
    return {
        "devices": {
            "requests": [
                {"name": "nic", "exactly": {"deviceClassName": driver, "selectors": [selector]}}
            ]
        }
    }
