"""What the in-memory apiserver promises beyond the shared contract: isolation, hooks, history."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from gpu_slicer.kube import errors
from gpu_slicer.kube.memory import Call, InMemoryKubeApi, copy_obj, merge_patch

CM = ("v1", "ConfigMap")


def config_map(name: str, namespace: str = "default", **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": dict(data),
    }


# ---------------------------------------------------------------- isolation
def test_changing_a_returned_object_does_not_change_the_store(memory: InMemoryKubeApi) -> None:
    got = memory.create(config_map("a", key="v"))
    got["data"]["key"] = "changed"
    memory.get(*CM, "a", "default")["data"]["key"] = "changed too"
    assert memory.get(*CM, "a", "default")["data"] == {"key": "v"}


def test_changing_the_object_passed_in_does_not_change_the_store(memory: InMemoryKubeApi) -> None:
    obj = config_map("a", key="v")
    memory.create(obj)
    obj["data"]["key"] = "changed"
    assert memory.get(*CM, "a", "default")["data"] == {"key": "v"}


def test_changing_a_watched_object_does_not_change_the_store(memory: InMemoryKubeApi) -> None:
    memory.create(config_map("a", key="v"))
    (event,) = memory.watch(*CM, timeout_s=0)
    event.object["data"]["key"] = "changed"
    assert memory.get(*CM, "a", "default")["data"] == {"key": "v"}


# ---------------------------------------------------------------- server behaviour
def test_an_update_that_changes_nothing_keeps_the_resource_version(
    memory: InMemoryKubeApi,
) -> None:
    obj = memory.create(config_map("a", key="v"))
    again = memory.update(obj)
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    assert (
        list(memory.watch(*CM, resource_version=obj["metadata"]["resourceVersion"], timeout_s=0))
        == []
    )


def test_a_status_change_does_not_bump_generation(memory: InMemoryKubeApi) -> None:
    memory.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {},
        }
    )
    patched = memory.patch(
        "resource.k8s.io/v1",
        "ResourceClaim",
        "c",
        {"status": {"allocation": {"devices": {"results": []}}}},
        namespace="ml",
    )
    assert patched["metadata"]["generation"] == 1


def test_create_refuses_an_object_that_already_has_a_resource_version(
    memory: InMemoryKubeApi,
) -> None:
    obj = config_map("a")
    obj["metadata"]["resourceVersion"] = "7"
    with pytest.raises(errors.Invalid, match="resourceVersion"):
        memory.create(obj)


def test_a_cluster_scoped_object_loses_a_namespace_it_was_given(memory: InMemoryKubeApi) -> None:
    created = memory.create(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "namespace": "ml"}}
    )
    assert "namespace" not in created["metadata"]
    assert memory.get("v1", "Node", "n")["metadata"]["name"] == "n"


def test_creation_timestamp_comes_from_the_injected_clock() -> None:
    api = InMemoryKubeApi(clock=lambda: datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert api.create(config_map("a"))["metadata"]["creationTimestamp"] == "2030-01-02T03:04:05Z"


def test_namespaces_can_be_required_to_exist() -> None:
    api = InMemoryKubeApi(require_namespaces=True)
    with pytest.raises(errors.NotFound, match="namespaces"):
        api.create(config_map("a", "ml"))
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    assert api.create(config_map("a", "ml"))["metadata"]["namespace"] == "ml"


def test_apply_without_a_field_manager_is_invalid(memory: InMemoryKubeApi) -> None:
    with pytest.raises(errors.Invalid, match="field_manager"):
        memory.apply(config_map("a"), field_manager="")


def test_an_object_with_finalizers_stays_until_they_are_removed(memory: InMemoryKubeApi) -> None:
    obj = config_map("a")
    obj["metadata"]["finalizers"] = ["gpu-slicer.io/cleanup"]
    start = memory.create(obj)
    memory.delete(*CM, "a", "default")
    marked = memory.get(*CM, "a", "default")
    assert marked["metadata"]["deletionTimestamp"]
    memory.patch(*CM, "a", {"metadata": {"finalizers": None}}, namespace="default")
    with pytest.raises(errors.NotFound):
        memory.get(*CM, "a", "default")
    events = memory.watch(*CM, resource_version=start["metadata"]["resourceVersion"], timeout_s=0)
    assert [e.type for e in events] == ["MODIFIED", "DELETED"]


# ---------------------------------------------------------------- watch history
def test_a_watch_that_falls_behind_the_history_raises_expired() -> None:
    api = InMemoryKubeApi(history=4)
    start = api.create(config_map("first"))
    events = api.watch(*CM, resource_version=start["metadata"]["resourceVersion"], timeout_s=0)
    for i in range(10):
        api.create(config_map(f"c{i}"))
    with pytest.raises(errors.ApiError) as caught:
        next(events)
    assert (caught.value.status, caught.value.reason) == (410, "Expired")


def test_a_watch_from_a_recent_version_survives_history_trimming() -> None:
    api = InMemoryKubeApi(history=4)
    for i in range(10):
        last = api.create(config_map(f"c{i}"))
    api.create(config_map("new"))
    events = api.watch(*CM, resource_version=last["metadata"]["resourceVersion"], timeout_s=0)
    assert [e.object["metadata"]["name"] for e in events] == ["new"]


def test_a_blocked_watch_receives_a_write_from_another_thread(memory: InMemoryKubeApi) -> None:
    events = memory.watch(*CM, resource_version=memory.resource_version, timeout_s=30)
    writer = threading.Thread(target=memory.create, args=(config_map("late"),))
    writer.start()
    first = next(events)
    writer.join()
    assert (first.type, first.object["metadata"]["name"]) == ("ADDED", "late")


def test_close_ends_a_watch_that_has_no_timeout(memory: InMemoryKubeApi) -> None:
    received: list[str] = []
    events = memory.watch(*CM, resource_version=memory.resource_version)
    reader = threading.Thread(target=lambda: received.extend(e.type for e in events))
    reader.start()
    memory.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert received == []


# ---------------------------------------------------------------- test hooks
def test_fail_next_can_target_one_kind_and_several_calls(memory: InMemoryKubeApi) -> None:
    memory.fail_next("get", errors.Unavailable("down"), times=2, kind="ConfigMap")
    memory.create(config_map("a"))
    memory.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}})
    assert memory.get("v1", "Node", "n")["metadata"]["name"] == "n"
    for _ in range(2):
        with pytest.raises(errors.Unavailable):
            memory.get(*CM, "a", "default")
    assert memory.get(*CM, "a", "default")["metadata"]["name"] == "a"


def test_fail_next_rejects_an_unknown_verb(memory: InMemoryKubeApi) -> None:
    with pytest.raises(ValueError, match="unknown verb"):
        memory.fail_next("replace", errors.Unavailable("x"))


def test_calls_record_verb_resource_and_object(memory: InMemoryKubeApi) -> None:
    memory.create(config_map("a"))
    memory.apply(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}, field_manager="gpu-slicer"
    )
    memory.list(*CM)
    assert memory.calls == [
        ("create", "v1", "ConfigMap", "default", "a"),
        ("apply", "v1", "Node", None, "n"),
        ("list", "v1", "ConfigMap", None, None),
    ]
    assert memory.calls[0] == Call("create", "v1", "ConfigMap", "default", "a")


def test_rbac_verbs_translate_calls_into_rules(memory: InMemoryKubeApi) -> None:
    memory.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {},
        },
        field_manager="gpu-slicer",
    )
    list(memory.watch("resource.k8s.io/v1", "ResourceClaim", timeout_s=0))
    assert memory.rbac_verbs() == {
        ("resource.k8s.io", "resourceslices"): {"patch"},
        ("resource.k8s.io", "resourceclaims"): {"watch"},
    }


def test_dropped_fields_also_vanish_on_update_and_patch(memory: InMemoryKubeApi) -> None:
    memory.drop_fields("ConfigMap", ["data.secret"])
    obj = memory.create(config_map("a", keep="1"))
    obj["data"]["secret"] = "x"
    assert memory.update(obj)["data"] == {"keep": "1"}
    patched = memory.patch(*CM, "a", {"data": {"secret": "y"}}, namespace="default")
    assert patched["data"] == {"keep": "1"}


# ---------------------------------------------------------------- concurrency
def test_concurrent_read_modify_write_loops_lose_no_update(memory: InMemoryKubeApi) -> None:
    memory.create(config_map("counter", n="0"))
    threads, rounds = 6, 30
    versions: list[str] = []

    def bump() -> None:
        for _ in range(rounds):
            while True:
                obj = memory.get(*CM, "counter", "default")
                obj["data"]["n"] = str(int(obj["data"]["n"]) + 1)
                try:
                    versions.append(memory.update(obj)["metadata"]["resourceVersion"])
                    break
                except errors.Conflict:
                    continue

    workers = [threading.Thread(target=bump) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert memory.get(*CM, "counter", "default")["data"]["n"] == str(threads * rounds)
    assert len(set(versions)) == threads * rounds


# ---------------------------------------------------------------- helpers
def test_merge_patch_follows_rfc_7386_examples() -> None:
    # The example from RFC 7386 section 3.
    target = {
        "title": "Goodbye!",
        "author": {"givenName": "John", "familyName": "Doe"},
        "tags": ["example", "sample"],
        "content": "This will be unchanged",
    }
    patch = {
        "title": "Hello!",
        "phoneNumber": "+01-123-456-7890",
        "author": {"familyName": None},
        "tags": ["example"],
    }
    assert merge_patch(target, patch) == {
        "title": "Hello!",
        "author": {"givenName": "John"},
        "tags": ["example"],
        "content": "This will be unchanged",
        "phoneNumber": "+01-123-456-7890",
    }


def test_copy_obj_shares_nothing_mutable() -> None:
    original = {"a": [{"b": 1}], "c": {"d": [1, 2]}}
    copied = copy_obj(original)
    copied["a"][0]["b"] = 2
    copied["c"]["d"].append(3)
    assert original == {"a": [{"b": 1}], "c": {"d": [1, 2]}}


def test_update_of_an_object_that_was_recreated_raises_conflict(
    memory: InMemoryKubeApi,
) -> None:
    old = memory.create(config_map("a"))
    memory.delete(*CM, "a", "default")
    memory.create(config_map("a"))
    del old["metadata"]["resourceVersion"]
    with pytest.raises(errors.Conflict, match="created again"):
        memory.update(old)
