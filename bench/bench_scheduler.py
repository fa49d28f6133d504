"""gpu-slicer's claims on the real kube-scheduler at cluster size, against a plain-device baseline.

For each Kubernetes release and node count, one control plane (built like the sandbox's) with
hollow nodes (:mod:`sandbox.hollow`: Node objects and ResourceSlices, nothing behind them), and
in that one run, one after the other on the same nodes:

1. ``plain``: pods whose claim asks for one device of another driver that publishes as many
   devices per node as gpu-slicer does, without counters (the baseline);
2. gpu-slicer's slices are added to every node (what ``gpu-slicer slices --gpus SPEC`` prints);
3. ``plain-gs``: the same plain pods again, now beside gpu-slicer's slices: what gpu-slicer
   costs everyone else;
4. gpu-slicer's claim shapes, as the webhook writes them for the default policy:
   ``single`` (``nvidia.com/mig-1g.10gb: 1``), ``fallback`` (profiles annotation
   ``1g.10gb,2g.20gb,3g.40gb``), ``memory`` (``gpu-slicer.io/gpu-memory: 20Gi``), ``whole``
   (``nvidia.com/gpu: 1``), ``nvlink`` (``nvidia.com/gpu: 2``, NVLink first);
5. with ``--static``: the same nodes in the static layout (the agent's ``--publish static``
   mode: the layout's instances only, no counters), ``plain-static`` and the shapes again;
6. with ``--profiles LIST``: the partitionable layout again with only those profiles (the
   agent's ``--profiles``), ``plain-profiles`` and the shapes again (``single-profiles``...);
7. with ``--minimal-attributes``: the partitionable layout again with the agent's
   ``--attributes minimal``, ``plain-minimal`` and the shapes again (``single-minimal``...);
   with ``--profiles`` too, also the two settings together (``single-profiles-minimal``...),
   with ``--static`` too, the static layout with minimal attributes (``single-static-minimal``...).

A warm-up run of plain pods comes first, unrecorded. Each run creates its pods held by a
scheduling gate, each with its own ResourceClaim, releases them together and times until every
pod is bound (or ``--timeout`` passed: pods/s is then what was bound in that time); scheduler
CPU per pod is read from /proc. Runs are cleared before the next (pods deleted, claims
deallocated by the controller manager). Ratios within one run are the figures to trust on a
shared machine; absolute rates move with the host.

    python bench/bench_scheduler.py [--versions 1.36,1.37] [--nodes 20,100,250] [--pods 100]
        [--gpus A100-80GB:8] [--timeout 60] [--static] [--profiles LIST] [--minimal-attributes]
        [--workloads plain,single,...] [--json FILE]

On 1.35 the DRAPartitionableDevices gate (alpha, off by default) is turned on for the run.
Builds each release's binaries into the cache on first use (``sandbox.binaries``); loopback
only; every control plane is stopped on exit, errors, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.hollow import (  # noqa: E402
    PLAIN_DRIVER,
    HollowCluster,
    RunResult,
    device_count,
    gpu_slicer_slices,
    plain_claim_spec,
    plain_device_class,
    plain_slices,
)
from sim import scheduler_cost  # noqa: E402
from sim.agreement import claim_spec_for  # noqa: E402
from slicer.deviceclasses import device_classes  # noqa: E402
from slicer.identity import DRIVER  # noqa: E402
from slicer.layout import StaticLayout  # noqa: E402
from slicer.profile_filter import ProfileFilter  # noqa: E402
from webhook.policy import Policy  # noqa: E402

Obj = dict[str, Any]

SHAPES: dict[str, tuple[Mapping[str, int], Mapping[str, str]]] = {
    "single": ({"nvidia.com/mig-1g.10gb": 1}, {}),
    "fallback": ({}, {"gpu-slicer.io/profiles": "1g.10gb,2g.20gb,3g.40gb"}),
    "memory": ({}, {"gpu-slicer.io/gpu-memory": "20Gi"}),
    "whole": ({"nvidia.com/gpu": 1}, {}),
    "nvlink": ({"nvidia.com/gpu": 2}, {}),
}
"""Each gpu-slicer workload: the container's legacy resources and the pod's annotations."""
STATIC_LAYOUT = StaticLayout.from_mapping(
    {
        # An A100-80GB node as a morning's mig-parted config might leave it: half the GPUs in
        # 1g slices, a quarter in 2g, a quarter in 3g (the shapes the workloads ask for).
        "default": ["1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "1g.10gb@4"]
        + ["1g.10gb@5", "1g.10gb@6"],
        "gpus": {
            "4": ["2g.20gb@0", "2g.20gb@2", "2g.20gb@4"],
            "5": ["2g.20gb@0", "2g.20gb@2", "2g.20gb@4"],
            "6": ["3g.40gb@0", "3g.40gb@4"],
            "7": ["3g.40gb@0", "3g.40gb@4"],
        },
    }
)
"""What ``--static`` publishes on every node (for 8-GPU A100/H100-80GB nodes)."""


def pods_for(workload: str, pods: int, nodes: int) -> int:
    """Fewer pods where each takes whole GPUs, so that every run fits the free devices."""
    if workload.startswith("memory-static"):
        return min(pods, 2 * nodes)  # STATIC_LAYOUT holds four 3g.40gb per node
    shape = workload.partition("-")[0]
    if shape == "whole":
        return min(pods, 2 * nodes)
    if shape == "nvlink":
        return min(pods, nodes)
    return pods


def models_policy(args: argparse.Namespace) -> Policy:
    """The default policy with ``gpuModels`` naming the models the nodes have (``--gpus``):
    what an admin writes so that chains name no other model's profiles."""
    models = tuple(dict.fromkeys(part.split(":")[0] for part in args.gpus.split(",")))
    return dataclasses.replace(Policy.default(), gpu_models=models)


