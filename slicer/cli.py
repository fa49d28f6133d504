"""Subcommands of the node agent: ``catalog`` (and, as they land, ``slices`` and ``agent``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from slicer import catalog
from slicer.errors import CatalogError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("catalog", help="print the MIG catalog of every supported model")
    p.add_argument("--gpu", metavar="MODEL", help="only this model (e.g. H100-80GB)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_catalog)


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
        models = [catalog.get_model(args.gpu)] if args.gpu else list(catalog.MODELS)
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
        print(f"  {'profile':<12} {'memory':>9} {'mem sl':>6} {'comp sl':>7} {'SMs':>4} "
              f"{'max':>3}  starts")
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
