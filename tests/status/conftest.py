"""Fixtures for the status tests (the objects are built in status_fixtures)."""

from __future__ import annotations

import pytest
from status_fixtures import sandbox_like

from kube.memory import InMemoryKubeApi


@pytest.fixture
def cluster() -> InMemoryKubeApi:
    """The sandbox-like objects in an in-memory apiserver."""
    api = InMemoryKubeApi(server_version=(1, 36))
    for objects in sandbox_like().values():
        for obj in objects:
            api.create(obj)
    api.clear_calls()
    return api
