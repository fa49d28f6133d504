"""``gpu-slicer sandbox up``: a real control plane with simulated GPUs, in the foreground."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gpu_slicer.sandbox import binaries
from gpu_slicer.sandbox.errors import SandboxError, UsageError
from gpu_slicer.sandbox.nodes import DEFAULT_NODES, DEPLOY_DIR, parse_node

if TYPE_CHECKING:
    from gpu_slicer.sandbox.sandbox import Settings

# sandbox.sandbox is imported only when the command runs: it loads the Kubernetes client
# (urllib3, ssl), which must not be imported into every gpu-slicer command (the webhook's gevent
# workers patch ssl and need it unimported in their parent).


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``sandbox up``."""
    sandbox = subparsers.add_parser(
        "sandbox", help="a real Kubernetes control plane on this machine, with simulated GPUs"
    )
    commands = sandbox.add_subparsers(dest="sandbox_command", metavar="COMMAND", required=True)
    up = commands.add_parser(
        "up",
        help="start etcd, the control plane, the webhook, agents and kubelet stand-ins",
        description=(
            "Runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from "
            "the Kubernetes Go modules into a cache on first use, or taken from --kube-bin), the "
            "gpu-slicer webhook and one agent per node on simulated GPUs, and a kubelet stand-in "
            "per node. Writes DIR/kubeconfig and DIR/ready, stays in the foreground, and stops "
            "everything on Ctrl-C or SIGTERM."
        ),
    )
    up.add_argument(
        "--state-dir",
        required=True,
        type=Path,
        metavar="DIR",
        help="folder for the sandbox's files (new, empty, or an old sandbox's)",
    )
    up.add_argument(
        "--node",
        action="append",
        metavar="NAME=GPUSPEC",
        help="a node and its simulated GPUs, e.g. a100=A100-80GB:1 (repeatable; "
        f"default {DEFAULT_NODES[0]})",
    )
    up.add_argument(
        "--k8s-version",
        default=binaries.DEFAULT_MINOR,
        metavar="V",
        help=f"Kubernetes version: {binaries.describe_releases()} "
        f"(default {binaries.DEFAULT_MINOR})",
    )
    up.add_argument(
        "--kube-bin",
        type=Path,
        metavar="DIR",
        help="use kube-apiserver, kube-scheduler and kube-controller-manager from "
        "DIR instead of building them",
    )
    up.add_argument(
        "--apiserver-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port of kube-apiserver on 127.0.0.1 (default: any free port)",
    )
    up.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port of the webhook on 127.0.0.1 (default: any free port)",
    )
    up.add_argument(
        "--webhook-policy",
        type=Path,
        metavar="FILE",
        help="the webhook's policy file (default: the built-in policy)",
    )
    up.add_argument(
        "--partitionable-devices",
        choices=["default", "on", "off"],
        default="default",
        help="the DRAPartitionableDevices gate on every component (default: the "
        "release's: off up to 1.35, on from 1.36)",
    )
    up.add_argument(
        "--extended-resources",
        action="store_true",
        help="also apply the DeviceClasses that serve nvidia.com/* extended resources (KEP-5004)",
    )
    up.add_argument(
        "--static-layout",
        type=Path,
        metavar="FILE",
        help="passed to every agent: the MIG layout advertised when the apiserver "
        "has no partitionable devices (1.35, or --partitionable-devices off)",
    )
    up.add_argument(
        "--install",
        choices=["kustomize", "helm"],
        default="kustomize",
        help="apply gpu-slicer's RBAC, policies, DeviceClasses and webhook "
        "configuration from deploy/base (default) or by `helm install` of "
        "deploy/helm/gpu-slicer (helm from the PATH, or built with Go)",
    )
    up.add_argument(
        "--real-node",
        metavar="NAME",
        help="give node NAME (one of --node) a real kubelet and containerd that run its pods' "
        "containers, the GPUs still simulated (root, cgroups, runc and the CNI plugins needed; "
        "kubelet and containerd built with Go into the cache on first use)",
    )
    up.add_argument(
        "--agent-pod",
        action="store_true",
        help="with --real-node and --install helm: the real node runs the chart's agent "
        "DaemonSet from the project's image (built into the cache on first use, imported, "
        "never pulled) instead of the agent process",
    )
    up.add_argument(
        "--webhook-pod",
        action="store_true",
        help="with --real-node and --install helm: the real node runs the chart's webhook "
        "Deployment from the project's image on its network (at --webhook-port), which the "
        "apiserver calls through the Service's endpoint (aggregator routing), instead of the "
        "webhook process",
    )
    up.add_argument(
        "--import-image",
        type=Path,
        action="append",
        default=[],
        metavar="ARCHIVE",
        help="with --real-node: also import this OCI image archive into its containerd "
        "(repeatable; for example an earlier release's image, python3 -m sandbox.releases)",
    )
    up.add_argument(
        "--deploy-dir",
        type=Path,
        default=DEPLOY_DIR,
        metavar="DIR",
        help="the deploy/ folder whose RBAC, policies and DeviceClasses to apply",
    )
    up.add_argument(
        "--gpu-slicer",
        type=Path,
        metavar="PATH",
        help="run the webhook and the agents as this gpu-slicer command, e.g. VENV/bin/gpu-slicer "
        "of a plain 'pip install' (default: this Python with this tree's code)",
    )
    up.set_defaults(func=run_up)


