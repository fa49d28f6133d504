"""Find or build ``kustomize``, for the test that runs ``convert`` as a KRM exec function.

kubectl's embedded kustomize has no ``--enable-exec``, so it never runs exec functions; the
standalone kustomize does. A ``kustomize`` on the PATH wins; otherwise it is built from the
module pinned in ``tools/kustomize`` into ``~/.cache/gpu-slicer/kustomize/<version>/``.

Run as a script to build (or find) it and print its path: ``python3 -m sandbox.kustomize``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_slicer.sandbox import go_tool
from gpu_slicer.sandbox.errors import BuildError

MODULE = go_tool.ROOT / "tools" / "kustomize"
MODULE_PATH = "sigs.k8s.io/kustomize/kustomize/v5"


class KustomizeUnavailable(BuildError):
    """kustomize is not on the PATH and cannot be built here (no Go, or the build failed)."""


def kustomize_binary() -> Path:
    """The kustomize to run: on the PATH, cached, or built now (minutes on two cores)."""
    version = go_tool.pinned_version(MODULE, MODULE_PATH, KustomizeUnavailable)

    def build(target: Path) -> None:
        go_tool.build("kustomize", MODULE, MODULE_PATH, target, "-s -w", KustomizeUnavailable)

    return go_tool.find_or_build("kustomize", version, build)


if __name__ == "__main__":
    try:
        print(kustomize_binary())
    except KustomizeUnavailable as exc:
        print(f"sandbox.kustomize: {exc}", file=sys.stderr)
        sys.exit(1)
