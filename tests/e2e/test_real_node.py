"""A real node: the kubelet and containerd run converted pods' containers, the GPU simulated.

A sandbox of its own with one node, ``real``, started with ``--real-node real``. Each pod runs
busybox, which writes what it sees from inside its container to its log: the NVIDIA device
nodes, ``NVIDIA_VISIBLE_DEVICES`` and its device cgroup's allow-list. The tests read that log
through the apiserver (which asks the kubelet) and compare it with the claim's CDI spec and the
simulated GPU's instances.

Skipped with the reason where the machine cannot run containers (not root, no cgroups, runc or
the CNI plugins missing) or the kubelet and containerd cannot be built; under ``CI=true`` that
is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_slicer.core.devices import parse_device_name
from gpu_slicer.sandbox import binaries, node_host, oci_image, realnode
from gpu_slicer.sandbox.errors import BuildError
from gpu_slicer.sandbox.node_namespace import KUBELET_SYSCTLS
from gpu_slicer.slicer.simulated_store import events_dir
from tests.support.e2e_sandbox import (
    ENABLED,
    Sandbox,
    assert_stopped_cleanly,
    pod_manifest,
    resource_health,
    start_sandbox,
    stop_sandbox,
    wait_webhook_knows,
)
from tests.support.real_node_probe import container_report, probe_pod

NODE = "real"
GPUS = "A100-80GB:1"
STAND_IN = "beside"
"""A node of the same sandbox that keeps the kubelet stand-in."""
LIMITS = {"nvidia.com/mig-1g.10gb": "1"}
Obj = dict[str, Any]


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str) -> None:
    if _under_ci():
        pytest.fail(f"the real node cannot run here: {reason}")
    pytest.skip(f"no real node: {reason}")


def _host_state(cgroup_root: str, bridge: str) -> Obj:
    """What the node must leave as it found: mounts seen here, kernel settings, cgroups, links."""
    return {
        "mounts": sorted(
            line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ),
        "sysctls": {
            name: (Path("/proc/sys") / name).read_text()
            for name in KUBELET_SYSCTLS
            if (Path("/proc/sys") / name).exists()
        },
        "cgroups": [
            str(h / cgroup_root)
            for h in node_host.every_cgroup_mount()
            if (h / cgroup_root).exists()
        ],
        "bridge": Path("/sys/class/net", bridge).exists(),
        "host folders": {
            p: Path(p).exists()
            for p in ("/var/lib/kubelet", "/var/log/pods", "/run/containerd", "/etc/cni/net.d")
        },
    }


@pytest.fixture(scope="module")
def real(kube_binaries: binaries.Binaries) -> Iterator[Sandbox]:
    folder = Path(tempfile.mkdtemp(prefix="gs-real-")) / "sb"
    problems = node_host.preflight(folder)
    if problems:
        _unavailable("; ".join(problems))
    try:
        realnode.ensure_parts(
            binaries.DEFAULT_MINOR,
            progress=lambda m: print(f"[e2e] {m}", file=sys.__stderr__, flush=True),
        )
    except BuildError as exc:
        _unavailable(str(exc))
    rn_id = realnode.short_id(folder, NODE)
    cgroup_root, bridge = f"gpu-slicer-{NODE}-{rn_id}", f"gsl{rn_id}"
    before = _host_state(cgroup_root, bridge)
    running = start_sandbox(folder, {NODE: GPUS, STAND_IN: GPUS}, "--real-node", NODE)
    try:
        running.core.create_namespace(
            {"metadata": {"name": ENABLED, "labels": {"gpu-slicer.io/migration": "enabled"}}}
        )
        wait_webhook_knows(running)
        yield running
    finally:
        running.client.close()
        code = stop_sandbox(running.process)
    assert_stopped_cleanly(code, folder)
    assert _host_state(cgroup_root, bridge) == before
    shutil.rmtree(folder.parent)  # containerd's images and snapshots: kept only on failure


def _pod(name: str) -> Obj:
    return probe_pod(name, NODE, LIMITS)


def _claim_spec(box: Sandbox, pod: Obj) -> Obj:
    [claim] = box.claims_of(pod)
    uid = claim["metadata"]["uid"]
    path = box.dir / "nodes" / NODE / "cdi" / f"k8s.gpu-slicer.io-claim_{uid}.json"
    spec: Obj = json.loads(path.read_text())
    return spec


def _expected(spec: Obj) -> tuple[set[str], str]:
    nodes = {n["path"] for n in spec["containerEdits"].get("deviceNodes", [])}
    [device] = spec["devices"]
    nodes |= {n["path"] for n in device["containerEdits"]["deviceNodes"]}
    [visible] = [e for e in device["containerEdits"]["env"] if "NVIDIA_VISIBLE_DEVICES" in e]
    return nodes, visible


def _caps(devices: set[str]) -> set[str]:
    return {d for d in devices if d.startswith("/dev/nvidia-caps/")}


def _registrations(box: Sandbox) -> int:
    return box.log(f"agent-{NODE}").count("registered with the kubelet")


def _checkpoint(box: Sandbox) -> dict[str, bytes]:
    folder = box.dir / "nodes" / NODE / "checkpoint"
    # The claims the agent holds; agent.lock names the running agent and changes with it.
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix != ".lock"}


def _started(box: Sandbox, name: str) -> tuple[str, int]:
    [status] = box.pod(ENABLED, name)["status"]["containerStatuses"]
    return status["containerID"], status["restartCount"]


@pytest.fixture(scope="module")
def two_pods(real: Sandbox) -> list[Obj]:
    pods = []
    for name in ("first", "second"):
        real.create_pod(ENABLED, _pod(name))
        pods.append(real.wait_running(ENABLED, name, timeout_s=150))
    return pods


def test_a_converted_pod_sees_exactly_its_devices_from_inside_its_container(
    real: Sandbox, two_pods: list[Obj]
) -> None:
    pod = two_pods[0]
    assert pod["spec"]["resourceClaims"], "the webhook converted the pod"
    seen = container_report(real, "first")
    nodes, visible = _expected(_claim_spec(real, pod))
    assert seen["devices"] == nodes
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= seen["devices"]
    assert "/dev/nvidia0" in seen["devices"]
    assert len(_caps(seen["devices"])) == 2
    assert seen["env"] == visible
    assert re.fullmatch(r"NVIDIA_VISIBLE_DEVICES=MIG-[0-9a-f-]{36}", seen["env"])
    if seen["cgroup"]:  # cgroup v1: the allow-list runc wrote for this container
        minors = sorted(int(p.rsplit("cap", 1)[1]) for p in _caps(seen["devices"]))
        assert {f"c 237:{m} rwm" for m in minors} == {
            c for c in seen["cgroup"] if c.startswith("c 237:")
        }
        assert "c 195:0 rwm" in seen["cgroup"]


def test_two_pods_on_one_gpu_see_different_capability_nodes_and_not_each_others(
    real: Sandbox, two_pods: list[Obj]
) -> None:
    first, second = container_report(real, "first"), container_report(real, "second")
    assert "/dev/nvidia0" in first["devices"] and "/dev/nvidia0" in second["devices"]
    assert _caps(first["devices"]).isdisjoint(_caps(second["devices"]))
    assert len(_caps(first["devices"])) == len(_caps(second["devices"])) == 2
    assert first["env"] != second["env"]
    assert len(real.instances(NODE)) == 2


HEALTH_WORDS = ("WatchResources", "health stream", "health info", "health update", "dra-healthinfo")
"""What the kubelet's lines about the DRA resource-health service say (pkg/kubelet/cm/dra)."""


