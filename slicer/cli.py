"""Subcommands of the node agent: ``catalog``, ``slices`` and ``agent run``.

``agent run`` takes every flag also from an environment variable (its twin, named in the help),
so a DaemonSet can configure the agent without arguments; values that come that way bypass
argparse's checks, so :func:`run_agent` checks them all again and exits 2 naming the flag.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import MODES, DeviceSpec, parse_device_name
from gpu_slicer.core.errors import CatalogError, DeviceNameError, GpuSlicerError, GpuSpecError
from gpu_slicer.kube.api import KubeApi
from gpu_slicer.kube.errors import KubeError
from gpu_slicer.kube.settings import SettingsError, env_name
from gpu_slicer.slicer import agent_lock
from gpu_slicer.slicer.agent import AgentConfig, NodeAgent
from gpu_slicer.slicer.backend import GpuBackend, HealthEvent, model_of
from gpu_slicer.slicer.cdi import (
    FALLBACK_EDITS,
    TOOLKIT_SPEC_PATHS,
    CdiError,
    CommonEdits,
    find_toolkit_spec,
    load_toolkit_spec,
    toolkit_spec_from_ctk,
)
from gpu_slicer.slicer.demand import asked_for
from gpu_slicer.slicer.device_attributes import ATTRIBUTES_CHOICES
from gpu_slicer.slicer.deviceclasses import device_classes
from gpu_slicer.slicer.errors import BackendError, CheckpointTooNew
from gpu_slicer.slicer.inventory import KUBERNETES_VERSIONS, PoolPlan
from gpu_slicer.slicer.layout import LayoutError, StaticLayout
from gpu_slicer.slicer.ordering import DEVICE_ORDERS
from gpu_slicer.slicer.preview import preview_pool
from gpu_slicer.slicer.profile_filter import ProfileChoice, ProfileFilter, ProfileFilterError
from gpu_slicer.slicer.scaling import DEGRADES_AT_NODES
from gpu_slicer.slicer.settings import (
    BACKENDS,
    KUBE_CHOICES,
    AgentSettings,
    float_or_text,
    node_name_problem,
)
from gpu_slicer.slicer.simulated import SimulatedBackend

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("catalog", help="print the MIG catalog of every supported model")
    p.add_argument("--gpu", metavar="MODEL", help="only this model (e.g. H100-80GB)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_catalog)
    register_slices(subparsers)
    register_agent(subparsers)


def catalog_json(models: list[gpu_model.GpuModel]) -> list[dict[str, Any]]:
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
            f"{m.key}: {m.architecture}, {m.memory_bytes / gpu_model.GIB:.1f} GiB, "
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
                f"  {p.name:<12} {p.memory_bytes / gpu_model.GIB:>6.2f}GiB {p.memory_slices:>6} "
                f"{p.compute_slices:>7} {p.multiprocessors:>4} {p.max_count:>3}  "
                f"{','.join(map(str, p.starts))}{mark}"
            )
        print()
    print("* not confirmed on real hardware; + not in NVIDIA's published tables")
    return 0


# --- slices ---------------------------------------------------------------------------------

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
        choices=KUBERNETES_VERSIONS,
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
        choices=list(DEVICE_ORDERS),
        help="device order: how the pool lists devices (default best-fit)",
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
    p.add_argument(
        "--demand",
        default=None,
        metavar="LIST",
        help="what the node publishes when the cluster's claims ask for these MIG profiles "
        "(the agent's default, --advertised-profiles asked), e.g. 1g.10gb,3g.40gb; '' for "
        "none asked (an idle node); without it, every profile (--advertised-profiles all)",
    )
    p.add_argument(
        "--attributes",
        default="full",
        choices=ATTRIBUTES_CHOICES,
        help="the attributes each device carries (the agent's --attributes; default full)",
    )
    p.add_argument(
        "--allocated",
        default="",
        metavar="DEVICES",
        help="what the node publishes while claims hold these devices (comma-separated names, "
        "e.g. gpu-0-mig-3g40gb-0): the devices they leave no room for are left out",
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
        allocated = [parse_device_name(n.strip()) for n in args.allocated.split(",") if n.strip()]
    except DeviceNameError as exc:
        return fail(f"--allocated: {exc}")
    try:
        layout = StaticLayout.load(Path(args.static_layout)) if args.static_layout else None
        backend = SimulatedBackend(args.gpus, node_name=args.node)
        limit = _profile_filter(args.profiles, backend)
        profiles: ProfileChoice | None = limit
        if args.demand is not None:
            profiles = asked_for(args.demand, backend.gpus(), limit=limit)

        def plan(held: list[DeviceSpec]) -> PoolPlan:
            return preview_pool(
                args.node,
                args.gpus,
                server_version=(major, minor),
                mode=args.mode,
                order=args.order,
                static_layout=layout,
                profiles=profiles,
                attributes=args.attributes,
                generation=args.generation,
                allocated=held,
            )

        pool = plan(allocated)
        problem = _allocation_problem(allocated, pool, plan)
        if problem:
            return fail(problem)
    except GpuSlicerError as exc:
        return fail(str(exc))
    objects = list(pool.slices)
    if args.device_classes:
        objects = device_classes(extended_resources=args.extended_resources) + objects
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.dump_all(objects, sys.stdout, Dumper=YAML_DUMPER, sort_keys=False)
    return 0


def _allocation_problem(
    allocated: list[DeviceSpec], pool: PoolPlan, plan: Callable[[list[DeviceSpec]], PoolPlan]
) -> str | None:
    """Why ``--allocated`` names devices no claims could hold together on this node, if so."""
    names = [spec.device_name for spec in allocated]
    for name in names:
        if name not in pool.order:
            return f"--allocated {name}: the node does not publish such a device"
    for index, name in enumerate(names):
        others = allocated[:index] + allocated[index + 1 :]
        if name in plan(others).ruled_out:
            beside = ", ".join(n for n in names if n != name)
            return f"--allocated {name}: no claim can hold it beside {beside} (they overlap)"
    return None


# --- agent run ------------------------------------------------------------------------------


_AGENT_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--node", {"help": "this node's name, the pool name [GPU_SLICER_NODE or NODE_NAME]"}),
    (
        "--backend",
        {"choices": BACKENDS, "help": "GPU access: NVML, or simulated GPUs (default nvml)"},
    ),
    (
        "--simulate-gpus",
        {"metavar": "SPEC", "help": "simulated GPUs, e.g. H100-80GB:2,A100-80GB:1"},
    ),
    (
        "--simulate-state",
        {
            "metavar": "FILE",
            "type": Path,
            "help": "with --backend simulated: keep the simulated GPUs' MIG state in FILE, so "
            "that it outlives a restart of the agent as on real GPUs",
        },
    ),
    (
        "--kubeconfig",
        {"help": "kubeconfig file; default: in-cluster [GPU_SLICER_KUBECONFIG or KUBECONFIG]"},
    ),
    (
        "--kube",
        {
            "choices": KUBE_CHOICES,
            "help": "'memory': an empty in-process API, for trying the agent without a cluster",
        },
    ),
    ("--checkpoint-dir", {"type": Path, "help": "checkpoint directory"}),
    ("--cdi-dir", {"type": Path, "help": "CDI spec directory"}),
    (
        "--plugins-dir",
        {
            "type": Path,
            "help": "kubelet plugins directory (dra.sock goes in <dir>/gpu-slicer.io/)",
        },
    ),
    ("--registry-dir", {"type": Path, "help": "kubelet plugin registry directory"}),
    ("--metrics-bind", {"help": "host:port for /metrics; empty to disable (default :9464)"}),
    (
        "--reconcile-interval",
        {"type": float_or_text, "help": "seconds between reconcile passes (default 30)"},
    ),
    (
        "--device-order",
        {"help": "how devices are listed in the pool: best-fit, anti-fragmentation, name"},
    ),
    (
        "--policy",
        {
            "help": "deprecated spelling of --device-order [GPU_SLICER_POLICY, read only when "
            "it names a device order and GPU_SLICER_DEVICE_ORDER is unset]"
        },
    ),
    (
        "--republish-interval",
        {
            "type": float_or_text,
            "help": "minimum seconds between two ResourceSlice rewrites that only change the "
            "device order (best-fit; default 10)",
        },
    ),
    (
        "--reprobe-interval",
        {
            "type": float_or_text,
            "help": "seconds between checks of the apiserver version and, after a fallback to "
            "the static layout, probes for partitionable devices; 0 disables (default 600)",
        },
    ),
    (
        "--toolkit-cdi-spec",
        {
            "metavar": "FILE",
            "type": Path,
            "help": "the NVIDIA Container Toolkit's CDI spec (nvidia-ctk cdi generate output) "
            "whose common edits every claim's spec carries; default: the first of "
            "/etc/cdi/nvidia.yaml|json, /var/run/cdi/nvidia.yaml|json",
        },
    ),
    (
        "--nvidia-ctk",
        {
            "metavar": "PATH",
            "help": "instead of a spec file, run '<PATH> cdi generate --format=json' at start-up",
        },
    ),
    (
        "--static-layout",
        {
            "metavar": "FILE",
            "type": Path,
            "help": "static layout file (the format of 'gpu-slicer slices --static-layout'): "
            "the existing instances advertised when the apiserver has no partitionable devices",
        },
    ),
    (
        "--advertise",
        {
            "help": "partitionable: every MIG slice the GPUs could host, with shared counters, "
            "instances made just in time; static: only the instances that exist (the static "
            "layout), for Kubernetes releases before 1.37 in clusters beyond about "
            f"{DEGRADES_AT_NODES} GPU nodes (docs/install-kubernetes.md)",
        },
    ),
    (
        "--profiles",
        {
            "metavar": "LIST",
            "help": "advertise only these MIG profiles (partitionable layout; the whole GPU "
            "stays): names or patterns, '-' excludes, e.g. 1g.10gb,2g.20gb,3g.40gb,7g.80gb or "
            "-*+me,-1g.20gb; fewer devices per node cost the scheduler less for every DRA pod "
            "(docs/agent.md); empty: all",
        },
    ),
    (
        "--advertised-profiles",
        {
            "help": "asked: of those profiles, only the ones the cluster's claims and claim "
            "templates ask for, plus --always-advertise (a new shape waits only for the "
            "agents to republish); all: every one, all the time (docs/agent.md; default asked)",
        },
    ),
    (
        "--always-advertise",
        {
            "metavar": "LIST",
            "help": "MIG profiles advertised whether or not anyone asks (the --profiles syntax), "
            "e.g. 1g.10gb,3g.40gb; empty: none",
        },
    ),
    (
        "--withdraw-after",
        {
            "type": float_or_text,
            "help": "seconds a profile nobody asks for any more stays advertised (default "
            "1800); devices that are allocated or prepared stay whatever their profile",
        },
    ),
    (
        "--attributes",
        {
            "help": "full: every attribute and capacity the agent knows of a device; minimal: "
            "only those gpu-slicer's classes, claims and status read, which costs the "
            "scheduler less for every DRA pod of every driver (docs/agent.md)",
        },
    ),
    (
        "--lock-wait",
        {
            "type": float_or_text,
            "help": "seconds to wait for another agent on the same --checkpoint-dir to exit (a "
            "rolling update); 0 exits 2 at once",
        },
    ),
)
"""``agent run``'s flags; each is a field of :class:`slicer.settings.AgentSettings`, whose
defaults apply when neither the flag nor its environment twin is given."""


def register_agent(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpu-slicer agent run``."""
    agent = subparsers.add_parser("agent", help="the node agent (DRA kubelet plugin for MIG)")
    commands = agent.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="run the node agent: publish slices, serve the kubelet, reconcile",
        description="Every flag has an environment-variable twin, shown in brackets; flags "
        "win over the environment.",
    )
    for flag, options in _AGENT_FLAGS:
        twin = env_name(flag[2:])
        help_text = str(options.get("help", ""))
        if twin not in help_text:
            help_text += f" [{twin}]"
        run.add_argument(flag, **{**options, "help": help_text})
    run.set_defaults(func=run_agent)
    register_simulate_event(commands)


