"""slicer.agent's assembly: the parts reach each other (a change wakes the reconciler),
republishing goes through the slice publisher unless the caller takes it over, GPUs start in
their default mode."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_slicer.kube.errors import ApiError
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.agent import Advertise, AgentConfig, AgentParts, assemble, discover_modes
from gpu_slicer.slicer.claim_cache import AllocatedDevice
from gpu_slicer.slicer.clock import Clock
from gpu_slicer.slicer.device_attributes import MINIMAL_ATTRIBUTES
from gpu_slicer.slicer.profile_filter import ProfileFilter
from gpu_slicer.slicer.publisher import NODE_LOOK_AGAIN_S
from gpu_slicer.slicer.reconciler import NodeView
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import NODE, allocate_claim, delete_claim

SLICES = ("resource.k8s.io/v1", "ResourceSlice")


def _config(root: Path) -> AgentConfig:
    return AgentConfig(node=NODE, checkpoint_dir=root / "c", cdi_dir=root / "d")


def _wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_reconciler_publishes_through_the_slice_publisher_by_default(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    parts = assemble(_config(tmp_path), backend=backend, api=api)
    assert parts.publisher is not None
    parts.claims.sync_once()
    assert parts.reconciler.reconcile_once().republished
    assert api.objects(*SLICES)


@pytest.mark.parametrize("advertise", ["partitionable", "static"])
def test_the_advertise_setting_decides_whether_counters_are_published(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path, advertise: Advertise
) -> None:
    config = AgentConfig(
        node=NODE, checkpoint_dir=tmp_path / "c", cdi_dir=tmp_path / "d", advertise=advertise
    )
    parts = assemble(config, backend=backend, api=api)
    parts.claims.sync_once()
    parts.reconciler.reconcile_once()
    counters = [s for s in api.objects(*SLICES) if s["spec"].get("sharedCounters")]
    consuming = [
        d
        for s in api.objects(*SLICES)
        for d in s["spec"].get("devices", ())
        if d.get("consumesCounters")
    ]
    assert bool(counters) == bool(consuming) == (advertise == "partitionable")
    assert api.objects(*SLICES)


def test_a_republish_of_the_callers_replaces_the_publisher(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    views: list[NodeView] = []

    def record(view: NodeView) -> None:
        views.append(view)

    parts = assemble(_config(tmp_path), backend=backend, api=api, republish=record)
    assert parts.publisher is None
    parts.reconciler.reconcile_once()
    assert len(views) == 1 and len(views[0].gpus) == 2
    assert not api.objects(*SLICES)


def _claim_event(api: InMemoryKubeApi, parts: AgentParts) -> None:
    allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
    parts.claims.sync_once()


def _state_change(api: InMemoryKubeApi, parts: AgentParts) -> None:
    parts.state.prepare("u-1", "ml", "c", [AllocatedDevice("gpu", "gpu-0-mig-1g10gb-0", NODE)])


@pytest.mark.parametrize("change", [_claim_event, _state_change], ids=["claim", "state"])
def test_a_change_wakes_the_reconciler_thread_long_before_its_interval(
    change: Callable[[InMemoryKubeApi, AgentParts], None],
    api: InMemoryKubeApi,
    backend: SimulatedBackend,
    tmp_path: Path,
) -> None:
    parts = assemble(_config(tmp_path), backend=backend, api=api, republish=lambda _view: None)
    reconciler = parts.reconciler
    stop = threading.Event()
    thread = threading.Thread(target=reconciler.run, args=(stop, 3600.0), daemon=True)
    thread.start()
    try:
        _wait_for(lambda: reconciler.last_report is not None)
        first = reconciler.last_report
        change(api, parts)
        _wait_for(lambda: reconciler.last_report is not first)
    finally:
        stop.set()
        reconciler.nudge()
        thread.join(timeout=10)


def test_gpus_start_dynamic_on_hopper_and_in_mig_slices_on_ampere() -> None:
    backend = SimulatedBackend("H100-80GB:1,A100-80GB:1", node_name=NODE)
    assert discover_modes(backend) == {0: "dynamic", 1: "mig"}


def test_the_profiles_setting_reaches_the_published_pool(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    kept = ProfileFilter.parse("-*+me")
    assert kept is not None
    config = AgentConfig(
        node=NODE,
        checkpoint_dir=tmp_path / "c",
        cdi_dir=tmp_path / "d",
        profiles=kept,
        advertised_profiles="all",
    )
    parts = assemble(config, backend=backend, api=api)
    parts.claims.sync_once()
    parts.reconciler.reconcile_once()
    names = [d["name"] for s in api.objects(*SLICES) for d in s["spec"].get("devices", ())]
    assert names and not any(name.endswith(tuple(f"me-{i}" for i in range(8))) for name in names)
    assert any("-mig-1g" in name for name in names)


def test_the_attributes_setting_reaches_the_published_pool(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    config = AgentConfig(
        node=NODE, checkpoint_dir=tmp_path / "c", cdi_dir=tmp_path / "d", attributes="minimal"
    )
    parts = assemble(config, backend=backend, api=api)
    parts.claims.sync_once()
    parts.reconciler.reconcile_once()
    devices = [d for s in api.objects(*SLICES) for d in s["spec"].get("devices", ())]
    assert devices
    assert all(set(d["attributes"]) <= MINIMAL_ATTRIBUTES for d in devices)
    assert all(set(d["capacity"]) == {"gpu-slicer.io/memory"} for d in devices)


def _on_clock(
    api: InMemoryKubeApi,
    backend: SimulatedBackend,
    root: Path,
    now: list[float],
    **settings: object,
) -> AgentParts:
    """The agent's parts, its limiter on the clock ``now[0]``."""
    config = AgentConfig(
        node=NODE,
        checkpoint_dir=root / "c",
        cdi_dir=root / "d",
        **settings,  # type: ignore[arg-type]
    )
    return assemble(
        config, backend=backend, api=api, clock=Clock(monotonic=lambda: now[0], time=time.time)
    )


