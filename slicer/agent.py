"""The node agent: discovery, publishing, the kubelet plugin, the reconciler, health, metrics.

:class:`NodeAgent` wires the parts (each in its own module) and owns their threads:

* ``claim-watch``  keeps the ResourceClaim cache current (slicer.claims), retrying with backoff
  while the apiserver is unreachable; prepared claims keep working from the checkpoint;
* ``health``       turns backend health events into taints (slicer.health);
* ``reconciler``   runs a pass every ``reconcile_interval_s`` and whenever a claim, the state or
  health changes (slicer.reconciler); its passes publish the ResourceSlices (slicer.publisher).
  A change of device order alone (``best-fit`` following allocations) goes through a
  :class:`slicer.ordering.RepublishLimiter`: at most one such rewrite per
  ``republish_interval_s``; the publisher answers how long it held the order back and the
  reconciler wakes up then to publish it. The same wake-up drives the publisher's periodic
  version check and, after a fallback to the static layout, its probe for partitionable devices;
* the gRPC servers of the kubelet plugin (slicer.plugin);
* the Prometheus metrics server.

``gpu-slicer agent run`` (:func:`register_agent`) builds the backend and API client from flags
(each with an environment-variable twin) and runs a NodeAgent until SIGTERM or SIGINT, then stops
it cleanly: the registration socket goes first, in-flight calls finish, sockets are removed. The
ResourceSlices stay: a restarted agent takes them over instead of making the scheduler think the
devices vanished. The simulator embeds NodeAgent directly with an in-memory API.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import start_http_server

from kube.api import KubeApi
from kube.errors import KubeError
from slicer import agent_lock
from slicer.agent_metrics import AgentMetrics
from slicer.backend import GpuBackend, model_of
from slicer.cdi import (
    FALLBACK_EDITS,
    TOOLKIT_SPEC_PATHS,
    CdiDirectory,
    CdiError,
    CommonEdits,
    find_toolkit_spec,
    load_toolkit_spec,
    toolkit_spec_from_ctk,
)
from slicer.checkpoint import CheckpointStore
from slicer.claims import DRIVER, ClaimCache
from slicer.errors import BackendError, GpuSpecError, SlicerError
from slicer.health import HealthTracker
from slicer.inventory import default_mode, effective_mode
from slicer.layout import LayoutError, StaticLayout
from slicer.mig_mode import GpuMode, MigModeManager
from slicer.ordering import POLICIES, RepublishLimiter
from slicer.plugin import DraDriver, PluginServer
from slicer.publisher import PublisherMetrics, SlicePublisher
from slicer.reconciler import NodeView, Reconciler, Republish
from slicer.state import DeviceState

log = logging.getLogger(__name__)

KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
KUBELET_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CDI_DIR = "/var/run/cdi"
CHECKPOINT_DIR = "/var/lib/gpu-slicer"


@dataclass(frozen=True)
class AgentConfig:
    """Where the agent keeps its files and sockets, and how often it reconciles."""

    node: str
    checkpoint_dir: Path = Path(CHECKPOINT_DIR)
    cdi_dir: Path = Path(CDI_DIR)
    plugins_dir: Path = Path(KUBELET_PLUGINS_DIR)
    registry_dir: Path = Path(KUBELET_REGISTRY_DIR)
    metrics_bind: str = ":9464"
    """``host:port`` for /metrics; empty: no metrics server."""
    reconcile_interval_s: float = 30.0
    stale_prepare_s: float = 120.0
    policy: str = "best-fit"
    republish_interval_s: float = 10.0
    """At least this long between two rewrites that only change the device order."""
    republish_quiet_s: float = 2.0
    """A new device order must hold this long before it is written (a burst settles first)."""
    reprobe_interval_s: float = 600.0
    """How often the publisher re-reads the server version and, after a fallback to the static
    layout, probes for partitionable devices; 0: never (restart the agent instead)."""
    cdi_common: CommonEdits = FALLBACK_EDITS
    """The edits every claim's CDI spec carries (the NVIDIA Container Toolkit's, when found)."""
    static_layout: StaticLayout | None = None
    """Which existing instances the static layout (no counters) advertises besides the agent's."""


