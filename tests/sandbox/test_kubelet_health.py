"""The kubelet stand-in's resource health, as the kubelet 1.36 keeps and writes it: the health
cache and its timeouts, the shape of ``allocatedResourcesStatus``, and the stream from a real
agent over its unix socket (and from one without the service)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.sandbox.kubelet_health import (
    AllocatedDevice,
    HealthCache,
    HealthWatch,
    container_resource_status,
    pod_resource_status,
    pods_holding,
)
from gpu_slicer.slicer.agent import NodeAgent
from gpu_slicer.slicer.plugin import PluginServer
from gpu_slicer.slicer.proto import dra_health_v1alpha1_pb2 as pb
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import agent_config

DRIVER = "gpu-slicer.io"


def _response(*devices: tuple[str, int, str], timeout: int = 0) -> Any:
    response = pb.NodeWatchResourcesResponse()
    for name, health, message in devices:
        response.devices.add(
            device=pb.DeviceIdentifier(pool_name="n", device_name=name),
            health=health,
            health_check_timeout_seconds=timeout,
            message=message,
        )
    return response


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_reports_changes_and_ages_reports_out_to_unknown() -> None:
    clock = Clock()
    cache = HealthCache(clock)
    assert cache.get(DRIVER, "n", "gpu-0") == ("Unknown", "")
    changed = cache.update(DRIVER, _response(("gpu-0", pb.HEALTHY, ""), ("gpu-1", pb.HEALTHY, "")))
    assert changed == [("n", "gpu-0"), ("n", "gpu-1")]
    assert (
        cache.update(DRIVER, _response(("gpu-0", pb.HEALTHY, ""), ("gpu-1", pb.HEALTHY, ""))) == []
    )
    clock.now += 10
    changed = cache.update(DRIVER, _response(("gpu-0", pb.UNHEALTHY, "xid-79")))
    assert changed == [("n", "gpu-0")]  # gpu-1 left out, but not for longer than 30 s yet
    assert cache.get(DRIVER, "n", "gpu-0") == ("Unhealthy", "xid-79")
    assert cache.get(DRIVER, "n", "gpu-1") == ("Healthy", "")
    clock.now += 25  # gpu-1 last heard of 35 s ago
    assert cache.get(DRIVER, "n", "gpu-1") == ("Unknown", "")
    assert cache.update(DRIVER, _response(("gpu-0", pb.UNHEALTHY, "xid-79"))) == [("n", "gpu-1")]
    cache.clear_driver(DRIVER)
    assert cache.get(DRIVER, "n", "gpu-0") == ("Unknown", "")


def test_the_drivers_timeout_and_an_overlong_message_are_kept_as_the_kubelet_keeps_them() -> None:
    clock = Clock()
    cache = HealthCache(clock)
    cache.update(DRIVER, _response(("gpu-0", pb.UNHEALTHY, "x" * 2000), timeout=120))
    clock.now += 100
    health, message = cache.get(DRIVER, "n", "gpu-0")
    assert health == "Unhealthy"
    assert len(message) == 1024 and message.endswith("...")


def _device(name: str, request: str = "gpu", cdi: bool = True) -> AllocatedDevice:
    ids = (f"k8s.gpu-slicer.io/claim=uid-{name}",) if cdi else ()
    return AllocatedDevice(DRIVER, "n", name, (request,), ids)


POD = {
    "metadata": {"name": "p", "namespace": "ml", "uid": "pod-1"},
    "spec": {
        "resourceClaims": [
            {"name": "gpu-slicer", "resourceClaimTemplateName": "t"},
            {"name": "shared", "resourceClaimName": "shared-claim"},
        ],
        "initContainers": [{"name": "init", "resources": {"claims": [{"name": "gpu-slicer"}]}}],
        "containers": [
            {"name": "main", "resources": {"claims": [{"name": "gpu-slicer"}]}},
            {"name": "side", "resources": {"claims": [{"name": "shared", "request": "b"}]}},
            {"name": "plain"},
        ],
    },
    "status": {"resourceClaimStatuses": [{"name": "gpu-slicer", "resourceClaimName": "p-gpu-x"}]},
}


def _health(driver: str, pool: str, device: str) -> tuple[str, str]:
    return ("Unhealthy", "GPU 1 is unhealthy") if device.startswith("gpu-1") else ("Healthy", "")


def test_each_container_gets_its_claims_devices_named_as_the_kubelet_names_them() -> None:
    claims = {
        "p-gpu-x": [_device("gpu-0-mig-1g10gb-0"), _device("gpu-1-mig-1g10gb-0")],
        "shared-claim": [_device("gpu-0", "a"), _device("gpu-1", "b", cdi=False)],
    }
    status = pod_resource_status(POD, claims, _health)
    assert status == {
        "main": [
            {
                "name": "claim:gpu-slicer",
                "resources": [
                    {
                        "resourceID": "k8s.gpu-slicer.io/claim=uid-gpu-0-mig-1g10gb-0",
                        "health": "Healthy",
                    },
                    {
                        "resourceID": "k8s.gpu-slicer.io/claim=uid-gpu-1-mig-1g10gb-0",
                        "health": "Unhealthy",
                        "message": "GPU 1 is unhealthy",
                    },
                ],
            }
        ],
        "side": [
            {
                "name": "claim:shared/b",
                "resources": [
                    {
                        "resourceID": "gpu-slicer.io/n/gpu-1",
                        "health": "Unhealthy",
                        "message": "GPU 1 is unhealthy",
                    }
                ],
            }
        ],
    }  # init containers and containers without claims get nothing


def test_a_claim_not_prepared_yet_and_duplicate_ids_are_left_out() -> None:
    container = POD["spec"]["containers"][0]  # type: ignore[index]
    assert container_resource_status(POD, container, {}, _health) == []
    twice = [_device("gpu-0-mig-1g10gb-0"), _device("gpu-0-mig-1g10gb-0")]
    [entry] = container_resource_status(POD, container, {"p-gpu-x": twice}, _health)
    assert len(entry["resources"]) == 1


def test_a_change_names_the_pods_whose_claims_hold_the_device() -> None:
    claims = [({"pod-1", "pod-2"}, [_device("gpu-0")]), ({"pod-3"}, [_device("gpu-1")])]
    assert pods_holding(claims, DRIVER, [("n", "gpu-0")]) == {"pod-1", "pod-2"}
    assert pods_holding(claims, "other.io", [("n", "gpu-0")]) == set()


# --- the stream, from a real agent over its unix socket ------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))  # unix socket paths must be short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _agent(root: Path, backend: SimulatedBackend) -> NodeAgent:
    # every profile published: the stream reports the devices a node advertises
    config = agent_config(root, "n", advertised_profiles="all")
    return NodeAgent(config, backend=backend, api=InMemoryKubeApi())


def test_the_watch_follows_a_real_agents_stream_and_stops(short_dir: Path) -> None:
    backend = SimulatedBackend("A100-80GB:2", node_name="n")
    agent = _agent(short_dir, backend)
    agent.start()
    cache = HealthCache()
    unhealthy = threading.Event()

    def on_change(driver: str, changed: list[tuple[str, str]]) -> None:
        if cache.get(driver, "n", "gpu-1-mig-1g10gb-6")[0] == "Unhealthy":
            unhealthy.set()

    watch = HealthWatch(DRIVER, str(agent.plugin.dra_path), cache, on_change, retry_s=0.1)
    try:
        watch.start()
        backend.inject_xid(1, 79)
        assert unhealthy.wait(30), watch.last_error
        assert cache.get(DRIVER, "n", "gpu-0-mig-1g10gb-6") == ("Healthy", "")
        assert cache.get(DRIVER, "n", "gpu-1-mig-7g80gb-0")[0] == "Unhealthy"
        assert watch.streams == 1
    finally:
        watch.stop()
        agent.stop()
    assert cache.get(DRIVER, "n", "gpu-0-mig-1g10gb-6") == (
        "Unknown",
        "",
    )  # forgotten when the stream ends


def test_a_driver_without_the_service_is_called_again_and_nothing_breaks(
    short_dir: Path,
) -> None:
    agent = _agent(short_dir, SimulatedBackend("A100-80GB:1", node_name="n"))
    old = PluginServer(
        agent.driver, plugins_dir=short_dir / "old", registry_dir=short_dir / "oldreg"
    )  # as agents before the health service: no DRAResourceHealth
    old.start()
    tried = threading.Event()
    watch = HealthWatch(DRIVER, str(old.dra_path), HealthCache(), lambda *_: None, retry_s=0.05)
    try:
        watch.start()
        for _ in range(600):  # a correctness wait, bounded so that a hang fails
            if watch.last_error:
                break
            tried.wait(0.05)
        assert watch.last_error.startswith("UNIMPLEMENTED")
        assert watch.streams == 0
    finally:
        watch.stop()
        old.stop()
        agent.driver.close()
