"""The publisher against the in-memory apiserver: writes, idempotence, generations, conflicts,
and the fallback to the static layout when counters are dropped."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_slicer.core.devices import SliceSpec
from gpu_slicer.core.identity import DRIVER, RESOURCE_API
from gpu_slicer.kube.errors import AlreadyExists, Conflict, Forbidden, NotFound, Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.clock import Clock
from gpu_slicer.slicer.errors import PublishError
from gpu_slicer.slicer.inventory import GpuState, check_limits
from gpu_slicer.slicer.ordering import RepublishLimiter
from gpu_slicer.slicer.publisher import (
    FALLBACK_REASON,
    RESTORED_REASON,
    AdvertiseState,
    PublisherMetrics,
    SlicePublisher,
)

WRITES = {"create", "update", "delete", "patch", "apply"}


def slices_of(api: InMemoryKubeApi, node: str = "node-a") -> list[dict[str, Any]]:
    return sorted(
        (
            s
            for s in api.objects(RESOURCE_API, "ResourceSlice")
            if s["spec"]["pool"]["name"] == node
        ),
        key=lambda s: s["metadata"]["name"],
    )


def writes(api: InMemoryKubeApi) -> list[str]:
    return [c.verb for c in api.calls if c.verb in WRITES and c.kind == "ResourceSlice"]


@pytest.fixture
def api() -> InMemoryKubeApi:
    api = InMemoryKubeApi(server_version=(1, 36))
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    return api


def _no_sleep(_seconds: float) -> None:
    """Retries do not wait in these tests."""


NO_WAIT = Clock(sleep=_no_sleep)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def publisher(api: InMemoryKubeApi, sleeps: list[float]) -> SlicePublisher:
    return SlicePublisher(
        api,
        "node-a",
        device_order="best-fit",
        clock=Clock(
            sleep=sleeps.append, time=lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
        ),
    )


def test_the_first_publish_creates_the_whole_pool_at_generation_one(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    result = publisher.publish(make_states("H200:10"))
    stored = slices_of(api)
    assert result.changed and result.generation == 1
    assert [s["metadata"]["name"] for s in stored] == list(result.slices)
    assert check_limits(stored, (1, 36)) == []
    expected = publisher.plan(make_states("H200:10"), generation=1).slices
    assert [s["spec"] for s in stored] == [s["spec"] for s in expected]
    node_uid = api.get("v1", "Node", "node-a")["metadata"]["uid"]
    assert all(s["metadata"]["ownerReferences"][0]["uid"] == node_uid for s in stored)


def test_the_node_is_read_once_while_the_pool_names_it(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    publisher.publish(make_states("H100-80GB:4"))
    api.clear_calls()
    assert publisher.publish(make_states("H100-80GB:2")).changed
    assert publisher.publish(make_states("H100-80GB:4")).changed
    assert [c for c in api.calls if c.kind == "Node"] == []
    # Gone with its slices (the garbage collector), it is looked for again.
    api.delete("v1", "Node", "node-a")
    for obj in slices_of(api):
        api.delete("resource.k8s.io/v1", "ResourceSlice", obj["metadata"]["name"])
    publisher.publish(make_states("H100-80GB:4"))
    assert [c.verb for c in api.calls if c.kind == "Node" and c.verb == "get"] == ["get"]
    assert all("ownerReferences" not in s["metadata"] for s in slices_of(api))


def test_publishing_the_same_inventory_again_writes_nothing(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    publisher.publish(make_states("H100-80GB:4"))
    api.clear_calls()
    result = publisher.publish(make_states("H100-80GB:4"))
    assert not result.changed and result.generation == 1
    assert writes(api) == []
    assert (
        publisher.metrics.registry.get_sample_value(
            "gpu_slicer_slices_publishes_total", {"result": "unchanged"}
        )
        == 1
    )


def test_a_layout_change_bumps_the_generation_and_deletes_stale_slices(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    publisher.publish(make_states("H100-80GB:16"))
    before = {s["metadata"]["name"] for s in slices_of(api)}
    result = publisher.publish(make_states("H100-80GB:2"))
    after = slices_of(api)
    assert result.generation == 2 and result.deleted
    assert {s["metadata"]["name"] for s in after} == set(result.slices) < before
    assert {s["spec"]["pool"]["generation"] for s in after} == {2}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in after} == {len(after)}


def test_slices_of_other_nodes_and_drivers_are_left_alone(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    other = SlicePublisher(api, "node-b", clock=NO_WAIT)
    other.publish(make_states("A30:2"))
    foreign = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.nvidia.com-x"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        },
    }
    api.create(foreign)
    publisher.publish(make_states("H100-80GB:1"))
    publisher.publish(make_states("H100-80GB:2"))
    assert len(slices_of(api, "node-b")) == len(other.plan(make_states("A30:2")).slices)
    assert (
        api.get(RESOURCE_API, "ResourceSlice", "node-a-gpu.nvidia.com-x")["spec"]["driver"]
        == "gpu.nvidia.com"
    )
    assert all(
        s["spec"]["driver"] == DRIVER
        for s in slices_of(api)
        if "nvidia" not in s["metadata"]["name"]
    )


def test_conflicts_are_retried_with_growing_backoff(
    api: InMemoryKubeApi,
    publisher: SlicePublisher,
    sleeps: list[float],
    make_states: Callable[..., list[GpuState]],
) -> None:
    publisher.publish(make_states("H100-80GB:1"))
    api.fail_next("update", Conflict("stale"), times=3, kind="ResourceSlice")
    result = publisher.publish(make_states("H100-80GB:1", mode="mig"))
    assert result.generation == 2
    assert sleeps == [0.2, 0.4, 0.8]
    assert {s["spec"]["pool"]["generation"] for s in slices_of(api)} == {2}
    assert publisher.metrics.registry.get_sample_value("gpu_slicer_slices_conflicts_total") == 3


def test_a_conflict_that_never_ends_is_reported_not_looped_on(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    publisher.publish(make_states("H100-80GB:1"))
    api.fail_next("update", Conflict("stale"), times=100, kind="ResourceSlice")
    with pytest.raises(PublishError, match="after 6 attempts"):
        publisher.publish(make_states("H100-80GB:1", mode="mig"))


@pytest.mark.parametrize("error", [Forbidden("no rbac"), Unavailable("down")])
def test_api_failures_surface_as_publish_errors(
    api: InMemoryKubeApi,
    publisher: SlicePublisher,
    make_states: Callable[..., list[GpuState]],
    error: Exception,
) -> None:
    api.fail_next("list", error)  # type: ignore[arg-type]
    with pytest.raises(PublishError, match="cannot list"):
        publisher.publish(make_states("H100-80GB:1"))
    assert (
        publisher.metrics.registry.get_sample_value(
            "gpu_slicer_slices_publishes_total", {"result": "error"}
        )
        == 1
    )


def test_the_server_version_decides_the_layout(
    api: InMemoryKubeApi, make_states: Callable[..., list[GpuState]]
) -> None:
    api.set_server_version(1, 34)
    publisher = SlicePublisher(api, "node-a", clock=NO_WAIT)
    result = publisher.publish(make_states("H100-80GB:4"))
    assert result.plan.split == "combined"
    assert all("sharedCounters" in s["spec"] and "devices" in s["spec"] for s in slices_of(api))
    assert check_limits(slices_of(api), (1, 34)) == []


def test_dropped_counters_switch_to_the_static_layout_and_say_so(
    api: InMemoryKubeApi,
    publisher: SlicePublisher,
    make_states: Callable[..., list[GpuState]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    api.drop_fields("ResourceSlice", ["spec.sharedCounters", "spec.devices[].consumesCounters"])
    placed = {0: [("3g.40gb", 0)]}
    states = make_states("H100-80GB:2", instances=placed, owned=placed)
    with caplog.at_level(logging.WARNING, logger="gpu_slicer.slicer.publisher"):
        result = publisher.publish(states)
    assert result.fell_back and result.static and publisher.static
    stored = slices_of(api)
    names = {d["name"] for s in stored for d in s["spec"].get("devices", [])}
    assert names == {"gpu-0-mig-3g40gb-0", "gpu-1"}  # what exists; gpu-1 has MIG off
    assert {s["spec"]["pool"]["generation"] for s in stored} == {result.generation}
    assert check_limits(stored, (1, 36)) == []
    events = api.objects("events.k8s.io/v1", "Event")
    assert [e["reason"] for e in events] == [FALLBACK_REASON]
    assert events[0]["regarding"]["kind"] == "Node" and events[0]["type"] == "Warning"
    assert any(r.__dict__.get("reason") == FALLBACK_REASON for r in caplog.records)
    registry = publisher.metrics.registry
    assert registry.get_sample_value("gpu_slicer_slices_counters_dropped_total") == 1
    assert registry.get_sample_value("gpu_slicer_slices_static_layout") == 1
    # Once static, publishing the same again is a no-op: no second event, no writes.
    api.clear_calls()
    assert not publisher.publish(states).changed
    assert writes(api) == [] and len(api.objects("events.k8s.io/v1", "Event")) == 1


def test_metrics_can_live_in_the_agents_registry(api: InMemoryKubeApi) -> None:
    metrics = PublisherMetrics()
    publisher = SlicePublisher(api, "node-a", metrics=metrics, clock=NO_WAIT)
    assert publisher.metrics.registry is metrics.registry
    assert metrics.registry.get_sample_value("gpu_slicer_slices_static_layout") == 0


def test_a_slice_deleted_behind_the_publishers_back_is_created_again(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    publisher.publish(make_states("H100-80GB:2"))
    api.fail_next("update", NotFound("gone"), kind="ResourceSlice")
    result = publisher.publish(make_states("H100-80GB:2", mode="mig"))
    assert [s["metadata"]["name"] for s in slices_of(api)] == list(result.slices)
    assert {s["spec"]["pool"]["generation"] for s in slices_of(api)} == {2}


def test_a_slice_someone_else_created_first_is_taken_over(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    desired = publisher.plan(make_states("H100-80GB:1")).slices
    squatter = {**desired[0], "spec": {**desired[0]["spec"], "devices": []}}
    squatter["spec"].pop("sharedCounters", None)
    api.create(squatter)  # an old agent's leftover, in our pool at generation 1
    api.fail_next("create", AlreadyExists("taken"), kind="ResourceSlice")  # and a racing writer
    result = publisher.publish(make_states("H100-80GB:1"))
    stored = slices_of(api)
    assert result.generation == 2 and check_limits(stored, (1, 36)) == []
    assert [s["spec"] for s in stored] == [
        s["spec"] for s in publisher.plan(make_states("H100-80GB:1"), generation=2).slices
    ]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# A pool that empties out (a full-mode GPU holding a foreign instance advertises nothing) and is
# published again unchanged still reports the generation it was last written at.
@example(steps=[(1, "dynamic", None), (1, "full", ("1g.10gb", 6)), (1, "full", ("1g.10gb", 6))])
@given(
    steps=st.lists(
        st.tuples(
            st.integers(1, 6),
            st.sampled_from(["dynamic", "mig", "full"]),
            st.sampled_from([None, ("1g.10gb", 6), ("3g.40gb", 0)]),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_any_sequence_of_inventories_leaves_exactly_the_last_pool_in_the_api(
    make_states: Callable[..., list[GpuState]],
    steps: list[tuple[int, str, tuple[str, int] | None]],
) -> None:
    api = InMemoryKubeApi(server_version=(1, 35))
    publisher = SlicePublisher(api, "node-a", clock=NO_WAIT)
    generation = 0
    for count, mode, foreign in steps:
        states = make_states(
            f"H100-80GB:{count}", mode=mode, instances={0: [foreign]} if foreign else None
        )
        result = publisher.publish(states)
        generation += result.changed
        stored = slices_of(api)
        assert result.generation == generation
        assert check_limits(stored, (1, 35)) == []
        assert [s["spec"] for s in stored] == [
            s["spec"] for s in publisher.plan(states, generation=generation).slices
        ]


def test_an_order_only_change_waits_for_the_limiter_but_a_content_change_does_not(
    api: InMemoryKubeApi, make_states: Callable[..., list[GpuState]]
) -> None:
    clock = [0.0]
    limiter = RepublishLimiter(min_interval_s=30, quiet_s=2, clock=lambda: clock[0])
    publisher = SlicePublisher(
        api, "node-a", device_order="best-fit", limiter=limiter, clock=NO_WAIT
    )
    states = make_states("H100-80GB:3")
    publisher.publish(states)
    busy = [SliceSpec(2, "3g.40gb", 0)]
    clock[0] = 10
    held = publisher.publish(states, allocated=busy)
    assert not held.changed and held.deferred_s == 20
    assert pool_order(api)[0].startswith("gpu-0")
    clock[0] = 31
    written = publisher.publish(states, allocated=busy)
    assert written.changed and written.generation == 2
    # The GPU in use leads the order now, less what its claim leaves no room for.
    assert pool_order(api)[0].startswith("gpu-2-") and "gpu-2" not in pool_order(api)
    # What is advertised changed (a GPU went full): no waiting, even right after a publish.
    changed = publisher.publish(make_states("H100-80GB:3", mode="full"), allocated=busy)
    assert changed.changed and changed.deferred_s is None


def test_devices_an_allocation_rules_out_leave_when_the_limiter_allows_and_return_at_once(
    api: InMemoryKubeApi, make_states: Callable[..., list[GpuState]]
) -> None:
    clock = [0.0]
    limiter = RepublishLimiter(min_interval_s=30, quiet_s=2, clock=lambda: clock[0])
    publisher = SlicePublisher(api, "node-a", limiter=limiter, clock=NO_WAIT)  # order by name
    states = make_states("H100-80GB:2")
    publisher.publish(states)
    everything = set(pool_order(api))
    busy = [SliceSpec(1, "4g.40gb", 0)]
    clock[0] = 10
    held = publisher.publish(states, allocated=busy)
    assert not held.changed and held.deferred_s == 20 and set(pool_order(api)) == everything
    clock[0] = 30
    written = publisher.publish(states, allocated=busy)
    assert written.changed and written.plan.ruled_out
    assert set(pool_order(api)) == everything - written.plan.ruled_out
    assert "gpu-1" not in pool_order(api) and "gpu-1-mig-4g40gb-0" in pool_order(api)
    # Freed: listed again at once, though the last write was a moment ago.
    clock[0] = 31
    freed = publisher.publish(states)
    assert freed.changed and freed.deferred_s is None and set(pool_order(api)) == everything


def pool_order(api: InMemoryKubeApi) -> list[str]:
    return [d["name"] for s in slices_of(api) for d in s["spec"].get("devices", [])]


DROPPED = ["spec.sharedCounters", "spec.devices[].consumesCounters"]


def _counters_in(api: InMemoryKubeApi) -> bool:
    return any(s["spec"].get("sharedCounters") for s in slices_of(api))


def _probes(api: InMemoryKubeApi) -> int:
    return sum(
        1 for c in api.calls if c.verb == "create" and c.kind == "ResourceSlice" and not c.name
    )


def _rechecking(api: InMemoryKubeApi, now: list[float]) -> SlicePublisher:
    """node-a's publisher, rechecking the apiserver every 600 s of the clock ``now[0]``."""
    return SlicePublisher(
        api,
        "node-a",
        recheck_interval_s=600,
        clock=Clock(monotonic=lambda: now[0], sleep=_no_sleep),
    )


