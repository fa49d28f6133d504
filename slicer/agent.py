"""The node agent: discovery, publishing, the kubelet plugin, the reconciler, health, metrics.

:func:`assemble` wires the agent's parts (below); :class:`NodeAgent` runs them and owns their
threads:

* ``claim-watch``  keeps the ResourceClaim cache current (slicer.claim_cache), retrying with backoff
  while the apiserver is unreachable; prepared claims keep working from the checkpoint;
* ``health``       turns backend health events into taints (slicer.health);
* ``reconciler``   runs a pass every ``reconcile_interval_s`` and whenever a claim, the state or
  health changes (slicer.reconciler); its passes publish the ResourceSlices (slicer.publisher).
  A change of device order alone (``best-fit`` following allocations) goes through a
  :class:`slicer.ordering.RepublishLimiter`: at most one such rewrite per
  ``republish_interval_s``; the publisher answers how long it held the order back and the
  reconciler wakes up then to publish it. The same wake-up drives the publisher's periodic
  version check and, after a fallback to the static layout, its probe for partitionable devices;
* the gRPC servers of the kubelet plugin (slicer.plugin), with the resource-health stream of
  every device (slicer.device_health);
* the Prometheus metrics server.

``gpu-slicer agent run`` (slicer.cli) runs a NodeAgent until SIGTERM or SIGINT, then
:meth:`NodeAgent.stop` ends it cleanly: the registration socket goes first, in-flight calls
finish, sockets are removed. The ResourceSlices stay: a restarted agent takes them over instead
of making the scheduler think the devices vanished.

The agent process (:class:`NodeAgent`), the agent's tests and the simulator's API-mode node all
build the same graph with :func:`assemble` (checkpoint, CDI specs, device state, claim cache,
health, reconciler, slice publisher, DRA driver), so that what the tests exercise cannot drift
from what runs on a node. :func:`assemble` starts no thread and binds no socket: the caller
decides what runs.

The state, the claim cache and health ask for a reconcile pass when they change, yet the
reconciler needs them to exist first. :func:`assemble` breaks that cycle with the reconciler's
wake-up event, made before any part and handed out as their ``on_change``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from prometheus_client import start_http_server

from gpu_slicer.kube.api import KubeApi
from gpu_slicer.slicer.agent_metrics import AgentMetrics, PublisherMetrics
from gpu_slicer.slicer.backend import GpuBackend, model_of
from gpu_slicer.slicer.cdi import FALLBACK_EDITS, CdiDirectory, CommonEdits
from gpu_slicer.slicer.checkpoint import CheckpointStore
from gpu_slicer.slicer.claim_cache import ClaimCache
from gpu_slicer.slicer.clock import SYSTEM_CLOCK, Clock
from gpu_slicer.slicer.demand import (
    DEFAULT_WITHDRAW_AFTER_S,
    AdvertisedProfiles,
    Demand,
    DeviceMenu,
)
from gpu_slicer.slicer.demand_watch import NodeDemand
from gpu_slicer.slicer.device_attributes import DeviceAttributes
from gpu_slicer.slicer.device_health import HealthFeed
from gpu_slicer.slicer.health import HealthTracker
from gpu_slicer.slicer.inventory import default_mode
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.slicer.mig_mode import GpuMode, MigModeManager
from gpu_slicer.slicer.ordering import RepublishLimiter
from gpu_slicer.slicer.plugin import DraDriver, PluginServer
from gpu_slicer.slicer.pool_watch import PoolWatch
from gpu_slicer.slicer.profile_filter import ProfileFilter
from gpu_slicer.slicer.publisher import SlicePublisher
from gpu_slicer.slicer.reconciler import NodeView, Reconciler, Republish
from gpu_slicer.slicer.state import DeviceState

log = logging.getLogger(__name__)

KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
KUBELET_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CDI_DIR = "/var/run/cdi"
CHECKPOINT_DIR = "/var/lib/gpu-slicer"


Advertise = Literal["partitionable", "static"]
ADVERTISE_CHOICES: tuple[Advertise, ...] = get_args(Advertise)


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
    device_order: str = "best-fit"
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
    profiles: ProfileFilter | None = None
    """The MIG profiles the partitionable layout may ever advertise; None: every profile."""
    advertised_profiles: AdvertisedProfiles = "asked"
    """``asked``: of those, the ones the cluster's claims and templates ask for, plus
    ``always_advertise`` (:mod:`slicer.demand`); ``all``: every one, all the time."""
    always_advertise: ProfileFilter | None = None
    """Profiles advertised whether or not anyone asks (the admin's floor)."""
    withdraw_after_s: float = DEFAULT_WITHDRAW_AFTER_S
    """How long a profile nobody asks for any more stays advertised."""
    attributes: DeviceAttributes = "full"
    """Which attributes and capacities each device carries (:mod:`slicer.device_attributes`)."""
    advertise: Advertise = "partitionable"
    """``partitionable``: every slice the GPUs could host, with counters (falling back to the
    static layout on its own when the apiserver drops counters); ``static``: always the static
    layout, for releases whose scheduler does not scale with counters (:mod:`slicer.scaling`)."""
    report_scaling: bool = True
    """Warn (log, gauge) when counters go to a release whose scheduler pays for them with the
    square of the node count; False where no real scheduler reads the pool (the simulator)."""


@dataclass(frozen=True)
class AgentParts:
    """An agent's parts, wired to each other and to ``metrics``; none of them running yet."""

    metrics: AgentMetrics
    state: DeviceState
    """Prepares and unprepares; owns the MIG-mode manager (``state.mig``)."""
    claims: ClaimCache
    health: HealthTracker
    health_feed: HealthFeed
    """Each device's health for the kubelet's resource-health stream."""
    reconciler: Reconciler
    driver: DraDriver
    publisher: SlicePublisher | None
    """The ResourceSlice writer (with its republish limiter); None when the caller gave its own
    ``republish``."""
    limiter: RepublishLimiter | None = None
    """The publisher's limiter on device-order-only rewrites (paced by the clock's
    ``monotonic``); None without a publisher."""
    demand: NodeDemand | None = None
    """What the cluster asks of this node (its template watch runs with the agent); None when
    every profile is advertised, or without a publisher."""
    pool_watch: PoolWatch | None = None
    """This node's slices as the API holds them (its watch runs with the agent): what another
    hand deleted is published again; None without a publisher."""


def assemble(
    config: AgentConfig,
    *,
    backend: GpuBackend,
    api: KubeApi,
    metrics: AgentMetrics | None = None,
    modes: dict[int, GpuMode] | None = None,
    republish: Republish | None = None,
    clock: Clock = SYSTEM_CLOCK,
    max_parallel: int = 8,
) -> AgentParts:
    """Build the parts. ``republish`` replaces the slice publisher (tests record the views
    instead); ``clock`` paces republishing (``monotonic``) and stamps checkpoint entries (``time``);
    ``max_parallel`` is how many claims the driver prepares at once."""
    metrics = metrics or AgentMetrics()
    wake = threading.Event()
    feed: HealthFeed | None = None

    def changed() -> None:
        """The state or health changed: reconcile (republish) and re-check the health streams."""
        wake.set()
        if feed is not None:
            feed.changed()

    def mig_blocked(gpu: int, _message: str) -> None:
        metrics.mig_mode_blocked.labels(str(gpu)).inc()
        wake.set()  # the GPU's mode may have changed (kept as it is): republish

    mig = MigModeManager(
        backend, modes if modes is not None else discover_modes(backend), on_blocked=mig_blocked
    )
    state = DeviceState(
        backend,
        CheckpointStore(config.checkpoint_dir),
        CdiDirectory(config.cdi_dir, config.cdi_common),
        mig=mig,
        metrics=metrics,
        clock=clock.time,
        on_change=changed,
        static_layout=config.static_layout,
    )
    claims = ClaimCache(
        api,
        pool=config.node,
        on_change=wake.set,
        on_error=lambda _error: metrics.api_errors.labels("watch-claims").inc(),
    )
    health = HealthTracker(backend, on_change=changed, metrics=metrics)
    feed = HealthFeed(
        unhealthy=lambda: health.unhealthy,
        prepared=lambda: [d.device_name for e in state.entries().values() for d in e.devices],
    )
    publisher: SlicePublisher | None = None
    limiter: RepublishLimiter | None = None
    demand: NodeDemand | None = None
    pool_watch: PoolWatch | None = None
    if republish is None:
        limiter = RepublishLimiter(
            min_interval_s=config.republish_interval_s,
            quiet_s=min(config.republish_quiet_s, config.republish_interval_s),
            clock=clock.monotonic,
        )
        publisher = SlicePublisher(
            api,
            config.node,
            device_order=config.device_order,
            metrics=PublisherMetrics(metrics.registry),
            limiter=limiter,
            recheck_interval_s=config.reprobe_interval_s or None,
            static=config.advertise == "static",
            static_layout=config.static_layout,
            profiles=config.profiles,
            attributes=config.attributes,
            clock=clock,
            report_scaling=config.report_scaling,
        )
        if config.advertised_profiles == "asked" and config.advertise == "partitionable":
            menu = DeviceMenu(backend.gpus(), config.attributes)
            demand = NodeDemand(
                api,
                claims,
                menu,
                Demand(
                    menu.profiles,
                    floor=config.always_advertise,
                    limit=config.profiles,
                    withdraw_after_s=config.withdraw_after_s,
                ),
                clock,
                on_change=wake.set,
                on_error=lambda _error: metrics.api_errors.labels("watch-templates").inc(),
            )
        republish = _publishing(publisher, feed, demand)
        pool_watch = PoolWatch(
            api,
            config.node,
            on_change=wake.set,
            on_error=lambda _error: metrics.api_errors.labels("watch-slices").inc(),
        )
    reconciler = Reconciler(
        state,
        claims,
        pool=config.node,
        health=health,
        republish=republish,
        stale_after_s=config.stale_prepare_s,
        clock=clock.monotonic,
        wake=wake,
        publish_key=_publish_key(demand, pool_watch),
    )
    driver = DraDriver(state, claims, pool=config.node, max_parallel=max_parallel)
    return AgentParts(
        metrics,
        state,
        claims,
        health,
        feed,
        reconciler,
        driver,
        publisher,
        limiter,
        demand,
        pool_watch,
    )


def _publish_key(
    demand: NodeDemand | None, pool_watch: PoolWatch | None
) -> Callable[[], Hashable] | None:
    """What the pool depends on besides the node's view: the profiles asked for, the slices the
    API holds (one deleted must be written again)."""
    parts = [part.key for part in (demand, pool_watch) if part is not None]
    if not parts:
        return None
    return lambda: tuple(key() for key in parts)


def kubelet_plugin(config: AgentConfig, parts: AgentParts, *, workers: int = 8) -> PluginServer:
    """The kubelet plugin's gRPC servers in the configured folders (listening once started),
    with the resource-health service. Apart from :func:`assemble` because only an agent that
    serves the kubelet needs them."""
    return PluginServer(
        parts.driver,
        plugins_dir=config.plugins_dir,
        registry_dir=config.registry_dir,
        workers=workers,
        health=parts.health_feed,
    )


def discover_modes(backend: GpuBackend) -> dict[int, GpuMode]:
    """Each GPU's mode: dynamic on Hopper and newer, MIG slices on Ampere, full when unknown."""
    return {info.index: default_mode(model_of(info)) for info in backend.gpus()}


def _publishing(
    publisher: SlicePublisher, feed: HealthFeed, demand: NodeDemand | None
) -> Republish:
    """The reconciler's republish through ``publisher``, advertising what ``demand`` says the
    cluster asks for: it answers when to publish again although nothing changed (a held-back
    order change, the periodic version check, a profile due to be withdrawn). The devices it
    planned are the ones the health stream reports."""
    adopted = False

    def publish(view: NodeView) -> float | None:
        nonlocal adopted
        profiles = None
        if demand is not None:
            if not adopted:  # what an earlier run published stays until the delay passes
                demand.adopt(publisher.published_profiles())
                adopted = True
            profiles = demand.advertised()
        result = publisher.publish(view.gpus, allocated=view.allocated, profiles=profiles)
        feed.set_published(result.plan.order)
        if result.deferred_s is not None:
            log.debug("device order change held back", extra={"seconds": result.deferred_s})
        due = (
            result.deferred_s,
            publisher.recheck_in(),
            demand.next_withdrawal_in() if demand is not None else None,
        )
        waits = [w for w in due if w is not None]
        return min(waits) if waits else None

    return publish


__all__ = [
    "CDI_DIR",
    "CHECKPOINT_DIR",
    "KUBELET_PLUGINS_DIR",
    "KUBELET_REGISTRY_DIR",
    "AgentConfig",
    "AgentParts",
    "assemble",
    "discover_modes",
    "kubelet_plugin",
]


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
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.backend = backend
        self.api = api
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server: Any = None
        parts = assemble(
            config,
            backend=backend,
            api=api,
            metrics=metrics,
            modes=modes,
            republish=republish,
            clock=clock,
        )
        self.metrics = parts.metrics
        self.state = parts.state
        self.claims = parts.claims
        self.demand = parts.demand
        self.pool_watch = parts.pool_watch
        self.health = parts.health
        self.publisher = parts.publisher
        self.reconciler = parts.reconciler
        self.driver = parts.driver
        self.health_feed = parts.health_feed
        self.plugin = kubelet_plugin(config, parts)

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

    def start(self) -> None:
        if self.state.load_problem:
            log.error(
                "started with an unusable checkpoint; reconciling against the GPUs",
                extra={"problem": self.state.load_problem},
            )
        self._report_facts()
        self.claims.start()
        if self.demand is not None:
            self.demand.start()
        if self.pool_watch is not None:
            self.pool_watch.start()
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
        if self.demand is not None:
            self.demand.stop()
        if self.pool_watch is not None:
            self.pool_watch.stop()
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


__all__ = ["NodeAgent"]
