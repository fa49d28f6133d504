"""Hollow nodes whose pools the agent's own publisher writes, advertising what the cluster's
claim templates ask for: how long a pod of a shape no node advertised yet waits, on the real
scheduler.

Each hollow node has the agent's :class:`slicer.publisher.SlicePublisher` and the agent's
reading of demand (:mod:`slicer.demand`: the templates read against the node's GPUs, the same
``Demand`` bookkeeping). One watch of the templates stands for every agent's own (they see the
same events); on a change the nodes republish from a pool of workers, as agents on separate
machines would, each as soon as its turn comes. A pod binds once the first node that can host
it has published, so the wait measured is the agents' reaction, one node's publish and the
scheduler's retry, from the pod's creation.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpu_slicer.core.errors import GpuSlicerError
from gpu_slicer.core.identity import RESOURCE_API
from gpu_slicer.kube.api import KubeApi
from gpu_slicer.kube.errors import KubeError
from gpu_slicer.kube.watch_cache import WatchCache
from gpu_slicer.slicer.demand import Advertised, ClaimAsks, Demand, DeviceMenu, read_template
from gpu_slicer.slicer.inventory import GpuState
from gpu_slicer.slicer.preview import preview_gpus
from gpu_slicer.slicer.publisher import SlicePublisher
from gpu_slicer.slicer.simulated import SimulatedBackend

log = logging.getLogger(__name__)


@dataclass
class HollowAgents:
    """The agents of ``nodes`` (each with simulated ``gpus``), publishing what is asked."""

    api: KubeApi
    nodes: Sequence[str]
    gpus: str
    server_version: tuple[int, int]
    workers: int = 8

    def __post_init__(self) -> None:
        first = SimulatedBackend(self.gpus, node_name=self.nodes[0]).gpus()
        self.menu = DeviceMenu(first)
        self.demand = Demand(self.menu.profiles, withdraw_after_s=0.0)
        self.states: dict[str, list[GpuState]] = {n: preview_gpus(n, self.gpus) for n in self.nodes}
        self.publishers = {
            n: SlicePublisher(
                self.api,
                n,
                server_version=self.server_version,
                recheck_interval_s=None,
                report_scaling=False,
            )
            for n in self.nodes
        }
        self._lock = threading.Lock()
        self._writing = {n: threading.Lock() for n in self.nodes}
        """One publish per node at a time, as the agent's reconciler runs them."""
        self._shown: frozenset[str] | None = None
        self._chosen: Advertised | None = None
        self.published: dict[str, float] = {}
        """When each node's first publish of the latest change completed (monotonic seconds):
        a node may publish the same change twice (both queued changes run it), once counts."""
        self._threads = ThreadPoolExecutor(self.workers)
        self.templates: WatchCache[frozenset[str]] = WatchCache(
            self.api,
            RESOURCE_API,
            "ResourceClaimTemplate",
            lambda template: read_template(template, self.menu).asked,
            watch_timeout_s=60.0,
            on_change=self._changed,
        )

    def start(self) -> None:
        """Publish what is asked now (nothing, at first) and follow the templates."""
        self._changed()
        self.templates.start()

    def wait_published(self, timeout_s: float) -> float | None:
        """When every node had published the latest change (monotonic), or None after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.published) >= len(self.nodes):
                    return max(self.published.values())
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        self.templates.stop(timeout_s=1)
        self._threads.shutdown(wait=True)

    def _changed(self) -> None:
        with self._lock:
            asked = frozenset().union(*self.templates.values())
            now = time.monotonic()
            self.demand.observe(ClaimAsks(asked), now)
            chosen = self.demand.advertised(now)
            shown = frozenset(p for p in self.menu.profiles if chosen.allows(p))
            if shown == self._shown:
                return
            self._shown = shown
            self._chosen = chosen
            self.published = {}
        order = list(self.nodes)
        random.shuffle(order)  # no node is always first to publish
        for node in order:
            self._threads.submit(self._publish, node)

    def _publish(self, node: str) -> None:
        """The latest choice, as the agent's reconciler publishes what it sees when it runs."""
        try:
            with self._writing[node]:
                with self._lock:
                    chosen = self._chosen
                self.publishers[node].publish(self.states[node], profiles=chosen)
            with self._lock:
                if chosen is self._chosen:  # else the newer change's own publish counts
                    self.published.setdefault(node, time.monotonic())
        except (KubeError, GpuSlicerError) as exc:
            log.warning("hollow agent could not publish", extra={"node": node, "error": str(exc)})