class NodeAgent:
    """One node's agent; :meth:`start` runs everything, :meth:`stop` ends it."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        backend: GpuBackend,
        api: KubeApi,
        metrics: AgentMetrics | None = None,
        republish: Republish | None = None,
        modes: dict[int, GpuMode] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.backend = backend
        self.api = api
        self.metrics = metrics or AgentMetrics()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server: Any = None
        self.mig = MigModeManager(
            backend,
            modes if modes is not None else discover_modes(backend),
            on_blocked=lambda gpu, _msg: self.metrics.mig_mode_blocked.labels(str(gpu)).inc(),
        )
        self.state = DeviceState(
            backend,
            CheckpointStore(config.checkpoint_dir),
            CdiDirectory(config.cdi_dir, config.cdi_common),
            mig=self.mig,
            metrics=self.metrics,
            on_change=self._nudge,
            static_layout=config.static_layout,
        )
        self.claims = ClaimCache(
            api,
            pool=config.node,
            on_change=self._nudge,
            on_error=lambda _error: self.metrics.api_errors.labels("watch-claims").inc(),
        )
        self.health = HealthTracker(backend, on_change=self._nudge, metrics=self.metrics)
        if republish is None:
            self.limiter: RepublishLimiter | None = RepublishLimiter(
                min_interval_s=config.republish_interval_s,
                quiet_s=min(config.republish_quiet_s, config.republish_interval_s),
                clock=clock,
            )
            self.publisher: SlicePublisher | None = SlicePublisher(
                api,
                config.node,
                policy=config.policy,
                metrics=PublisherMetrics(self.metrics.registry),
                limiter=self.limiter,
                recheck_interval_s=config.reprobe_interval_s or None,
                static_layout=config.static_layout,
                clock=clock,
            )
            republish = self._publish
        else:
            self.limiter = None
            self.publisher = None
        self.reconciler = Reconciler(
            self.state,
            self.claims,
            pool=config.node,
            health=self.health,
            republish=republish,
            stale_after_s=config.stale_prepare_s,
            clock=clock,
        )
        self.driver = DraDriver(self.state, self.claims, pool=config.node)
        self.plugin = PluginServer(
            self.driver, plugins_dir=config.plugins_dir, registry_dir=config.registry_dir
        )

    def _report_facts(self) -> None:
        """Say at start-up what pods will get: CUDA libraries or not, catalog or GPU figures."""
        common = self.config.cdi_common
        self.metrics.cdi_toolkit_edits.set(1 if common.from_toolkit else 0)
        if common.from_toolkit:
            log.info(
                "claim CDI specs carry the NVIDIA Container Toolkit's edits",
                extra={"source": common.source},
            )
        else:
            log.warning(
                "no NVIDIA Container Toolkit CDI spec found (--toolkit-cdi-spec, --nvidia-ctk, "
                "/etc/cdi/nvidia.yaml, /var/run/cdi/nvidia.yaml): pods get their GPU's device "
                "nodes but not the driver's libraries, so CUDA will not run in them; run "
                "'nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml' on the node"
            )
        for info in self.backend.gpus():
            self.metrics.catalog_differences.labels(str(info.index)).set(
                len(info.catalog_differences)
            )

    def _publish(self, view: NodeView) -> float | None:
        """Publish; returns when to publish again although nothing changed (or None)."""
        assert self.publisher is not None
        result = self.publisher.publish(view.gpus, allocated=view.allocated)
        if result.deferred_s is not None:
            log.debug("device order change held back", extra={"seconds": result.deferred_s})
        waits = [w for w in (result.deferred_s, self.publisher.recheck_in()) if w is not None]
        return min(waits) if waits else None

    def _nudge(self) -> None:
        # Before start() the reconciler does not exist yet (DeviceState may call during init).
        reconciler = getattr(self, "reconciler", None)
        if reconciler is not None:
            reconciler.nudge()

    def start(self) -> None:
        if self.state.load_problem:
            log.error(
                "started with an unusable checkpoint; reconciling against the GPUs",
                extra={"problem": self.state.load_problem},
            )
        self._report_facts()
        self.claims.start()
        self._spawn("health", lambda: self.health.run(self._stop))
        self._spawn(
            "reconciler", lambda: self.reconciler.run(self._stop, self.config.reconcile_interval_s)
        )
        self.plugin.start()
        if self.config.metrics_bind:
            host, _, port = self.config.metrics_bind.rpartition(":")
            try:
                self._metrics_server, _ = start_http_server(
                    int(port), addr=host or "0.0.0.0", registry=self.metrics.registry
                )
            except OSError as exc:
                raise OSError(
                    exc.errno, f"--metrics-bind {self.config.metrics_bind}: {exc.strerror}"
                ) from exc
        log.info(
            "node agent running", extra={"node": self.config.node, "gpus": len(self.backend.gpus())}
        )

    def stop(self) -> None:
        """Stop serving, then stop the threads; safe to call twice."""
        self._stop.set()
        self.plugin.stop()
        self.reconciler.nudge()
        self.claims.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()
        self.driver.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        log.info("node agent stopped", extra={"node": self.config.node})

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)


def discover_modes(backend: GpuBackend) -> dict[int, GpuMode]:
    """Each GPU's mode: dynamic on Hopper and newer, MIG slices on Ampere, full when unknown."""
    modes: dict[int, GpuMode] = {}
    for info in backend.gpus():
        model = model_of(info)
        if model is None:
            modes[info.index] = "full"
            continue
        modes[info.index] = effective_mode(default_mode(model), model)
    return modes


# --- the CLI ---------------------------------------------------------------------------------


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


def _seconds(flag: str, value: object, *, zero: bool) -> float | str:
    """A valid number of seconds, or the usage message naming the flag."""
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
        return f"{flag} must be a number of seconds {bound}, not {value!r}"
    return value


