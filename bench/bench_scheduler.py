"""gpu-slicer's claims on the real kube-scheduler at cluster size, against its baselines.

For each Kubernetes release and node count, one control plane (built like the sandbox's) with
hollow nodes (:mod:`sandbox.hollow`: Node objects and ResourceSlices, nothing behind them), and
in that one run, one after the other on the same nodes. Every node has a NIC driver beside its
GPUs (:mod:`sandbox.neighbours`: 8 RDMA virtual functions per node, as real GPU nodes have),
whose pods are the measure of what a GPU driver's pools cost everyone else. One GPU driver's
pools at a time:

1. ``nic``: the NIC's pods alone (the baseline for ``nic-*``);
2. ``plain``: a plain-device driver with as many devices per node as gpu-slicer publishes, no
   counters: the baseline for gpu-slicer's own pods;
3. NVIDIA's DynamicMIG layout for the same GPUs (the peer): ``nic-nvidia``, and the webhook's
   NVIDIA target (claims for ``mig.nvidia.com``) in ``single-nvidia`` and ``memory-nvidia``;
4. gpu-slicer advertising every profile (under its driver name, ``z.gpu-slicer.io``, which sorts
   after every other): ``nic-gs`` and its claim shapes as the webhook writes
   them for the default policy: ``single`` (``nvidia.com/mig-1g.10gb: 1``), ``fallback``
   (profiles annotation ``1g.10gb,2g.20gb,3g.40gb``), ``memory`` (``gpu-slicer.io/gpu-memory:
   20Gi``), ``whole`` (``nvidia.com/gpu: 1``), ``nvlink`` (``nvidia.com/gpu: 2``, NVLink first),
   and the chains with ``--models`` (``fallback-models``, ``memory-models``);
5. gpu-slicer advertising what is asked (``--demand``, the agent's default
   ``--advertised-profiles asked``): ``nic-asked``, ``single-asked``, ``fallback-asked``,
   ``memory-asked``: what ships;
6. the same pools under 0.1's driver name, ``gpu-slicer.io``, which sorts before the NIC's and
   most drivers': ``nic-first`` and the shapes (``single-first``...): what the rename saves
   other drivers' pods and costs gpu-slicer's (cost models before 2026-12-04 called the
   ``-asked`` runs of this release ``-last``, and these ``-asked``);
7. with ``--static``, ``--profiles LIST`` and ``--minimal-attributes`` (alone and together): the
   agent's other publishing settings, ``nic-static``, ``single-static``... and so on;
8. with ``--busy PROFILE``: what is asked, as published while a claim holds one ``PROFILE``
   slice on every GPU (the devices it leaves no counters for are left out): ``nic-busy``,
   ``single-busy``... A busy cluster's nodes cost other pods that much.
9. with ``--one-placement``, a what-if that no agent setting publishes: what is asked, but only
   the first placement of each profile on each GPU (a quarter of the devices for three
   profiles on an A100; an agent would then republish between two pods of one profile on one
   GPU): ``nic-one``, ``single-one``... and with ``--minimal-attributes`` also ``-one-minimal``;
   and ``nic-counters``, the pool's counter sets without a device. They measure what listing
   fewer devices would still save, and what the pool costs other drivers' pods without any
   (docs/performance.md).

With ``--new-shape ROUNDS`` it measures instead how long a pod of a shape no node advertises yet
waits, from its creation to its binding, with hollow agents publishing what is asked
(:mod:`sandbox.hollow_agents`).

A warm-up run of NIC pods comes first, unrecorded. Each run creates its pods held by a
scheduling gate, each with its own ResourceClaim, releases them together and times until every
pod is bound (or ``--timeout`` passed: pods/s is then what was bound in that time); scheduler
CPU per pod is read from /proc. Runs are cleared before the next (pods deleted, claims
deallocated by the controller manager). Ratios within one run are the figures to trust on a
shared machine; absolute rates move with the host.

    python bench/bench_scheduler.py [--versions 1.36,1.37] [--nodes 20,100,250] [--pods 100]
        [--gpus A100-80GB:8] [--timeout 60] [--demand 1g.10gb,3g.40gb] [--static]
        [--profiles LIST] [--minimal-attributes] [--busy 3g.40gb] [--one-placement]
        [--workloads nic,single,...]
        [--json FILE]
    python bench/bench_scheduler.py --new-shape 3 [--versions 1.37] [--nodes 100]

On 1.35 the DRAPartitionableDevices gate (alpha, off by default) is turned on for the run.
Builds each release's binaries into the cache on first use (``sandbox.binaries``); loopback
only; every control plane is stopped on exit, errors, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import SliceSpec, parse_device_name  # noqa: E402
from gpu_slicer.core.identity import DRIVER, LEGACY_DRIVERS, RESOURCE_API  # noqa: E402
from gpu_slicer.sandbox.hollow import (  # noqa: E402
    PLAIN_DRIVER,
    HollowCluster,
    RunResult,
    as_driver,
    device_count,
    gpu_slicer_slices,
    plain_claim_spec,
    plain_device_class,
    plain_slices,
    process_cpu_s,
)
from gpu_slicer.sandbox.hollow_agents import HollowAgents  # noqa: E402
from gpu_slicer.sandbox.neighbours import (  # noqa: E402
    NVIDIA_DRIVER,
    dynamic_mig_slices,
    nic_claim_spec,
    nic_device_class,
    nic_slices,
    nvidia_device_classes,
)
from gpu_slicer.sim import scheduler_cost  # noqa: E402
from gpu_slicer.sim.agreement import claim_spec_for  # noqa: E402
from gpu_slicer.slicer.demand import asked_for  # noqa: E402
from gpu_slicer.slicer.deviceclasses import device_classes  # noqa: E402
from gpu_slicer.slicer.layout import StaticLayout  # noqa: E402
from gpu_slicer.slicer.profile_filter import ProfileChoice, ProfileFilter  # noqa: E402
from gpu_slicer.slicer.simulated import SimulatedBackend  # noqa: E402
from gpu_slicer.webhook.policy import Policy  # noqa: E402

Obj = dict[str, Any]

SHAPES: dict[str, tuple[Mapping[str, int], Mapping[str, str]]] = {
    "single": ({"nvidia.com/mig-1g.10gb": 1}, {}),
    "fallback": ({}, {"gpu-slicer.io/profiles": "1g.10gb,2g.20gb,3g.40gb"}),
    "memory": ({}, {"gpu-slicer.io/gpu-memory": "20Gi"}),
    "whole": ({"nvidia.com/gpu": 1}, {}),
    "nvlink": ({"nvidia.com/gpu": 2}, {}),
}
"""Each gpu-slicer workload: the container's legacy resources and the pod's annotations."""
ASKED_SHAPES = ("single", "fallback", "memory")
"""The shapes whose profiles the cluster's demand (``--demand``) holds."""
FIRST_DRIVER = LEGACY_DRIVERS[0]
"""0.1's driver name: it sorted before almost every other driver's."""
"""gpu-slicer's pools under a driver name that sorts after every other driver's."""
NVIDIA_POLICY = dataclasses.replace(Policy.default(), target="nvidia")
"""The webhook's NVIDIA target: claims for ``mig.nvidia.com``, selecting ``gpu.nvidia.com``."""
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
    if args.busy:
        busy = {"profiles": "asked", "allocated": args.busy}
        found.append(("busy", tuple(ASKED_SHAPES), busy))
    if args.one_placement:
        one = {"profiles": "asked", "what_if": "one"}
        found.append(("one", tuple(ASKED_SHAPES), one))
        if args.minimal_attributes:
            found.append(("one-minimal", tuple(ASKED_SHAPES), one | minimal))
        # The pool's counter sets and no device: what other drivers' pods pay for the pool alone.
        found.append(("counters", (), {"profiles": "asked", "what_if": "counters"}))
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
        classes = [
            plain_device_class(args.plain_driver),
            nic_device_class(),
            *nvidia_device_classes(),
            *device_classes(),
        ]
        cluster.create_all(classes)
        names = [f"node-{i:04d}" for i in range(nodes)]
        cluster.add_nodes(names)
        # Every node has its RDMA NICs, whatever GPU driver runs beside them.
        cluster.create_all([s for n in names for s in nic_slices(n)])
        ours = {n: gpu_slicer_slices(n, args.gpus, server) for n in names}
        per_node = device_count(ours[names[0]])
        _say(f"{nodes} nodes, {per_node} gpu-slicer devices per node; Kubernetes {cluster.release}")
        time.sleep(2)

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
                f"  {name:<18} {result.bound:>4}/{result.released} bound in {result.seconds:6.1f}"
                f" s: {result.pods_per_s:7.2f} pods/s, {result.cpu_ms_per_pod:8.1f} ms CPU/pod"
            )
            cluster.clear(f"bench-{name}")

        @contextlib.contextmanager
        def pools(label: str, slices: dict[str, list[Obj]], driver: str) -> Iterator[None]:
            """A GPU driver's pools on every node for the runs inside the block."""
            cluster.create_all([s for n in names for s in slices[n]])
            _say(f"  {label}: {device_count(slices[names[0]])} devices per node")
            time.sleep(2)
            try:
                yield
            finally:
                cluster.delete_slices(driver)

        nic = nic_claim_spec()
        # Unrecorded: a release's first pods take longer (caches filling, the heap growing),
        # which would flatter every ratio to the baselines measured next.
        cluster.run("warmup", nic, pods=args.pods, timeout_s=args.timeout)
        cluster.clear("bench-warmup")
        run("nic", nic)
        plain = plain_claim_spec(args.plain_driver)
        plain_pool = {n: plain_slices(n, per_node, args.plain_driver) for n in names}
        with pools("plain driver", plain_pool, args.plain_driver):
            run("plain", plain)
        nvidia = {n: dynamic_mig_slices(n, args.gpus, server) for n in names}
        with pools("NVIDIA DynamicMIG", nvidia, NVIDIA_DRIVER):
            run("nic", nic, "nic-nvidia")
            for shape in ("single", "memory"):
                resources, annotations = SHAPES[shape]
                spec = claim_spec_for([resources], annotations=annotations, policy=NVIDIA_POLICY)
                run(shape, spec, f"{shape}-nvidia")
        with pools("gpu-slicer, every profile", ours, DRIVER):
            run("nic", nic, "nic-gs")
            for shape, (resources, annotations) in SHAPES.items():
                run(shape, claim_spec_for([resources], annotations=annotations))
            for shape in ("fallback", "memory"):
                resources, annotations = SHAPES[shape]
                spec = claim_spec_for(
                    [resources], annotations=annotations, policy=models_policy(args)
                )
                run(shape, spec, f"{shape}-models")
        asked = {
            n: gpu_slicer_slices(n, args.gpus, server, profiles=demand(args, n)) for n in names
        }
        for suffix, driver, pool in (
            ("asked", DRIVER, asked),
            ("first", FIRST_DRIVER, {n: as_driver(asked[n], FIRST_DRIVER) for n in names}),
        ):
            with pools(f"gpu-slicer, asked for {args.demand} ({driver})", pool, driver):
                run("nic", nic, f"nic-{suffix}")
                for shape in ASKED_SHAPES:
                    resources, annotations = SHAPES[shape]
                    spec = claim_spec_for([resources], annotations=annotations)
                    run(shape, spec, f"{shape}-{suffix}")

        for suffix, shapes, options in variants(args):
            labels = {f"{shape}-{suffix}" for shape in ("nic", *shapes)}
            if args.workloads and not labels & args.workloads:
                continue
            pool = {n: variant_slices(args, n, server, options) for n in names}
            with pools(suffix, pool, DRIVER):
                run("nic", nic, f"nic-{suffix}")
                for shape in shapes:
                    resources, annotations = SHAPES[shape]
                    spec = claim_spec_for([resources], annotations=annotations)
                    run(shape, spec, f"{shape}-{suffix}")
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return results