def register_simulate_event(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpu-slicer agent simulate-event``."""
    event = commands.add_parser(
        "simulate-event",
        help="give a running agent's simulated GPU a health event (Xid, lost, recovered)",
        description="The agent must run with --backend simulated --simulate-state FILE; it "
        "takes the event within a second, as if NVML had reported it.",
    )
    event.add_argument(
        "--simulate-state",
        metavar="FILE",
        type=Path,
        required=True,
        help="the running agent's --simulate-state file",
    )
    event.add_argument("--gpu", type=int, required=True, help="the GPU's index")
    kind = event.add_mutually_exclusive_group(required=True)
    kind.add_argument("--xid", type=int, help="an Xid error, e.g. 79 (critical) or 13 (not)")
    kind.add_argument("--lost", action="store_true", help="the GPU falls off the bus")
    kind.add_argument(
        "--recovered",
        action="store_true",
        help="the GPU was reset and answers again (its MIG instances are gone)",
    )
    event.set_defaults(func=run_simulate_event)


def run_simulate_event(args: argparse.Namespace) -> int:
    from gpu_slicer.slicer.simulated_store import queue_event, read_state

    try:
        gpus = read_state(args.simulate_state)["gpus"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"gpu-slicer agent simulate-event: --simulate-state {args.simulate_state} is not "
            f"a running simulated agent's state file: {exc}",
            file=sys.stderr,
        )
        return 2
    if not 0 <= args.gpu < len(gpus):
        print(
            f"gpu-slicer agent simulate-event: --gpu {args.gpu}: the node has GPUs "
            f"0-{len(gpus) - 1}",
            file=sys.stderr,
        )
        return 2
    if args.xid is not None:
        event = HealthEvent(args.gpu, "xid", xid=args.xid)
    elif args.lost:
        event = HealthEvent(args.gpu, "gpu-lost")
    else:
        event = HealthEvent(args.gpu, "recovered")
    path = queue_event(args.simulate_state, event)
    print(f"queued {event.kind} on GPU {args.gpu}: {path}")
    return 0


def agent_settings(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> AgentSettings:
    """The agent's settings: defaults, then the environment, then the flags given; deprecated
    spellings are logged as warnings."""
    flags = {
        flag[2:]: getattr(args, flag[2:].replace("-", "_"))
        for flag, _ in _AGENT_FLAGS
        if getattr(args, flag[2:].replace("-", "_")) is not None
    }
    settings, warnings = AgentSettings.from_sources(flags, environ)
    for warning in warnings:
        log.warning(warning)
    return settings


class _Refusal(Exception):
    """Ends ``agent run`` before the agent runs: the message for stderr and the exit code
    (2: the flags are wrong, 1: the node or the cluster failed)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def run_agent(args: argparse.Namespace) -> int:
    """Check every setting before anything touches the GPUs, then run the agent until SIGTERM
    or SIGINT."""
    try:
        settings = _checked_settings(args)
        config = _agent_config(settings)
        lock = _lock(settings.checkpoint_dir, settings.seconds("lock_wait"))
        backend = _open_backend(settings)
        api = _open_api(settings)
        _check_layout(config.static_layout, backend, config.profiles)
        agent = _build_agent(config, backend, api)
    except _Refusal as exc:
        print(f"gpu-slicer agent run: {exc}", file=sys.stderr)
        return exc.code
    return _serve(agent, backend, lock)


def _checked_settings(args: argparse.Namespace) -> AgentSettings:
    try:
        return agent_settings(args).check()
    except SettingsError as exc:
        raise _Refusal(exc.problems[0]) from exc


def _agent_config(settings: AgentSettings) -> AgentConfig:
    """What the agent's parts are built from (:meth:`AgentSettings.agent_config`), with the
    toolkit's CDI edits found, read or generated here (a failing nvidia-ctk is a runtime
    failure, not a bad flag)."""
    edits = _common_edits(settings)
    try:
        return settings.agent_config(edits)
    except SettingsError as exc:
        raise _Refusal(exc.problems[0]) from exc


def _common_edits(settings: AgentSettings) -> CommonEdits:
    """The toolkit's edits; a spec named by flag must be usable, nvidia-ctk must run."""
    if settings.toolkit_cdi_spec and settings.nvidia_ctk:
        raise _Refusal("give --toolkit-cdi-spec or --nvidia-ctk, not both")
    try:
        return _toolkit_edits(settings)
    except CdiError as exc:
        if settings.toolkit_cdi_spec:
            raise _Refusal(f"--toolkit-cdi-spec: {exc}") from exc
        raise _Refusal(f"--nvidia-ctk: {exc}", code=1) from exc


def _toolkit_edits(settings: AgentSettings) -> CommonEdits:
    """The toolkit's common CDI edits: the named file, nvidia-ctk, or the first usual file."""
    if settings.toolkit_cdi_spec:
        return load_toolkit_spec(settings.toolkit_cdi_spec)
    if settings.nvidia_ctk:
        return toolkit_spec_from_ctk(settings.nvidia_ctk)
    found = find_toolkit_spec(
        (*TOOLKIT_SPEC_PATHS, settings.cdi_dir / "nvidia.yaml", settings.cdi_dir / "nvidia.json")
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


def _open_backend(settings: AgentSettings) -> GpuBackend:
    try:
        return _backend(settings)
    except GpuSpecError as exc:
        raise _Refusal(f"--simulate-gpus: {exc}") from exc
    except GpuSlicerError as exc:
        raise _Refusal(f"cannot open the GPUs: {exc}", code=1) from exc


def _backend(settings: AgentSettings) -> GpuBackend:
    if settings.backend == "simulated":
        simulated = SimulatedBackend(settings.simulate_gpus, node_name=settings.node)
        if settings.simulate_state:
            from gpu_slicer.slicer.simulated_store import PersistedBackend

            return PersistedBackend(simulated, Path(settings.simulate_state))
        return simulated
    from gpu_slicer.slicer.nvml import NvmlBackend

    return NvmlBackend()


def _open_api(settings: AgentSettings) -> KubeApi:
    try:
        return _api(settings)
    except KubeError as exc:
        hint = (
            "; to run without a cluster, add --kube memory (an in-memory API, with "
            "--backend simulated)"
            if settings.kube == "cluster"
            else ""
        )
        raise _Refusal(f"{exc}{hint}", code=1) from exc


def _api(settings: AgentSettings) -> KubeApi:
    if settings.kube == "memory":
        from gpu_slicer.kube.memory import InMemoryKubeApi

        return InMemoryKubeApi()
    from gpu_slicer.kube.client import RealKubeApi

    return RealKubeApi.from_config(settings.kubeconfig)


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
    except CheckpointTooNew as exc:  # a newer agent's checkpoint: the node, not the flags
        raise _Refusal(f"cannot start: {exc}", code=1) from exc
    except GpuSlicerError as exc:  # e.g. a socket path over the kernel's limit
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
    except (GpuSlicerError, OSError) as exc:
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
