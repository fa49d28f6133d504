"""Watch-backed caches: namespace modes and DeviceClass extended-resource names."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_slicer.kube.api import Obj
from gpu_slicer.kube.errors import NotFound, Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.webhook.caches import (
    CacheError,
    ExtendedResourceNames,
    NamespaceModes,
    mode_from_labels,
)


def namespace(name: str, mode: str | None = None) -> Obj:
    labels = {"gpu-slicer.io/migration": mode} if mode else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def device_class(name: str, extended: str | None = None) -> Obj:
    spec: Obj = {"selectors": []}
    if extended:
        spec["extendedResourceName"] = extended
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.fixture
def api() -> Iterator[InMemoryKubeApi]:
    memory = InMemoryKubeApi()
    yield memory
    memory.close()


@pytest.mark.parametrize(
    ("labels", "mode"),
    [
        ({"gpu-slicer.io/migration": "enabled"}, "enabled"),
        ({"gpu-slicer.io/migration": "audit"}, "audit"),
        ({"gpu-slicer.io/migration": "Enabled"}, "disabled"),
        ({"gpu-slicer.io/migration": ""}, "disabled"),
        ({}, "disabled"),
        (None, "disabled"),
    ],
    ids=["enabled", "audit", "wrong-case", "empty", "absent", "no-labels"],
)
def test_the_label_value_gives_the_mode(labels: object, mode: str) -> None:
    assert mode_from_labels(labels) == mode


def test_modes_follow_label_changes_through_the_watch(api: InMemoryKubeApi) -> None:
    api.create(namespace("ml", "enabled"))
    modes = NamespaceModes(api)
    modes.start()
    try:
        eventually(lambda: modes.synced)
        assert modes.mode("ml") == "enabled"
        api.patch(
            "v1", "Namespace", "ml", {"metadata": {"labels": {"gpu-slicer.io/migration": "audit"}}}
        )
        eventually(lambda: modes.mode("ml") == "audit")
        api.patch(
            "v1", "Namespace", "ml", {"metadata": {"labels": {"gpu-slicer.io/migration": None}}}
        )
        eventually(lambda: modes.mode("ml") == "disabled")
        api.create(namespace("new", "enabled"))
        eventually(lambda: modes.cache.get("new") == "enabled")
        api.clear_calls()
        assert modes.mode("new") == "enabled"
        assert [c for c in api.calls if c.verb == "get"] == []  # answered from the cache
    finally:
        modes.stop()


def test_a_namespace_the_cache_has_not_seen_is_looked_up_once(api: InMemoryKubeApi) -> None:
    modes = NamespaceModes(api, miss_ttl_s=60)
    modes.cache.relist()  # synced, empty
    api.create(namespace("fresh", "audit"))  # the watch is not running: the cache lags
    assert modes.mode("fresh") == "audit"
    assert modes.mode("fresh") == "audit"
    assert [c.verb for c in api.calls].count("get") == 1
    assert modes.mode("gone") == "disabled"  # NotFound: nothing to convert there


def test_an_unreachable_api_on_a_miss_is_a_cache_error(api: InMemoryKubeApi) -> None:
    modes = NamespaceModes(api)
    api.fail_next("get", Unavailable("timeout"))
    with pytest.raises(CacheError, match="timeout"):
        modes.mode("ml")


def test_extended_resource_names_come_from_device_classes(api: InMemoryKubeApi) -> None:
    api.create(device_class("gpu.gpu-slicer.io"))
    api.create(device_class("legacy-gpu", "nvidia.com/gpu"))
    names = ExtendedResourceNames(api)
    names.start()
    try:
        eventually(lambda: names.synced)
        assert names.names() == frozenset({"nvidia.com/gpu"})
        api.create(device_class("legacy-mig", "nvidia.com/mig-1g.10gb"))
        eventually(lambda: "nvidia.com/mig-1g.10gb" in names.names())
        api.delete("resource.k8s.io/v1", "DeviceClass", "legacy-gpu")
        eventually(lambda: names.names() == frozenset({"nvidia.com/mig-1g.10gb"}))
    finally:
        names.stop()


def test_an_apiserver_without_device_classes_counts_as_synced_and_empty(
    api: InMemoryKubeApi,
) -> None:
    api.fail_next(
        "list", NotFound("the server could not find the requested resource"), kind="DeviceClass"
    )
    names = ExtendedResourceNames(api)
    names.start()
    try:
        eventually(lambda: names.synced)
        assert names.names() == frozenset()
        assert [c.verb for c in api.calls] == ["list"]  # no watch on a missing API
    finally:
        names.stop()


class _DroppingApi(InMemoryKubeApi):
    """Watches that hang until ``drop`` is set, then fail as a connection torn down would."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.drop = threading.Event()
        self.error = error

    def watch(self, *_args: Any, **_kwargs: Any) -> Iterator[Any]:
        self.drop.wait(5)
        raise self.error
        yield  # a generator, as the real watch is


@pytest.mark.parametrize(
    "error", [Unavailable("connection reset"), NotFound("the server is going away")]
)
def test_a_watch_that_fails_while_the_cache_stops_is_not_reported_or_acted_on(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    # A shutdown (or a test's teardown) stops the caches, then the connections go; the failure
    # that follows is no news: no "watch failed" warning, no relist, no "classes changed".
    api = _DroppingApi(error)
    changes: list[str] = []
    names = ExtendedResourceNames(api, on_change=lambda: changes.append("changed"))
    names.cache.start()
    eventually(lambda: names.synced)
    seen = (len(changes), len([c for c in api.calls if c.verb == "list"]))
    with caplog.at_level("WARNING", logger="gpu_slicer.webhook.caches"):
        names.cache.stop()
        api.drop.set()
        names.cache.stop(timeout_s=5)
    assert not [r for r in caplog.records if "watch failed" in r.getMessage()]
    assert (len(changes), len([c for c in api.calls if c.verb == "list"])) == seen
