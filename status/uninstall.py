"""``gpu-slicer uninstall-check``: refuses an uninstall while a claim of gpu-slicer's driver is
allocated, naming the pods that hold them.

An allocated claim is a pod that needs the agent: to prepare its MIG instance before it starts,
and to unprepare it (destroy the instance, remove its CDI file) when it is deleted. Without the
agent the kubelet cannot finish such a pod's termination (docs/install-kubernetes.md,
"Uninstall"), and its instance stays on the GPU. The chart runs this command as a
``pre-delete`` hook, so ``helm uninstall`` stops before deleting anything while such pods
remain; it is the same check by hand before ``kubectl delete -k``.

It reads ResourceClaims in every namespace and never writes. Like :mod:`status.cli`, it imports
the Kubernetes client only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpu_slicer.core.identity import DRIVERS, RESOURCE_API
from gpu_slicer.kube import documents
from gpu_slicer.kube.api import KubeApi, Obj
from gpu_slicer.kube.errors import KubeError
from gpu_slicer.status.cli import cluster_api

PREFIX = "gpu-slicer uninstall-check"
POLL_S = 2.0


@dataclass(frozen=True)
class HeldClaim:
    """A claim the driver allocated, and the pods it is reserved for."""

    namespace: str
    name: str
    pods: tuple[str, ...]
    nodes: tuple[str, ...]

    def line(self) -> str:
        held = ", ".join(f"pod {self.namespace}/{p}" for p in self.pods) or "no pod (yet)"
        where = f" on {', '.join(self.nodes)}" if self.nodes else ""
        return f"claim {self.namespace}/{self.name}{where}: {held}"


def _nodes(allocation: Obj) -> tuple[str, ...]:
    """The node names an allocation's node selector pins (a node-local device: one)."""
    selector = allocation.get("nodeSelector") or {}
    found: set[str] = set()
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                found.update(field.get("values") or [])
    return tuple(sorted(found))


_NAMES = " or ".join(DRIVERS)


def held_claims(api: KubeApi, drivers: tuple[str, ...] = DRIVERS) -> list[HeldClaim]:
    """Every ResourceClaim with a device of ``drivers`` (gpu-slicer's name, or an earlier
    release's) in its allocation."""
    held = []
    for claim in api.list(RESOURCE_API, "ResourceClaim").items:
        status = claim.get("status") or {}
        allocation = status.get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        if not any(r.get("driver") in drivers for r in results):
            continue
        pods = tuple(
            sorted(
                r.get("name", "")
                for r in status.get("reservedFor") or []
                if r.get("resource") == "pods"
            )
        )
        meta = claim["metadata"]
        held.append(HeldClaim(meta.get("namespace", ""), meta["name"], pods, _nodes(allocation)))
    return sorted(held, key=lambda c: (c.namespace, c.name))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``uninstall-check``."""
    p = subparsers.add_parser(
        "uninstall-check",
        help="exit 1 while a claim of gpu-slicer's driver is allocated (run before uninstalling)",
        description=(
            "Lists the ResourceClaims in every namespace whose allocation holds a device of "
            "gpu-slicer's driver, with the pods they are reserved for, and exits 1 while there "
            "is any: those pods need the agent to terminate and to give their MIG instances "
            "back. Exits 0 once there is none. Reads only. The chart runs it as a pre-delete "
            "hook of `helm uninstall`."
        ),
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: KUBECONFIG, the in-cluster account, then ~/.kube/config)",
    )
    p.add_argument(
        "--wait",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="wait up to this long for the claims to go (pods being deleted) before failing",
    )
    p.set_defaults(func=run_uninstall_check)


def run_uninstall_check(
    args: argparse.Namespace,
    *,
    api_factory: Callable[[str | None], KubeApi] = cluster_api,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> int:
    problem = documents.file_problem("--kubeconfig", args.kubeconfig)
    if problem:
        print(f"{PREFIX}: {problem}", file=sys.stderr)
        return 2
    if not args.wait >= 0:
        print(f"{PREFIX}: --wait must be 0 or more seconds, not {args.wait}", file=sys.stderr)
        return 2
    try:
        api = api_factory(args.kubeconfig)
    except KubeError as exc:
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        return 1
    deadline = monotonic() + args.wait
    while True:
        try:
            held = held_claims(api)
        except KubeError as exc:  # unsure is not safe: refuse
            print(f"{PREFIX}: cannot list ResourceClaims: {exc}", file=sys.stderr)
            return 1
        if not held or monotonic() >= deadline:
            break
        sleep(min(POLL_S, max(0.0, deadline - monotonic())))
    if not held:
        print(f"no claim of {_NAMES} is allocated: nothing needs the agent any more")
        return 0
    print(
        f"{PREFIX}: {len(held)} claim(s) of {_NAMES} still allocated; the agent must run "
        "until their pods are gone (delete or replace them, after setting their namespaces "
        "back: docs/install-kubernetes.md, Uninstall):",
        file=sys.stderr,
    )
    for claim in held:
        print(f"  {claim.line()}", file=sys.stderr)
    return 1


__all__ = ["HeldClaim", "held_claims", "register", "run_uninstall_check"]
