"""How long ``translate_pod`` takes per pod, in-process, against a JSON round trip of the same pod.

``bench_webhook.py`` measures whole requests over TLS; this isolates the pure translation that
every request not served from the engine's memo pays. The baseline is
``json.loads(json.dumps(pod))`` of the same pod in the same process: roughly what decoding the pod
out of a review costs, so the ratio stays meaningful on any machine. Prints figures only (no
pass/fail on time).

Kinds (a Deployment's pod, as in ``bench_webhook.py``, with a sidecar and many other fields):

  mig-1g.10gb       ``nvidia.com/mig-1g.10gb: 1``
  gpu x2            ``nvidia.com/gpu: 2`` (NVLink-first chain)
  gpu-memory 12Gi   annotation ``gpu-slicer.io/gpu-memory: 12Gi`` (a chain of 8 profiles)
  profiles chain    annotation ``gpu-slicer.io/profiles: 1g.10gb,2g.20gb,gpu``
  right-sized       ``nvidia.com/gpu: 1`` in a namespace with a ``gpu`` list
  nothing to do     CPU and memory only

Each kind runs three ways: the same pod object every call; ("fresh") a different pod object each
call (a unique annotation), as the webhook sees pods that its memo does not answer, whose claim
translation derives once per GPU shape and remembers; and ("new") a pod whose GPU shape is new
each call too (its first container's name differs), so the claim is derived every time (with
more calls than the 1,024 shapes remembered, every pass misses).

``--without NAMES`` runs with those of the translation's stores (``webhook.remembered``: ``derived
claims``, ``patches``, ``gpu chains``... or ``all``) calling their function every time instead:
what each store is worth, measured, not argued.

    python bench/bench_translate.py [--calls 5000] [--rounds 5] [--profile KIND]
                                    [--without "derived claims,patches"]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_webhook import deployment_pod  # noqa: E402
from gpu_slicer.webhook.policy import Policy, load_policy  # noqa: E402
from gpu_slicer.webhook.remembered import Remembered  # noqa: E402
from gpu_slicer.webhook.translate import translate_pod  # noqa: E402

Pod = dict[str, Any]


def _with_annotation(pod: Pod, key: str, value: str) -> Pod:
    out = copy.deepcopy(pod)
    out["metadata"]["annotations"][key] = value
    return out


def _renamed(pod: Pod, name: str) -> Pod:
    out = copy.deepcopy(pod)
    out["spec"]["containers"][0]["name"] = name
    return out


def kinds() -> dict[str, tuple[Pod, str]]:
    """Kind -> (pod, namespace)."""
    cpu = {"cpu": "4", "memory": "32Gi"}
    return {
        "mig-1g.10gb": (deployment_pod({"limits": {**cpu, "nvidia.com/mig-1g.10gb": "1"}}), "ml"),
        "gpu x2": (deployment_pod({"limits": {**cpu, "nvidia.com/gpu": "2"}}), "ml"),
        "gpu-memory 12Gi": (
            _with_annotation(deployment_pod({"limits": cpu}), "gpu-slicer.io/gpu-memory", "12Gi"),
            "ml",
        ),
        "profiles chain": (
            _with_annotation(
                deployment_pod({"limits": cpu}), "gpu-slicer.io/profiles", "1g.10gb,2g.20gb,gpu"
            ),
            "ml",
        ),
        "right-sized": (deployment_pod({"limits": {**cpu, "nvidia.com/gpu": "1"}}), "embeddings"),
        "nothing to do": (deployment_pod({"limits": cpu}), "ml"),
    }


POLICY = """
namespaces:
  embeddings:
    gpu: [1g.10gb, 2g.20gb, 3g.40gb]
"""


def remembered_without(names: str) -> tuple[Remembered, list[str]]:
    """The translation's stores, those named (or ``all``) turned off; the names."""
    found = [store.name for store in Remembered().stores()]
    wanted = list(found) if names == "all" else [n.strip() for n in names.split(",") if n]
    unknown = [n for n in wanted if n not in found]
    if unknown:
        raise SystemExit(f"--without: no store {', '.join(unknown)}; one of {', '.join(found)}")
    sizes = {"derived claims": "derived_claims", "patches": "patches"}
    return Remembered(**{sizes[n]: 0 for n in wanted}), wanted


def best_per_call(fn: Callable[[Pod], object], pods: list[Pod], rounds: int) -> float:
    """Seconds per call, the best of ``rounds`` passes over ``pods`` (least disturbed by other
    load on a shared machine)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for pod in pods:
            fn(pod)
        best = min(best, (time.perf_counter() - start) / len(pods))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000, help="calls per pass")
    parser.add_argument("--rounds", type=int, default=5, help="passes; the best one counts")
    parser.add_argument("--profile", metavar="KIND", help="cProfile translate_pod on this kind")
    parser.add_argument(
        "--without", default="", metavar="NAMES", help="stores not used (comma-separated, or all)"
    )
    args = parser.parse_args()

    policy: Policy = load_policy(POLICY)
    remembered, off = remembered_without(args.without)
    print(
        f"translate_pod, {args.calls} calls per pass, best of {args.rounds} passes; "
        "baseline: json.loads(json.dumps(pod)) of the same pods"
        + (f"; without the stores {', '.join(off)}" if off else "")
    )
    print(f"{'kind':<18} {'pods':<6} {'translate us':>12} {'json us':>8} {'ratio':>6}")
    for label, (pod, namespace) in kinds().items():

        def translate(p: Pod, namespace: str = namespace) -> object:
            return translate_pod(p, namespace=namespace, policy=policy, remembered=remembered)

        def round_trip(p: Pod) -> object:
            return json.loads(json.dumps(p))

        same = [pod] * args.calls
        fresh = [_with_annotation(pod, "build-id", str(i)) for i in range(args.calls)]
        new = [_renamed(p, f"main-{i}") for i, p in enumerate(fresh)]
        for variant, pods in (("same", same), ("fresh", fresh), ("new", new)):
            took = best_per_call(translate, pods, args.rounds)
            base = best_per_call(round_trip, pods, args.rounds)
            print(
                f"{label:<18} {variant:<6} {took * 1e6:>12.1f} {base * 1e6:>8.1f} "
                f"{took / base:>6.2f}"
            )

    if args.profile:
        pod, namespace = kinds()[args.profile]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls):
            translate_pod(pod, namespace=namespace, policy=policy, remembered=remembered)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
