"""The end-to-end tier: one `gpu-slicer sandbox up` for the whole session, real control plane.

The sandbox runs as the user runs it (the command, in a subprocess); tests act on it through the
admin kubeconfig with the official client, and read what the stand-ins recorded: the simulated
GPUs' state file per node and the OCI specs the kubelet stand-in made per container
(``e2e_sandbox.Sandbox``).

The control-plane binaries are built (or taken from the cache) before the sandbox starts. Without
Go and without cached binaries the tier is skipped, except under ``CI=true``, where that is a
failure.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gpu_slicer.sandbox import binaries
from gpu_slicer.sandbox.errors import BuildError
from tests.support.e2e_sandbox import (
    AUDIT,
    ENABLED,
    NODES,
    PLAIN,
    Sandbox,
    assert_stopped_cleanly,
    start_sandbox,
    stop_sandbox,
    wait_webhook_knows,
)

T = TypeVar("T")


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _progress(message: str) -> None:
    print(f"[e2e] {message}", file=sys.__stderr__, flush=True)


def _built(what: str, build: Callable[[], T]) -> T:
    """What ``build`` builds (or finds in the cache); without it the tier is skipped, and under
    ``CI=true`` it fails."""
    try:
        return build()
    except BuildError as exc:
        if _under_ci():
            pytest.fail(f"the end-to-end tier needs {what}: {exc}")
        pytest.skip(f"no {what}: {exc}")


@pytest.fixture(scope="session")
def kube_binaries() -> binaries.Binaries:
    """The control plane for the default version, built once into the cache."""
    from gevent import monkey

    assert not monkey.is_module_patched("socket"), (
        "an earlier test ran `webhook serve` in this process and gevent patched it; the "
        "sandbox's clients cannot run in a patched process"
    )
    return _built(
        "the control plane", lambda: binaries.ensure(binaries.DEFAULT_MINOR, progress=_progress)
    )


@pytest.fixture(scope="session")
def kubectl() -> Path:
    """kubectl of the default version, built once into the cache: for what a test does as an
    admin would (``kubectl drain``)."""
    return _built(
        "kubectl",
        lambda: binaries.ensure_command("kubectl", binaries.DEFAULT_MINOR, progress=_progress),
    )


@pytest.fixture(scope="session")
def sandbox(kube_binaries: binaries.Binaries) -> Iterator[Sandbox]:
    folder = Path(tempfile.mkdtemp(prefix="gs-e2e-")) / "sb"
    running = start_sandbox(folder, NODES)
    core = running.core
    for name, mode in ((ENABLED, "enabled"), (AUDIT, "audit"), (PLAIN, None)):
        labels = {"gpu-slicer.io/migration": mode} if mode else {}
        core.create_namespace({"metadata": {"name": name, "labels": labels}})
    # The webhook learns namespace labels from a watch: wait until it converts in ENABLED.
    wait_webhook_knows(running)
    yield running
    running.client.close()
    code = stop_sandbox(running.process)
    assert_stopped_cleanly(code, folder)
    assert not list(folder.glob("**/*.sock")), "sockets left behind"
