"""The real GPU backend: a thin layer over NVML through ``pynvml`` (nvidia-ml-py).

Thin on purpose: geometry decisions live in the catalog and the agent; this package only turns a
``GpuBackend`` call into the NVML calls that do it, and NVML's errors into
``slicer.errors.BackendError`` subclasses (``raise ... from`` the ``NVMLError``). A reader walks
it in this order:

* :mod:`slicer.nvml.session`: ``nvmlInit`` once, on first use; device handles looked up once and
  cached (an uncached look-up can take seconds on a loaded node); NVML's errors as ours.
* :mod:`slicer.nvml.discovery`: each GPU's facts. Facts come from the GPU, not the catalog: every
  GPU-instance profile is read (memory, multiprocessors, engines, instance count, compute
  slices, name) with its placements; :mod:`slicer.hardware` turns them into the GPU's model
  (``GpuInfo.mig_model``), and where the catalog disagrees each difference is logged and listed
  in ``GpuInfo.catalog_differences``. A GPU the catalog does not know (GB200, B300, RTX PRO
  6000, ...) is advertised from those facts. Only when NVML reports no profile (MIG mode off on a
  driver that needs it on) does a catalog GPU fall back to the catalog's model; the facts are
  read again once MIG mode is on. A GPU with neither a catalog entry nor MIG profiles (an L4 or
  L40S beside H100s: NVML answers NOT_SUPPORTED to its MIG calls) is reported with MIG off and
  no MIG model, so the agent offers it whole; leaving it out would hide a usable GPU. Profile ids
  differ between devices, so they are never hard-coded: each is looked up by the catalog's
  ``nvml_constant`` and cached per GPU.
* :mod:`slicer.nvml.topology`: NVLink domains (fabric clique, else NVLink-connected groups).
* :mod:`slicer.nvml.instances`: MIG mode, GPU and compute instances, processes and capability
  minors. GPU instances are always created at an explicit placement, passed by reference
  (``byref(c_nvmlGpuInstancePlacement_t(start, size))``). ``instances`` of a GPU whose MIG mode
  is off is an empty list, as in the simulated backend.
* :mod:`slicer.nvml.events`: Xid critical errors and lost GPUs.
* :mod:`slicer.nvml.backend`: ``NvmlBackend``, the ``GpuBackend`` over those parts.

Capability minors are read from ``<root>/proc/driver/nvidia/capabilities/gpu<minor>/mig/...``
and the boot id from ``<root>/proc/sys/kernel/random/boot_id``; ``root`` is injectable so tests
can lay out those files, and so can the ``pynvml`` module itself (``nvml=``).
"""

from gpu_slicer.slicer.nvml.backend import NvmlBackend

__all__ = ["NvmlBackend"]
