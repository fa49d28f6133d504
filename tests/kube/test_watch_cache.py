"""kube.watch_cache: a kind listed, then watched, kept current through broken watches."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from gpu_slicer.kube.api import Obj
from gpu_slicer.kube.errors import ApiError, Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.kube.watch_cache import WatchCache


def namespace(name: str, mode: str) -> Obj:
    labels = {"gpu-slicer.io/migration": mode}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


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


def test_an_expired_watch_lists_again(api: InMemoryKubeApi) -> None:
    api.create(namespace("ml", "enabled"))
    cache: WatchCache[str] = WatchCache(
        api,
        "v1",
        "Namespace",
        lambda ns: ns["metadata"]["labels"].get("gpu-slicer.io/migration", "none"),
        watch_timeout_s=0.2,
    )
    api.fail_next("watch", ApiError("too old resource version", status=410, reason="Expired"))
    cache.start()
    try:
        eventually(lambda: cache.synced and cache.get("ml") == "enabled")
        api.create(namespace("later", "audit"))
        eventually(lambda: cache.get("later") == "audit")
        lists = [c for c in api.calls if c.verb == "list"]
        assert len(lists) >= 2  # the first list, and the one after 410
    finally:
        cache.stop()


def test_errors_while_listing_are_retried_and_the_cache_is_not_synced_meanwhile(
    api: InMemoryKubeApi,
) -> None:
    api.create(namespace("ml", "enabled"))
    api.fail_next("list", Unavailable("connection refused"), times=2)
    cache: WatchCache[str] = WatchCache(
        api, "v1", "Namespace", lambda ns: "seen", backoff_s=(0.01, 0.02)
    )
    assert not cache.synced
    cache.start()
    try:
        eventually(lambda: cache.synced)
        assert cache.get("ml") == "seen"
    finally:
        cache.stop()
