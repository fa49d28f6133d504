"""End to end through the real gRPC services over unix sockets: a test client plays the kubelet,
the cluster is in memory and the GPUs are simulated."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from gpu_slicer.kube.errors import Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.agent import NodeAgent
from gpu_slicer.slicer.cdi import validate_spec
from gpu_slicer.slicer.claim_cache import ClaimCache
from gpu_slicer.slicer.plugin import ClaimRef, DraDriver
from gpu_slicer.slicer.proto import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import NODE, agent_config, allocate_claim, build_agent, ref

VERSIONS = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.api = InMemoryKubeApi()
        self.backend = SimulatedBackend("H100-80GB:2", node_name=NODE)
        self.config = agent_config(root)
        self.agent = NodeAgent(self.config, backend=self.backend, api=self.api)
        self.agent.start()
        self.channels: list[grpc.Channel] = []

    def channel(self, path: Path) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{path}")
        self.channels.append(channel)
        return channel

    def dra(self, version: str) -> tuple[ModuleType, Any]:
        pb, pb_grpc = VERSIONS[version]
        return pb, pb_grpc.DRAPluginStub(self.channel(self.agent.plugin.dra_path))

    def close(self) -> None:
        """The agent first: closing its API under it would fail its last republish."""
        for channel in self.channels:
            channel.close()
        self.agent.stop()
        self.api.close()


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))  # unix socket paths must be short
    node = Node(root)
    try:
        yield node
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)


def claim_msg(pb: ModuleType, claim: dict[str, Any]) -> Any:
    uid, namespace, name = ref(claim)
    return pb.Claim(namespace=namespace, uid=uid, name=name)


def test_the_kubelet_learns_the_endpoint_and_versions_from_the_registration_socket(
    node: Node,
) -> None:
    endpoint = str(node.config.plugins_dir / "z.gpu-slicer.io" / "dra.sock")
    # The same endpoint under 0.1's name too: the kubelet sends the claims allocated under
    # that name (before an upgrade) to the plugin registered under it.
    for name in ("z.gpu-slicer.io", "gpu-slicer.io"):
        stub = pluginregistration_pb2_grpc.RegistrationStub(
            node.channel(node.config.registry_dir / f"{name}-reg.sock")
        )
        info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
        assert info.type == "DRAPlugin"
        assert (info.name, info.endpoint) == (name, endpoint)
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    stub.NotifyRegistrationStatus(
        pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=10
    )
    assert node.agent.plugin.legacy_registrations["gpu-slicer.io"].registered.is_set()
    assert not node.agent.plugin.registration.registered.is_set()  # told only under 0.1's


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_creates_the_slice_and_unprepare_removes_it(node: Node, version: str) -> None:
    pb, stub = node.dra(version)
    claim = allocate_claim(node.api, ["gpu-1-mig-3g40gb-4"])
    uid = ref(claim)[0]
    response = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[claim_msg(pb, claim)]), timeout=30
    )
    result = response.claims[uid]
    assert result.error == ""
    [device] = result.devices
    assert list(device.request_names) == ["gpu"]
    assert device.pool_name == NODE
    assert device.device_name == "gpu-1-mig-3g40gb-4"
    assert list(device.cdi_device_ids) == [f"k8s.gpu-slicer.io/claim={uid}-gpu-1-mig-3g40gb-4"]

    [inst] = node.backend.instances(1)
    assert (inst.profile, inst.start, inst.ci_id is not None) == ("3g.40gb", 4, True)
    spec_file = node.config.cdi_dir / f"k8s.gpu-slicer.io-claim_{uid}.json"
    spec = json.loads(spec_file.read_text())
    assert validate_spec(spec) == []
    assert f"{spec['kind']}={spec['devices'][0]['name']}" == device.cdi_device_ids[0]
    edits = spec["devices"][0]["containerEdits"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={inst.uuid}"]
    gi_cap, ci_cap = node.backend.capability_minors(1, inst.gi_id, inst.ci_id or 0)
    paths = [n["path"] for n in edits["deviceNodes"]]
    assert "/dev/nvidia1" in paths
    assert f"/dev/nvidia-caps/nvidia-cap{gi_cap}" in paths
    assert f"/dev/nvidia-caps/nvidia-cap{ci_cap}" in paths

    again = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[claim_msg(pb, claim)]), timeout=30
    )
    assert again.claims[uid] == result  # idempotent

    gone = stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[claim_msg(pb, claim)]), timeout=30
    )
    assert gone.claims[uid].error == ""
    assert node.backend.instances(1) == []
    assert not spec_file.exists()


def test_one_bad_claim_in_a_batch_fails_alone(node: Node) -> None:
    pb, stub = node.dra("v1")
    good = allocate_claim(node.api, ["gpu-0-mig-1g10gb-0"])
    elsewhere = allocate_claim(node.api, ["gpu-0-mig-1g10gb-1"], pool="node-b")
    ghost = pb.Claim(namespace="ml", uid="no-such-uid", name="ghost")
    response = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(
            claims=[claim_msg(pb, good), claim_msg(pb, elsewhere), ghost]
        ),
        timeout=30,
    )
    assert response.claims[ref(good)[0]].error == ""
    assert "no allocation for driver z.gpu-slicer.io or gpu-slicer.io in pool node-a" in (
        response.claims[ref(elsewhere)[0]].error
    )
    assert "does not exist" in response.claims["no-such-uid"].error
    assert [(i.profile, i.start) for i in node.backend.instances(0)] == [("1g.10gb", 0)]


def test_unprepare_while_processes_run_returns_an_error_for_the_kubelet_to_retry(
    node: Node,
) -> None:
    pb, stub = node.dra("v1")
    claim = allocate_claim(node.api, ["gpu-0-mig-2g20gb-4"])
    stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[claim_msg(pb, claim)]), timeout=30
    )
    [inst] = node.backend.instances(0)
    node.backend.attach_process(0, inst.gi_id, 31337)
    busy = stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[claim_msg(pb, claim)]), timeout=30
    )
    assert "31337" in busy.claims[ref(claim)[0]].error
    assert len(node.backend.instances(0)) == 1
    node.backend.detach_process(0, 31337)
    done = stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[claim_msg(pb, claim)]), timeout=30
    )
    assert done.claims[ref(claim)[0]].error == ""


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("uid", "abc\x00def", "claim uid 'abc\\x00def' is not a Kubernetes UID"),
        ("uid", "../../etc/cron.d/x", "claim uid '../../etc/cron.d/x' is not a Kubernetes UID"),
        ("uid", "a" * 5000, "(5000 characters) is not a Kubernetes UID"),
        ("namespace", "ml/../kube-system", "namespace 'ml/../kube-system' is not a namespace"),
        ("name", "x" * 300, "(300 characters) is not a ResourceClaim's name"),
    ],
)
def test_a_claim_reference_that_cannot_be_a_claims_is_refused_as_invalid_argument(
    node: Node, field: str, value: str, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    pb, stub = node.dra("v1")
    claim = allocate_claim(node.api, ["gpu-0-mig-1g10gb-0"])
    prepared = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[claim_msg(pb, claim)]), timeout=30
    )
    assert prepared.claims[ref(claim)[0]].error == ""
    cdi_before = sorted(p.name for p in node.config.cdi_dir.iterdir())
    bad = {"namespace": "ml", "uid": "6f1c2d3e-0a4b-4c5d-8e9f-0123456789ab", "name": "c"}
    bad[field] = value
    batch = [claim_msg(pb, claim), pb.Claim(**bad)]  # a good claim beside it: refused too

    for call, request in (
        (stub.NodeUnprepareResources, pb.NodeUnprepareResourcesRequest(claims=batch)),
        (stub.NodePrepareResources, pb.NodePrepareResourcesRequest(claims=batch)),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "claim 2 of 2: " in refused.value.details()
        assert says in refused.value.details()
        assert len(refused.value.details()) < 400
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert sorted(p.name for p in node.config.cdi_dir.iterdir()) == cdi_before
    assert ref(claim)[0] in node.agent.state.entries()  # the good claim was left alone


def test_prepared_claims_keep_working_while_the_apiserver_is_unreachable(node: Node) -> None:
    pb, stub = node.dra("v1")
    claim = allocate_claim(node.api, ["gpu-0-mig-1g10gb-6"])
    request = pb.NodePrepareResourcesRequest(claims=[claim_msg(pb, claim)])
    first = stub.NodePrepareResources(request, timeout=30)
    node.api.fail_next("get", Unavailable("apiserver unreachable"), times=100)
    node.api.fail_next("list", Unavailable("apiserver unreachable"), times=100)
    again = stub.NodePrepareResources(request, timeout=30)
    assert again == first


def test_a_claim_that_cannot_be_read_gets_an_error_naming_the_apiserver(tmp_path: Path) -> None:
    api = InMemoryKubeApi()
    agent = build_agent(SimulatedBackend("H100-80GB:1", node_name=NODE), api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-5"])  # not in the cache yet: a GET is needed
    api.fail_next("get", Unavailable("connection refused"))
    driver = DraDriver(agent.state, ClaimCache(api, pool=NODE), pool=NODE)
    uid, namespace, name = ref(claim)
    outcome = driver.prepare_one(ClaimRef(namespace, uid, name))
    assert "cannot read ResourceClaim" in outcome.error and "retry" in outcome.error
    assert driver.prepare_one(ClaimRef(namespace, uid, name)).error == ""
    driver.close()


def test_a_prepared_claim_is_answered_without_reading_it_and_counted_once(
    tmp_path: Path,
) -> None:
    api = InMemoryKubeApi()
    agent = build_agent(SimulatedBackend("H100-80GB:1", node_name=NODE), api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-5"])
    [device] = agent.prepare(claim)
    driver = DraDriver(agent.state, ClaimCache(api, pool=NODE), pool=NODE)  # reading needs a GET
    api.fail_next("get", Unavailable("connection refused"), times=10)
    uid, namespace, name = ref(claim)
    outcome = driver.prepare_one(ClaimRef(namespace, uid, name))
    assert outcome.error == "" and outcome.devices == (device,)
    prepares = "gpu_slicer_agent_prepares_total"
    assert agent.metrics.value(prepares, {"outcome": "already"}) == 1
    driver.close()


def test_the_agent_publishes_its_pool_and_taints_a_lost_gpu_until_it_recovers(
    node: Node,
) -> None:
    def tainted() -> set[str]:
        return {
            d["name"]
            for s in node.api.objects("resource.k8s.io/v1", "ResourceSlice")
            if s["spec"]["pool"]["name"] == NODE
            for d in s["spec"].get("devices", [])
            if any(t["key"] == "gpu-slicer.io/unhealthy" for t in d.get("taints", []))
        }

    _wait(lambda: bool(node.api.objects("resource.k8s.io/v1", "ResourceSlice")))
    assert tainted() == set()
    node.backend.lose_gpu(1)
    _wait(lambda: bool(tainted()))
    assert all(name.startswith("gpu-1") for name in tainted())
    assert "gpu-1" in tainted()
    node.backend.recover_gpu(1)
    _wait(lambda: not tainted())


def _health_until(stream: Any, condition: Any, limit: int = 200) -> dict[str, tuple[int, str]]:
    """Reads a health stream until a message satisfies ``condition``; device -> (health, text)."""
    for _, message in zip(range(limit), stream, strict=False):
        assert {d.device.pool_name for d in message.devices} == {NODE}
        seen = {d.device.device_name: (d.health, d.message) for d in message.devices}
        if condition(seen):
            return seen
    raise AssertionError("the health stream never reached the expected state")


def _health_stub(node: Node) -> Any:
    """A resource-health client on a connection of its own to the agent's DRA socket."""
    return dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(  # type: ignore[no-untyped-call]
        node.channel(node.agent.plugin.dra_path)
    )