OWN_CANCEL = "code = Canceled desc = context canceled"
"""A stopping kubelet cancels its own stream and logs that as an error (1.36.3's
HandleWatchResourcesStream checks for context.Canceled, not the gRPC status): not the driver's."""


def _health_trouble(kubelet_log: str) -> list[str]:
    """The kubelet's error lines (klog ``E``) about resource health, and any Unimplemented."""
    return [
        line
        for line in kubelet_log.splitlines()
        if "Unimplemented" in line
        or (
            line.startswith("E")
            and any(word in line for word in HEALTH_WORDS)
            and OWN_CANCEL not in line
        )
    ]


def _health_story(box: Sandbox, pod: Obj, wanted: str) -> str:
    """What a timed-out health wait needs to be understood: the status the kubelet last wrote
    against what was awaited, the kubelet's lines about the health stream (any level) and the
    agent's about health events and streams, and the events left in the simulated GPU's inbox."""
    try:
        return _health_lines(box, pod, wanted)
    except (OSError, ApiException, KeyError) as exc:  # the timeout is the failure to report
        return f"(the health story could not be gathered: {exc!r})\n"


def _health_lines(box: Sandbox, pod: Obj, wanted: str) -> str:
    kubelet = [
        line
        for line in box.log(f"kubelet-{NODE}").splitlines()
        if any(word in line for word in HEALTH_WORDS)
    ]
    agent = [line for line in box.log(f"agent-{NODE}").splitlines() if "health" in line.lower()]
    inbox = events_dir(Path(box.ready["nodes"][NODE]["gpuState"]))
    queued = sorted(p.name for p in inbox.iterdir()) if inbox.is_dir() else []
    return "\n".join(
        [
            f"awaited {wanted}; the pod's allocatedResourcesStatus now: "
            + json.dumps(_resource_status(box, pod)),
            f"kubelet health lines (last 40 of {len(kubelet)}):",
            *kubelet[-40:],
            f"agent health lines (last 40 of {len(agent)}):",
            *agent[-40:],
            f"events still queued for the agent: {queued}",
            "",
        ]
    )


