"""An agent upgraded from 0.1, which published under the driver name ``gpu-slicer.io``.

0.1's name sorted before almost every other driver, so every other driver's pod walked past
gpu-slicer's devices on every node (docs/install-kubernetes.md, "Scheduler scaling"); this
release publishes under ``z.gpu-slicer.io``. Claims allocated in 0.1's pool keep that name in
their allocation for their whole life. The agent therefore prepares and releases them as its
own, deletes 0.1's pool on its node, and keeps its new pool from offering what they hold: the
scheduler counts them only against the pool they were allocated from, which is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.core.devices import SliceSpec, WholeGpu
from gpu_slicer.core.identity import DRIVER, LEGACY_DRIVERS
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.sandbox import image, releases
from gpu_slicer.slicer.agent import AgentConfig, AgentParts, assemble
from gpu_slicer.slicer.inventory import GpuState, advertise_gpu
from gpu_slicer.slicer.plugin import ClaimRef
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.slicer.conftest import states_for
from tests.support.agent_fixtures import NODE, allocate_claim, build_agent

SLICES = ("resource.k8s.io/v1", "ResourceSlice")
OLD = LEGACY_DRIVERS[0]


def old_slice(node: str) -> dict[str, Any]:
    """A slice of 0.1's pool on ``node``, as 0.1's agent left it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu-slicer.io-000"},
        "spec": {
            "driver": OLD,
            "nodeName": node,
            "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def parts(api: InMemoryKubeApi, tmp_path: Path) -> AgentParts:
    backend = SimulatedBackend("A100-80GB:2", node_name=NODE)
    config = AgentConfig(
        node=NODE,
        checkpoint_dir=tmp_path / "c",
        cdi_dir=tmp_path / "d",
        advertised_profiles="all",
    )
    return assemble(config, backend=backend, api=api)


def published(api: InMemoryKubeApi) -> dict[str, dict[str, Any]]:
    """Device name -> device of this node's pool under the current name."""
    return {
        d["name"]: d
        for s in api.objects(*SLICES)
        if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == NODE
        for d in s["spec"].get("devices", ())
    }


def counters(api: InMemoryKubeApi, gpu: int) -> dict[str, str]:
    for s in api.objects(*SLICES):
        for counter_set in s["spec"].get("sharedCounters") or ():
            if counter_set["name"] == f"gpu-{gpu}-counters":
                return {k: v["value"] for k, v in counter_set["counters"].items()}
    raise AssertionError(f"no counter set for GPU {gpu}")


def reconcile(agent: AgentParts) -> None:
    agent.claims.sync_once()
    agent.reconciler.reconcile_once()


def test_0_1_s_pool_on_this_node_is_replaced_and_other_nodes_pools_stay(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    api.create(old_slice(NODE))
    api.create(old_slice("node-b"))  # that node's agent is not upgraded yet: not ours to touch
    reconcile(parts(api, tmp_path))
    pools = {(s["spec"]["driver"], s["spec"]["nodeName"]) for s in api.objects(*SLICES)}
    assert pools == {(DRIVER, NODE), (OLD, "node-b")}


def test_a_claim_of_0_1_s_pool_is_prepared_released_and_its_placement_never_offered_twice(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    agent = parts(api, tmp_path)
    reconcile(agent)
    full = published(api)
    assert "gpu-1-mig-3g40gb-4" in full and "gpu-1-mig-1g10gb-5" in full

    # Allocated by the scheduler from 0.1's pool before the upgrade, not prepared yet.
    claim = allocate_claim(api, ["gpu-1-mig-3g40gb-4"], driver=OLD)
    reconcile(agent)
    held = published(api)
    # Nothing overlapping slices 4-7 of GPU 1 is offered, and the counters say they are taken,
    # so the scheduler cannot give them to a claim of the new pool; GPU 0 is untouched.
    assert not any(
        n.startswith("gpu-1-mig-") and n.endswith(("-4", "-5", "-6", "-7")) for n in held
    )
    assert "gpu-1" not in held  # the whole GPU overlaps it too
    assert {n for n in full if n.startswith("gpu-0")} <= set(held)
    assert all(counters(api, 1)[f"memory-slice-{i}"] == "0" for i in range(4, 8))
    assert all(counters(api, 1)[f"memory-slice-{i}"] == "1" for i in range(4))

    uid, namespace, name = claim["metadata"]["uid"], "ml", claim["metadata"]["name"]
    outcome = agent.driver.prepare_one(ClaimRef(namespace, uid, name))
    assert outcome.error == ""
    assert [d.device_name for d in outcome.devices] == ["gpu-1-mig-3g40gb-4"]
    reconcile(agent)
    assert set(published(api)) == set(held)  # its instance now exists: still held, still taken

    assert agent.driver.unprepare_one(ClaimRef(namespace, uid, name)) == ""
    api.delete(*("resource.k8s.io/v1", "ResourceClaim"), name, namespace)
    reconcile(agent)
    assert set(published(api)) == set(full)
    assert agent.state.backend.instances(1) == []


def test_a_claim_of_the_current_name_keeps_its_device_offered() -> None:
    """The contrast: the scheduler counts a claim of this pool itself, so its device stays
    listed and the counters stay whole (withdrawing it would invalidate the allocation)."""
    (state,) = states_for("A100-80GB:1", mode="mig")
    mine = advertise_gpu(state, keep=frozenset({SliceSpec(0, "3g.40gb", 4)}))
    theirs = advertise_gpu(
        GpuState(state.info, state.mode, held_elsewhere=frozenset({SliceSpec(0, "3g.40gb", 4)}))
    )
    assert "gpu-0-mig-3g40gb-4" in {d.name for d in mine.devices}
    assert "gpu-0-mig-3g40gb-4" not in {d.name for d in theirs.devices}
    assert mine.counter_set is not None and theirs.counter_set is not None
    assert mine.counter_set.values["memory-slice-4"] == 1
    assert theirs.counter_set.values["memory-slice-4"] == 0


@pytest.mark.parametrize("mode", ["mig", "full", "dynamic"])
def test_a_whole_gpu_of_0_1_s_pool_leaves_nothing_of_that_gpu_offered(mode: str) -> None:
    (state,) = states_for("H100-80GB:1", mode=mode)
    held = GpuState(state.info, state.mode, held_elsewhere=frozenset({WholeGpu(0)}))
    assert advertise_gpu(state).devices
    assert advertise_gpu(held).devices == ()
    assert advertise_gpu(held, static=True).devices == ()


def _read_with_0_1(folder: Path) -> subprocess.CompletedProcess[str]:
    """0.1's own checkpoint reader (its tree from the repository's history) on ``folder``."""
    try:
        tree = releases.source()
    except releases.HistoryMissing as exc:
        pytest.skip(str(exc))
    code = (
        "import sys; from slicer.checkpoint import CheckpointStore; "
        "print(sorted(CheckpointStore(sys.argv[1]).load().claims))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_0_1_refuses_the_checkpoint_once_it_holds_a_claim_of_the_new_name(tmp_path: Path) -> None:
    """A rollback to 0.1 with such a claim prepared must not let 0.1 take it for a released
    claim (it knows only the old name) and destroy the instance under its running pod: 0.1
    stops before it opens a socket, naming the release that wrote the file."""
    api = InMemoryKubeApi()
    backend = SimulatedBackend("A100-80GB:1", node_name=NODE)
    agent = build_agent(backend, api, tmp_path)
    old = allocate_claim(api, ["gpu-0-mig-1g10gb-0"], driver=OLD)
    agent.prepare(old)
    readable = _read_with_0_1(tmp_path / "checkpoint")
    assert readable.returncode == 0, readable.stderr
    assert readable.stdout.strip() == repr([old["metadata"]["uid"]])

    new = allocate_claim(api, ["gpu-0-mig-1g10gb-1"])
    agent.prepare(new)
    refused = _read_with_0_1(tmp_path / "checkpoint")
    assert refused.returncode != 0
    assert f"is format version 3, written by gpu-slicer {image.version()}" in refused.stderr

    agent.unprepare(new)  # gone again: 0.1 may take the file over
    assert _read_with_0_1(tmp_path / "checkpoint").returncode == 0
