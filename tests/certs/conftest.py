"""Shared fixtures for the certs tests: settings and a cluster in memory."""

from __future__ import annotations

import datetime as dt

import pytest

from gpu_slicer.certs.ensure import EnsureSettings
from gpu_slicer.kube.memory import InMemoryKubeApi
from tests.support.certs_cases import CONFIG, NAMESPACE, SECRET, SERVICE, webhook_configuration


@pytest.fixture
def settings() -> EnsureSettings:
    return EnsureSettings(
        namespace=NAMESPACE,
        secret=SECRET,
        webhook_config=CONFIG,
        service=SERVICE,
        days=90,
        ca_days=3650,
        renew_before=dt.timedelta(days=30),
        rotation_grace=dt.timedelta(days=1),
    )


@pytest.fixture
def api() -> InMemoryKubeApi:
    kube = InMemoryKubeApi()
    kube.create(webhook_configuration())
    kube.clear_calls()
    return kube
