"""The node agent: discovery, publishing, the kubelet plugin, the reconciler, health, metrics.

:class:`NodeAgent` runs the parts :func:`slicer.assembly.assemble` wires, and owns their threads:

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
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import start_http_server

from gpu_slicer.kube.api import KubeApi
from gpu_slicer.slicer.agent_metrics import AgentMetrics
from gpu_slicer.slicer.assembly import AgentConfig, assemble, kubelet_plugin
from gpu_slicer.slicer.backend import GpuBackend
from gpu_slicer.slicer.clock import SYSTEM_CLOCK, Clock
from gpu_slicer.slicer.mig_mode import GpuMode
from gpu_slicer.slicer.reconciler import Republish

log = logging.getLogger(__name__)


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
