"""Operators' controllers for the end-to-end tier, built from their Go modules into the cache.

``sandbox/go/jobset`` and ``sandbox/go/lws`` pin the JobSet and LeaderWorkerSet controllers
(one module each: they need different Kubernetes libraries); each is built once into
``~/.cache/gpu-slicer/<name>/<version>/`` and reused. They run against a sandbox's apiserver
with the admin kubeconfig, their admission webhooks served on loopback.

Run as a script to build them and print their paths: ``python3 -m sandbox.operators``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_slicer.sandbox import go_tool
from gpu_slicer.sandbox.errors import BuildError

GO = go_tool.ROOT / "sandbox" / "go"
JOBSET = "sigs.k8s.io/jobset"
LWS = "sigs.k8s.io/lws"


class OperatorUnavailable(BuildError):
    """An operator's controller cannot be built here (no Go, or the build failed)."""


def jobset_version() -> str:
    return go_tool.pinned_version(GO / "jobset", JOBSET, OperatorUnavailable)


def lws_version() -> str:
    return go_tool.pinned_version(GO / "lws", LWS, OperatorUnavailable)


def jobset_binary() -> Path:
    """The JobSet controller (its module's ``main`` package), cached or built now."""
    return _binary("jobset", JOBSET, jobset_version())


def lws_binary() -> Path:
    """The LeaderWorkerSet controller (``cmd``), cached or built now."""
    return _binary("lws", f"{LWS}/cmd", lws_version())


def _binary(name: str, package: str, version: str) -> Path:
    target = go_tool.cached(name, version)
    if not target.is_file():
        go_tool.build(name, GO / name, package, target, "-s -w", OperatorUnavailable)
    return target


if __name__ == "__main__":
    try:
        print(jobset_binary())
        print(lws_binary())
    except OperatorUnavailable as exc:
        print(f"sandbox.operators: {exc}", file=sys.stderr)
        sys.exit(1)
