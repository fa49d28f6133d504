"""The node agent's own cost per prepare and unprepare, with GPU work taking no time.

Prints figures only (no pass/fail on time). The simulated backend answers at once, so what is
measured is the agent: planning, the per-GPU and checkpoint locks, the checkpoint writes, the CDI
spec write and removal, and for the ``grpc`` rows the kubelet's round trip over a unix socket.
The baseline, run in the same process, makes exactly the backend calls one prepare and unprepare
need (create GI, create CI, capability minors, processes, destroy CI, destroy GI) with nothing
around them.

Each run is made twice: with the checkpoint and CDI files on a tmpfs (what fsync costs nothing
on) and on the disk of the working directory (what a node's /var/lib looks like), so the cost of
durability shows apart from the agent's own work. A prepare makes one durable checkpoint write
(PrepareStarted: temp file, fsync, rename, directory fsync) and one atomic but not fsynced write
(PrepareCompleted, see docs/agent.md); an unprepare one durable write. The reference rows fsync
every write, as the agent did before, so the saving is measured in the same process. Other
claims stay prepared meanwhile (``--resident``, default 42: six full H100s of 1g slices), so the
checkpoint has a realistic size.

The issue's goal is a p99 of at most 20 ms per call for the agent's own overhead.

    python bench/bench_prepare.py [--calls 1000] [--resident 42] [--tmpfs DIR] [--disk DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from kube.memory import InMemoryKubeApi  # noqa: E402
from slicer.agent import AgentConfig, NodeAgent  # noqa: E402
from slicer.checkpoint import Checkpoint, CheckpointStore  # noqa: E402
from slicer.claims import AllocatedDevice  # noqa: E402
from slicer.proto import dra_v1_pb2, dra_v1_pb2_grpc  # noqa: E402
from slicer.simulated import SimulatedBackend  # noqa: E402

NODE = "bench-node"
GPUS = "H100-80GB:8"
GOAL_MS = 20.0
# Seven 1g slices spread over the placements of two GPUs, so instances come and go at
# different places (and GI ids) rather than one spot. GPUs 2-7 hold the resident claims.
DEVICES = [f"gpu-{g}-mig-1g10gb-{s}" for g in (0, 1) for s in range(7)]
RESIDENT = [f"gpu-{g}-mig-1g10gb-{s}" for g in range(2, 8) for s in range(7)]

_fsyncs = [0]
_real_fsync = os.fsync


def _counting_fsync(fd: Any) -> None:
    _fsyncs[0] += 1
    _real_fsync(fd)


os.fsync = _counting_fsync  # counts the checkpoint's fsyncs per call


class EveryWriteDurable(CheckpointStore):
    """The reference: every checkpoint write fsynced (file and directory), as before."""

    def save(self, checkpoint: Checkpoint, *, durable: bool = True) -> None:
        super().save(checkpoint, durable=True)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def stats(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples) * 1000, percentile(samples, 0.99) * 1000


def row(name: str, samples: list[float]) -> tuple[float, float]:
    median, p99 = stats(samples)
    print(f"  {name:<44} median {median:8.3f} ms   p99 {p99:8.3f} ms   (n={len(samples)})")
    return median, p99


def timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def bench_baseline(calls: int) -> tuple[list[float], list[float]]:
    backend = SimulatedBackend(GPUS, node_name=NODE, mig_enabled=True)
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


class Run:
    """One agent with its files under ``files`` and its sockets under a short temp dir."""

    def __init__(self, files: Path, resident: int, *, every_write_durable: bool = False) -> None:
        self.sockets = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp"))
        self.api = InMemoryKubeApi()
        self.backend = SimulatedBackend(GPUS, node_name=NODE, mig_enabled=True)
        config = AgentConfig(
            node=NODE, checkpoint_dir=files / "ckpt", cdi_dir=files / "cdi",
            plugins_dir=self.sockets / "p", registry_dir=self.sockets / "r", metrics_bind="",
            reconcile_interval_s=3600,
        )
        self.agent = NodeAgent(config, backend=self.backend, api=self.api,
                               republish=lambda view: None)
        if every_write_durable:
            self.agent.state.store = EveryWriteDurable(files / "ckpt")
        for i, device in enumerate(RESIDENT[:resident]):
            self.agent.state.prepare(f"resident-{i}", "ml", f"r{i}",
                                     [AllocatedDevice("gpu", device, NODE)])
        self.checkpoint_bytes = self.agent.state.store.path.stat().st_size

    def in_process(self, calls: int) -> tuple[list[float], list[float], float, float]:
        state = self.agent.state
        prepare: list[float] = []
        unprepare: list[float] = []
        fsyncs_prepare = fsyncs_unprepare = 0
        for i in range(calls):
            results = [AllocatedDevice("gpu", DEVICES[i % len(DEVICES)], NODE)]
            before = _fsyncs[0]
            prepare.append(timed(state.prepare, f"uid-{i}", "ml", f"c{i}", results))
            middle = _fsyncs[0]
            unprepare.append(timed(state.unprepare, f"uid-{i}"))
            fsyncs_prepare += middle - before
            fsyncs_unprepare += _fsyncs[0] - middle
        return prepare, unprepare, fsyncs_prepare / calls, fsyncs_unprepare / calls

    def grpc(self, calls: int) -> tuple[list[float], list[float]]:
        """Through gRPC, as the kubelet calls it (claims created in the in-memory API first)."""
        claims = []
        for i in range(calls):
            created = self.api.create({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": f"g{i}", "namespace": "ml"},
                "spec": {"devices": {"requests": []}},
                "status": {"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": "gpu-slicer.io", "pool": NODE,
                    "device": DEVICES[i % len(DEVICES)]}]}}},
            })
            claims.append(dra_v1_pb2.Claim(namespace="ml", name=f"g{i}",
                                           uid=created["metadata"]["uid"]))
        self.agent.claims.sync_once()
        self.agent.plugin.start()
        prepare: list[float] = []
        unprepare: list[float] = []
        try:
            with grpc.insecure_channel(f"unix://{self.agent.plugin.dra_path}") as channel:
                stub = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
                for claim in claims:
                    prepare.append(timed(lambda claim=claim: stub.NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim]))))
                    unprepare.append(timed(lambda claim=claim: stub.NodeUnprepareResources(
                        dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]))))
        finally:
            self.agent.plugin.stop()
            self.agent.driver.close()
        return prepare, unprepare

    def close(self) -> None:
        shutil.rmtree(self.sockets, ignore_errors=True)


def verdict(p99: float, base_p99: float) -> str:
    overhead = p99 - base_p99
    met = "met" if overhead <= GOAL_MS else "NOT met"
    return f"+{overhead:7.3f} ms over the baseline p99: goal (<= {GOAL_MS:g} ms) {met}"


def bench_location(label: str, where: Path, calls: int, resident: int,
                   base: tuple[float, float, float, float]) -> list[str]:
    """Runs and prints one location; returns the goal lines for the summary."""
    bp_med, bp_p99, bu_med, bu_p99 = base
    root = Path(tempfile.mkdtemp(prefix="gsb-files-", dir=where))
    summary: list[str] = []
    try:
        print(f"\n{label}: files under {root}")
        run = Run(root / "agent", resident)
        try:
            prep, unprep, f_prep, f_unprep = run.in_process(calls)
            g_prep, g_unprep = run.grpc(calls)
        finally:
            run.close()
        print(f"  checkpoint file with {resident} resident claims: {run.checkpoint_bytes} bytes; "
              f"fsyncs per prepare {f_prep:g}, per unprepare {f_unprep:g}")
        print(" agent (DeviceState, in process)")
        p_med, p_p99 = row("prepare", prep)
        u_med, u_p99 = row("unprepare", unprep)
        print(" agent through gRPC over a unix socket (what the kubelet sees)")
        gp_med, gp_p99 = row("NodePrepareResources", g_prep)
        gu_med, gu_p99 = row("NodeUnprepareResources", g_unprep)
        ref = Run(root / "reference", resident, every_write_durable=True)
        try:
            r_prep, r_unprep, rf_prep, _ = ref.in_process(calls)
        finally:
            ref.close()
        print(f" reference: every checkpoint write fsynced ({rf_prep:g} fsyncs per prepare)")
        r_med, r_p99 = row("prepare", r_prep)
        print(" overhead over the bare backend calls (p99) and ratio of medians")
        for name, (a_med, a_p99, b_med, b_p99) in {
            "prepare": (p_med, p_p99, bp_med, bp_p99),
            "unprepare": (u_med, u_p99, bu_med, bu_p99),
            "NodePrepareResources": (gp_med, gp_p99, bp_med, bp_p99),
            "NodeUnprepareResources": (gu_med, gu_p99, bu_med, bu_p99),
            "prepare, every write fsynced (reference)": (r_med, r_p99, bp_med, bp_p99),
        }.items():
            ratio = a_med / b_med if b_med else float("inf")
            line = f"{label}, {name}: {verdict(a_p99, b_p99)}"
            print(f"  {name:<44} x{ratio:8.1f} median   {verdict(a_p99, b_p99)}")
            summary.append(line)
        if r_med:
            print(f"  prepare median vs the reference: x{p_med / r_med:.2f}, "
                  f"p99 x{p_p99 / r_p99:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return summary


def _is_tmpfs(path: Path) -> bool:
    try:
        with open("/proc/mounts") as mounts:
            best = ("", "")
            resolved = str(path.resolve())
            for line in mounts:
                _, mount, fstype, *_ = line.split()
                if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) \
                        and len(mount) >= len(best[0]):
                    best = (mount, fstype)
            return best[1] == "tmpfs"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--resident", type=int, default=42,
                        help=f"claims kept prepared meanwhile (0-{len(RESIDENT)})")
    parser.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"),
                        help="a tmpfs directory (default /dev/shm; skipped when absent)")
    parser.add_argument("--disk", type=Path, default=Path.cwd(),
                        help="a directory on disk (default: the working directory)")
    args = parser.parse_args(argv)
    resident = max(0, min(args.resident, len(RESIDENT)))
    base_prep, base_unprep = bench_baseline(args.calls)
    print(f"prepare + unprepare of one 1g slice, {args.calls} calls each, {GPUS} simulated, "
          f"{resident} other claims prepared")
    print("baseline: the bare backend calls")
    bp_med, bp_p99 = row("backend calls for a prepare", base_prep)
    bu_med, bu_p99 = row("backend calls for an unprepare", base_unprep)
    base = (bp_med, bp_p99, bu_med, bu_p99)
    summary: list[str] = []
    if args.tmpfs.is_dir() and _is_tmpfs(args.tmpfs):
        summary += bench_location("tmpfs", args.tmpfs, args.calls, resident, base)
    else:
        print(f"\n(no tmpfs at {args.tmpfs}; skipped)")
    disk_label = "tmpfs (given as --disk)" if _is_tmpfs(args.disk) else "disk"
    summary += bench_location(disk_label, args.disk.resolve(), args.calls, resident, base)
    print("\nsummary: the goal is a p99 of at most 20 ms for the agent's own overhead")
    for line in summary:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
