"""Subcommands of the node agent: ``catalog``, ``slices`` and ``agent run``.

``agent run`` takes every flag also from an environment variable (its twin, named in the help),
so a DaemonSet can configure the agent without arguments; values that come that way bypass
argparse's checks, so :func:`run_agent` checks them all again and exits 2 naming the flag.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from kube.api import KubeApi
from kube.errors import KubeError
from kube.names import subdomain_problem
from slicer import agent_lock, catalog
from slicer.agent import NodeAgent
from slicer.assembly import (
    ADVERTISE_CHOICES,
    CDI_DIR,
    CHECKPOINT_DIR,
    KUBELET_PLUGINS_DIR,
    KUBELET_REGISTRY_DIR,
    AgentConfig,
)
from slicer.backend import GpuBackend, model_of
from slicer.cdi import (
    FALLBACK_EDITS,
    TOOLKIT_SPEC_PATHS,
    CdiError,
    CommonEdits,
    find_toolkit_spec,
    load_toolkit_spec,
    toolkit_spec_from_ctk,
)
from slicer.deviceclasses import device_classes
from slicer.errors import BackendError, CatalogError, GpuSpecError, SlicerError
from slicer.inventory import MODES, InventoryError
from slicer.layout import LayoutError, StaticLayout
from slicer.ordering import POLICIES
from slicer.preview import preview_pool
from slicer.profile_filter import ProfileFilter, ProfileFilterError
from slicer.scaling import DEGRADES_AT_NODES
from slicer.simulated import SimulatedBackend

log = logging.getLogger(__name__)


def node_name_problem(node: str) -> str | None:
    """Why ``--node`` is not a valid node name (which is also the agent's pool name)."""
    return subdomain_problem("--node", node, "node")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("catalog", help="print the MIG catalog of every supported model")
    p.add_argument("--gpu", metavar="MODEL", help="only this model (e.g. H100-80GB)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_catalog)
    register_slices(subparsers)
    register_agent(subparsers)


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
            "notInNvidiaTables": catalog.NOT_PUBLISHED.get(m.key),
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
                    "notInNvidiaTables": catalog.NOT_PUBLISHED.get(f"{m.key} {p.name}"),
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
        if m.key in catalog.NOT_PUBLISHED:
            print(f"  not in NVIDIA's published tables: {catalog.NOT_PUBLISHED[m.key]}")
        for p in m.profiles:
            mark = "" if p.confirmed else " *"
            if f"{m.key} {p.name}" in catalog.NOT_PUBLISHED:
                mark += " +"
            print(
                f"  {p.name:<12} {p.memory_bytes / catalog.GIB:>6.2f}GiB {p.memory_slices:>6} "
                f"{p.compute_slices:>7} {p.multiprocessors:>4} {p.max_count:>3}  "
                f"{','.join(map(str, p.starts))}{mark}"
            )
        print()
    print("* not confirmed on real hardware; + not in NVIDIA's published tables")
    return 0


# --- slices ---------------------------------------------------------------------------------

K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
YAML_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter where PyYAML was built with it (the same text; the pure-Python one spent
most of ``slices -o yaml``'s time on 200 devices), the pure-Python one otherwise."""


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
    p.add_argument(
        "--profiles",
        default="",
        metavar="LIST",
        help="only these MIG profiles (the agent's --profiles), e.g. 1g.10gb,3g.40gb or -*+me",
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

    problem = node_name_problem(args.node)
    if problem:
        return fail(problem)
    if not 0 <= args.generation < 2**63:
        return fail(f"--generation {args.generation} must be >= 0 and fit in 64 bits")
    major, minor = (int(x) for x in args.k8s_version.split("."))
    try:
        layout = StaticLayout.load(Path(args.static_layout)) if args.static_layout else None
        profiles = _profile_filter(args.profiles, SimulatedBackend(args.gpus, node_name=args.node))
        plan = preview_pool(
            args.node,
            args.gpus,
            server_version=(major, minor),
            mode=args.mode,
            order=args.order,
            static_layout=layout,
            generation=args.generation,
            profiles=profiles,
        )
    except (SlicerError, BackendError, InventoryError) as exc:
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


# --- agent run ------------------------------------------------------------------------------


def _env(*names: str, default: str | None = None) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return default


def register_agent(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpu-slicer agent run``."""
    agent = subparsers.add_parser("agent", help="the node agent (DRA kubelet plugin for MIG)")
    commands = agent.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="run the node agent: publish slices, serve the kubelet, reconcile",
        description="Every flag has an environment-variable twin, shown in brackets.",
    )
    run.add_argument(
        "--node",
        default=_env("GPU_SLICER_NODE", "NODE_NAME"),
        help="this node's name, the pool name [GPU_SLICER_NODE or NODE_NAME]",
    )
    run.add_argument(
        "--backend",
        choices=["nvml", "simulated"],
        default=_env("GPU_SLICER_BACKEND", default="nvml"),
        help="GPU access: NVML, or simulated GPUs [GPU_SLICER_BACKEND]",
    )
    run.add_argument(
        "--simulate-gpus",
        metavar="SPEC",
        default=_env("GPU_SLICER_SIMULATE_GPUS", default="H100-80GB:2"),
        help="simulated GPUs, e.g. H100-80GB:2,A100-80GB:1 [GPU_SLICER_SIMULATE_GPUS]",
    )
    run.add_argument(
        "--simulate-state",
        metavar="FILE",
        type=Path,
        default=_env("GPU_SLICER_SIMULATE_STATE"),
        help="with --backend simulated: keep the simulated GPUs' MIG state in "
        "FILE, so that it outlives a restart of the agent as on real GPUs "
        "[GPU_SLICER_SIMULATE_STATE]",
    )
    run.add_argument(
        "--kubeconfig",
        default=_env("GPU_SLICER_KUBECONFIG", "KUBECONFIG"),
        help="kubeconfig file; default: in-cluster [GPU_SLICER_KUBECONFIG]",
    )
    run.add_argument(
        "--kube",
        choices=["cluster", "memory"],
        default=_env("GPU_SLICER_KUBE", default="cluster"),
        help="'memory': an empty in-process API, for trying the agent without a "
        "cluster [GPU_SLICER_KUBE]",
    )
    for flag, env, default, what in (
        ("--checkpoint-dir", "GPU_SLICER_CHECKPOINT_DIR", CHECKPOINT_DIR, "checkpoint directory"),
        ("--cdi-dir", "GPU_SLICER_CDI_DIR", CDI_DIR, "CDI spec directory"),
        (
            "--plugins-dir",
            "GPU_SLICER_PLUGINS_DIR",
            KUBELET_PLUGINS_DIR,
            "kubelet plugins directory (dra.sock goes in <dir>/gpu-slicer.io/)",
        ),
        (
            "--registry-dir",
            "GPU_SLICER_REGISTRY_DIR",
            KUBELET_REGISTRY_DIR,
            "kubelet plugin registry directory",
        ),
    ):
        run.add_argument(
            flag,
            type=Path,
            default=Path(_env(env, default=default) or default),
            help=f"{what} [{env}]",
        )
    run.add_argument(
        "--metrics-bind",
        default=_env("GPU_SLICER_METRICS_BIND", default=":9464"),
        help="host:port for /metrics; empty to disable [GPU_SLICER_METRICS_BIND]",
    )
    run.add_argument(
        "--reconcile-interval",
        type=_float_or_text,
        default=_env("GPU_SLICER_RECONCILE_INTERVAL", default="30"),
        help="seconds between reconcile passes [GPU_SLICER_RECONCILE_INTERVAL]",
    )
    run.add_argument(
        "--policy",
        default=_env("GPU_SLICER_POLICY", default="best-fit"),
        help="device order policy: best-fit, anti-fragmentation, name [GPU_SLICER_POLICY]",
    )
    run.add_argument(
        "--republish-interval",
        type=_float_or_text,
        default=_env("GPU_SLICER_REPUBLISH_INTERVAL", default="10"),
        help="minimum seconds between two ResourceSlice rewrites that only change "
        "the device order (best-fit) [GPU_SLICER_REPUBLISH_INTERVAL]",
    )
    run.add_argument(
        "--reprobe-interval",
        type=_float_or_text,
        default=_env("GPU_SLICER_REPROBE_INTERVAL", default="600"),
        help="seconds between checks of the apiserver version and, after a "
        "fallback to the static layout, probes for partitionable devices; "
        "0 disables [GPU_SLICER_REPROBE_INTERVAL]",
    )
    run.add_argument(
        "--toolkit-cdi-spec",
        metavar="FILE",
        type=Path,
        default=_env("GPU_SLICER_TOOLKIT_CDI_SPEC"),
        help="the NVIDIA Container Toolkit's CDI spec (nvidia-ctk cdi generate "
        "output) whose common edits every claim's spec carries; default: "
        "the first of /etc/cdi/nvidia.yaml|json, /var/run/cdi/nvidia.yaml|json "
        "[GPU_SLICER_TOOLKIT_CDI_SPEC]",
    )
    run.add_argument(
        "--nvidia-ctk",
        metavar="PATH",
        default=_env("GPU_SLICER_NVIDIA_CTK"),
        help="instead of a spec file, run '<PATH> cdi generate --format=json' at "
        "start-up [GPU_SLICER_NVIDIA_CTK]",
    )
    run.add_argument(
        "--static-layout",
        metavar="FILE",
        type=Path,
        default=_env("GPU_SLICER_STATIC_LAYOUT"),
        help="static layout file (the format of 'gpu-slicer slices "
        "--static-layout'): the existing instances advertised when the "
        "apiserver has no partitionable devices [GPU_SLICER_STATIC_LAYOUT]",
    )
    run.add_argument(
        "--profiles",
        default=_env("GPU_SLICER_PROFILES", default=""),
        metavar="LIST",
        help="advertise only these MIG profiles (partitionable layout; the whole GPU "
        "stays): names or patterns, '-' excludes, e.g. 1g.10gb,2g.20gb,3g.40gb,7g.80gb "
        "or -*+me,-1g.20gb; fewer devices per node cost the scheduler less for every "
        "DRA pod (docs/agent.md); empty: all [GPU_SLICER_PROFILES]",
    )
    run.add_argument(
        "--advertise",
        default=_env("GPU_SLICER_ADVERTISE", default="partitionable"),
        help="partitionable: every MIG slice the GPUs could host, with shared counters, "
        "instances made just in time; static: only the instances that exist (the "
        "static layout), for Kubernetes releases before 1.37 in clusters beyond about "
        f"{DEGRADES_AT_NODES} GPU nodes (docs/install-kubernetes.md) [GPU_SLICER_ADVERTISE]",
    )
    run.add_argument(
        "--lock-wait",
        type=_float_or_text,
        default=_env("GPU_SLICER_LOCK_WAIT", default="0"),
        help="seconds to wait for another agent on the same --checkpoint-dir to "
        "exit (a rolling update); 0 exits 2 at once [GPU_SLICER_LOCK_WAIT]",
    )
    run.set_defaults(func=run_agent)


def _float_or_text(value: str) -> float | str:
    """Parse a number, keeping bad text so that run_agent can name the flag (exit 2)."""
    try:
        return float(value)
    except ValueError:
        return value


_MAX_SECONDS = 10_000_000.0
"""About 115 days; beyond it the threads' timers overflow."""


class _Refusal(Exception):
    """Ends ``agent run`` before the agent runs: the message for stderr and the exit code
    (2: the flags are wrong, 1: the node or the cluster failed)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _seconds(flag: str, value: object, *, zero: bool) -> float:
    """A valid number of seconds; refuses naming the flag otherwise."""
    if isinstance(value, str):
        value = _float_or_text(value)
    if (
        not isinstance(value, float)
        or not math.isfinite(value)
        or value < 0
        or (not zero and value == 0)
        or value > _MAX_SECONDS
    ):
        bound = (">= 0" if zero else "> 0") + f" and <= {_MAX_SECONDS:,.0f}"
        raise _Refusal(f"{flag} must be a number of seconds {bound}, not {value!r}")
    return value


def _flag_problem(args: argparse.Namespace) -> str | None:
    """The first bad flag value, named; environment twins bypass argparse's own checks."""
    if not args.node:
        return "--node is required (or set GPU_SLICER_NODE / NODE_NAME)"
    problem = node_name_problem(args.node)
    if problem:
        return problem
    for flag, value, choices in (
        ("--backend", args.backend, ("nvml", "simulated")),
        ("--kube", args.kube, ("cluster", "memory")),
        ("--policy", args.policy, tuple(POLICIES)),
        ("--advertise", args.advertise, ADVERTISE_CHOICES),
    ):
        if value not in choices:
            return f"{flag} {value!r} is not one of {', '.join(choices)}"
    for flag in ("--checkpoint-dir", "--cdi-dir", "--plugins-dir", "--registry-dir"):
        folder = getattr(args, flag[2:].replace("-", "_"))
        if folder.exists() and not folder.is_dir():
            return f"{flag} {folder} is a file, not a folder"
    if args.metrics_bind:
        host, sep, port = args.metrics_bind.rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535:
            return (
                f"--metrics-bind {args.metrics_bind!r} is not host:port with a port "
                "0-65535 (e.g. :9464)"
            )
    return None


def run_agent(args: argparse.Namespace) -> int:
    """Check every flag before anything touches the GPUs, then run the agent until SIGTERM or
    SIGINT."""
    try:
        config, lock_wait = _agent_config(args)
        lock = _lock(args.checkpoint_dir, lock_wait)
        backend = _open_backend(args)
        api = _open_api(args)
        _check_layout(config.static_layout, backend, config.profiles)
        agent = _build_agent(config, backend, api)
    except _Refusal as exc:
        print(f"gpu-slicer agent run: {exc}", file=sys.stderr)
        return exc.code
    return _serve(agent, backend, lock)


def _agent_config(args: argparse.Namespace) -> tuple[AgentConfig, float]:
    """The agent's settings from the flags alone, and how long to wait for the lock."""
    problem = _flag_problem(args)
    if problem:
        raise _Refusal(problem)
    reconcile_interval = _seconds("--reconcile-interval", args.reconcile_interval, zero=False)
    republish_interval = _seconds("--republish-interval", args.republish_interval, zero=False)
    reprobe_interval = _seconds("--reprobe-interval", args.reprobe_interval, zero=True)
    lock_wait = _seconds("--lock-wait", args.lock_wait, zero=True)
    try:
        layout = StaticLayout.load(args.static_layout) if args.static_layout else None
    except LayoutError as exc:
        raise _Refusal(f"--static-layout: {exc}") from exc
    try:
        profiles = ProfileFilter.parse(args.profiles or "")
    except ProfileFilterError as exc:
        raise _Refusal(f"--profiles: {exc}") from exc
    config = AgentConfig(
        node=args.node,
        checkpoint_dir=args.checkpoint_dir,
        cdi_dir=args.cdi_dir,
        plugins_dir=args.plugins_dir,
        registry_dir=args.registry_dir,
        metrics_bind=args.metrics_bind,
        reconcile_interval_s=reconcile_interval,
        policy=args.policy,
        republish_interval_s=republish_interval,
        reprobe_interval_s=reprobe_interval,
        cdi_common=_common_edits(args),
        static_layout=layout,
        profiles=profiles,
        advertise=args.advertise,
    )
    return config, lock_wait


def _common_edits(args: argparse.Namespace) -> CommonEdits:
    """The toolkit's edits; a spec named by flag must be usable, nvidia-ctk must run."""
    if args.toolkit_cdi_spec and args.nvidia_ctk:
        raise _Refusal("give --toolkit-cdi-spec or --nvidia-ctk, not both")
    try:
        return _toolkit_edits(args)
    except CdiError as exc:
        if args.toolkit_cdi_spec:
            raise _Refusal(f"--toolkit-cdi-spec: {exc}") from exc
        raise _Refusal(f"--nvidia-ctk: {exc}", code=1) from exc


def _toolkit_edits(args: argparse.Namespace) -> CommonEdits:
    """The toolkit's common CDI edits: the named file, nvidia-ctk, or the first usual file."""
    if args.toolkit_cdi_spec:
        return load_toolkit_spec(args.toolkit_cdi_spec)
    if args.nvidia_ctk:
        return toolkit_spec_from_ctk(args.nvidia_ctk)
    found = find_toolkit_spec(
        (*TOOLKIT_SPEC_PATHS, args.cdi_dir / "nvidia.yaml", args.cdi_dir / "nvidia.json")
    )
    if found is None:
        return FALLBACK_EDITS
    try:
        return load_toolkit_spec(found)
    except CdiError as exc:
        log.error(
            "the toolkit CDI spec found is unusable; claim specs get no driver libraries",
            extra={"problem": str(exc)},
        )
        return FALLBACK_EDITS


def _lock(checkpoint_dir: Path, wait_s: float) -> agent_lock.AgentLock:
    """One agent per checkpoint folder, taken before anything touches the GPUs, sockets,
    checkpoint or CDI specs."""
    try:
        return agent_lock.acquire(
            checkpoint_dir,
            wait_s=wait_s,
            on_wait=lambda holder: log.info(
                "waiting for the agent lock", extra={"holder": holder, "wait_s": wait_s}
            ),
        )
    except agent_lock.AgentLockHeld as exc:
        raise _Refusal(str(exc)) from exc
    except OSError as exc:
        raise _Refusal(f"cannot lock --checkpoint-dir: {exc}", code=1) from exc


def _open_backend(args: argparse.Namespace) -> GpuBackend:
    try:
        return _backend(args)
    except GpuSpecError as exc:
        raise _Refusal(f"--simulate-gpus: {exc}") from exc
    except SlicerError as exc:
        raise _Refusal(f"cannot open the GPUs: {exc}", code=1) from exc


def _backend(args: argparse.Namespace) -> GpuBackend:
    if args.backend == "simulated":
        simulated = SimulatedBackend(args.simulate_gpus, node_name=args.node)
        if args.simulate_state:
            from slicer.simulated_store import PersistedBackend

            return PersistedBackend(simulated, Path(args.simulate_state))
        return simulated
    from slicer.nvml import NvmlBackend

    return NvmlBackend()


def _open_api(args: argparse.Namespace) -> KubeApi:
    try:
        return _api(args)
    except KubeError as exc:
        hint = (
            "; to run without a cluster, add --kube memory (an in-memory API, with "
            "--backend simulated)"
            if args.kube == "cluster"
            else ""
        )
        raise _Refusal(f"{exc}{hint}", code=1) from exc


def _api(args: argparse.Namespace) -> KubeApi:
    if args.kube == "memory":
        from kube.memory import InMemoryKubeApi

        return InMemoryKubeApi()
    from kube.client import RealKubeApi

    return RealKubeApi.from_config(args.kubeconfig)


def _check_layout(
    layout: StaticLayout | None, backend: GpuBackend, profiles: ProfileFilter | None = None
) -> None:
    """The static layout and ``--profiles`` must fit the GPUs found (flags checked against the
    node)."""
    if layout is None and profiles is None:
        return
    try:
        models = [model_of(info) for info in backend.gpus()]
        if layout is not None:
            layout.check(models)
        if profiles is not None:
            profiles.check(models)
    except LayoutError as exc:
        raise _Refusal(f"--static-layout: {exc}") from exc
    except ProfileFilterError as exc:
        raise _Refusal(str(exc)) from exc
    except BackendError as exc:
        raise _Refusal(f"cannot open the GPUs: {exc}", code=1) from exc


def _profile_filter(text: str, backend: GpuBackend) -> ProfileFilter | None:
    """``gpu-slicer slices --profiles``: parsed and checked against the simulated GPUs."""
    profiles = ProfileFilter.parse(text)
    if profiles is not None:
        profiles.check([model_of(info) for info in backend.gpus()])
    return profiles


def _build_agent(config: AgentConfig, backend: GpuBackend, api: KubeApi) -> NodeAgent:
    try:
        return NodeAgent(config, backend=backend, api=api)
    except (BackendError, OSError) as exc:
        raise _Refusal(f"cannot start: {exc}", code=1) from exc
    except SlicerError as exc:  # e.g. a socket path over the kernel's limit
        raise _Refusal(str(exc)) from exc


def _serve(agent: NodeAgent, backend: GpuBackend, lock: agent_lock.AgentLock) -> int:
    """Run the agent until SIGTERM or SIGINT, then stop it, close the GPUs, free the lock."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received; shutting down", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.start()
    except (SlicerError, OSError) as exc:
        agent.stop()
        print(f"gpu-slicer agent run: cannot start: {exc}", file=sys.stderr)
        return 1
    print(
        f"gpu-slicer agent: serving {agent.plugin.dra_path} and {agent.plugin.registration_path}",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(1.0):
        pass
    agent.stop()
    close = getattr(backend, "close", None)
    if callable(close):
        close()
    lock.release()
    return 0
