"""The node agent's Prometheus metrics, in a registry of its own (one per agent instance).

A registry per agent keeps tests (which start many agents in one process) from colliding on
metric names, and lets ``agent run`` serve exactly these metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class AgentMetrics:
    """Every metric the agent exports; names carry the ``gpu_slicer_agent_`` prefix."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.prepares = Counter(
            "gpu_slicer_agent_prepares",
            "Claims prepared, by outcome (ok, already: idempotent repeat, error)",
            ["outcome"],
            registry=r,
        )
        self.unprepares = Counter(
            "gpu_slicer_agent_unprepares",
            "Claims unprepared, by outcome (ok, absent, busy, error)",
            ["outcome"],
            registry=r,
        )
        self.prepare_seconds = Histogram(
            "gpu_slicer_agent_prepare_seconds",
            "Time to prepare one claim, GPU work included",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.instances = Gauge(
            "gpu_slicer_agent_instances",
            "MIG instances on this node's GPUs by profile and "
            "owner (agent: backs a prepared claim, foreign: made by someone else)",
            ["profile", "owner"],
            registry=r,
        )
        self.mig_created = Counter(
            "gpu_slicer_agent_mig_created",
            "MIG instances created to prepare a claim, by profile",
            ["profile"],
            registry=r,
        )
        self.mig_destroyed = Counter(
            "gpu_slicer_agent_mig_destroyed",
            "MIG instances destroyed when their claim was unprepared or rolled back, by profile",
            ["profile"],
            registry=r,
        )
        self.orphans_destroyed = Counter(
            "gpu_slicer_agent_orphans_destroyed",
            "Idle instances of the agent's that no "
            "prepared claim owned, destroyed by the reconciler",
            registry=r,
        )
        self.drift = Counter(
            "gpu_slicer_agent_drift_found",
            "Differences the reconciler found between the API, "
            "the checkpoint and the GPUs, by kind",
            ["kind"],
            registry=r,
        )
        self.free_memory_slices = Gauge(
            "gpu_slicer_agent_free_memory_slices",
            "Memory slices not covered by any MIG instance, per GPU",
            ["gpu"],
            registry=r,
        )
        self.busy_refusals = Counter(
            "gpu_slicer_agent_busy_refusals",
            "Destroys refused because processes still run on the instance",
            registry=r,
        )
        self.mig_mode_blocked = Counter(
            "gpu_slicer_agent_mig_mode_blocked",
            "MIG mode switches blocked by other clients or a pending reset",
            ["gpu"],
            registry=r,
        )
        self.checkpoint_problems = Counter(
            "gpu_slicer_agent_checkpoint_problems",
            "Unusable checkpoint files recovered by reconciling",
            registry=r,
        )
        self.api_errors = Counter(
            "gpu_slicer_agent_api_errors",
            "Failed calls to the Kubernetes API, by operation",
            ["operation"],
            registry=r,
        )
        self.api_reachable = Gauge(
            "gpu_slicer_agent_api_reachable",
            "1 while the claim watch is in sync with the apiserver",
            registry=r,
        )
        self.unhealthy_gpus = Gauge(
            "gpu_slicer_agent_unhealthy_gpus",
            "GPUs whose devices carry the unhealthy taint",
            registry=r,
        )
        self.republishes = Counter(
            "gpu_slicer_agent_republishes",
            "ResourceSlice republications, by outcome",
            ["outcome"],
            registry=r,
        )
        self.reconciles = Counter(
            "gpu_slicer_agent_reconciles", "Reconciler passes, by outcome", ["outcome"], registry=r
        )

        self.cdi_toolkit_edits = Gauge(
            "gpu_slicer_agent_cdi_toolkit_edits",
            "1 when claim CDI specs carry the NVIDIA "
            "Container Toolkit's common edits (driver libraries, hooks); 0: no toolkit spec was "
            "found and pods start without the CUDA libraries",
            registry=r,
        )
        self.catalog_differences = Gauge(
            "gpu_slicer_agent_catalog_differences",
            "Values where the GPU's own MIG profile "
            "facts (NVML) differ from the catalog, per GPU; the GPU's values are published",
            ["gpu"],
            registry=r,
        )

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when absent): for tests and the CLI."""
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found


class PublisherMetrics:
    """The slice publisher's metrics (``gpu_slicer_slices_``), in the registry given (the
    agent's) or a private one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.publishes = Counter(
            "gpu_slicer_slices_publishes",
            "Pool publications by result (written, unchanged, "
            "deferred: an order-only change held back by the rate limiter, error)",
            ["result"],
            registry=r,
        )
        self.conflicts = Counter(
            "gpu_slicer_slices_conflicts",
            "Slice writes retried after a Conflict or an unavailable apiserver",
            registry=r,
        )
        self.counters_dropped = Counter(
            "gpu_slicer_slices_counters_dropped",
            "Times the apiserver dropped shared counters "
            "from written slices (no partitionable devices)",
            registry=r,
        )
        self.static_layout = Gauge(
            "gpu_slicer_slices_static_layout",
            "1 while only existing instances are advertised "
            "because the apiserver has no partitionable devices",
            registry=r,
        )
        self.quadratic_scheduling = Gauge(
            "gpu_slicer_slices_quadratic_scheduling",
            "1 while this pool publishes counters to a Kubernetes release whose scheduler "
            "cost for them grows with the square of the nodes that do (before 1.37; "
            "docs/install-kubernetes.md#scheduler-scaling)",
            registry=r,
        )
        self.devices = Gauge(
            "gpu_slicer_slices_devices", "Devices in the published pool", registry=r
        )
        self.generation = Gauge(
            "gpu_slicer_slices_generation", "Generation of the published pool", registry=r
        )
        self.probes = Counter(
            "gpu_slicer_slices_partitionable_probes",
            "Dry-run probes, while in the static "
            "fallback, of whether the apiserver keeps counters now, by result (dropped, kept, "
            "error)",
            ["result"],
            registry=r,
        )
        self.restored = Counter(
            "gpu_slicer_slices_partitionable_restored",
            "Switches from the static fallback back "
            "to partitionable devices after a probe found counters kept",
            registry=r,
        )