def test_the_health_stream_reports_every_device_and_a_critical_xid_on_its_gpu(node: Node) -> None:
    pb = dra_health_v1alpha1_pb2
    stub = _health_stub(node)
    claim = allocate_claim(node.api, ["gpu-1-mig-3g40gb-4"])
    prepared = node.dra("v1")[1].NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(dra_v1_pb2, claim)]), timeout=30
    )
    assert prepared.claims[ref(claim)[0]].error == ""
    stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest())

    # Once the pool is published, every device of it, whole GPUs and slices, healthy; not the
    # devices the claim's slice leaves no room for, which the pool leaves out.
    first = _health_until(stream, lambda seen: "gpu-1-mig-1g10gb-0" in seen)
    assert {"gpu-0", "gpu-1-mig-3g40gb-4", "gpu-0-mig-7g80gb-0"} <= set(first)
    assert {"gpu-1", "gpu-1-mig-1g10gb-6"}.isdisjoint(first)
    assert {health for health, _ in first.values()} == {pb.HEALTHY}

    node.backend.inject_xid(1, 13)  # an application's fault: the GPU stays healthy
    node.backend.inject_xid(1, 79)  # fell off the bus: every device of GPU 1 turns unhealthy
    hit = _health_until(stream, lambda seen: seen["gpu-1-mig-3g40gb-4"][0] == pb.UNHEALTHY)
    for name, (health, message) in hit.items():
        if name.startswith("gpu-1"):
            assert health == pb.UNHEALTHY and "xid-79" in message, name
        else:
            assert (health, message) == (pb.HEALTHY, ""), name

    node.backend.recover_gpu(1)
    _health_until(stream, lambda seen: {h for h, _ in seen.values()} == {pb.HEALTHY})
    stream.cancel()
    _wait(lambda: node.agent.health_feed.streams == 0)


