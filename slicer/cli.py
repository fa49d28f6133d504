"""Subcommands of the node agent: ``catalog`` (and, as they land, ``slices`` and ``agent``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from slicer import catalog
from slicer.deviceclasses import device_classes
from slicer.devices import SliceSpec
from slicer.errors import BackendError, CatalogError, SlicerError
from slicer.inventory import MODES, GpuState, InventoryError, default_mode, plan_pool
from slicer.layout import StaticLayout
from slicer.ordering import POLICIES
from slicer.simulated import SimulatedBackend


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("catalog", help="print the MIG catalog of every supported model")
    p.add_argument("--gpu", metavar="MODEL", help="only this model (e.g. H100-80GB)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_catalog)
    register_slices(subparsers)
    __import__("slicer.agent", fromlist=["register_agent"]).register_agent(subparsers)


def catalog_json(models: list[catalog.GpuModel]) -> list[dict[str, Any]]:
    return [
        {
            "model": m.key,
            "aliases": list(m.aliases),
            "productNames": list(m.product_names),
            "pciDeviceIds": [f"{i:#06x}" for i in m.pci_device_ids],
            "architecture": m.architecture,
            "memoryBytes": m.memory_bytes,
            "memorySlices": m.memory_slices,
            "computeSlices": m.compute_slices,
            "multiprocessors": m.multiprocessors,
            "confirmed": m.confirmed,
            "profiles": [
                {
                    "name": p.name,
                    "nvmlConstant": p.nvml_constant,
                    "typicalId": p.typical_id,
                    "memoryBytes": p.memory_bytes,
                    "memorySlices": p.memory_slices,
                    "computeSlices": p.compute_slices,
                    "multiprocessors": p.multiprocessors,
                    "engines": vars(p.engines),
                    "maxCount": p.max_count,
                    "placementStarts": list(p.starts),
                    "placementSize": p.memory_slices,
                    "confirmed": p.confirmed,
                }
                for p in m.profiles
            ],
        }
        for m in models
    ]


def run_catalog(args: argparse.Namespace) -> int:
    try:
        models = [catalog.get_model(args.gpu)] if args.gpu is not None else list(catalog.MODELS)
    except CatalogError as exc:
        print(f"gpu-slicer catalog: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(catalog_json(models), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for m in models:
        note = "" if m.confirmed else "  (values not confirmed on hardware)"
        print(
            f"{m.key}: {m.architecture}, {m.memory_bytes / catalog.GIB:.1f} GiB, "
            f"{m.memory_slices} memory slices, {m.compute_slices} compute slices{note}"
        )
        print(
            f"  {'profile':<12} {'memory':>9} {'mem sl':>6} {'comp sl':>7} {'SMs':>4} "
            f"{'max':>3}  starts"
        )
        for p in m.profiles:
            mark = "" if p.confirmed else " *"
            print(
                f"  {p.name:<12} {p.memory_bytes / catalog.GIB:>6.2f}GiB {p.memory_slices:>6} "
                f"{p.compute_slices:>7} {p.multiprocessors:>4} {p.max_count:>3}  "
                f"{','.join(map(str, p.starts))}{mark}"
            )
        print()
    print("* not confirmed on real hardware")
    return 0


# --- slices ---------------------------------------------------------------------------------

K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
YAML_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter where PyYAML was built with it (the same text; the pure-Python one spent
most of ``slices -o yaml``'s time on 200 devices), the pure-Python one otherwise."""
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def register_slices(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "slices",
        help="print the ResourceSlices the node agent would publish for simulated GPUs",
        description="Print the ResourceSlices (and optionally DeviceClasses) the node agent "
        "would publish for a node with simulated GPUs, without a cluster or a GPU.",
    )
    p.add_argument("--node", required=True, metavar="NAME", help="node name (also the pool)")
    p.add_argument(
        "--gpus",
        required=True,
        metavar="SPEC",
        help="simulated GPUs, e.g. H200-141GB:8 or H100-80GB:2,A100-80GB:1",
    )
    p.add_argument(
        "--k8s-version",
        default="1.36",
        choices=K8S_VERSIONS,
        help="apiserver version whose layout and limits to follow (default 1.36)",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        help="per-GPU mode (default: dynamic on Hopper and newer, mig on Ampere)",
    )
    p.add_argument(
        "--order",
        default="best-fit",
        choices=list(POLICIES),
        help="device-order policy (default best-fit)",
    )
    p.add_argument(
        "--static-layout",
        metavar="FILE",
        help="advertise the static layout (no counters): create the instances this "
        "YAML file names on the simulated GPUs and list only those",
    )
    p.add_argument("--generation", type=int, default=1, help="pool generation (default 1)")
    p.add_argument("--device-classes", action="store_true", help="also print the DeviceClasses")
    p.add_argument(
        "--extended-resources",
        action="store_true",
        help="with --device-classes: the GPU class serves nvidia.com/gpu (KEP-5004)",
    )
    p.add_argument("-o", "--output", default="yaml", choices=("yaml", "json"))
    p.set_defaults(func=run_slices)


def run_slices(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"gpu-slicer slices: {message}", file=sys.stderr)
        return 2

    if len(args.node) > 253 or not _NODE_NAME.fullmatch(args.node):
        return fail(
            f"--node {args.node!r} is not a valid node name: lower-case letters, "
            "digits, '-' and '.', at most 253 characters"
        )
    if not 0 <= args.generation < 2**63:
        return fail(f"--generation {args.generation} must be >= 0 and fit in 64 bits")
    try:
        backend = SimulatedBackend(args.gpus, node_name=args.node)
    except SlicerError as exc:
        return fail(str(exc))
    major, minor = (int(x) for x in args.k8s_version.split("."))
    infos = backend.gpus()
    models = [catalog.get_model(info.model) for info in infos]
    owned: dict[int, frozenset[SliceSpec]] = {}
    layout = None
    if args.static_layout:
        try:
            layout = StaticLayout.load(Path(args.static_layout))
            layout.check(models)
            owned = _build_static_layout(backend, layout, len(infos))
        except (SlicerError, BackendError) as exc:
            return fail(str(exc))
        infos = backend.gpus()
    states = [
        GpuState(
            info,
            mode=args.mode or default_mode(models[info.index]),
            instances=tuple(backend.instances(info.index)),
            owned=owned.get(info.index, frozenset()),
        )
        for info in infos
    ]
    try:
        plan = plan_pool(
            args.node,
            states,
            server_version=(major, minor),
            generation=args.generation,
            policy=args.order,
            static=layout is not None,
            static_layout=layout,
        )
    except InventoryError as exc:
        return fail(str(exc))
    objects = list(plan.slices)
    if args.device_classes:
        objects = device_classes(extended_resources=args.extended_resources) + objects
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.dump_all(objects, sys.stdout, Dumper=YAML_DUMPER, sort_keys=False)
    return 0


def _build_static_layout(
    backend: SimulatedBackend, layout: StaticLayout, count: int
) -> dict[int, frozenset[SliceSpec]]:
    """Create the configured instances on the simulated GPUs, as the agent would at start-up."""
    owned: dict[int, frozenset[SliceSpec]] = {}
    for index in range(count):
        wanted = layout.for_gpu(index)
        if not wanted:
            continue
        backend.set_mig_mode(index, True)
        made: set[SliceSpec] = set()
        for profile, start in wanted:
            gi = backend.create_gpu_instance(index, profile, start)
            backend.create_compute_instance(index, gi)
            made.add(SliceSpec(index, profile, start))
        owned[index] = frozenset(made)
    return owned
