"""Fixtures for the status tests (the objects are built in status_fixtures)."""

from __future__ import annotations

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from tests.support.status_fixtures import sandbox_like


@pytest.fixture
def cluster() -> InMemoryKubeApi:
    """The sandbox-like objects in an in-memory apiserver."""
    api = InMemoryKubeApi(server_version=(1, 36))
    for objects in sandbox_like().values():
        for obj in objects:
            api.create(obj)
    api.clear_calls()
    return api