def _first_message_within(stream: Any, limit_s: float) -> Any:
    """The stream's first message, or AssertionError when none came within ``limit_s``."""
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(next(stream)), daemon=True)
    reader.start()
    reader.join(limit_s)
    assert got, f"no health message within {limit_s} s"
    return got[0]


def test_a_thousand_watchers_that_never_read_leave_the_kubelets_stream_served(
    node: Node,
) -> None:
    pb = dra_health_v1alpha1_pb2
    health = _health_stub(node)
    watchers = node.agent.plugin.health_watchers
    kubelet = health.NodeWatchResources(pb.NodeWatchResourcesRequest())
    _health_until(kubelet, lambda seen: "gpu-1" in seen)

    # A local client opens 1,000 streams on its own connection and never reads any of them.
    hostile = _health_stub(node)  # a connection of its own
    streams = [hostile.NodeWatchResources(pb.NodeWatchResourcesRequest()) for _ in range(1000)]
    _wait(lambda: watchers.admitted == 1001, limit_s=120)
    assert watchers.count <= watchers.limit

    # The kubelet's stream stayed open and still hears of a fault at once.
    node.backend.inject_xid(1, 79)
    hit = _health_until(kubelet, lambda seen: seen["gpu-1"][0] == pb.UNHEALTHY)
    assert "xid-79" in hit["gpu-1"][1]

    # A kubelet that dials again now is served within a second (a generous bound: the goal).
    again = health.NodeWatchResources(pb.NodeWatchResourcesRequest())
    first = _first_message_within(again, 1.0)
    assert {d.device.device_name for d in first.devices} >= {"gpu-0", "gpu-1"}

    # All but the newest few gave way; prepare calls went on meanwhile.
    assert watchers.closed >= 1001 - watchers.limit
    with pytest.raises(grpc.RpcError) as ended:
        list(streams[500])  # its one message, then the end
    assert ended.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED)
    claim = allocate_claim(node.api, ["gpu-0-mig-1g10gb-0"])
    pb1, dra = node.dra("v1")
    prepared = dra.NodePrepareResources(
        pb1.NodePrepareResourcesRequest(claims=[claim_msg(pb1, claim)]), timeout=30
    )
    assert prepared.claims[ref(claim)[0]].error == ""
    for stream in streams:
        stream.cancel()
    kubelet.cancel()
    again.cancel()
    _wait(lambda: watchers.count == 0)