def _usage(message: str) -> int:
    print(f"gpu-slicer agent run: {message}", file=sys.stderr)
    return 2


_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _flag_problem(args: argparse.Namespace) -> str | None:
    """The first bad flag value, named; environment twins bypass argparse's own checks."""
    if not args.node:
        return "--node is required (or set GPU_SLICER_NODE / NODE_NAME)"
    if len(args.node) > 253 or not _NODE_NAME.fullmatch(args.node):
        return (
            f"--node {args.node!r} is not a valid node name: lower-case letters, digits, "
            "'-' and '.', at most 253 characters"
        )
    for flag, value, choices in (
        ("--backend", args.backend, ("nvml", "simulated")),
        ("--kube", args.kube, ("cluster", "memory")),
        ("--policy", args.policy, tuple(POLICIES)),
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
    problem = _flag_problem(args)
    if problem:
        return _usage(problem)
    reconcile_interval = _seconds("--reconcile-interval", args.reconcile_interval, zero=False)
    if isinstance(reconcile_interval, str):
        return _usage(reconcile_interval)
    republish_interval = _seconds("--republish-interval", args.republish_interval, zero=False)
    if isinstance(republish_interval, str):
        return _usage(republish_interval)
    reprobe_interval = _seconds("--reprobe-interval", args.reprobe_interval, zero=True)
    if isinstance(reprobe_interval, str):
        return _usage(reprobe_interval)
    lock_wait = _seconds("--lock-wait", args.lock_wait, zero=True)
    if isinstance(lock_wait, str):
        return _usage(lock_wait)
    try:
        layout = StaticLayout.load(args.static_layout) if args.static_layout else None
    except LayoutError as exc:
        return _usage(f"--static-layout: {exc}")
    if args.toolkit_cdi_spec and args.nvidia_ctk:
        return _usage("give --toolkit-cdi-spec or --nvidia-ctk, not both")
    try:
        common = _toolkit_edits(args)
    except CdiError as exc:
        if args.toolkit_cdi_spec:
            return _usage(f"--toolkit-cdi-spec: {exc}")
        print(f"gpu-slicer agent run: --nvidia-ctk: {exc}", file=sys.stderr)
        return 1
    try:  # before anything touches the GPUs, sockets, checkpoint or CDI specs
        lock = agent_lock.acquire(
            args.checkpoint_dir,
            wait_s=lock_wait,
            on_wait=lambda holder: log.info(
                "waiting for the agent lock", extra={"holder": holder, "wait_s": lock_wait}
            ),
        )
    except agent_lock.AgentLockHeld as exc:
        return _usage(str(exc))
    except OSError as exc:
        print(f"gpu-slicer agent run: cannot lock --checkpoint-dir: {exc}", file=sys.stderr)
        return 1
    try:
        backend = _backend(args)
    except GpuSpecError as exc:
        return _usage(f"--simulate-gpus: {exc}")
    except SlicerError as exc:
        print(f"gpu-slicer agent run: cannot open the GPUs: {exc}", file=sys.stderr)
        return 1
    try:
        api = _api(args)
    except KubeError as exc:
        hint = (
            "; to run without a cluster, add --kube memory (an in-memory API, with "
            "--backend simulated)"
            if args.kube == "cluster"
            else ""
        )
        print(f"gpu-slicer agent run: {exc}{hint}", file=sys.stderr)
        return 1
    if layout is not None:
        try:
            layout.check([model_of(info) for info in backend.gpus()])
        except LayoutError as exc:
            return _usage(f"--static-layout: {exc}")
        except BackendError as exc:
            print(f"gpu-slicer agent run: cannot open the GPUs: {exc}", file=sys.stderr)
            return 1
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
        cdi_common=common,
        static_layout=layout,
    )
    try:
        agent = NodeAgent(config, backend=backend, api=api)
    except (BackendError, OSError) as exc:
        print(f"gpu-slicer agent run: cannot start: {exc}", file=sys.stderr)
        return 1
    except SlicerError as exc:  # e.g. a socket path over the kernel's limit
        return _usage(str(exc))
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


def _backend(args: argparse.Namespace) -> GpuBackend:
    if args.backend == "simulated":
        from slicer.simulated import SimulatedBackend

        simulated = SimulatedBackend(args.simulate_gpus, node_name=args.node)
        if args.simulate_state:
            from slicer.simulated_store import PersistedBackend

            return PersistedBackend(simulated, Path(args.simulate_state))
        return simulated
    from slicer.nvml import NvmlBackend

    return NvmlBackend()


def _api(args: argparse.Namespace) -> KubeApi:
    if args.kube == "memory":
        from kube.memory import InMemoryKubeApi

        return InMemoryKubeApi()
    from kube.client import RealKubeApi

    return RealKubeApi.from_config(args.kubeconfig)


__all__ = ["DRIVER", "AgentConfig", "NodeAgent", "discover_modes", "register_agent"]
