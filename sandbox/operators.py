"""Operators' controllers for the end-to-end tier, built from their Go modules into the cache.

``sandbox/go/operators`` pins them (today the JobSet controller); each is built once into
``~/.cache/gpu-slicer/<name>/<version>/`` and reused. They run against a sandbox's apiserver
with the admin kubeconfig, their admission webhooks served on loopback.

Run as a script to build them and print their paths: ``python3 -m sandbox.operators``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sandbox import go_tool
from sandbox.errors import BuildError

MODULE = go_tool.ROOT / "sandbox" / "go" / "operators"
JOBSET = "sigs.k8s.io/jobset"


class OperatorUnavailable(BuildError):
    """An operator's controller cannot be built here (no Go, or the build failed)."""


def jobset_version() -> str:
    return go_tool.pinned_version(MODULE, JOBSET, OperatorUnavailable)


def jobset_binary() -> Path:
    """The JobSet controller (its module's ``main`` package), cached or built now."""
    target = go_tool.cached("jobset", jobset_version())
    if not target.is_file():
        go_tool.build("jobset", MODULE, JOBSET, target, "-s -w", OperatorUnavailable)
    return target


if __name__ == "__main__":
    try:
        print(jobset_binary())
    except OperatorUnavailable as exc:
        print(f"sandbox.operators: {exc}", file=sys.stderr)
        sys.exit(1)