def test_when_every_place_is_taken_the_newest_watcher_gives_way_and_is_told_why(
    node: Node,
) -> None:
    pb = dra_health_v1alpha1_pb2
    health = _health_stub(node)
    watchers = node.agent.plugin.health_watchers
    streams = []
    for _ in range(watchers.limit):
        stream = health.NodeWatchResources(pb.NodeWatchResourcesRequest())
        next(stream)
        streams.append(stream)
    newcomer = health.NodeWatchResources(pb.NodeWatchResourcesRequest())
    assert next(newcomer).devices

    with pytest.raises(grpc.RpcError) as ended:
        list(streams[-1])
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the agent serves at most 4 at a time, and the newest gives way" in (
        ended.value.details()
    )
    # The oldest (the kubelet's, opened first) is still served.
    node.backend.inject_xid(0, 79)
    _health_until(streams[0], lambda seen: seen["gpu-0"][0] == pb.UNHEALTHY)
    for stream in [*streams, newcomer]:
        stream.cancel()
    _wait(lambda: watchers.count == 0)


def test_the_health_stream_ends_cleanly_when_the_agent_stops(node: Node) -> None:
    stub = _health_stub(node)
    stream = stub.NodeWatchResources(dra_health_v1alpha1_pb2.NodeWatchResourcesRequest())
    next(stream)
    node.agent.plugin.stop()
    rest = list(stream)  # the end of the stream, not an error: the kubelet dials again
    assert len(rest) <= 1
    assert stream.code() == grpc.StatusCode.OK


def _wait(condition: Any, limit_s: float = 20.0) -> None:
    """Poll for an asynchronous effect (a correctness wait, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
