"""What gpu-slicer adds to a pod's start-up, on the sandbox's real control plane.

Prints figures only. One sandbox (``gpu-slicer sandbox up``, Kubernetes 1.36, one node with
eight simulated H100s whose MIG operations take no time) serves pairs of pods created one after
the other: a pod asking for nothing (the baseline) and the same pod asking for
``nvidia.com/mig-1g.10gb: 1`` in a namespace that opted in. For each pod the time from the
create call to the pod reported Running is measured, so both go through the same apiserver,
scheduler and kubelet stand-in; the difference is what gpu-slicer's path costs: the webhook call
(admission), the ResourceClaim the controller manager makes from the template, the scheduler's
allocation against the agent's slices, and the agent's prepare (checkpoint, MIG instance, CDI
spec) with the CDI injection.

The breakdown comes from a watch the benchmark holds on the pods, stamped when each event arrives
(apiserver timestamps have one-second resolution): admitted (the create call returned), claim
created (the controller manager made the claim and recorded it in the pod's status), bound (the
scheduler allocated the claim in its PreBind step, then bound the pod), Running (the kubelet
stand-in prepared the claim through the agent, injected the CDI devices, reported the pod).

On real hardware creating a MIG instance takes seconds (GPU instance and compute instance
creation in the driver); the simulated GPU here takes none, so the figures are the software
path only.

    python bench/bench_pod_startup.py [--pods 50] [--state-dir /tmp/bench-sb]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client as k8s  # noqa: E402
from kubernetes import watch as k8s_watch  # noqa: E402

from gpu_slicer.sandbox import launch  # noqa: E402
from gpu_slicer.sandbox.cluster import api_client  # noqa: E402

NAMESPACE = "bench"
NODE = "bench-node"
GPUS = "H100-80GB:8"


class Stamps:
    """When each object's transitions were first seen, by a watch in this process."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()

    def mark(self, key: tuple[str, str]) -> None:
        with self.lock:
            self.seen.setdefault(key, time.perf_counter())

    def get(self, key: tuple[str, str]) -> float | None:
        with self.lock:
            return self.seen.get(key)


def watch_pods(core: k8s.CoreV1Api, stamps: Stamps, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            for event in k8s_watch.Watch().stream(
                core.list_namespaced_pod, NAMESPACE, timeout_seconds=5
            ):
                record(event["object"], stamps)
        except Exception:  # a stream cut at its timeout: watch again
            continue


def record(pod: Any, stamps: Stamps) -> None:
    """Stamps the transitions ``pod`` shows, the first time each is seen."""
    name = pod.metadata.name
    for status in pod.status.resource_claim_statuses or []:
        if status.resource_claim_name:
            stamps.mark((name, "claim-created"))
    if pod.spec.node_name:
        stamps.mark((name, "bound"))
    if pod.status.phase == "Running":
        stamps.mark((name, "running"))


def pod(name: str, gpu: bool) -> dict[str, Any]:
    limits = {"nvidia.com/mig-1g.10gb": "1"} if gpu else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def start(core: k8s.CoreV1Api, stamps: Stamps, name: str, gpu: bool) -> dict[str, float]:
    begin = time.perf_counter()
    core.create_namespaced_pod(NAMESPACE, pod(name, gpu))
    admitted = time.perf_counter()
    deadline = begin + 120
    while stamps.get((name, "running")) is None:
        if time.perf_counter() > deadline:
            raise SystemExit(f"pod {name} did not run within 120 s")
        time.sleep(0.002)
    phases = {"admitted": admitted - begin}
    for step in ("claim-created", "bound", "running"):
        seen = stamps.get((name, step))
        if seen is not None:
            phases[step] = seen - begin
    return phases


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50, help="pods of each kind (<= 56)")
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.pods <= 56:
        parser.error("--pods must be 1-56 (eight H100s hold 56 1g.10gb slices)")
    folder = args.state_dir or Path(tempfile.mkdtemp(prefix="gs-bench-")) / "sb"
    process = launch.launch(folder, {NODE: GPUS})
    try:
        run(launch.wait_ready(folder, process), args.pods)
    finally:
        launch.stop(process)


def run(ready: dict[str, Any], pods: int) -> None:
    client = api_client(Path(ready["kubeconfig"]))
    core = k8s.CoreV1Api(client)
    core.create_namespace(
        {"metadata": {"name": NAMESPACE, "labels": {"gpu-slicer.io/migration": "enabled"}}}
    )
    time.sleep(2)  # the webhook's namespace cache learns the label
    stamps = Stamps()
    stop = threading.Event()
    threading.Thread(target=watch_pods, args=(core, stamps, stop), daemon=True).start()
    time.sleep(1)
    start(core, stamps, "warm-plain", False)
    start(core, stamps, "warm-gpu", True)
    core.delete_namespaced_pod("warm-gpu", NAMESPACE)
    time.sleep(3)
    plain: list[dict[str, float]] = []
    gpu: list[dict[str, float]] = []
    for i in range(pods):
        plain.append(start(core, stamps, f"plain-{i}", False))
        gpu.append(start(core, stamps, f"gpu-{i}", True))
    stop.set()
    report(plain, gpu)


def report(plain: list[dict[str, float]], gpu: list[dict[str, float]]) -> None:
    def ms(values: list[float]) -> str:
        return (
            f"p50 {statistics.median(values) * 1000:7.1f} ms   "
            f"p95 {percentile(values, 0.95) * 1000:7.1f} ms   "
            f"max {max(values) * 1000:7.1f} ms"
        )

    base = [p["running"] for p in plain]
    ours = [p["running"] for p in gpu]
    print(f"create -> Running, {len(base)} pods each (same sandbox, interleaved)")
    print(f"  no GPU (baseline)          {ms(base)}")
    print(f"  nvidia.com/mig-1g.10gb: 1  {ms(ours)}")
    added = [g - b for g, b in zip(ours, base, strict=True)]
    print(
        f"  added by gpu-slicer        p50 {statistics.median(added) * 1000:7.1f} ms   "
        f"p95 {(percentile(ours, 0.95) - percentile(base, 0.95)) * 1000:7.1f} ms "
        "(p95 of GPU pods minus p95 of plain pods)"
    )
    print("breakdown of the GPU pods (time since the create call, p50 / p95):")
    for step in ("admitted", "claim-created", "bound", "running"):
        values = [p[step] for p in gpu if step in p]
        print(
            f"  {step:14s} {statistics.median(values) * 1000:7.1f} / "
            f"{percentile(values, 0.95) * 1000:7.1f} ms"
        )
    admitted_plain = [p["admitted"] for p in plain]
    print(
        f"  admission alone: {statistics.median(admitted_plain) * 1000:.1f} ms for a plain pod "
        f"(the webhook is not called), "
        f"{statistics.median([p['admitted'] for p in gpu]) * 1000:.1f} ms for a GPU pod"
    )
    print("MIG creation on real GPUs takes seconds; the simulated GPU takes none.")


if __name__ == "__main__":
    main()
