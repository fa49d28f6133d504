"""The test tools built from tools/ (helm, kustomize): found or built, else the test is skipped
with the reason, except under CI=true, where a missing tool fails."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_slicer.sandbox.errors import BuildError


@functools.cache
def helm() -> Path:
    from gpu_slicer.sandbox.helm import helm_binary

    return _or_skip("helm", helm_binary)


@functools.cache
def kustomize() -> Path:
    from gpu_slicer.sandbox.kustomize import kustomize_binary

    return _or_skip("kustomize", kustomize_binary)


def _or_skip(name: str, find: Callable[[], Path]) -> Path:
    try:
        return find()
    except BuildError as exc:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"{name} unavailable: {exc}")
