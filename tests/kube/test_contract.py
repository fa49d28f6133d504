"""The KubeApi contract, run against both implementations.

``seam`` is the in-memory apiserver called directly, and the real client talking HTTP to a stub
apiserver that is itself backed by an in-memory one. A scenario that passes on both shows that
the real client's wire handling and error mapping agree with what the in-memory twin promises
the rest of the code.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Seam

from gpu_slicer.kube import errors
from gpu_slicer.kube.api import WatchEvent

RES = "resource.k8s.io/v1"


def claim(name: str, namespace: str = "ml", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": RES,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"devices": {"requests": []}},
    }


def resource_slice(name: str, node: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": RES,
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "driver": "gpu-slicer.io",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def take(events: Iterator[WatchEvent], count: int) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = [
        (e.type, e.object["metadata"]["name"]) for e in itertools.islice(events, count)
    ]
    close = getattr(events, "close", None)
    if close is not None:
        close()
    return got


# ---------------------------------------------------------------- create / get
def test_create_fills_server_managed_metadata(seam: Seam) -> None:
    created = seam.api.create(claim("a"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert seam.api.get(RES, "ResourceClaim", "a", "ml") == created


def test_resource_versions_increase_with_every_write(seam: Seam) -> None:
    first = seam.api.create(claim("a"))
    second = seam.api.create(resource_slice("s", "node-a"))
    patched = seam.api.patch(
        RES, "ResourceClaim", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="ml"
    )
    assert rv(first) < rv(second) < rv(patched)


def test_creating_an_existing_object_raises_already_exists(seam: Seam) -> None:
    seam.api.create(claim("a"))
    with pytest.raises(errors.AlreadyExists):
        seam.api.create(claim("a"))


def test_the_same_name_in_another_namespace_is_a_different_object(seam: Seam) -> None:
    seam.api.create(claim("a", "ml"))
    seam.api.create(claim("a", "embeddings"))
    assert len(seam.api.list(RES, "ResourceClaim").items) == 2


def test_generate_name_gives_each_object_its_own_name(seam: Seam) -> None:
    obj = claim("")
    obj["metadata"] = {"generateName": "pod-gpu-", "namespace": "ml"}
    names = {seam.api.create(obj)["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("pod-gpu-") for n in names)


def test_dry_run_create_returns_the_object_without_storing_it(seam: Seam) -> None:
    answered = seam.api.create(claim("a"), dry_run=True)
    assert answered["metadata"]["name"] == "a"
    with pytest.raises(errors.NotFound):
        seam.api.get(RES, "ResourceClaim", "a", "ml")


def test_getting_a_missing_object_raises_not_found(seam: Seam) -> None:
    with pytest.raises(errors.NotFound):
        seam.api.get(RES, "ResourceSlice", "nope")


def test_a_namespaced_object_without_namespace_is_invalid(seam: Seam) -> None:
    obj = claim("a")
    del obj["metadata"]["namespace"]
    with pytest.raises(errors.Invalid):
        seam.api.create(obj)


# ---------------------------------------------------------------- update
def test_update_with_the_current_resource_version_succeeds(seam: Seam) -> None:
    obj = seam.api.create(claim("a"))
    obj["spec"]["devices"]["requests"] = [{"name": "gpu"}]
    updated = seam.api.update(obj)
    assert rv(updated) > rv(obj)
    assert updated["metadata"]["generation"] == 2


def test_update_with_a_stale_resource_version_raises_conflict(seam: Seam) -> None:
    stale = seam.api.create(claim("a"))
    seam.api.patch(RES, "ResourceClaim", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="ml")
    with pytest.raises(errors.Conflict):
        seam.api.update(stale)


def test_updating_a_missing_object_raises_not_found(seam: Seam) -> None:
    with pytest.raises(errors.NotFound):
        seam.api.update(claim("ghost"))


def test_a_label_change_does_not_bump_generation(seam: Seam) -> None:
    obj = seam.api.create(claim("a"))
    obj["metadata"]["labels"] = {"x": "1"}
    assert seam.api.update(obj)["metadata"]["generation"] == 1


# ---------------------------------------------------------------- list and selectors
@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gold", {"a"}),
        ("tier==gold", {"a"}),
        ("tier!=gold", {"b", "c"}),
        ("tier in (gold,silver)", {"a", "b"}),
        ("tier notin (gold)", {"b", "c"}),
        ("tier", {"a", "b"}),
        ("!tier", {"c"}),
        ("tier,team=ml", {"a"}),
    ],
    ids=lambda value: str(value),
)
def test_list_filters_by_label_selector(seam: Seam, selector: str, expected: set[str]) -> None:
    seam.api.create(claim("a", tier="gold", team="ml"))
    seam.api.create(claim("b", tier="silver"))
    seam.api.create(claim("c"))
    listed = seam.api.list(RES, "ResourceClaim", "ml", label_selector=selector)
    assert {o["metadata"]["name"] for o in listed.items} == expected


def test_list_filters_by_field_selector_on_nested_fields(seam: Seam) -> None:
    seam.api.create(resource_slice("s1", "node-a"))
    seam.api.create(resource_slice("s2", "node-b"))
    on_a = seam.api.list(RES, "ResourceSlice", field_selector="spec.nodeName=node-a")
    not_a = seam.api.list(
        RES, "ResourceSlice", field_selector="spec.nodeName!=node-a,spec.driver=gpu-slicer.io"
    )
    assert [o["metadata"]["name"] for o in on_a.items] == ["s1"]
    assert [o["metadata"]["name"] for o in not_a.items] == ["s2"]


def test_list_items_carry_api_version_and_kind(seam: Seam) -> None:
    seam.api.create(resource_slice("s1", "node-a"))
    (item,) = seam.api.list(RES, "ResourceSlice").items
    assert (item["apiVersion"], item["kind"]) == (RES, "ResourceSlice")


def test_list_reports_the_latest_resource_version(seam: Seam) -> None:
    seam.api.create(claim("a"))
    last = seam.api.create(claim("b", "other"))
    listed = seam.api.list(RES, "ResourceClaim", "ml")
    assert listed.resource_version == last["metadata"]["resourceVersion"]


def test_list_in_one_namespace_leaves_out_the_others(seam: Seam) -> None:
    seam.api.create(claim("a", "ml"))
    seam.api.create(claim("b", "other"))
    assert [o["metadata"]["name"] for o in seam.api.list(RES, "ResourceClaim", "ml").items] == ["a"]


# ---------------------------------------------------------------- patch and apply
def test_merge_patch_null_removes_a_field(seam: Seam) -> None:
    seam.api.create(claim("a", tier="gold", team="ml"))
    patched = seam.api.patch(
        RES, "ResourceClaim", "a", {"metadata": {"labels": {"tier": None}}}, namespace="ml"
    )
    assert patched["metadata"]["labels"] == {"team": "ml"}


def test_json_patch_applies_operations_in_order(seam: Seam) -> None:
    seam.api.create(resource_slice("s1", "node-a"))
    patched = seam.api.patch(
        RES,
        "ResourceSlice",
        "s1",
        [
            {"op": "add", "path": "/spec/devices/-", "value": {"name": "gpu-0"}},
            {"op": "replace", "path": "/spec/pool/generation", "value": 2},
        ],
        patch_type="json",
    )
    assert patched["spec"]["devices"] == [{"name": "gpu-0"}]
    assert patched["spec"]["pool"]["generation"] == 2


def test_a_failing_json_patch_test_operation_is_invalid(seam: Seam) -> None:
    seam.api.create(resource_slice("s1", "node-a"))
    with pytest.raises(errors.Invalid):
        seam.api.patch(
            RES,
            "ResourceSlice",
            "s1",
            [{"op": "test", "path": "/spec/nodeName", "value": "node-b"}],
            patch_type="json",
        )


def test_strategic_patch_merges_maps(seam: Seam) -> None:
    seam.api.create(resource_slice("s1", "node-a"))
    patched = seam.api.patch(
        RES,
        "ResourceSlice",
        "s1",
        {"spec": {"pool": {"generation": 3}}},
        patch_type="strategic",
    )
    assert patched["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}


def test_patch_with_a_stale_resource_version_raises_conflict(seam: Seam) -> None:
    first = seam.api.create(claim("a"))
    seam.api.patch(RES, "ResourceClaim", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="ml")
    with pytest.raises(errors.Conflict):
        seam.api.patch(
            RES,
            "ResourceClaim",
            "a",
            {"metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}},
            namespace="ml",
        )


def test_patching_a_missing_object_raises_not_found(seam: Seam) -> None:
    with pytest.raises(errors.NotFound):
        seam.api.patch(RES, "ResourceSlice", "ghost", {"spec": {}})


def test_apply_creates_then_merges_over_the_stored_object(seam: Seam) -> None:
    created = seam.api.apply(resource_slice("s1", "node-a"), field_manager="gpu-slicer")
    applied = seam.api.apply(
        {
            "apiVersion": RES,
            "kind": "ResourceSlice",
            "metadata": {"name": "s1"},
            "spec": {"devices": [{"name": "gpu-0"}]},
        },
        field_manager="gpu-slicer",
        force=True,
    )
    assert applied["metadata"]["uid"] == created["metadata"]["uid"]
    assert applied["spec"]["devices"] == [{"name": "gpu-0"}]
    assert applied["spec"]["nodeName"] == "node-a"


# ---------------------------------------------------------------- delete
def test_delete_removes_the_object(seam: Seam) -> None:
    seam.api.create(claim("a"))
    seam.api.delete(RES, "ResourceClaim", "a", "ml")
    with pytest.raises(errors.NotFound):
        seam.api.get(RES, "ResourceClaim", "a", "ml")


def test_deleting_a_missing_object_raises_not_found(seam: Seam) -> None:
    with pytest.raises(errors.NotFound):
        seam.api.delete(RES, "ResourceClaim", "ghost", "ml")


def test_delete_with_a_stale_resource_version_raises_conflict_and_keeps_it(seam: Seam) -> None:
    stale = seam.api.create(claim("a"))
    seam.api.patch(RES, "ResourceClaim", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="ml")
    with pytest.raises(errors.Conflict):
        seam.api.delete(
            RES, "ResourceClaim", "a", "ml", resource_version=stale["metadata"]["resourceVersion"]
        )
    assert seam.api.get(RES, "ResourceClaim", "a", "ml")["metadata"]["name"] == "a"


def test_delete_with_the_current_resource_version_succeeds(seam: Seam) -> None:
    current = seam.api.create(claim("a"))
    seam.api.delete(
        RES, "ResourceClaim", "a", "ml", resource_version=current["metadata"]["resourceVersion"]
    )
    assert seam.api.list(RES, "ResourceClaim").items == []


# ---------------------------------------------------------------- watch
def test_watch_replays_changes_after_a_version_in_order(seam: Seam) -> None:
    start = seam.api.create(resource_slice("s1", "node-a"))
    seam.api.create(resource_slice("s2", "node-a"))
    seam.api.patch(RES, "ResourceSlice", "s1", {"spec": {"pool": {"generation": 2}}})
    seam.api.delete(RES, "ResourceSlice", "s2")
    events = seam.api.watch(
        RES, "ResourceSlice", resource_version=start["metadata"]["resourceVersion"], timeout_s=5
    )
    assert take(events, 3) == [("ADDED", "s2"), ("MODIFIED", "s1"), ("DELETED", "s2")]


def test_watch_without_a_version_starts_with_the_current_objects(seam: Seam) -> None:
    seam.api.create(resource_slice("s1", "node-a"))
    events = seam.api.watch(RES, "ResourceSlice", timeout_s=5)
    seam.api.create(resource_slice("s2", "node-a"))
    assert take(events, 2) == [("ADDED", "s1"), ("ADDED", "s2")]


def test_watch_sees_only_objects_matching_its_selectors(seam: Seam) -> None:
    listed = seam.api.list(RES, "ResourceSlice")
    events = seam.api.watch(
        RES,
        "ResourceSlice",
        resource_version=listed.resource_version,
        field_selector="spec.nodeName=node-b",
        timeout_s=5,
    )
    seam.api.create(resource_slice("s1", "node-a"))
    seam.api.create(resource_slice("s2", "node-b"))
    assert take(events, 1) == [("ADDED", "s2")]


def test_watch_reports_an_object_leaving_its_label_selection_as_deleted(seam: Seam) -> None:
    start = seam.api.create(claim("a", tier="gold"))
    events = seam.api.watch(
        RES,
        "ResourceClaim",
        "ml",
        label_selector="tier=gold",
        resource_version=start["metadata"]["resourceVersion"],
        timeout_s=5,
    )
    seam.api.patch(
        RES, "ResourceClaim", "a", {"metadata": {"labels": {"tier": "lead"}}}, namespace="ml"
    )
    seam.api.patch(
        RES, "ResourceClaim", "a", {"metadata": {"labels": {"tier": "gold"}}}, namespace="ml"
    )
    assert take(events, 2) == [("DELETED", "a"), ("ADDED", "a")]


def test_watch_ends_when_its_timeout_passes(seam: Seam) -> None:
    listed = seam.api.list(RES, "ResourceSlice")
    events = seam.api.watch(
        RES, "ResourceSlice", resource_version=listed.resource_version, timeout_s=1
    )
    assert list(events) == []


def test_watch_from_a_version_older_than_the_history_raises_expired(seam: Seam) -> None:
    for i in range(seam.store_history * 2 + 1):
        seam.api.create(claim(f"c{i}"))
    with pytest.raises(errors.ApiError) as caught:
        list(seam.api.watch(RES, "ResourceClaim", resource_version="1", timeout_s=1))
    assert caught.value.status == 410


# ---------------------------------------------------------------- failures and version
@pytest.mark.parametrize(
    "error",
    [
        errors.Unavailable("apiserver restarting"),
        errors.Forbidden("no RBAC"),
        errors.Invalid("bad spec"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_injected_failures_reach_the_caller_as_the_same_error_type(
    seam: Seam, error: errors.KubeError
) -> None:
    seam.store.fail_next("create", error)
    with pytest.raises(type(error)):
        seam.api.create(claim("a"))
    assert seam.api.create(claim("a"))["metadata"]["name"] == "a"


def test_fields_an_apiserver_drops_are_missing_when_read_back(seam: Seam) -> None:
    seam.store.drop_fields(
        "ResourceSlice", ["spec.sharedCounters", "spec.devices[].consumesCounters"]
    )
    obj = resource_slice("s1", "node-a")
    obj["spec"]["sharedCounters"] = [{"name": "gpu-0-counters", "counters": {}}]
    obj["spec"]["devices"] = [{"name": "gpu-0", "consumesCounters": [{"counterSet": "x"}]}]
    seam.api.create(obj)
    stored = seam.api.get(RES, "ResourceSlice", "s1")
    assert "sharedCounters" not in stored["spec"]
    assert stored["spec"]["devices"] == [{"name": "gpu-0"}]


def test_server_version_reports_major_and_minor(seam: Seam) -> None:
    seam.store.set_server_version(1, 34)
    assert seam.api.server_version() == (1, 34)


def test_updating_an_object_without_a_name_is_invalid(seam: Seam) -> None:
    nameless = claim("")
    with pytest.raises(errors.Invalid):
        seam.api.update(nameless)
