"""The node agent's own cost per prepare and unprepare, with GPU work taking no time.

Prints figures only (no pass/fail on time). The simulated backend answers at once, so what is
measured is the agent: planning, the per-GPU and checkpoint locks, two checkpoint writes (temp
file, fsync, rename) per prepare and one per unprepare, the CDI spec write and removal, and for
the ``grpc`` rows the kubelet's round trip over a unix socket. The baseline, run in the same
process, makes exactly the backend calls one prepare and unprepare need (create GI, create CI,
capability minors, processes, destroy CI, destroy GI) with nothing around them.

The issue's goal is a p99 of at most 20 ms per call for the agent's own overhead.

    python bench/bench_prepare.py [--calls 1000] [--dir DIR]   # DIR: where files go (disk!)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from kube.memory import InMemoryKubeApi  # noqa: E402
from slicer.agent import AgentConfig, NodeAgent  # noqa: E402
from slicer.claims import AllocatedDevice  # noqa: E402
from slicer.proto import dra_v1_pb2, dra_v1_pb2_grpc  # noqa: E402
from slicer.simulated import SimulatedBackend  # noqa: E402

NODE = "bench-node"
# Seven 1g slices spread over the placements of two GPUs, so instances come and go at
# different places (and GI ids) rather than one spot.
DEVICES = [f"gpu-{g}-mig-1g10gb-{s}" for g in (0, 1) for s in range(7)]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def row(name: str, samples: list[float]) -> tuple[str, float, float]:
    median = statistics.median(samples) * 1000
    p99 = percentile(samples, 0.99) * 1000
    print(f"  {name:<34} median {median:8.3f} ms   p99 {p99:8.3f} ms   (n={len(samples)})")
    return name, median, p99


def timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def bench_baseline(calls: int) -> tuple[list[float], list[float]]:
    backend = SimulatedBackend("H100-80GB:2", node_name=NODE, mig_enabled=True)
    prepare: list[float] = []
    unprepare: list[float] = []
    for i in range(calls):
        gpu, start = divmod(i % len(DEVICES), 7)
        holder: dict[str, int] = {}

        def create(gpu: int = gpu, start: int = start, holder: dict[str, int] = holder) -> None:
            gi = backend.create_gpu_instance(gpu, "1g.10gb", start)
            inst = backend.create_compute_instance(gpu, gi)
            backend.capability_minors(gpu, gi, inst.ci_id or 0)
            holder["gi"] = gi

        def destroy(gpu: int = gpu, holder: dict[str, int] = holder) -> None:
            backend.processes(gpu, holder["gi"])
            backend.destroy_compute_instance(gpu, holder["gi"], 0)
            backend.destroy_gpu_instance(gpu, holder["gi"])

        prepare.append(timed(create))
        unprepare.append(timed(destroy))
    return prepare, unprepare


def bench_agent(calls: int, root: Path) -> tuple[list[float], list[float], list[float],
                                                  list[float]]:
    api = InMemoryKubeApi()
    backend = SimulatedBackend("H100-80GB:2", node_name=NODE, mig_enabled=True)
    config = AgentConfig(
        node=NODE, checkpoint_dir=root / "ckpt", cdi_dir=root / "cdi",
        plugins_dir=root / "p", registry_dir=root / "r", metrics_bind="",
        reconcile_interval_s=3600,
    )
    agent = NodeAgent(config, backend=backend, api=api, republish=lambda view: None)
    state = agent.state
    prepare: list[float] = []
    unprepare: list[float] = []
    for i in range(calls):
        device = DEVICES[i % len(DEVICES)]
        uid = f"uid-{i}"
        results = [AllocatedDevice("gpu", device, NODE)]
        prepare.append(timed(state.prepare, uid, "ml", f"c{i}", results))
        unprepare.append(timed(state.unprepare, uid))

    # Through gRPC, as the kubelet calls it (claims created in the in-memory API first).
    claims = []
    for i in range(calls):
        created = api.create({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"g{i}", "namespace": "ml"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu-slicer.io", "pool": NODE,
                "device": DEVICES[i % len(DEVICES)]}]}}},
        })
        claims.append(dra_v1_pb2.Claim(namespace="ml", name=f"g{i}",
                                       uid=created["metadata"]["uid"]))
    agent.claims.sync_once()
    agent.plugin.start()
    grpc_prepare: list[float] = []
    grpc_unprepare: list[float] = []
    with grpc.insecure_channel(f"unix://{agent.plugin.dra_path}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for claim in claims:
            grpc_prepare.append(timed(lambda claim=claim: stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim]))))
            grpc_unprepare.append(timed(lambda claim=claim: stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]))))
    agent.plugin.stop()
    agent.driver.close()
    return prepare, unprepare, grpc_prepare, grpc_unprepare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=None,
                        help="directory for checkpoint and CDI files (default: a temp dir)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gsb-", dir=args.dir or "/tmp"))
    try:
        base_prep, base_unprep = bench_baseline(args.calls)
        prep, unprep, g_prep, g_unprep = bench_agent(args.calls, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"prepare + unprepare of one 1g slice, {args.calls} calls each, files under {root}")
    print("baseline: the bare backend calls")
    _, bp_med, bp_p99 = row("backend calls for a prepare", base_prep)
    _, bu_med, bu_p99 = row("backend calls for an unprepare", base_unprep)
    print("agent (DeviceState, in process)")
    _, p_med, p_p99 = row("prepare", prep)
    _, u_med, u_p99 = row("unprepare", unprep)
    print("agent through gRPC over a unix socket (what the kubelet sees)")
    _, gp_med, gp_p99 = row("NodePrepareResources", g_prep)
    _, gu_med, gu_p99 = row("NodeUnprepareResources", g_unprep)
    print("agent overhead over the baseline (p99, ms) and ratio of medians")
    for name, (a_p99, b_p99, a_med, b_med) in {
        "prepare": (p_p99, bp_p99, p_med, bp_med),
        "unprepare": (u_p99, bu_p99, u_med, bu_med),
        "NodePrepareResources": (gp_p99, bp_p99, gp_med, bp_med),
        "NodeUnprepareResources": (gu_p99, bu_p99, gu_med, bu_med),
    }.items():
        ratio = a_med / b_med if b_med else float("inf")
        print(f"  {name:<34} +{a_p99 - b_p99:8.3f} ms p99   x{ratio:7.1f} median"
              f"   (goal: p99 <= 20 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
