"""``gpu-slicer status``: per node and GPU, the MIG slices that claims hold, the pods holding them
and what is free; per namespace, the migration mode and how many pods were converted.

It reads the cluster (ResourceSlices, ResourceClaims, Pods, Namespaces) and never writes. This
module must not import the Kubernetes client at import time: the CLI parser is built in the
webhook's gevent workers too, where ``ssl`` must not be imported before gevent patches it, so
:func:`kube.api.connect` imports it when the command runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import replace

from gpu_slicer.core.identity import DRIVERS, RESOURCE_API
from gpu_slicer.kube import documents
from gpu_slicer.kube.api import KubeApi, Obj, connect
from gpu_slicer.kube.errors import Forbidden, KubeError, NotFound, Unavailable
from gpu_slicer.kube.names import subdomain_problem
from gpu_slicer.status.render import as_json, table
from gpu_slicer.status.view import ClusterStatus, build_status, scaling_notes

PREFIX = "gpu-slicer status"


class StatusReadError(Exception):
    """The cluster could not be read (exit 1)."""


def read_status(api: KubeApi, *, node: str | None = None) -> ClusterStatus:
    """Reads the four lists the status is made of and builds it (:func:`status.view
    .build_status`); every object is listed once, read only.

    Raises StatusReadError with a one-line reason when the cluster cannot be read."""
    lists: dict[str, list[Obj]] = {}
    for api_version, kind in (
        (RESOURCE_API, "ResourceSlice"),
        (RESOURCE_API, "ResourceClaim"),
        ("v1", "Pod"),
        ("v1", "Namespace"),
    ):
        # Slices: one list per driver name (the current one, and 0.1's while nodes not
        # upgraded yet still publish under it); a field selector cannot say "either".
        selectors: list[str | None] = [None]
        if kind == "ResourceSlice":
            on_node = f",spec.nodeName={node}" if node else ""
            selectors = [f"spec.driver={driver}{on_node}" for driver in DRIVERS]
        try:
            lists[kind] = [
                obj
                for field_selector in selectors
                for obj in api.list(api_version, kind, field_selector=field_selector).items
            ]
        except NotFound as exc:
            raise StatusReadError(
                f"the apiserver does not serve {kind} in {api_version} "
                f"(Kubernetes 1.34 or later is needed): {exc}"
            ) from exc
        except Forbidden as exc:
            raise StatusReadError(f"not allowed to list {kind}s in every namespace: {exc}") from exc
        except Unavailable as exc:
            raise StatusReadError(f"cannot reach the cluster: {exc}") from exc
        except KubeError as exc:
            raise StatusReadError(f"listing {kind}s failed: {exc}") from exc
    status = build_status(
        lists["ResourceSlice"], lists["ResourceClaim"], lists["Pod"], lists["Namespace"], node=node
    )
    try:
        version = api.server_version()
    except KubeError:
        return status  # the lists were read: a version the apiserver will not tell costs a note
    return replace(status, notes=(*status.notes, *scaling_notes(version, lists["ResourceSlice"])))


def cluster_api(kubeconfig: str | None) -> KubeApi:
    """The real API for ``status`` and ``uninstall-check`` (:func:`kube.api.connect`)."""
    return connect(kubeconfig, quiet_retries=True)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``status``."""
    p = subparsers.add_parser(
        "status",
        help="MIG slices per node and GPU, who holds them, what is free; namespaces converted",
        description=(
            "Reads the cluster (ResourceSlices, ResourceClaims, Pods, Namespaces; nothing is "
            "changed) and draws one row per GPU, a cell per memory slice: the instances that "
            "claims hold there with the pod holding each, and the free slices. Then, per "
            "namespace labelled gpu-slicer.io/migration, its mode and how many pods the "
            "webhook converted."
        ),
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: KUBECONFIG, the in-cluster account, then ~/.kube/config)",
    )
    p.add_argument("--node", metavar="NAME", help="only this node's GPUs")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=run_status)


def run_status(
    args: argparse.Namespace,
    *,
    api_factory: Callable[[str | None], KubeApi] = cluster_api,
    width: int | None = None,
) -> int:
    problem = None if args.node is None else subdomain_problem("--node", args.node, "node")
    if problem:
        print(f"{PREFIX}: {problem}", file=sys.stderr)
        return 2
    problem = documents.file_problem("--kubeconfig", args.kubeconfig)
    if problem:
        print(f"{PREFIX}: {problem}", file=sys.stderr)
        return 2
    try:
        api = api_factory(args.kubeconfig)
    except KubeError as exc:
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        return 1
    try:
        status = read_status(api, node=args.node)
    except StatusReadError as exc:
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        return 1
    if args.node is not None and not status.nodes:
        print(
            f"{PREFIX}: node {args.node} publishes no gpu-slicer ResourceSlices and no "
            "claim holds a device there",
            file=sys.stderr,
        )
        return 1
    if args.output == "json":
        json.dump(as_json(status), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        columns = width if width is not None else shutil.get_terminal_size((100, 24)).columns
        sys.stdout.write(table(status, width=columns))
    return 0
