"""Fixtures for the deploy tests: rendered overlays (kubectl kustomize runs once per target)."""

from __future__ import annotations

import pytest

from tests.support.deploy_cases import Obj, render


@pytest.fixture
def base() -> list[Obj]:
    return render("base")


@pytest.fixture
def self_managed() -> list[Obj]:
    return render("overlays/self-managed")


@pytest.fixture
def cert_manager() -> list[Obj]:
    return render("overlays/cert-manager")


@pytest.fixture
def openshift() -> list[Obj]:
    return render("overlays/openshift")


@pytest.fixture
def extended() -> list[Obj]:
    return render("overlays/extended-resources")
