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

The baseline is interleaved with the measured rows: every agent call is followed by the bare
backend calls of the same operation (and, in process, by the reference agent's call), so load
on a shared machine hits all of them alike. The calls are cut into ``--rounds`` rounds; each row
prints its median and p99 as min / median / max over the rounds, and the p99 of all its calls.

The issue's goal is a p99 of at most 20 ms per call for the agent's own overhead.

    python bench/bench_prepare.py [--calls 1000] [--rounds 5] [--resident 42] [--tmpfs DIR]
                                  [--disk DIR]
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

from gpu_slicer.core.identity import DRIVER  # noqa: E402
from gpu_slicer.kube.memory import InMemoryKubeApi  # noqa: E402
from gpu_slicer.slicer.agent import (
    AgentConfig,  # noqa: E402
    NodeAgent,  # noqa: E402
)
from gpu_slicer.slicer.checkpoint import Checkpoint, CheckpointStore  # noqa: E402
from gpu_slicer.slicer.claim_cache import AllocatedDevice  # noqa: E402
from gpu_slicer.slicer.proto import dra_v1_pb2, dra_v1_pb2_grpc  # noqa: E402
from gpu_slicer.slicer.simulated import SimulatedBackend  # noqa: E402

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


ROUNDS = [5]
"""How many rounds the calls are cut into (``--rounds``)."""


def rounds_of(samples: list[float]) -> list[list[float]]:
    count = max(1, min(ROUNDS[0], len(samples)))
    size = len(samples) // count
    return [samples[i * size : (i + 1) * size] for i in range(count)]


def spread(values: list[float]) -> str:
    return f"{min(values):7.3f} / {statistics.median(values):7.3f} / {max(values):7.3f}"


def row(name: str, samples: list[float]) -> tuple[float, float]:
    """Prints min / median / max over the rounds of each round's median and p99; returns the
    median and p99 of all the samples."""
    median, p99 = stats(samples)
    per_round = [stats(r) for r in rounds_of(samples)]
    print(
        f"  {name:<40} median {spread([m for m, _ in per_round])} ms   p99 "
        f"{spread([p for _, p in per_round])} ms   all: p99 {p99:7.3f} ms (n={len(samples)})"
    )
    return median, p99


def timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


class Bare:
    """The baseline: exactly the backend calls one prepare and one unprepare make."""

    def __init__(self) -> None:
        self.backend = SimulatedBackend(GPUS, node_name=NODE, mig_enabled=True)
        self.prepare: list[float] = []
        self.unprepare: list[float] = []

    def cycle(self, i: int) -> None:
        """One prepare's and one unprepare's backend calls, timed into the sample lists."""
        backend = self.backend
        gpu, start = divmod(i % len(DEVICES), 7)
        holder: dict[str, int] = {}

        def create() -> None:
            gi = backend.create_gpu_instance(gpu, "1g.10gb", start)
            inst = backend.create_compute_instance(gpu, gi)
            backend.capability_minors(gpu, gi, inst.ci_id or 0)
            holder["gi"] = gi

        def destroy() -> None:
            backend.processes(gpu, holder["gi"])
            backend.destroy_compute_instance(gpu, holder["gi"], 0)
            backend.destroy_gpu_instance(gpu, holder["gi"])

        self.prepare.append(timed(create))
        self.unprepare.append(timed(destroy))


class Run:
    """One agent with its files under ``files`` and its sockets under a short temp dir."""

    def __init__(self, files: Path, resident: int, *, every_write_durable: bool = False) -> None:
        self.sockets = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp"))
        self.api = InMemoryKubeApi()
        self.backend = SimulatedBackend(GPUS, node_name=NODE, mig_enabled=True)
        config = AgentConfig(
            node=NODE,
            checkpoint_dir=files / "ckpt",
            cdi_dir=files / "cdi",
            plugins_dir=self.sockets / "p",
            registry_dir=self.sockets / "r",
            metrics_bind="",
            reconcile_interval_s=3600,
        )
        self.agent = NodeAgent(
            config, backend=self.backend, api=self.api, republish=lambda view: None
        )
        if every_write_durable:
            self.agent.state.store = EveryWriteDurable(files / "ckpt")
        for i, device in enumerate(RESIDENT[:resident]):
            self.agent.state.prepare(
                f"resident-{i}", "ml", f"r{i}", [AllocatedDevice("gpu", device, NODE)]
            )
        self.checkpoint_bytes = self.agent.state.store.path.stat().st_size
        self.ref_prepare: list[float] = []
        self.ref_fsyncs = 0

    def in_process(
        self, calls: int, bare: Bare, reference: Run | None = None
    ) -> tuple[list[float], list[float], float, float]:
        """Prepare and unprepare ``calls`` times, each followed by the baseline's calls and,
        when given, by the reference agent's prepare and unprepare of the same device."""
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
            bare.cycle(i)
            if reference is not None:
                reference.reference_cycle(i, results)
        return prepare, unprepare, fsyncs_prepare / calls, fsyncs_unprepare / calls

    def reference_cycle(self, i: int, results: list[AllocatedDevice]) -> None:
        before = _fsyncs[0]
        self.ref_prepare.append(timed(self.agent.state.prepare, f"uid-{i}", "ml", f"c{i}", results))
        self.ref_fsyncs += _fsyncs[0] - before
        self.agent.state.unprepare(f"uid-{i}")

    def grpc(self, calls: int, bare: Bare) -> tuple[list[float], list[float]]:
        """Through gRPC, as the kubelet calls it (claims created in the in-memory API first)."""
        claims = []
        for i in range(calls):
            created = self.api.create(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"g{i}", "namespace": "ml"},
                    "spec": {"devices": {"requests": []}},
                    "status": {
                        "allocation": {
                            "devices": {
                                "results": [
                                    {
                                        "request": "gpu",
                                        "driver": DRIVER,
                                        "pool": NODE,
                                        "device": DEVICES[i % len(DEVICES)],
                                    }
                                ]
                            }
                        }
                    },
                }
            )
            claims.append(
                dra_v1_pb2.Claim(namespace="ml", name=f"g{i}", uid=created["metadata"]["uid"])
            )
        self.agent.claims.sync_once()
        self.agent.plugin.start()
        prepare: list[float] = []
        unprepare: list[float] = []
        try:
            with grpc.insecure_channel(f"unix://{self.agent.plugin.dra_path}") as channel:
                stub = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
                for i, claim in enumerate(claims):
                    prepare.append(
                        timed(
                            lambda claim=claim: stub.NodePrepareResources(
                                dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim])
                            )
                        )
                    )
                    unprepare.append(
                        timed(
                            lambda claim=claim: stub.NodeUnprepareResources(
                                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim])
                            )
                        )
                    )
                    bare.cycle(i)
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


