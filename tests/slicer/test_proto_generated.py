"""The committed gRPC code matches the .proto files, and speaks the kubelet's method paths."""

from __future__ import annotations

from pathlib import Path

from gpu_slicer.slicer.proto import (
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_pb2,
)
from gpu_slicer.slicer.proto.generate import PROTO_DIR, generate


def test_the_committed_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in generate(tmp_path)}
    committed = {p.name: p.read_text() for p in PROTO_DIR.iterdir() if "_pb2" in p.name}
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"run `python -m slicer.proto.generate` and commit: {stale}"


def test_services_have_the_names_the_kubelet_calls() -> None:
    def methods(module: object, service: str) -> list[str]:
        descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
        return [m.full_name for m in descriptor.methods]

    assert methods(dra_v1_pb2, "DRAPlugin") == [
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin.NodePrepareResources",
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin.NodeUnprepareResources",
    ]
    assert methods(dra_v1beta1_pb2, "DRAPlugin") == [
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin.NodePrepareResources",
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin.NodeUnprepareResources",
    ]
    assert methods(pluginregistration_pb2, "Registration") == [
        "pluginregistration.Registration.GetInfo",
        "pluginregistration.Registration.NotifyRegistrationStatus",
    ]
    assert methods(dra_health_v1alpha1_pb2, "DRAResourceHealth") == [
        "v1alpha1.DRAResourceHealth.NodeWatchResources"
    ]
    watch = dra_health_v1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods[0]
    assert watch.server_streaming and not watch.client_streaming


def test_field_numbers_match_the_kubelet_api() -> None:
    device = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in device.items()} == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    claim = dra_v1_pb2.Claim.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in claim.items()} == {"namespace": 1, "uid": 2, "name": 3}
    info = pluginregistration_pb2.PluginInfo.DESCRIPTOR.fields_by_name
    assert info["supported_versions"].number == 4
    health = dra_health_v1alpha1_pb2.DeviceHealth.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in health.items()} == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    ident = dra_health_v1alpha1_pb2.DeviceIdentifier.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in ident.items()} == {"pool_name": 1, "device_name": 2}
    assert dict(dra_health_v1alpha1_pb2.HealthStatus.items()) == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }


def test_messages_round_trip_on_the_wire() -> None:
    response = dra_v1_pb2.NodePrepareResourcesResponse()
    response.claims["uid-1"].devices.add(
        request_names=["gpu"],
        pool_name="n",
        device_name="gpu-0",
        cdi_device_ids=["k8s.gpu-slicer.io/claim=uid-1-gpu-0"],
    )
    wire = response.SerializeToString()
    assert dra_v1_pb2.NodePrepareResourcesResponse.FromString(wire) == response
    # v1beta1 reads the same bytes (share_id is not set)
    beta = dra_v1beta1_pb2.NodePrepareResourcesResponse.FromString(wire)
    assert beta.claims["uid-1"].devices[0].device_name == "gpu-0"
