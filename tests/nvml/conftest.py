"""The mock-NVML tier: the agent's ``nvml`` backend, through the unmodified ``nvidia-ml-py``
bindings, against ``libnvidia-ml.so.1`` built from sandbox/go/nvmlmock (NVIDIA's go-nvml mock
servers behind the NVML C API).

The library is built once into the cache (seconds to a minute or two cold) and loaded into the
test process. Without Go or a C compiler the tier is skipped with the reason, except under
``CI=true``, where that is a failure. Each test gets a fresh mock node (``mock.reset``) and a
fresh backend, closed afterwards.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.sandbox import nvml_mock
from gpu_slicer.sandbox.errors import BuildError
from gpu_slicer.slicer.nvml import NvmlBackend
from tests.support.agent_fixtures import Agent, build_agent
from tests.support.nvml_mock import MockNvml

BOOT_ID = "8a5d2c1e-0f3b-4d8e-9a77-3c1e5b0d9f42"


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _progress(message: str) -> None:
    print(f"[nvml-mock] {message}", file=sys.__stderr__, flush=True)


@pytest.fixture(scope="session")
def mock_library() -> MockNvml:
    """The built library, loaded; pynvml checked to call it."""
    try:
        path = nvml_mock.ensure(progress=_progress)
    except BuildError as exc:
        if _under_ci():
            pytest.fail(f"the mock-NVML tier needs the mock library: {exc}")
        pytest.skip(f"no mock NVML library: {exc}")
    library = MockNvml(path)
    library.check_bindings()
    return library


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """The node's / as the backend sees it: the boot id; the mock adds the driver's files."""
    root = tmp_path / "root"
    boot = root / "proc/sys/kernel/random"
    boot.mkdir(parents=True)
    (boot / "boot_id").write_text(BOOT_ID + "\n")
    return root


@pytest.fixture
def mock(mock_library: MockNvml, node_root: Path) -> MockNvml:
    """A node of 2 H100s; tests that need other GPUs call ``mock.reset`` again."""
    mock_library.reset("h100:2", root=node_root)
    return mock_library


@pytest.fixture
def make_backend(mock: MockNvml, node_root: Path) -> Iterator[Callable[[], NvmlBackend]]:
    """Fresh NvmlBackends over the real pynvml (a restarted agent is a new one), all closed."""
    made: list[NvmlBackend] = []

    def make() -> NvmlBackend:
        backend = NvmlBackend(root=node_root)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend: Callable[[], NvmlBackend]) -> NvmlBackend:
    return make_backend()


@pytest.fixture
def api() -> InMemoryKubeApi:
    return InMemoryKubeApi()


@pytest.fixture
def make_agent(
    make_backend: Callable[[], NvmlBackend], api: InMemoryKubeApi, tmp_path: Path
) -> Callable[..., Agent]:
    """An agent's parts on a fresh NvmlBackend (or ``backend``), on one checkpoint and CDI
    folder: calling it again is the agent restarted."""

    def make(backend: Any = None) -> Agent:
        return build_agent(backend or make_backend(), api, tmp_path / "agent")

    return make