def variant_slices(
    args: argparse.Namespace, node: str, server: tuple[int, int], options: dict[str, Any]
) -> list[Obj]:
    """What ``node`` publishes under a variant's options."""
    settings = node_options(args, node, options)
    what_if = settings.pop("what_if", None)
    slices = gpu_slicer_slices(node, args.gpus, server, **settings)
    if what_if == "one":
        return listing_only(slices, _first_of_each_profile())
    if what_if == "counters":
        return listing_only(slices, lambda _device: False)
    return slices


def _first_of_each_profile() -> Callable[[Obj], bool]:
    """Of each profile on each GPU, the placement listed first (the agent's device order);
    whole GPUs always."""
    seen: set[tuple[int, str]] = set()

    def keep(device: Obj) -> bool:
        found = parse_device_name(device["name"])
        if not isinstance(found, SliceSpec):
            return True
        if (found.gpu_index, found.profile) in seen:
            return False
        seen.add((found.gpu_index, found.profile))
        return True

    return keep


def listing_only(slices: list[Obj], keep: Callable[[Obj], bool]) -> list[Obj]:
    """A what-if no agent setting publishes: the pool with only the devices ``keep`` keeps,
    its counter sets as they were; slices left without devices or counters go, and the pool
    counts those that stay."""
    kept_slices: list[Obj] = []
    for original in slices:
        spec = original["spec"]
        devices = [d for d in spec.get("devices") or () if keep(d)]
        if not devices and not spec.get("sharedCounters"):
            continue
        kept = copy.deepcopy(original)
        if devices:
            kept["spec"]["devices"] = devices
        else:
            kept["spec"].pop("devices", None)
        kept_slices.append(kept)
    for kept in kept_slices:
        kept["spec"]["pool"]["resourceSliceCount"] = len(kept_slices)
    return kept_slices


