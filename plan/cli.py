"""``gpu-slicer plan``: the arguments, and the plan put together from the cluster's reading,
the verdicts and the simulation.

This module must not import the Kubernetes client at import time (the CLI parser is built in
the webhook's gevent workers too): :func:`kube.api.connect` imports it when the command runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence

from gpu_slicer.kube import documents
from gpu_slicer.kube.api import KubeApi, connect
from gpu_slicer.kube.errors import KubeError
from gpu_slicer.plan import cluster
from gpu_slicer.plan.advertising import advertising_notes
from gpu_slicer.plan.errors import PlanInputError
from gpu_slicer.plan.render import table
from gpu_slicer.plan.simulation import simulate
from gpu_slicer.plan.verdicts import Plan, WorkloadPlan, plan_namespace, quota_lines
from gpu_slicer.slicer.scaling import partitionable_scales, quadratic_warning
from gpu_slicer.webhook.convert import policy_table

_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def build_plan(
    api: KubeApi, namespaces: Sequence[str], *, policy_path: str | None, release_namespace: str
) -> Plan:
    """Reads the cluster and plans every workload of ``namespaces`` (all that have GPU
    workloads when empty)."""
    if policy_path:
        policy, raw, source = cluster.policy_file(policy_path)
    else:
        policy, raw, source = cluster.cluster_policy(api, release_namespace)
    native = cluster.native_extended_names(api)
    nodes, skipped = cluster.gpu_nodes(api)
    labels = cluster.namespace_labels(api)
    wanted = list(namespaces) or sorted(
        n for n in labels if n not in ("kube-system", release_namespace)
    )
    missing = [n for n in wanted if n not in labels]
    if missing:
        raise PlanInputError(f"namespace {missing[0]} does not exist in the cluster")
    workloads: list[WorkloadPlan] = []
    kinds = policy_table(policy)
    quotas = {}
    for ns in wanted:
        quota = cluster.namespace_quota(api, ns)
        lines = quota_lines(quota, ns, policy)
        if lines is not None:
            quotas[ns] = lines
        objects = cluster.workload_objects(api, ns)
        workloads += plan_namespace(objects, ns, policy, native, len(nodes), kinds, quota)
    shown = {
        ns: labels[ns] for ns in wanted if namespaces or any(w.namespace == ns for w in workloads)
    }
    plan = Plan(shown, source, workloads, nodes, skipped, None, quotas=quotas)
    plan.notes += cluster.crd_notes(api, {(w.kind, w.api_group) for w in workloads}, kinds)
    version = api.server_version()
    plan.simulation = simulate(plan, raw, version)
    plan.notes += advertising_notes(nodes, workloads)
    if nodes and not partitionable_scales(version):
        plan.notes.append(quadratic_warning(version, len(nodes)))
    if any(w.kind == "DaemonSet" for w in workloads):
        plan.notes.append(
            "DaemonSets count one pod per GPU node; their node selectors are not applied"
        )
    return plan


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``plan``."""
    p = subparsers.add_parser(
        "plan",
        help="what enabling gpu-slicer in a namespace would do (reads the cluster only)",
        description=(
            "Reads the namespaces' Deployments, StatefulSets, DaemonSets, Jobs, CronJobs, bare "
            "Pods and operators' workloads (PyTorchJob, RayCluster, JobSet, LeaderWorkerSet, "
            "InferenceService, Volcano Job, ...), runs the webhook's translation on their pod "
            "templates with the installed policy, and reports per workload what it becomes, "
            "what would be denied and why, and what is left alone. Then it simulates the "
            "converted workloads on the cluster's GPU nodes as today and with gpu-slicer. "
            "Nothing is changed."
        ),
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: in-cluster account, then ~/.kube/config)",
    )
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="a namespace to plan (repeat for more; default: every namespace with GPU workloads)",
    )
    p.add_argument(
        "--policy",
        metavar="FILE",
        help="a policy file (default: the installed webhook's ConfigMap "
        "gpu-slicer-policy, else the built-in policy)",
    )
    p.add_argument(
        "--release-namespace",
        default="gpu-slicer",
        metavar="NS",
        help="where gpu-slicer is installed (default: gpu-slicer)",
    )
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=run_plan)


def run_plan(
    args: argparse.Namespace, *, api_factory: Callable[[str | None], KubeApi] = connect
) -> int:
    prefix = "gpu-slicer plan"
    for ns in [*args.namespace, args.release_namespace]:
        if not _NAMESPACE.fullmatch(ns):
            print(
                f"{prefix}: {ns!r} is not a namespace name (lowercase letters, digits, '-')",
                file=sys.stderr,
            )
            return 2
    for flag, path in (("--kubeconfig", args.kubeconfig), ("--policy", args.policy)):
        problem = documents.file_problem(flag, path)
        if problem:
            print(f"{prefix}: {problem}", file=sys.stderr)
            return 2
    try:
        api = api_factory(args.kubeconfig)
    except KubeError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 1
    try:
        plan = build_plan(
            api, args.namespace, policy_path=args.policy, release_namespace=args.release_namespace
        )
    except PlanInputError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except KubeError as exc:
        print(f"{prefix}: reading the cluster failed: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        json.dump(plan.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(table(plan))
    return 0