def without_quantity(spec: Obj) -> Obj:
    """A diagnostic, not a claim the webhook writes: the same claim with its selectors'
    memory comparison dropped, to show what that comparison costs the allocator."""
    result: Obj = json.loads(json.dumps(spec))
    cut = ' && "memory" in device.capacity'
    for request in result["devices"]["requests"]:
        for alternative in request.get("firstAvailable") or [request.get("exactly") or {}]:
            for selector in alternative.get("selectors") or ():
                if cut not in selector["cel"]["expression"]:
                    raise ValueError("the memory claim no longer compares quantities here")
                selector["cel"]["expression"] = selector["cel"]["expression"].split(cut)[0]
    return result


def variants(args: argparse.Namespace) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    """The publishing variants measured after the default pool: (suffix, shapes, the options
    of :func:`sandbox.hollow.gpu_slicer_slices` that stand for the agent's settings)."""
    static: dict[str, Any] = {"static_layout": STATIC_LAYOUT}
    fitting_static = ("single", "fallback", "memory")  # whole GPUs: not in STATIC_LAYOUT
    minimal: dict[str, Any] = {"attributes": "minimal"}
    kept = ProfileFilter.parse(args.profiles) if args.profiles else None
    profiles: dict[str, Any] = {"profiles": kept}
    found: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
    if args.static:
        found.append(("static", fitting_static, static))
        if args.minimal_attributes:
            found.append(("static-minimal", fitting_static, static | minimal))
    if args.minimal_attributes:
        found.append(("minimal", tuple(SHAPES), minimal))
    if kept is not None:
        found.append(("profiles", tuple(SHAPES), profiles))
        if args.minimal_attributes:
            found.append(("profiles-minimal", tuple(SHAPES), profiles | minimal))
    return found


