"""NVLink topology: which GPUs of a node share an NVLink domain (published as an attribute so a
workload can ask for GPUs that talk over NVLink).

The fabric clique (``clusterUuid.cliqueId``) where NVML reports one (NVLink fabrics such as
GB200 NVL72), else the groups joined by active NVLinks, directly or through an NVSwitch, named by
a digest of their members' UUIDs so a group keeps its name across agent restarts.
"""

from __future__ import annotations

import hashlib
from ctypes import byref

from gpu_slicer.slicer.backend import GpuInfo
from gpu_slicer.slicer.nvml.session import NvmlSession, canonical_bus_id, text


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