def settings_from(args: argparse.Namespace) -> Settings:
    from gpu_slicer.sandbox.sandbox import Settings

    nodes = [parse_node(text) for text in (args.node or DEFAULT_NODES)]
    names = [n.name for n in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UsageError(f"--node names {', '.join(duplicates)} more than once")
    binaries.release_for(args.k8s_version)
    gate = {"default": None, "on": True, "off": False}[args.partitionable_devices]
    if args.gpu_slicer is not None and not (
        args.gpu_slicer.is_file() and os.access(args.gpu_slicer, os.X_OK)
    ):
        raise UsageError(f"--gpu-slicer {args.gpu_slicer} is not an executable file")
    return Settings(
        state_dir=args.state_dir,
        nodes=nodes,
        k8s_version=args.k8s_version,
        kube_bin=args.kube_bin,
        apiserver_port=args.apiserver_port,
        webhook_port=args.webhook_port,
        webhook_policy=args.webhook_policy,
        deploy_dir=args.deploy_dir,
        partitionable=gate,
        extended_resources=args.extended_resources,
        install=args.install,
        static_layout=args.static_layout,
        gpu_slicer=args.gpu_slicer.resolve() if args.gpu_slicer else None,
        real_node=args.real_node,
        agent_pod=args.agent_pod,
        webhook_pod=args.webhook_pod,
        extra_images=tuple(path.resolve() for path in args.import_image),
    )


def run_up(args: argparse.Namespace) -> int:
    from gpu_slicer.sandbox.sandbox import Sandbox

    def say(message: str) -> None:
        print(f"sandbox: {message}", file=sys.stderr, flush=True)

    try:
        sandbox = Sandbox(settings_from(args), progress=say)
        sandbox.check()
    except UsageError as exc:
        print(f"gpu-slicer sandbox up: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 0
    try:
        ready = sandbox.up()
        if not stop.is_set():
            print(
                f"sandbox: ready in {ready['startSeconds']} s: Kubernetes {ready['kubernetes']} "
                f"at {ready['server']}, nodes {', '.join(ready['nodes'])}\n"
                f"  export KUBECONFIG={ready['kubeconfig']}\n"
                f"  kubectl label namespace default gpu-slicer.io/migration=enabled\n"
                f"  gpu-slicer status\n"
                "Ctrl-C stops everything.",
                file=sys.stderr,
                flush=True,
            )
            sandbox.supervise(stop)
    except UsageError as exc:
        print(f"gpu-slicer sandbox up: {exc}", file=sys.stderr)
        code = 2
    except SandboxError as exc:
        print(f"gpu-slicer sandbox up: {exc}", file=sys.stderr)
        code = 1
    finally:
        say("stopping")
        sandbox.down()
        say("stopped")
    return code