def measure(args: argparse.Namespace, version: str, nodes: int) -> list[RunResult]:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-sched-{version}-{nodes}-"))
    # Before 1.36 partitionable devices are alpha and off: turned on, as the install guide says
    # an admin may, so that the release's scheduler is measured with counters.
    gate = True if int(version.split(".")[1]) < 36 else None
    cluster = HollowCluster(folder, k8s_version=version, partitionable=gate, progress=_say)
    results: list[RunResult] = []
    try:
        cluster.start()
        server = cluster.api_version
        cluster.create_all([plain_device_class(args.plain_driver), *device_classes()])
        names = [f"node-{i:04d}" for i in range(nodes)]
        cluster.add_nodes(names)
        ours = {n: gpu_slicer_slices(n, args.gpus, server) for n in names}
        per_node = device_count(ours[names[0]])
        cluster.create_all([s for n in names for s in plain_slices(n, per_node, args.plain_driver)])
        _say(f"{nodes} nodes, {per_node} devices per node and driver; Kubernetes {cluster.release}")
        time.sleep(2)

        plain = plain_claim_spec(args.plain_driver)

        def run(workload: str, spec: Obj, label: str | None = None) -> None:
            if args.workloads and (label or workload) not in args.workloads:
                return
            name = label or workload
            result = cluster.run(
                name,
                spec,
                pods=pods_for(name, args.pods, nodes),
                timeout_s=args.timeout,
            )
            results.append(result)
            _say(
                f"  {name:<14} {result.bound:>4}/{result.released} bound in {result.seconds:6.1f}"
                f" s: {result.pods_per_s:7.2f} pods/s, {result.cpu_ms_per_pod:8.1f} ms CPU/pod"
            )
            cluster.clear(f"bench-{name}")

        # Unrecorded: a release's first pods take longer (caches filling, the heap growing),
        # which would flatter every ratio to the plain baseline measured next.
        cluster.run("warmup", plain, pods=args.pods, timeout_s=args.timeout)
        cluster.clear("bench-warmup")
        run("plain", plain)
        cluster.create_all([s for n in names for s in ours[n]])
        time.sleep(2)
        run("plain", plain, "plain-gs")
        for shape, (resources, annotations) in SHAPES.items():
            run(shape, claim_spec_for([resources], annotations=annotations))
        for shape in ("fallback", "memory"):
            resources, annotations = SHAPES[shape]
            spec = claim_spec_for([resources], annotations=annotations, policy=models_policy(args))
            run(shape, spec, f"{shape}-models")
        resources, annotations = SHAPES["memory"]
        run(
            "memory",
            without_quantity(claim_spec_for([resources], annotations=annotations)),
            "memory-noquantity",
        )

        def variant(suffix: str, shapes: tuple[str, ...] = tuple(SHAPES), **options: Any) -> None:
            """gpu-slicer's slices again as the agent publishes them with ``options`` (its
            static layout, ``--profiles``, ``--attributes``), then the plain pods and ``shapes``."""
            labels = {f"{shape}-{suffix}" for shape in ("plain", *shapes)}
            if args.workloads and not labels & args.workloads:
                return
            cluster.delete_slices(DRIVER)
            pool = {n: gpu_slicer_slices(n, args.gpus, server, **options) for n in names}
            cluster.create_all([s for n in names for s in pool[n]])
            _say(f"  {suffix}: {device_count(pool[names[0]])} devices per node")
            time.sleep(2)
            run("plain", plain, f"plain-{suffix}")
            for shape in shapes:
                resources, annotations = SHAPES[shape]
                spec = claim_spec_for([resources], annotations=annotations)
                run(shape, spec, f"{shape}-{suffix}")

        for suffix, shapes, options in variants(args):
            variant(suffix, shapes, **options)
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return results


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the run's ``finally`` stops its control plane (else it outlives us)."""
    raise KeyboardInterrupt


def _say(text: str) -> None:
    print(text, flush=True)


