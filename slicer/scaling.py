"""How the kube-scheduler's cost for partitionable devices grows with the cluster, by release.

Partitionable devices put each GPU's counters in a ResourceSlice of their own. Up to Kubernetes
1.36 the scheduler's allocator treated every slice with counters as relevant to every node: for
each node it filters, it gathered the counter slices of every other node, found their pools
incomplete there and rescanned all slices for each of them (upstream issue fixed by kubernetes PR
#138917, in 1.37.0; no 1.36 patch release has it: the newest, 1.36.5, still gathers every
counter slice in ``k8s.io/dynamic-resource-allocation`` v0.36.5). Scheduler CPU per pod
then grows with the square of the number of nodes that publish counters, and every DRA pod pays
it, not only gpu-slicer's: with gpu-slicer's A100 x 8 pools at 100 nodes, a pod of another
driver took about 3 s of scheduler CPU on 1.36.3 (``bench/bench_scheduler.py``).

On such a release an admin keeps the cluster healthy beyond :data:`DEGRADES_AT_NODES` nodes by
running the agents with ``--advertise static`` (each node's static layout, without counters:
``docs/install-kubernetes.md#scheduler-scaling``).
"""

from __future__ import annotations

SCALES_FROM = (1, 37)
"""The first release whose scheduler filters a node with that node's counter slices only."""
DEGRADES_AT_NODES = 10
"""Nodes publishing counters from which, before :data:`SCALES_FROM`, a DRA pod costs the
scheduler several times what it costs without counters: measured on 1.36.3 with A100 x 8 nodes
(``bench/bench_scheduler.py``), a single-slice pod took 104 ms of scheduler CPU at 20 nodes
(16x a plain-device pod) and 2.7 s at 100 (144x); the cost grows with the square of the nodes,
so at 10 nodes it is about 4x."""


def partitionable_scales(version: tuple[int, int]) -> bool:
    """Whether a cluster at ``version`` (major, minor) schedules partitionable devices at a cost
    that grows with the node count, not its square."""
    return version >= SCALES_FROM


def release_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def quadratic_warning(version: tuple[int, int], nodes: int | None = None) -> str:
    """The line an admin reads where the cluster's release lacks the fix (agent log, status,
    plan): what happens, from what size, what to do."""
    where = f" ({nodes} GPU nodes here)" if nodes is not None else ""
    return (
        f"Kubernetes {release_text(version)} schedules partitionable devices at a cost that "
        f"grows with the square of the nodes publishing counters (fixed in "
        f"{release_text(SCALES_FROM)}){where}: past about {DEGRADES_AT_NODES} such nodes every "
        "DRA pod schedules slowly, not only gpu-slicer's. Upgrade to "
        f"{release_text(SCALES_FROM)}+, or run the agents with --advertise static "
        "(each node's static MIG layout, no counters)"
    )
