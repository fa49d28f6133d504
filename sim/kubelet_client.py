"""The kubelet's side of DRA in the simulator: what it holds per prepared claim, and its client.

Through the API the kubelet talks v1 gRPC to a real agent per node over unix sockets, as on a
real node; the fast path prepares on the simulated backend directly and needs only
:class:`RunningClaim`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_slicer.sim.pools import Device


@dataclass
class RunningClaim:
    """What the kubelet model holds for one running pod's claim."""

    uid: str
    name: str
    namespace: str
    devices: list[Device]


def scratch_dir() -> str | None:
    """A memory-backed folder when the system has one: the agent fsyncs its checkpoint and CDI
    files on every prepare, which on a disk costs far more than the simulated work."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class KubeletClient:
    """The kubelet's side of the DRA protocol: v1 gRPC calls over the agent's unix socket."""

    def __init__(self, driver: Any, base: Path) -> None:
        import grpc

        from gpu_slicer.slicer.plugin import PluginServer
        from gpu_slicer.slicer.proto import dra_v1_pb2

        self.pb = dra_v1_pb2
        # unix socket paths are limited to 107 bytes: keep them short.
        self.sockets = Path(tempfile.mkdtemp(prefix="gs-", dir=scratch_dir()))
        self.server = PluginServer(
            driver, plugins_dir=self.sockets / "p", registry_dir=self.sockets / "r", workers=2
        )
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix://{self.server.dra_path}")
        service = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        self.prepare_call = self.channel.unary_unary(
            f"/{service}/NodePrepareResources",
            request_serializer=self.pb.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=self.pb.NodePrepareResourcesResponse.FromString,
        )
        self.unprepare_call = self.channel.unary_unary(
            f"/{service}/NodeUnprepareResources",
            request_serializer=self.pb.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=self.pb.NodeUnprepareResourcesResponse.FromString,
        )

    def _claim(self, prepared: RunningClaim) -> Any:
        return self.pb.Claim(namespace=prepared.namespace, uid=prepared.uid, name=prepared.name)

    def prepare(self, prepared: RunningClaim) -> str:
        """NodePrepareResources for one claim; an error message, empty when the agent prepared
        exactly the allocated devices."""
        request = self.pb.NodePrepareResourcesRequest(claims=[self._claim(prepared)])
        response = self.prepare_call(request, timeout=30)
        answer = response.claims[prepared.uid]
        if answer.error:
            return str(answer.error)
        got = sorted(d.device_name for d in answer.devices)
        wanted = sorted(d.name for d in prepared.devices)
        if got != wanted:
            return f"prepared {got}, allocated {wanted}"
        return ""

    def unprepare(self, prepared: RunningClaim) -> str:
        request = self.pb.NodeUnprepareResourcesRequest(claims=[self._claim(prepared)])
        response = self.unprepare_call(request, timeout=30)
        return str(response.claims[prepared.uid].error)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0)
        shutil.rmtree(self.sockets, ignore_errors=True)
