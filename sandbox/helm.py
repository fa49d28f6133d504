"""Find or build ``helm``, for the chart tests and ``sandbox up --install helm``.

A ``helm`` on the PATH wins. Otherwise helm is built from the module pinned in ``tools/helm``
(``helm.sh/helm/v3`` through the Go module proxy) into
``~/.cache/gpu-slicer/helm/<version>/helm``, next to the control-plane binaries the sandbox
builds, and reused from there. Nothing built is committed.

Run as a script to build (or find) it and print its path: ``python3 -m sandbox.helm``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sandbox.binaries import cache_root
from sandbox.errors import BuildError

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "tools" / "helm"
MODULE_PATH = "helm.sh/helm/v3"


class HelmUnavailable(BuildError):
    """helm is not on the PATH and cannot be built here (no Go, or the build failed)."""


def pinned_version() -> str:
    """The helm version ``tools/helm/go.mod`` requires (one place to change it)."""
    text = (MODULE / "go.mod").read_text(encoding="utf-8")
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE_PATH)}\s+(v\S+)", text, re.M)
    if match is None:
        raise HelmUnavailable(f"{MODULE / 'go.mod'} does not require {MODULE_PATH}")
    return match.group(1)


def cache_dir() -> Path:
    return cache_root() / "helm" / pinned_version()


def _client_go_version() -> tuple[str, str]:
    """(major, minor) Kubernetes version of the client-go in tools/helm/go.mod (v0.37 -> 1.37)."""
    text = (MODULE / "go.mod").read_text(encoding="utf-8")
    match = re.search(r"k8s\.io/client-go\s+v0\.(\d+)\.", text)
    if match is None:
        raise HelmUnavailable(f"{MODULE / 'go.mod'} does not name k8s.io/client-go")
    return "1", match.group(1)


def _build(target: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise HelmUnavailable(
            "helm is not on the PATH and Go is not installed to build it from tools/helm; "
            "install helm or Go 1.26+"
        )
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
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / "helm"
        env = {**os.environ, "CGO_ENABLED": "0"}
        result = subprocess.run(
            [
                go,
                "build",
                "-trimpath",
                "-ldflags",
                ldflags,
                "-o",
                str(out),
                f"{MODULE_PATH}/cmd/helm",
            ],
            cwd=MODULE,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=3600,
        )
        if result.returncode != 0:
            raise HelmUnavailable(f"building helm {version} failed:\n{result.stderr[-4000:]}")
        out.replace(target)  # atomic: a concurrent reader sees no half-written binary


def helm_binary() -> Path:
    """The helm to run: on the PATH, cached, or built now (several minutes on two cores)."""
    on_path = shutil.which("helm")
    if on_path is not None:
        return Path(on_path)
    target = cache_dir() / "helm"
    if not target.is_file():
        _build(target)
    return target


if __name__ == "__main__":
    try:
        print(helm_binary())
    except HelmUnavailable as exc:
        print(f"sandbox.helm: {exc}", file=sys.stderr)
        sys.exit(1)
