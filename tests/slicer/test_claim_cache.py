"""Reading claims: our results only, the watch-backed cache, GET on a miss, API outages."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpu_slicer.kube.errors import Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.claim_cache import AllocatedDevice, ClaimCache, ClaimError, our_results
from tests.support.agent_fixtures import NODE, allocate_claim, ref


def test_only_results_of_our_driver_in_our_pool_count() -> None:
    """Ours: the driver's name, or 0.1's (``gpu-slicer.io``: a claim allocated before an
    upgrade), and this node's pool."""
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "a",
                            "driver": "z.gpu-slicer.io",
                            "pool": NODE,
                            "device": "gpu-0",
                        },
                        {
                            "request": "b",
                            "driver": "gpu.nvidia.com",
                            "pool": NODE,
                            "device": "gpu-1",
                        },
                        {
                            "request": "c/small",
                            "driver": "z.gpu-slicer.io",
                            "pool": "node-b",
                            "device": "gpu-2",
                        },
                        {
                            "request": "d/small",
                            "driver": "gpu-slicer.io",
                            "pool": NODE,
                            "device": "gpu-0-mig-1g10gb-6",
                        },
                    ]
                }
            }
        }
    }
    assert our_results(claim, pool=NODE) == [
        AllocatedDevice("a", "gpu-0", NODE, "z.gpu-slicer.io"),
        AllocatedDevice("d/small", "gpu-0-mig-1g10gb-6", NODE, "gpu-slicer.io"),
    ]
    assert our_results({"status": {}}, pool=NODE) == []


def test_a_miss_is_answered_by_a_get_and_a_replaced_claim_is_refused() -> None:
    api = InMemoryKubeApi()
    cache = ClaimCache(api, pool=NODE)
    claim = allocate_claim(api, ["gpu-0"], name="c")
    uid, namespace, name = ref(claim)
    assert cache.get(namespace, name, uid)["metadata"]["uid"] == uid
    api.delete("resource.k8s.io/v1", "ResourceClaim", name, namespace)
    allocate_claim(api, ["gpu-0"], name="c")
    with pytest.raises(ClaimError, match="replaced"):
        cache.get(namespace, name, uid)
    with pytest.raises(ClaimError, match="does not exist"):
        cache.get(namespace, "ghost", "u")


def _wait(condition: Any) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_the_watch_keeps_the_cache_current_and_recovers_after_an_outage() -> None:
    api = InMemoryKubeApi()
    api.fail_next("list", Unavailable("connection refused"), times=2)
    changes: list[int] = []
    errors: list[str] = []
    cache = ClaimCache(
        api,
        pool=NODE,
        on_change=lambda: changes.append(1),
        on_error=errors.append,
        backoff_s=(0.01, 0.05),
        watch_timeout_s=5,
    )
    cache.start()
    try:
        _wait(lambda: cache.synced)
        assert cache.api_failures == 0 and cache.last_error is None
        assert errors == ["connection refused", "connection refused"]  # reported, then retried
        claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
        _wait(lambda: ref(claim)[0] in cache.allocated())
        api.delete("resource.k8s.io/v1", "ResourceClaim", claim["metadata"]["name"], "ml")
        _wait(lambda: ref(claim)[0] not in cache.allocated())
        assert changes
        calls = len(api.calls)
        uid, namespace, name = ref(allocate_claim(api, ["gpu-1"]))
        _wait(lambda: uid in cache.allocated())
        cache.get(namespace, name, uid)
        assert not [c for c in api.calls[calls:] if c.verb == "get"]  # served from the cache
    finally:
        api.close()
        cache.stop()