def _resource_status(box: Sandbox, pod: Obj) -> list[Obj]:
    """The pod's ``allocatedResourcesStatus`` as the real kubelet last wrote it."""
    return resource_health(box.pod(ENABLED, pod["metadata"]["name"]))


def _status_of(pod: Obj, spec: Obj, health: str) -> list[Obj]:
    """What the kubelet writes for the pod's one claim: the entry named for the container's claim
    reference, its resource the claim's CDI device (the kubelet's ``resourceID``)."""
    [reference] = pod["spec"]["containers"][0]["resources"]["claims"]
    request = f"/{reference['request']}" if reference.get("request") else ""
    [device] = spec["devices"]
    resource = {"resourceID": f"{spec['kind']}={device['name']}", "health": health}
    return [{"name": f"claim:{reference['name']}{request}", "resources": [resource]}]


def test_the_real_kubelet_watches_the_agents_resource_health_without_an_error(
    real: Sandbox, two_pods: list[Obj]
) -> None:
    real.wait(
        lambda: "Successfully started WatchResources health stream" in real.log(f"kubelet-{NODE}"),
        what="the real kubelet opening the resource-health stream",
        timeout_s=90,
    )
    # The device's health in the pod's status comes only from the agent's stream (each stream
    # is logged at debug level only: a hostile client may open thousands).
    spec = _claim_spec(real, two_pods[0])
    real.wait(
        lambda: _resource_status(real, two_pods[0]) == _status_of(two_pods[0], spec, "Healthy"),
        what="the real kubelet reporting the pod's device Healthy",
        timeout_s=120,
    )
    assert _health_trouble(real.log(f"kubelet-{NODE}")) == []


def test_the_agent_restarted_under_running_containers_loses_nothing(
    real: Sandbox, two_pods: list[Obj]
) -> None:
    started = {name: _started(real, name) for name in ("first", "second")}
    instances = real.instances(NODE)
    checkpoint = _checkpoint(real)
    registrations = _registrations(real)
    real.restart(f"agent-{NODE}")
    real.wait(
        lambda: _registrations(real) > registrations,
        what="the restarted agent registered with the real kubelet",
    )
    assert real.instances(NODE) == instances
    assert _checkpoint(real) == checkpoint
    for name in ("first", "second"):
        assert _started(real, name) == started[name]
        assert real.pod(ENABLED, name)["status"]["phase"] == "Running"


def test_the_kubelet_restarted_reattaches_its_running_pods(
    real: Sandbox, two_pods: list[Obj]
) -> None:
    started = {name: _started(real, name) for name in ("first", "second")}
    instances = real.instances(NODE)
    claims = {c["metadata"]["uid"] for p in two_pods for c in real.claims_of(p)}
    component = f"kubelet-{NODE}"
    registrations = _registrations(real)
    real.restart(component)
    real.wait(
        lambda: real.log(component).count("Started kubelet") >= 2,
        what="the restarted kubelet running",
    )
    real.wait(
        lambda: _registrations(real) > registrations,
        what="the restarted kubelet registering the agent again",
        timeout_s=90,
    )
    for name in ("first", "second"):
        assert _started(real, name) == started[name]
        assert real.pod(ENABLED, name)["status"]["phase"] == "Running"
    assert real.instances(NODE) == instances
    for pod in two_pods:
        for claim in real.claims_of(pod):
            assert claim["metadata"]["uid"] in claims
            assert claim["status"]["reservedFor"][0]["uid"] == pod["metadata"]["uid"]


def test_deleting_a_pod_unprepares_and_destroys_its_instance(
    real: Sandbox, two_pods: list[Obj]
) -> None:
    for pod in two_pods:
        name = pod["metadata"]["name"]
        [claim] = real.claims_of(real.pod(ENABLED, name))
        before = len(real.instances(NODE))
        real.delete_pod(ENABLED, name)
        real.wait(
            lambda b=before: len(real.instances(NODE)) == b - 1,
            what=f"{name}'s instance destroyed",
        )
        real.wait(
            lambda c=claim: (
                not any(
                    x.metadata.uid == c["metadata"]["uid"]
                    for x in real.resource.list_namespaced_resource_claim(ENABLED).items
                )
            ),
            what=f"{name}'s claim released and deleted",
        )
        cdi = real.dir / "nodes" / NODE / "cdi"
        assert not any(claim["metadata"]["uid"] in p.name for p in cdi.iterdir())
    assert real.instances(NODE) == []