def test_after_a_fallback_a_probe_switches_back_once_the_apiserver_keeps_counters(
    api: InMemoryKubeApi,
    make_states: Callable[..., list[GpuState]],
) -> None:
    now = [0.0]
    publisher = _rechecking(api, now)
    states = make_states("H100-80GB:2")
    api.drop_fields("ResourceSlice", DROPPED)
    assert publisher.publish(states).fell_back and publisher.fell_back
    assert publisher.recheck_in() == 600
    # Not due yet: no probe. Due, gate still off: a dry-run probe, nothing written.
    now[0] = 300
    api.clear_calls()
    assert not publisher.publish(states).changed and _probes(api) == 0
    now[0] = 601
    result = publisher.publish(states)
    assert not result.changed and publisher.static and _probes(api) >= 1
    assert writes(api) == ["create"] * _probes(api)  # dry runs only
    assert not _counters_in(api)
    registry = publisher.metrics.registry
    assert (
        registry.get_sample_value(
            "gpu_slicer_slices_partitionable_probes_total", {"result": "dropped"}
        )
        == 1
    )
    # The gate is turned on: the next probe switches back and the pool gets its counters.
    api.stop_dropping("ResourceSlice")
    now[0] = 1202
    result = publisher.publish(states)
    assert result.changed and not result.static and not publisher.static
    assert not publisher.fell_back and _counters_in(api)
    assert check_limits(slices_of(api), (1, 36)) == []
    assert [e["reason"] for e in api.objects("events.k8s.io/v1", "Event")] == [
        FALLBACK_REASON,
        RESTORED_REASON,
    ]
    assert registry.get_sample_value("gpu_slicer_slices_static_layout") == 0
    assert registry.get_sample_value("gpu_slicer_slices_partitionable_restored_total") == 1
    assert (
        registry.get_sample_value(
            "gpu_slicer_slices_partitionable_probes_total", {"result": "kept"}
        )
        == 1
    )


