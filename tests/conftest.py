"""What every test gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_slicer.cli.logs import JsonFormatter

HERE = Path(__file__).parent
SLOW = (
    "e2e",
    "sandbox",
    "nvml",
    "deploy/test_helm.py",
    "webhook/test_gitops_tools.py",
    "test_soak.py",
)
"""Tests that build or start something heavy on first use (Kubernetes, the kubelet and
containerd, the image, helm, kustomize, the mock NVML library) or run for minutes: marked
``slow``, so that ``pytest -m "not slow"`` is the tier a contributor runs before a commit
(CONTRIBUTING.md)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(HERE).as_posix()
        if any(where == s or where.startswith(f"{s}/") for s in SLOW):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _root_logger_left_as_found() -> Iterator[None]:
    """A command run in-process (``main([...])``) points the root logger at the stderr pytest
    captured for that test, which is closed afterwards: every later record, from any test's
    thread, would then fail to print. Its handler comes off again, and the level is restored."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if isinstance(h.formatter, JsonFormatter)]:
        root.removeHandler(handler)
    root.setLevel(level)