def test_an_injected_fault_reaches_the_pod_status_the_real_kubelet_writes(real: Sandbox) -> None:
    # After the other pods are gone: the GPU's recovery is a reset, which empties it.
    real.create_pod(ENABLED, _pod("faulty"))
    pod = real.wait_running(ENABLED, "faulty", timeout_s=150)
    [claim] = real.claims_of(pod)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert parse_device_name(result["device"]).gpu_index == 0  # the node's one GPU
    spec = _claim_spec(real, pod)
    real.wait(
        lambda: _resource_status(real, pod) == _status_of(pod, spec, "Healthy"),
        what="the pod's device reported Healthy",
        timeout_s=120,
        explain=lambda: _health_story(real, pod, "Healthy"),
    )

    real.simulate_event(NODE, "--gpu", "0", "--xid", "79")

    def unhealthy() -> list[Obj]:
        found = _resource_status(real, pod)
        resources = [r for entry in found for r in entry["resources"]]
        return found if resources and all(r["health"] == "Unhealthy" for r in resources) else []

    try:
        found = real.wait(
            unhealthy,
            what="the Xid in the pod's allocatedResourcesStatus",
            timeout_s=120,
            explain=lambda: _health_story(real, pod, "Unhealthy"),
        )
        [[resource]] = [entry["resources"] for entry in found]
        message = resource.pop("message", "")
        assert found == _status_of(pod, spec, "Unhealthy")
        assert "GPU 0 is unhealthy (xid-79)" in message
        assert "Sending health update notification for pods" in real.log(f"kubelet-{NODE}")
        assert real.pod(ENABLED, "faulty")["status"]["phase"] == "Running"
        real.delete_pod(ENABLED, "faulty")
    finally:
        real.simulate_event(NODE, "--gpu", "0", "--recovered")
    assert _health_trouble(real.log(f"kubelet-{NODE}")) == []

    real.create_pod(ENABLED, _pod("recovered"))
    after = real.wait_running(ENABLED, "recovered", timeout_s=150)
    real.wait(
        lambda: (
            _resource_status(real, after) == _status_of(after, _claim_spec(real, after), "Healthy")
        ),
        what="a new pod's device Healthy on the recovered GPU",
        timeout_s=120,
        explain=lambda: _health_story(real, after, "Healthy"),
    )
    real.delete_pod(ENABLED, "recovered")
    real.wait(lambda: real.instances(NODE) == [], what="the recovered GPU's instance destroyed")


def test_the_other_nodes_keep_the_kubelet_stand_in(real: Sandbox) -> None:
    assert real.ready["nodes"][NODE]["kubelet"] == "real"
    assert real.ready["nodes"][STAND_IN]["kubelet"] == "stand-in"
    real.create_pod(ENABLED, pod_manifest("beside", node=STAND_IN, limits=LIMITS))
    pod = real.wait_running(ENABLED, "beside")
    assert pod["spec"]["resourceClaims"]
    spec = real.container_runtime(STAND_IN, ENABLED, "beside", "main")["ociSpec"]
    assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=MIG-") for e in spec["process"]["env"])
    assert real.core.read_node(STAND_IN).status.node_info.container_runtime_version == "sandbox://0"
    real.delete_pod(ENABLED, "beside")
    real.wait(lambda: real.instances(STAND_IN) == [], what="the stand-in's instance destroyed")


def test_an_image_archive_imported_into_the_node_runs_without_a_pull(
    real: Sandbox, tmp_path: Path
) -> None:
    busybox = node_host.static_busybox()
    assert busybox is not None  # the preflight checked it
    root = tmp_path / "root" / "bin"
    root.mkdir(parents=True)
    shutil.copy2(busybox, root / "busybox")
    image = oci_image.ImageSpec(
        "docker.io/library/imported:e2e",
        entrypoint=["/bin/busybox", "sh", "-c", "echo imported; exec /bin/busybox sleep 999999"],
    )
    archive = oci_image.write_archive(tmp_path / "root", image, tmp_path / "imported.tar")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_slicer.sandbox.oci_image",
            "--state-dir",
            str(real.dir),
            "--node",
            NODE,
            str(archive),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    pod = pod_manifest("imported", node=NODE)
    pod["spec"]["containers"][0] |= {"image": "imported:e2e", "imagePullPolicy": "Never"}
    real.create_pod(ENABLED, pod)
    real.wait_running(ENABLED, "imported", timeout_s=90)
    real.wait(
        lambda: "imported" in str(real.core.read_namespaced_pod_log("imported", ENABLED)),
        what="the imported image's output",
    )
    real.delete_pod(ENABLED, "imported")
