"""How long building the ResourceSlices of an 8 x H200 node takes, and how big they are.

Prints figures only (no pass/fail on time). Baselines run in the same process, interleaved with
the measured rows: every round times each variant once, in turn (the ``name`` policy's build, no
placement-cost work; each policy's build; a ``json.dumps`` of the result, what any write to the
apiserver costs anyway), so a burst of load on a shared machine hits baseline and measurement
alike. Ratios are taken within a round; each figure is printed as min / median / max over the
rounds.

    python bench/bench_slices.py [--rounds 50] [--gpus H200-141GB:8]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_slicer.core.devices import SliceSpec  # noqa: E402
from gpu_slicer.slicer.inventory import GpuState, plan_pool  # noqa: E402
from gpu_slicer.slicer.simulated import SimulatedBackend  # noqa: E402

DEVICE_ORDERS = ("name", "anti-fragmentation", "best-fit")


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spread(values: Sequence[float], scale: float = 1.0, unit: str = "") -> str:
    """min / median / max of ``values``."""
    return (
        f"{min(values) * scale:.2f} / {statistics.median(values) * scale:.2f} / "
        f"{max(values) * scale:.2f}{unit}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        "--runs",
        type=int,
        default=50,
        help="rounds; each times every variant once (default 50)",
    )
    parser.add_argument("--gpus", default="H200-141GB:8")
    args = parser.parse_args()

    states = [GpuState(info) for info in SimulatedBackend(args.gpus, node_name="bench").gpus()]
    allocated = [SliceSpec(1, "3g.71gb", 0), SliceSpec(5, "1g.18gb", 6)]
    print(
        f"node: {args.gpus}, {args.rounds} rounds; each round times the baseline (name), every "
        "policy and json.dumps once, in turn; figures are min / median / max over the rounds"
    )
    print(
        f"{'k8s':<5} {'policy':<19} {'build ms':>21} {'vs name (same round)':>22} "
        f"{'json ms':>19} {'slices':>6} {'devices':>7} {'bytes':>8} {'max slice':>9}"
    )
    for version in ((1, 34), (1, 35), (1, 36)):

        def build(policy: str, version: tuple[int, int] = version) -> list[dict[str, Any]]:
            return plan_pool(
                "bench", states, server_version=version, device_order=policy, allocated=allocated
            ).slices

        built = {policy: build(policy) for policy in DEVICE_ORDERS}  # warm caches, sizes
        builds: dict[str, list[float]] = {policy: [] for policy in DEVICE_ORDERS}
        ratios: dict[str, list[float]] = {policy: [] for policy in DEVICE_ORDERS}
        dumps: dict[str, list[float]] = {policy: [] for policy in DEVICE_ORDERS}
        for _ in range(args.rounds):
            base = seconds(lambda: build("name"))
            for policy in DEVICE_ORDERS:
                took = seconds(functools.partial(build, policy))
                builds[policy].append(took)
                ratios[policy].append(took / base)
                dumps[policy].append(seconds(functools.partial(json.dumps, built[policy])))
        for policy in DEVICE_ORDERS:
            slices = built[policy]
            sizes = [len(json.dumps(s, separators=(",", ":"))) for s in slices]
            devices = sum(len(s["spec"].get("devices", [])) for s in slices)
            print(
                f"1.{version[1]:<3} {policy:<19} {spread(builds[policy], 1e3):>21} "
                f"{spread(ratios[policy], unit='x'):>22} {spread(dumps[policy], 1e3):>19} "
                f"{len(slices):>6} {devices:>7} {sum(sizes):>8} {max(sizes):>9}"
            )
    print(
        "vs name: the policy's build over the name policy's build of the same round (the name "
        "row is two builds of the same thing: its spread is the noise); bytes: compact JSON "
        "of all slices; max slice: the largest one (the apiserver's request limit is about "
        "3 MiB, etcd's 1.5 MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