def node_options(args: argparse.Namespace, node: str, options: dict[str, Any]) -> dict[str, Any]:
    """A variant's options for ``node``: ``profiles: "asked"`` is what ``--demand`` asks for
    there, ``allocated: PROFILE`` one ``PROFILE`` slice held on each GPU (its first placement)."""
    out = dict(options)
    if out.get("profiles") == "asked":
        out["profiles"] = demand(args, node)
    profile = out.pop("allocated", None)
    if profile is not None:
        gpus = SimulatedBackend(args.gpus, node_name=node).gpus()
        out["allocated"] = [
            SliceSpec(g.index, profile, catalog.get_model(g.model).profile(profile).starts[0])
            for g in gpus
        ]
    return out


def demand(args: argparse.Namespace, node: str) -> ProfileChoice:
    """What a node advertises when the cluster's claims ask for ``--demand``'s profiles."""
    return asked_for(args.demand, SimulatedBackend(args.gpus, node_name=node).gpus())


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the run's ``finally`` stops its control plane (else it outlives us)."""
    raise KeyboardInterrupt


def _say(text: str) -> None:
    print(text, flush=True)


def table(rows: list[tuple[str, int, list[RunResult]]]) -> str:
    """One line per (release, nodes, workload): pods/s, CPU per pod, the ratio to its baseline
    (``nic`` for the NIC's pods, ``plain`` for GPU pods), to ``single`` for the chains, and for
    the NIC's pods the scheduler CPU each loses to the GPU driver's pools beside it."""
    out = [
        f"{'release':<9} {'nodes':>5}  {'workload':<20} {'pods/s':>8} {'CPU ms/pod':>11}"
        f" {'x base':>7} {'x single':>9} {'+ms/pod':>8}"
    ]
    for release, nodes, results in rows:
        rate = {r.workload: r.pods_per_s for r in results}
        cpu = {r.workload: r.cpu_ms_per_pod for r in results}
        for r in results:
            shape, dash, variant = r.workload.partition("-")
            base = rate.get("nic" if shape == "nic" else "plain")
            single = rate.get(f"single{dash}{variant}") or rate.get("single")
            vs_base = f"{r.pods_per_s / base:.2f}" if base else "-"
            vs_single = (
                f"{r.pods_per_s / single:.2f}" if single and shape in ("memory", "fallback") else ""
            )
            lost = (
                f"{r.cpu_ms_per_pod - cpu['nic']:.1f}"
                if shape == "nic" and variant and "nic" in cpu
                else ""
            )
            partial = "" if r.bound == r.released else f" ({r.bound}/{r.released})"
            out.append(
                f"{release:<9} {nodes:>5}  {r.workload + partial:<20} {r.pods_per_s:>8.2f}"
                f" {r.cpu_ms_per_pod:>11.1f} {vs_base:>7} {vs_single:>9} {lost:>8}"
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
    parser.add_argument(
        "--demand",
        default="1g.10gb,2g.20gb,3g.40gb",
        metavar="LIST",
        help="the profiles the cluster's claims ask for in the 'asked' and 'first' runs "
        "(default 1g.10gb,2g.20gb,3g.40gb)",
    )
    parser.add_argument(
        "--busy",
        default="",
        metavar="PROFILE",
        help="also measure what is asked as published while each GPU holds a PROFILE slice",
    )
    parser.add_argument(
        "--one-placement",
        action="store_true",
        help="also measure a what-if: what is asked, only the first placement of each profile "
        "on each GPU",
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
        help="also write the simulator's cost model (sim/scheduler-cost.yaml's format); the "
        "file's points these runs do not measure again are kept",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        help="measure nothing: turn an earlier --json file into --cost-model",
    )
    parser.add_argument(
        "--new-shape",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: with agents advertising what is asked, how long a pod of a shape no "
        "node advertises yet waits to be bound (ROUNDS rounds of seven profiles)",
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
    if args.new_shape:
        return new_shape_waits(args)
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


NEW_SHAPES = ("1g.10gb", "2g.20gb", "3g.40gb", "1g.20gb", "4g.40gb", "7g.80gb", "1g.10gb+me")
"""The profiles asked for one after the other, each new to every node (A100/H100 80GB)."""


def new_shape_waits(args: argparse.Namespace) -> int:
    """How long a pod of a shape no node advertises yet waits for its node, with the agents
    advertising what is asked (``--advertised-profiles asked``): from the pod's creation (its
    template made a moment before, as the webhook does) to its binding, per profile, for
    ``--new-shape`` rounds; every round starts with nothing asked."""
    for version in args.versions.split(","):
        for nodes in (int(n) for n in args.nodes.split(",")):
            waits = _new_shape_round_trips(args, version, nodes)
            waits.sort()
            p95 = waits[max(0, math.ceil(0.95 * len(waits)) - 1)]
            print(
                f"Kubernetes {version}, {nodes} nodes: {len(waits)} pods of new shapes, waits"
                f" median {statistics.median(waits):.2f} s, p95 {p95:.2f} s, max {waits[-1]:.2f} s",
                flush=True,
            )
    return 0


def _new_shape_round_trips(args: argparse.Namespace, version: str, nodes: int) -> list[float]:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-newshape-{version}-{nodes}-"))
    cluster = HollowCluster(folder, k8s_version=version, progress=_say)
    waits: list[float] = []
    try:
        cluster.start()
        api = cluster.api
        assert api is not None
        cluster.create_all([nic_device_class(), *device_classes()])
        names = [f"node-{i:04d}" for i in range(nodes)]
        cluster.add_nodes(names)
        cluster.create_all([s for n in names for s in nic_slices(n)])
        for round_ in range(args.new_shape):
            agents = HollowAgents(api, names, args.gpus, cluster.api_version)
            agents.start()
            namespace = f"new-shapes-{round_}"
            cluster.namespace(namespace)
            try:
                for profile in NEW_SHAPES:
                    spec = claim_spec_for([{f"nvidia.com/mig-{profile}": 1}])
                    cpu_before = _cpu_by_part(cluster)
                    created, wait = cluster.templated_pod_wait(
                        namespace, spec, timeout_s=args.timeout
                    )
                    waits.append(wait)
                    # which part is the agents' (publishing) and which the scheduler's retry
                    done = sorted(t - created for t in agents.published.values())
                    first = f"{done[0]:6.2f}" if done else "     -"
                    before = sum(1 for t in done if t <= wait)
                    everyone = agents.wait_published(timeout_s=args.timeout)
                    spent = _cpu_by_part(cluster)
                    cpu = ", ".join(f"{k} {spent[k] - cpu_before[k]:.1f}" for k in spent)
                    last = f"{everyone - created:.2f} s" if everyone is not None else "never"
                    _say(
                        f"  round {round_} {profile:<11} bound {wait:6.2f} s after creation;"
                        f" first node published at {first} s, {before} before the binding,"
                        f" all {nodes} by {last}; CPU s until then: {cpu}"
                    )
            finally:
                agents.stop()
                cluster.clear(namespace)
                kind = "ResourceClaimTemplate"
                for template in api.list(RESOURCE_API, kind, namespace).items:
                    api.delete(RESOURCE_API, kind, template["metadata"]["name"], namespace)
                cluster.delete_slices(DRIVER)
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return waits


def _cpu_by_part(cluster: HollowCluster) -> dict[str, float]:
    """CPU seconds so far of each control-plane process and of this one ("agents": the hollow
    agents, and the benchmark's own polling, a GET every 50 ms until the pod is bound): which
    part of a new shape's republishing is gpu-slicer's and which the cluster's."""
    assert cluster.plane is not None
    spent = {
        c.name.removeprefix("kube-"): process_cpu_s(c.pid)
        for c in cluster.plane.components
        if c.pid is not None
    }
    return spent | {"agents": time.process_time()}


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
    scheduler_cost.write(path, measured, runs, merge=True)


if __name__ == "__main__":
    raise SystemExit(main())