def test_no_probe_is_made_when_rechecks_are_off_or_the_static_layout_was_asked_for(
    api: InMemoryKubeApi,
    make_states: Callable[..., list[GpuState]],
) -> None:
    now = [0.0]
    off = SlicePublisher(
        api,
        "node-a",
        recheck_interval_s=None,
        clock=Clock(monotonic=lambda: now[0], sleep=_no_sleep),
    )
    asked = SlicePublisher(
        api, "node-b", static=True, clock=Clock(monotonic=lambda: now[0], sleep=_no_sleep)
    )
    api.drop_fields("ResourceSlice", DROPPED)
    states = make_states("H100-80GB:1")
    assert off.publish(states).fell_back and off.recheck_in() is None
    asked.publish(states)
    api.stop_dropping("ResourceSlice")
    now[0] = 10_000
    api.clear_calls()
    off.publish(states)
    asked.publish(states)
    assert off.static and asked.static and _probes(api) == 0


def test_a_probe_that_the_real_write_contradicts_backs_off(
    api: InMemoryKubeApi,
    make_states: Callable[..., list[GpuState]],
) -> None:
    now = [0.0]
    publisher = _rechecking(api, now)
    states = make_states("H100-80GB:1")
    api.drop_fields("ResourceSlice", DROPPED)
    publisher.publish(states)

    real_create = api.create

    def lying_dry_run(obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        return dict(obj) if dry_run else real_create(obj, dry_run=dry_run)

    api.create = lying_dry_run  # type: ignore[method-assign]
    now[0] = 601
    result = publisher.publish(states)
    assert result.fell_back and publisher.static  # switched back, found dropped, fell back
    assert publisher.recheck_in() == 1200  # twice the interval before the next probe


def test_a_switch_back_stays_unconfirmed_until_a_write_reads_the_counters_back(
    api: InMemoryKubeApi,
    make_states: Callable[..., list[GpuState]],
) -> None:
    now = [0.0]
    publisher = _rechecking(api, now)
    asked = SlicePublisher(api, "node-b", clock=NO_WAIT, static=True)
    assert asked.state is AdvertiseState.STATIC and publisher.state is AdvertiseState.PARTITIONABLE
    states = make_states("H100-80GB:1")
    api.drop_fields("ResourceSlice", DROPPED)
    publisher.publish(states)
    assert publisher.state is AdvertiseState.FELL_BACK
    # The gate is on and the probe sees it, but the write that follows fails.
    api.stop_dropping("ResourceSlice")
    api.fail_next("update", Forbidden("not now"), kind="ResourceSlice")
    now[0] = 601
    with pytest.raises(PublishError, match="not now"):
        publisher.publish(states)
    assert publisher.state is AdvertiseState.RESTORED and not publisher.static
    result = publisher.publish(states)
    assert result.changed and not result.fell_back and _counters_in(api)
    assert publisher.state is AdvertiseState.PARTITIONABLE


def test_a_new_server_version_is_picked_up_at_the_next_recheck(
    api: InMemoryKubeApi,
    make_states: Callable[..., list[GpuState]],
) -> None:
    now = [0.0]
    api.set_server_version(1, 34)
    publisher = _rechecking(api, now)
    states = make_states("H100-80GB:2")
    assert publisher.publish(states).plan.split == "combined"
    api.set_server_version(1, 36)
    now[0] = 100
    assert not publisher.publish(states).changed  # not due: the old version stays
    now[0] = 601
    result = publisher.publish(states)
    assert result.changed and result.plan.split == "split"
    assert check_limits(slices_of(api), (1, 36)) == []


# --- releases whose scheduler does not scale with counters ----------------------------------


@pytest.mark.parametrize(
    ("version", "static", "warned"),
    [((1, 36), False, True), ((1, 37), False, False), ((1, 36), True, False)],
    ids=["1.36 with counters", "1.37 with counters", "1.36 static layout"],
)
def test_counters_on_a_release_without_the_scheduler_fix_are_reported_once(
    make_states: Callable[..., list[GpuState]],
    caplog: pytest.LogCaptureFixture,
    version: tuple[int, int],
    static: bool,
    warned: bool,
) -> None:
    api = InMemoryKubeApi(server_version=version)
    metrics = PublisherMetrics()
    publisher = SlicePublisher(api, "node-a", static=static, metrics=metrics)
    with caplog.at_level(logging.WARNING, logger="gpu_slicer.slicer.publisher"):
        publisher.publish(make_states("H200:2"))
        publisher.publish(make_states("H200:1"))
    warnings = [r.getMessage() for r in caplog.records if "square" in r.getMessage()]
    assert len(warnings) == (1 if warned else 0)
    if warned:
        assert "fixed in 1.37" in warnings[0] and "--advertise static" in warnings[0]
    gauge = metrics.registry.get_sample_value("gpu_slicer_slices_quadratic_scheduling")
    assert gauge == (1.0 if warned else 0.0)


def test_what_the_apiserver_kept_is_read_from_the_write_replies(
    api: InMemoryKubeApi, publisher: SlicePublisher, make_states: Callable[..., list[GpuState]]
) -> None:
    """A publish that writes reads no slice back (each write's reply is the object as stored),
    so no other writer of the node's pool can make it look as if counters were dropped."""
    publisher.publish(make_states("A100-80GB:1"), allocated=(SliceSpec(0, "1g.10gb", 0),))
    api.clear_calls()
    result = publisher.publish(make_states("A100-80GB:1"))
    assert result.changed and not result.fell_back and not publisher.static
    slice_calls = [c.verb for c in api.calls if c.kind == "ResourceSlice"]
    assert "get" not in slice_calls and "update" in slice_calls
    api.drop_fields("ResourceSlice", ["spec.sharedCounters", "spec.devices[].consumesCounters"])
    api.clear_calls()
    result = publisher.publish(make_states("A100-80GB:1"), allocated=(SliceSpec(0, "2g.20gb", 0),))
    assert result.fell_back and publisher.static  # told by the replies alone
    assert "get" not in [c.verb for c in api.calls if c.kind == "ResourceSlice"]