def test_the_exposed_limiter_is_the_publishers_and_runs_on_the_assemblys_clock(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    now = [100.0]
    parts = _on_clock(api, backend, tmp_path, now, republish_interval_s=10.0, republish_quiet_s=2.0)
    assert parts.limiter is not None
    parts.claims.sync_once()
    assert parts.reconciler.reconcile_once().republished  # the publisher wrote at 100
    now[0] = 103.0
    parts.limiter.observe("another order")
    assert parts.limiter.due_in() == pytest.approx(7.0)  # 10 s after the publisher's write


def test_the_agent_leaves_out_what_a_claim_rules_out_and_lists_it_again_once_it_is_gone(
    api: InMemoryKubeApi, tmp_path: Path
) -> None:
    now = [100.0]
    backend = SimulatedBackend("H100-80GB:2", node_name=NODE)
    parts = _on_clock(
        api,
        backend,
        tmp_path,
        now,
        advertised_profiles="all",
        republish_interval_s=60.0,
        republish_quiet_s=2.0,
    )

    def listed() -> set[str]:
        parts.claims.sync_once()
        parts.reconciler.reconcile_once()
        return {d["name"] for s in api.objects(*SLICES) for d in s["spec"].get("devices", ())}

    everything = listed()
    claim = allocate_claim(api, ["gpu-1-mig-3g40gb-4"])
    assert listed() == everything  # held back: leaving devices out can wait
    now[0] = 161.0
    busy = listed()
    assert "gpu-1-mig-3g40gb-4" in busy and "gpu-1" not in busy
    assert "gpu-1-mig-1g10gb-0" in busy and "gpu-1-mig-1g10gb-4" not in busy
    assert {n for n in everything - busy if not n.startswith("gpu-1")} == set()
    delete_claim(api, claim)
    now[0] = 162.0  # a second after the last write, long before the interval is over
    assert listed() == everything


@pytest.mark.parametrize("report", [True, False])
def test_report_scaling_decides_whether_the_agent_warns_of_quadratic_scheduling(
    backend: SimulatedBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture, report: bool
) -> None:
    api = InMemoryKubeApi(server_version=(1, 36))
    config = AgentConfig(
        node=NODE, checkpoint_dir=tmp_path / "c", cdi_dir=tmp_path / "d", report_scaling=report
    )
    parts = assemble(config, backend=backend, api=api)
    parts.claims.sync_once()
    with caplog.at_level(logging.WARNING, logger="gpu_slicer.slicer.publisher"):
        parts.reconciler.reconcile_once()
    assert any("square" in r.getMessage() for r in caplog.records) == report


def _node(api: InMemoryKubeApi) -> str:
    """Registers the agent's Node (as its kubelet does); its new uid."""
    node = api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return str(node["metadata"]["uid"])


def _owners(api: InMemoryKubeApi) -> list[list[str]]:
    return [
        [o["uid"] for o in s["metadata"].get("ownerReferences", [])] for s in api.objects(*SLICES)
    ]


def _settled(api: InMemoryKubeApi, parts: AgentParts) -> bool:
    """Passes as the running agent makes them, its slice watch seeing each write, until one
    changes nothing; whether any slice was written."""
    assert parts.pool_watch is not None

    def versions() -> dict[str, str]:
        return {
            s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in api.objects(*SLICES)
        }

    before = versions()
    for _ in range(5):
        seen = versions()
        parts.pool_watch.sync_once()  # what the watch thread keeps current
        parts.reconciler.reconcile_once()
        if versions() == seen:
            return versions() != before
    raise AssertionError("the agent kept writing its slices")


def test_a_pool_deleted_by_another_hand_is_published_again_for_the_node_as_it_is_now(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    now = [100.0]
    first = _node(api)
    parts = _on_clock(api, backend, tmp_path, now, reprobe_interval_s=600.0)
    parts.claims.sync_once()
    assert _settled(api, parts)
    assert _owners(api) and all(o == [first] for o in _owners(api))
    assert not _settled(api, parts)  # nothing changed: nothing written

    # The Node is deleted: the garbage collector takes its slices along.
    api.delete("v1", "Node", NODE)
    for obj in api.objects(*SLICES):
        api.delete(*SLICES, obj["metadata"]["name"])
    assert _settled(api, parts)
    assert _owners(api) and all(o == [] for o in _owners(api))  # no Node to own them

    # Its kubelet registers it again (a new uid): while the Node is missing, a pass looks for
    # it every NODE_LOOK_AGAIN_S, and writes the slices for it once it is back.
    second = _node(api)
    assert not _settled(api, parts)
    now[0] += NODE_LOOK_AGAIN_S
    assert _settled(api, parts)
    assert all(o == [second] for o in _owners(api))
    assert not _settled(api, parts)


def test_a_node_that_cannot_be_read_is_retried_never_taken_for_no_owner(
    api: InMemoryKubeApi, backend: SimulatedBackend, tmp_path: Path
) -> None:
    node = _node(api)
    parts = _on_clock(api, backend, tmp_path, [100.0])
    assert parts.pool_watch is not None
    parts.claims.sync_once()
    assert _settled(api, parts)
    for obj in api.objects(*SLICES):
        api.delete(*SLICES, obj["metadata"]["name"])
    api.fail_next("get", ApiError("etcd timed out", status=500), kind="Node")
    parts.pool_watch.sync_once()
    report = parts.reconciler.reconcile_once()
    assert any("cannot read Node" in e for e in report.errors), report
    assert api.objects(*SLICES) == []  # nothing written without its owner
    assert parts.reconciler.reconcile_once().republished  # the next pass
    assert _owners(api) and all(o == [node] for o in _owners(api))
