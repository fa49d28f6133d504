"""Find or build ``helm``, for the chart tests and ``sandbox up --install helm``.

A ``helm`` on the PATH wins. Otherwise helm is built from the module pinned in ``tools/helm``
(``helm.sh/helm/v3`` through the Go module proxy) into
``~/.cache/gpu-slicer/helm/<version>/helm``, next to the control-plane binaries the sandbox
builds, and reused from there. Nothing built is committed.

Run as a script to build (or find) it and print its path: ``python3 -m sandbox.helm``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gpu_slicer.sandbox import go_tool
from gpu_slicer.sandbox.errors import BuildError

MODULE = go_tool.ROOT / "tools" / "helm"
MODULE_PATH = "helm.sh/helm/v3"


class HelmUnavailable(BuildError):
    """helm is not on the PATH and cannot be built here (no Go, or the build failed)."""


def pinned_version() -> str:
    """The helm version ``tools/helm/go.mod`` requires (one place to change it)."""
    return go_tool.pinned_version(MODULE, MODULE_PATH, HelmUnavailable)


def _client_go_version() -> tuple[str, str]:
    """(major, minor) Kubernetes version of the client-go in tools/helm/go.mod (v0.37 -> 1.37)."""
    text = (MODULE / "go.mod").read_text(encoding="utf-8")
    match = re.search(r"k8s\.io/client-go\s+v0\.(\d+)\.", text)
    if match is None:
        raise HelmUnavailable(f"{MODULE / 'go.mod'} does not name k8s.io/client-go")
    return "1", match.group(1)


def _build(target: Path) -> None:
    version = pinned_version()
    # As helm's own Makefile does: without the Kubernetes version of the client-go it was built
    # with, helm assumes 1.20 for `template` and `lint` and refuses charts that need newer.
    major, minor = _client_go_version()
    ldflags = " ".join(
        [
            "-s",
            "-w",
            f"-X {MODULE_PATH}/internal/version.version={version}",
            *(
                f"-X {MODULE_PATH}/pkg/{pkg}.k8sVersionMajor={major}"
                for pkg in ("chartutil", "lint/rules")
            ),
            *(
                f"-X {MODULE_PATH}/pkg/{pkg}.k8sVersionMinor={minor}"
                for pkg in ("chartutil", "lint/rules")
            ),
        ]
    )
    go_tool.build("helm", MODULE, f"{MODULE_PATH}/cmd/helm", target, ldflags, HelmUnavailable)


def helm_binary() -> Path:
    """The helm to run: on the PATH, cached, or built now (several minutes on two cores)."""
    return go_tool.find_or_build("helm", pinned_version(), _build)


if __name__ == "__main__":
    try:
        print(helm_binary())
    except HelmUnavailable as exc:
        print(f"sandbox.helm: {exc}", file=sys.stderr)
        sys.exit(1)