def bench_location(label: str, where: Path, calls: int, resident: int) -> list[str]:
    """Runs and prints one location; returns the goal lines for the summary."""
    root = Path(tempfile.mkdtemp(prefix="gsb-files-", dir=where))
    summary: list[str] = []
    try:
        print(f"\n{label}: files under {root}")
        run = Run(root / "agent", resident)
        ref = Run(root / "reference", resident, every_write_durable=True)
        bare, bare_grpc = Bare(), Bare()
        try:
            prep, unprep, f_prep, f_unprep = run.in_process(calls, bare, ref)
            g_prep, g_unprep = run.grpc(calls, bare_grpc)
        finally:
            run.close()
            ref.close()
        print(
            f"  checkpoint file with {resident} resident claims: {run.checkpoint_bytes} bytes; "
            f"fsyncs per prepare {f_prep:g}, per unprepare {f_unprep:g}"
        )
        print(f"  {'':<40} median min / median / max    p99 min / median / max")
        print(" baseline: the bare backend calls (interleaved with the in-process rows)")
        bp_med, bp_p99 = row("backend calls for a prepare", bare.prepare)
        bu_med, bu_p99 = row("backend calls for an unprepare", bare.unprepare)
        print(" agent (DeviceState, in process)")
        p_med, p_p99 = row("prepare", prep)
        u_med, u_p99 = row("unprepare", unprep)
        rf_prep = ref.ref_fsyncs / calls
        print(
            f" reference: every checkpoint write fsynced ({rf_prep:g} fsyncs per prepare; "
            "interleaved with the agent's calls)"
        )
        r_med, r_p99 = row("prepare", ref.ref_prepare)
        print(" baseline again (interleaved with the gRPC rows)")
        gbp_med, gbp_p99 = row("backend calls for a prepare", bare_grpc.prepare)
        gbu_med, gbu_p99 = row("backend calls for an unprepare", bare_grpc.unprepare)
        print(" agent through gRPC over a unix socket (what the kubelet sees)")
        gp_med, gp_p99 = row("NodePrepareResources", g_prep)
        gu_med, gu_p99 = row("NodeUnprepareResources", g_unprep)
        print(
            " overhead over the interleaved bare backend calls (p99 of all calls) and ratio of "
            "medians"
        )
        for name, (a_med, a_p99, b_med, b_p99) in {
            "prepare": (p_med, p_p99, bp_med, bp_p99),
            "unprepare": (u_med, u_p99, bu_med, bu_p99),
            "NodePrepareResources": (gp_med, gp_p99, gbp_med, gbp_p99),
            "NodeUnprepareResources": (gu_med, gu_p99, gbu_med, gbu_p99),
            "prepare, every write fsynced (reference)": (r_med, r_p99, bp_med, bp_p99),
        }.items():
            ratio = a_med / b_med if b_med else float("inf")
            line = f"{label}, {name}: {verdict(a_p99, b_p99)}"
            print(f"  {name:<44} x{ratio:8.1f} median   {verdict(a_p99, b_p99)}")
            summary.append(line)
        if r_med:
            print(
                f"  prepare median vs the reference: x{p_med / r_med:.2f}, p99 x{p_p99 / r_p99:.2f}"
            )
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
                if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) and len(
                    mount
                ) >= len(best[0]):
                    best = (mount, fstype)
            return best[1] == "tmpfs"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds the calls are cut into, for min / median / max (default 5)",
    )
    parser.add_argument(
        "--resident",
        type=int,
        default=42,
        help=f"claims kept prepared meanwhile (0-{len(RESIDENT)})",
    )
    parser.add_argument(
        "--tmpfs",
        type=Path,
        default=Path("/dev/shm"),
        help="a tmpfs directory (default /dev/shm; skipped when absent)",
    )
    parser.add_argument(
        "--disk",
        type=Path,
        default=Path.cwd(),
        help="a directory on disk (default: the working directory)",
    )
    args = parser.parse_args(argv)
    resident = max(0, min(args.resident, len(RESIDENT)))
    ROUNDS[0] = max(1, args.rounds)
    print(
        f"prepare + unprepare of one 1g slice, {args.calls} calls each in {ROUNDS[0]} rounds, "
        f"{GPUS} simulated, {resident} other claims prepared; the baseline and reference are "
        "interleaved with the agent's calls"
    )
    summary: list[str] = []
    if args.tmpfs.is_dir() and _is_tmpfs(args.tmpfs):
        summary += bench_location("tmpfs", args.tmpfs, args.calls, resident)
    else:
        print(f"\n(no tmpfs at {args.tmpfs}; skipped)")
    disk_label = "tmpfs (given as --disk)" if _is_tmpfs(args.disk) else "disk"
    summary += bench_location(disk_label, args.disk.resolve(), args.calls, resident)
    print("\nsummary: the goal is a p99 of at most 20 ms for the agent's own overhead")
    for line in summary:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
