"""The seam between the agent and the GPUs.

The agent only ever talks to a :class:`GpuBackend`. Two implementations exist:
``slicer.nvml.NvmlBackend`` (pynvml, real nodes) and ``slicer.simulated.SimulatedBackend``
(follows the catalog exactly as NVML would; tests and the simulator). Every method raises the
``slicer.errors.BackendError`` subclasses that mirror NVML's return codes, never raw NVML errors.

Creation and destruction are split into the GPU-instance and compute-instance steps NVML has,
because each step can fail on its own and cleanup must be able to resume between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import MigInstance
from gpu_slicer.core.errors import CatalogError
from gpu_slicer.core.gpu_model import GpuModel


@dataclass(frozen=True)
class GpuInfo:
    """What the agent needs to know about one physical GPU."""

    index: int
    minor: int
    uuid: str
    model: str
    """Catalog key (``core.catalog.get_model``) of the GPU's model."""
    product_name: str
    memory_bytes: int
    pci_bus_id: str
    """Canonical ``0000:3b:00.0`` form."""
    pcie_root: str
    """The PCIe root complex, e.g. ``pci0000:3a``; GPUs behind the same root share it."""
    architecture: str
    cuda_compute_capability: str
    driver_version: str
    mig_enabled: bool
    mig_pending: bool
    nvlink_domain: str | None
    """GPUs that share this value reach each other over NVLink (peers or a fabric clique)."""
    brand: str = ""
    """NVML's brand, spelled as NVIDIA's DRA driver publishes it (``Nvidia``, ``Tesla``...)."""
    cuda_driver_version: str = ""
    """The CUDA version the driver supports, ``12.8``."""
    mig_model: GpuModel | None = None
    """The MIG geometry as the GPU itself reports it (NVML); None: use the catalog's model."""
    catalog_differences: tuple[str, ...] = ()
    """Where the GPU's own profile facts disagree with the catalog, in words."""


def model_of(info: GpuInfo) -> GpuModel | None:
    """The model whose profiles the agent advertises: the GPU's own facts, else the catalog's.

    None for a GPU neither knows (no MIG): it is advertised whole.
    """
    if info.mig_model is not None:
        return info.mig_model
    try:
        return catalog.get_model(info.model)
    except CatalogError:
        return None


HealthKind = Literal["gpu-lost", "xid", "recovered"]


@dataclass(frozen=True)
class HealthEvent:
    """A change in a GPU's health that the agent turns into (or out of) a device taint."""

    gpu_index: int
    kind: HealthKind
    xid: int | None = None
    message: str = ""


@runtime_checkable
class GpuBackend(Protocol):
    def boot_id(self) -> str:
        """Identifies the current boot: MIG instances never survive a change of it."""
        ...

    def gpus(self) -> list[GpuInfo]: ...

    def instances(self, gpu_index: int) -> list[MigInstance]:
        """Every GPU instance on the GPU (with its compute instance, if any), ours or not."""
        ...

    def create_gpu_instance(self, gpu_index: int, profile: str, start: int) -> int:
        """Create a GPU instance at exactly ``start``; returns its GI id."""
        ...

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> MigInstance:
        """Create the compute instance that spans the whole GPU instance."""
        ...

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None: ...

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None: ...

    def processes(self, gpu_index: int, gi_id: int | None = None) -> list[int]:
        """PIDs running on a GPU instance, or on the whole GPU when ``gi_id`` is None."""
        ...

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        """Switch MIG mode; raises GpuInUse when clients block it, ResetRequired when pending."""
        ...

    def capability_minors(self, gpu_index: int, gi_id: int, ci_id: int) -> tuple[int, int]:
        """Minors of ``/dev/nvidia-caps/nvidia-cap<M>`` for the GI and the CI access caps."""
        ...

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        """Health changes since the last call, waiting at most ``timeout_s`` for one."""
        ...
