"""MIG slices end to end: the webhook converts, the real scheduler allocates against the agent's
counters, the kubelet stand-in prepares, and the simulated GPU holds exactly what was allocated."""

from __future__ import annotations

import subprocess
import sys

from gpu_slicer.kube.client import RealKubeApi
from gpu_slicer.status.cli import read_status
from tests.support.e2e_sandbox import ENABLED, Sandbox, pod_manifest

NODE = "a100"


def _deployment(replicas: int) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer", "namespace": ENABLED},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "infer"}},
            "template": {
                "metadata": {"labels": {"app": "infer"}},
                "spec": {
                    **pod_manifest("x", node=NODE, limits={"nvidia.com/mig-1g.10gb": "1"})["spec"]
                },
            },
        },
    }


def _allocated(box: Sandbox, pod: dict[str, object]) -> list[tuple[str, str]]:
    return [
        (r["request"], r["device"])
        for claim in box.claims_of(pod)  # type: ignore[arg-type]
        for r in claim["status"]["allocation"]["devices"]["results"]
    ]


def test_seven_small_slices_then_a_large_one_that_waits_for_room(sandbox: Sandbox) -> None:
    from kubernetes import client as k8s

    apps = k8s.AppsV1Api(sandbox.client)
    apps.create_namespaced_deployment(ENABLED, _deployment(7))

    def running() -> list[dict[str, object]]:
        pods = [
            sandbox.obj(p)
            for p in sandbox.core.list_namespaced_pod(ENABLED, label_selector="app=infer").items
        ]
        ok = [p for p in pods if p["status"].get("phase") == "Running"]  # type: ignore[union-attr]
        return ok if len(ok) == 7 and len(pods) == 7 else []

    pods = sandbox.wait(running, what="seven replicas running", timeout_s=90)
    devices = sorted(d for p in pods for _, d in _allocated(sandbox, p))
    assert devices == [f"gpu-0-mig-1g10gb-{start}" for start in range(7)]
    # The GPU holds exactly the seven allocated instances, each at its allocated placement.
    assert sandbox.instances(NODE) == [(0, "1g.10gb", start) for start in range(7)]
    # Each container got its own MIG device through CDI, checked by the reference library.
    caps: list[tuple[str, ...]] = []
    for pod in pods:
        meta = pod["metadata"]
        runtime = sandbox.container_runtime(NODE, ENABLED, meta["name"], "main")  # type: ignore[index]
        assert len(runtime["cdiDevices"]) == 1
        spec = runtime["ociSpec"]
        assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=MIG-") for e in spec["process"]["env"])
        # What CUDA needs, merged by the reference library from the agent's spec (the instance's
        # GPU and MIG capability nodes) and the toolkit's common edits (control and UVM nodes,
        # driver libraries, the ldcache hook).
        nodes = [d["path"] for d in spec["linux"]["devices"]]
        assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"} <= set(nodes)
        caps.append(tuple(n for n in nodes if n.startswith("/dev/nvidia-caps/")))
        assert len(caps[-1]) == 2
        assert any("libcuda.so" in m["destination"] for m in spec["mounts"])
        hooks = spec["hooks"]["createContainer"]
        assert any("update-ldcache" in h["args"] for h in hooks)
    assert len(set(caps)) == 7  # each instance's own GPU-instance and compute-instance caps

    # gpu-slicer status draws the same picture from the cluster alone.
    view = read_status(RealKubeApi.from_config(str(sandbox.kubeconfig)), node=NODE)
    gpu = view.node(NODE).gpus[0]
    assert sorted((i.profile, i.start) for i in gpu.instances) == [
        ("1g.10gb", start) for start in range(7)
    ]
    assert {p.name for i in gpu.instances for p in i.pods} == {p["metadata"]["name"] for p in pods}  # type: ignore[index]
    [enabled] = [n for n in view.namespaces if n.name == ENABLED]
    assert enabled.migration == "enabled" and enabled.holding >= 7
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_slicer.cli.main",
            "status",
            "--kubeconfig",
            str(sandbox.kubeconfig),
            "--node",
            NODE,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "1g.10gb" in shown.stdout

    large, _ = sandbox.create_pod(
        ENABLED, pod_manifest("train", node=NODE, limits={"nvidia.com/mig-3g.40gb": "1"})
    )
    sandbox.wait(
        lambda: any(
            c.get("reason") == "Unschedulable"
            for c in sandbox.pod(ENABLED, "train")["status"].get("conditions") or []
        ),
        what="the 3g.40gb pod to be unschedulable while seven 1g.10gb slices run",
    )

    apps.patch_namespaced_deployment_scale("infer", ENABLED, {"spec": {"replicas": 0}})
    sandbox.wait(
        lambda: not sandbox.core.list_namespaced_pod(ENABLED, label_selector="app=infer").items,
        what="replicas gone",
        timeout_s=90,
    )
    pod = sandbox.wait_running(ENABLED, "train", timeout_s=90)
    [(request, device)] = _allocated(sandbox, pod)
    assert device.startswith("gpu-0-mig-3g40gb-")
    start = int(device.rsplit("-", 1)[1])
    assert sandbox.instances(NODE) == [(0, "3g.40gb", start)]
    sandbox.delete_pod(ENABLED, "train")
    apps.delete_namespaced_deployment("infer", ENABLED)
    sandbox.wait(lambda: sandbox.instances(NODE) == [], what="the 3g.40gb instance destroyed")


def test_a_fallback_chain_takes_its_second_alternative_when_the_first_is_exhausted(
    sandbox: Sandbox,
) -> None:
    node = "a100-fallback"
    sandbox.create_pod(
        ENABLED, pod_manifest("big", node=node, limits={"nvidia.com/mig-4g.40gb": "1"})
    )
    sandbox.wait_running(ENABLED, "big")
    sandbox.create_pod(
        ENABLED,
        pod_manifest("chain", node=node, annotations={"gpu-slicer.io/profiles": "4g.40gb,3g.40gb"}),
    )
    pod = sandbox.wait_running(ENABLED, "chain")
    [(request, device)] = _allocated(sandbox, pod)
    claim = sandbox.claims_of(pod)[0]
    [spec_request] = claim["spec"]["devices"]["requests"]
    second = spec_request["firstAvailable"][1]["name"]
    assert request == f"{spec_request['name']}/{second}"
    assert device.startswith("gpu-0-mig-3g40gb-")
    assert sorted(p for _, p, _ in sandbox.instances(node)) == ["3g.40gb", "4g.40gb"]
    for name in ("chain", "big"):
        sandbox.delete_pod(ENABLED, name)
    sandbox.wait(lambda: sandbox.instances(node) == [], what="both instances destroyed")