def table(rows: list[tuple[str, int, list[RunResult]]]) -> str:
    """One line per (release, nodes, workload): pods/s, CPU per pod, ratio to ``plain``."""
    out = [
        f"{'release':<9} {'nodes':>5}  {'workload':<16} {'pods/s':>8} {'CPU ms/pod':>11}"
        f" {'x plain':>8} {'x single':>9}"
    ]
    for release, nodes, results in rows:
        rate = {r.workload: r.pods_per_s for r in results}
        for r in results:
            base = rate.get("plain")
            shape, dash, variant = r.workload.partition("-")
            single = rate.get(f"single{dash}{variant}") or rate.get("single")
            vs_plain = f"{r.pods_per_s / base:.2f}" if base else "-"
            vs_single = (
                f"{r.pods_per_s / single:.2f}" if single and shape in ("memory", "fallback") else ""
            )
            partial = "" if r.bound == r.released else f" ({r.bound}/{r.released})"
            out.append(
                f"{release:<9} {nodes:>5}  {r.workload + partial:<16} {r.pods_per_s:>8.2f}"
                f" {r.cpu_ms_per_pod:>11.1f} {vs_plain:>8} {vs_single:>9}"
            )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--versions", default="1.36,1.37", help="Kubernetes minors (1.35-1.37, and 1.38: its beta)"
    )
    parser.add_argument("--nodes", default="20,100,250", help="node counts, comma-separated")
    parser.add_argument("--pods", type=int, default=100, help="pods per run (default 100)")
    parser.add_argument("--gpus", default="A100-80GB:8", help="GPUs per node (default A100-80GB:8)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per run at most")
    parser.add_argument("--static", action="store_true", help="also measure the static layout")
    parser.add_argument(
        "--profiles",
        default="",
        metavar="LIST",
        help="also measure the partitionable layout with only these profiles "
        "(the agent's --profiles, e.g. 1g.10gb,2g.20gb,3g.40gb,7g.80gb)",
    )
    parser.add_argument(
        "--minimal-attributes",
        action="store_true",
        help="also measure the partitionable layout with the agent's --attributes minimal",
    )
    parser.add_argument("--workloads", default="", help="only these runs (comma-separated)")
    parser.add_argument(
        "--plain-driver",
        default=PLAIN_DRIVER,
        help=f"the other driver's name (default {PLAIN_DRIVER}, which sorts after "
        "gpu-slicer.io; devices.example.com sorts before it)",
    )
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument(
        "--cost-model",
        type=Path,
        help="also write the simulator's cost model (sim/scheduler-cost.yaml's format)",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        help="measure nothing: turn an earlier --json file into --cost-model",
    )
    parser.add_argument(
        "--template-pods",
        type=int,
        default=0,
        help="instead: N pods whose claims come from a template, with the controller "
        "manager's client rate at Kubernetes' default (20/s) and at 100/s",
    )
    args = parser.parse_args()
    if args.template_pods:
        return template_rates(args)
    if args.from_json:
        if not args.cost_model:
            parser.error("--from-json needs --cost-model")
        write_cost_model(args.cost_model, json.loads(args.from_json.read_text()))
        return 0
    args.workloads = {w for w in args.workloads.split(",") if w}
    rows: list[tuple[str, int, list[RunResult]]] = []
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        for version in args.versions.split(","):
            for nodes in (int(n) for n in args.nodes.split(",")):
                results = measure(args, version, nodes)
                rows.append((version, nodes, results))
                print(table(rows[-1:]), flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    print()
    print(table(rows))
    document = [
        {"version": v, "nodes": n, "gpus": args.gpus, "runs": [asdict(r) for r in rs]}
        for v, n, rs in rows
    ]
    if args.json:
        args.json.write_text(json.dumps(document, indent=2))
    if args.cost_model:
        write_cost_model(args.cost_model, document)
    return 0


def template_rates(args: argparse.Namespace) -> int:
    """How fast converted pods get their claims (from templates) and schedule, with the
    controller manager's client rate at the default and at the recommended setting."""
    version = args.versions.split(",")[-1]
    nodes = int(args.nodes.split(",")[0])
    spec = claim_spec_for([SHAPES["single"][0]], annotations=SHAPES["single"][1])
    print(f"{args.template_pods} pods from one template, {nodes} nodes, Kubernetes {version}")
    for qps in (None, 100.0):
        folder = Path(tempfile.mkdtemp(prefix="bench-templates-"))
        cluster = HollowCluster(
            folder, k8s_version=version, controller_manager_qps=qps, progress=_say
        )
        try:
            cluster.start()
            cluster.create_all(device_classes())
            names = [f"node-{i:04d}" for i in range(nodes)]
            cluster.add_nodes(names)
            cluster.create_all(
                [s for n in names for s in gpu_slicer_slices(n, args.gpus, cluster.api_version)]
            )
            time.sleep(2)
            claimed, done, bound = cluster.template_run(
                spec, pods=args.template_pods, timeout_s=args.timeout * 5
            )
        finally:
            cluster.stop()
            shutil.rmtree(folder, ignore_errors=True)
        label = "default (20)" if qps is None else f"{qps:g}"
        print(
            f"  controller-manager QPS {label:<13} claims for every pod after {claimed:6.1f} s"
            f" ({args.template_pods / claimed:6.1f} claims/s); {bound} pods bound after"
            f" {done:6.1f} s ({bound / done:6.1f} pods/s)",
            flush=True,
        )
    return 0


def write_cost_model(path: Path, document: list[Obj]) -> None:
    """The simulator's cost model from the runs (only runs whose every pod was bound: a run
    cut by ``--timeout`` still gives CPU per bound pod, which is what the model keeps)."""
    gpus = {d["gpus"] for d in document}
    runs = [
        (d["version"], d["nodes"], r["workload"], 1000 * r["scheduler_cpu_s"] / r["bound"])
        for d in document
        for r in d["runs"]
        if r["bound"]
    ]
    measured = (
        f"bench/bench_scheduler.py, nodes of {', '.join(sorted(gpus))}, "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs shared with other work"
    )
    scheduler_cost.write(path, measured, runs)


if __name__ == "__main__":
    raise SystemExit(main())
