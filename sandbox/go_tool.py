"""Building a Go command pinned by a small module under ``tools/`` into the cache.

helm (``tools/helm``) and kustomize (``tools/kustomize``) are test tools: a binary on the PATH
wins; otherwise the command is built once from the module the tool's ``go.mod`` requires (the
Go module proxy serves it) into ``~/.cache/gpu-slicer/<name>/<version>/<name>`` and reused.
Nothing built is committed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpu_slicer.sandbox.binaries import cache_root
from gpu_slicer.sandbox.errors import BuildError

ROOT = Path(__file__).resolve().parents[1]


def pinned_version(module: Path, module_path: str, error: type[BuildError]) -> str:
    """The version of ``module_path`` that ``module/go.mod`` requires (one place to change it)."""
    text = (module / "go.mod").read_text(encoding="utf-8")
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module_path)}\s+(v\S+)", text, re.M)
    if match is None:
        raise error(f"{module / 'go.mod'} does not require {module_path}")
    return match.group(1)


def cached(name: str, version: str) -> Path:
    """Where the built command lives."""
    return cache_root() / name / version / name


def find_or_build(name: str, version: str, build: Callable[[Path], None]) -> Path:
    """The command on the PATH, else the cached build of ``version``, else ``build`` it now."""
    on_path = shutil.which(name)
    if on_path is not None:
        return Path(on_path)
    target = cached(name, version)
    if not target.is_file():
        build(target)
    return target


def build(
    name: str, module: Path, package: str, target: Path, ldflags: str, error: type[BuildError]
) -> None:
    """``go build`` of ``package`` in ``module`` to ``target``, replaced atomically."""
    go = shutil.which("go")
    if go is None:
        raise error(
            f"{name} is not on the PATH and Go is not installed to build it from "
            f"tools/{module.name}; install {name} or Go 1.26+"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / name
        result = subprocess.run(
            [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(out), package],
            cwd=module,
            env={**os.environ, "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
            check=False,
            timeout=3600,
        )
        if result.returncode != 0:
            raise error(f"building {name} failed:\n{result.stderr[-4000:]}")
        out.replace(target)  # atomic: a concurrent reader sees no half-written binary
