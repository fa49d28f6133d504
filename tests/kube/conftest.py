"""Fixtures for the API seam: the in-memory apiserver, a stub HTTP apiserver, and clients."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client as k8s_client

from gpu_slicer.kube.api import KubeApi
from gpu_slicer.kube.client import RealKubeApi
from gpu_slicer.kube.memory import InMemoryKubeApi
from tests.support.kube_stub_apiserver import StubApiServer


def real_api_for(url: str) -> RealKubeApi:
    """A RealKubeApi for a plain-HTTP endpoint, without retries so failures are quick."""
    configuration = k8s_client.Configuration(host=url)
    configuration.retries = False
    configuration.proxy = None
    return RealKubeApi(k8s_client.ApiClient(configuration), request_timeout_s=5.0)


@pytest.fixture
def memory() -> InMemoryKubeApi:
    return InMemoryKubeApi()


@pytest.fixture
def stub() -> Iterator[StubApiServer]:
    server = StubApiServer()
    yield server
    server.close()
    assert server.errors == []


@pytest.fixture
def real(stub: StubApiServer) -> RealKubeApi:
    return real_api_for(stub.url)


@dataclass
class Seam:
    """An implementation under test and the in-memory store behind it (for hooks)."""

    api: KubeApi
    store: InMemoryKubeApi
    kind: str
    store_history: int = 20


@pytest.fixture(params=["memory", "real-over-http"])
def seam(request: pytest.FixtureRequest) -> Iterator[Seam]:
    """Both implementations: the contract tests must pass on each."""
    if request.param == "memory":
        store = InMemoryKubeApi(history=Seam.store_history)
        yield Seam(store, store, "memory")
        store.close()
        return
    server = StubApiServer(InMemoryKubeApi(history=Seam.store_history))
    yield Seam(real_api_for(server.url), server.backend, "real")
    server.close()
