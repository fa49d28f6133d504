"""How long building the ResourceSlices of an 8 x H200 node takes, and how big they are.

Prints figures only (no pass/fail on time). Baselines run in the same process: building with the
``name`` policy (no placement-cost work) and serialising the result with ``json.dumps`` (what
any write to the apiserver costs anyway), so the ratios stay meaningful on any machine.

    python bench/bench_slices.py [--runs 50] [--gpus H200-141GB:8]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slicer.devices import SliceSpec  # noqa: E402
from slicer.inventory import GpuState, plan_pool  # noqa: E402
from slicer.simulated import SimulatedBackend  # noqa: E402


def median_seconds(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--gpus", default="H200-141GB:8")
    args = parser.parse_args()

    states = [GpuState(info) for info in SimulatedBackend(args.gpus, node_name="bench").gpus()]
    allocated = [SliceSpec(1, "3g.71gb", 0), SliceSpec(5, "1g.18gb", 6)]
    print(f"node: {args.gpus}, {args.runs} runs per figure (median)")
    print(f"{'k8s':<5} {'policy':<19} {'build ms':>9} {'vs name':>8} {'json ms':>8} "
          f"{'slices':>6} {'devices':>7} {'bytes':>8} {'max slice':>9}")
    for version in ((1, 34), (1, 35), (1, 36)):
        def build(policy: str, version: tuple[int, int] = version) -> list[dict[str, Any]]:
            return plan_pool("bench", states, server_version=version, policy=policy,
                             allocated=allocated).slices

        base = median_seconds(lambda: build("name"), args.runs)
        for policy in ("name", "anti-fragmentation", "best-fit"):
            slices = build(policy)
            took = median_seconds(functools.partial(build, policy), args.runs)
            dumped = median_seconds(functools.partial(json.dumps, slices), args.runs)
            sizes = [len(json.dumps(s, separators=(",", ":"))) for s in slices]
            devices = sum(len(s["spec"].get("devices", [])) for s in slices)
            print(f"1.{version[1]:<3} {policy:<19} {took * 1e3:>9.2f} {took / base:>7.2f}x "
                  f"{dumped * 1e3:>8.2f} {len(slices):>6} {devices:>7} {sum(sizes):>8} "
                  f"{max(sizes):>9}")
    print("bytes: compact JSON of all slices; max slice: the largest one (the apiserver's "
          "request limit is about 3 MiB, etcd's 1.5 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
