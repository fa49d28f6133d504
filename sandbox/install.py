"""gpu-slicer as a cluster installs it: the package without extras in a fresh virtual environment.

The container image runs ``pip install .``: only the dependencies ``pyproject.toml`` declares,
none of the test extras. A runtime import that only the extras satisfy works in the developer's
environment and fails on every node. This module builds that install so that tests (and the
sandbox's components, ``sandbox up --gpu-slicer PATH``) run what ships:

* the declared dependencies go into a virtual environment kept in the cache
  (``<cache>/installed/<key>``, the key a hash of the Python version, the dependency list and the
  build requirement), made once from the package index and reused while they are unchanged;
* each :func:`install` makes a fresh environment for the package itself: a ``.pth`` file lends it
  the cached dependencies, and the package is built from the source tree (a copy, so that no
  ``build/`` appears in it) and installed without dependencies, so its code is always the tree's.

``install(...) / "bin" / "gpu-slicer"`` is then the command, importing nothing from the tree.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from pathlib import Path

from gpu_slicer.sandbox.binaries import Progress, cache_root, locked
from gpu_slicer.sandbox.errors import BuildError

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCE = shutil.ignore_patterns(
    ".git", "*.egg-info", "build", "dist", "__pycache__", ".*_cache", ".hypothesis", ".venv*"
)


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """What a plain ``pip install .`` brings: the declared dependencies, and setuptools to
    build the package without an isolated build environment."""
    data = tomllib.loads(pyproject.read_text())
    return sorted(data["project"]["dependencies"]) + sorted(data["build-system"]["requires"])


def dependency_key(reqs: list[str]) -> str:
    """Changes with the interpreter's version and the requirement list, nothing else."""
    facts = {"python": sys.version.split()[0], "implementation": sys.implementation.name}
    digest = hashlib.sha256(json.dumps([facts, reqs]).encode()).hexdigest()
    return digest[:16]


def _run(command: list[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise BuildError(f"{what} failed (exit {done.returncode}):\n" + "\n".join(tail))


def _site_packages(venv: Path) -> Path:
    relative = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    return venv / relative


def ensure_dependencies(*, cache: Path | None = None, progress: Progress = print) -> Path:
    """The cached environment with the declared dependencies, made when missing."""
    reqs = requirements()
    target = (cache or cache_root()) / "installed" / dependency_key(reqs)
    if (target / "build.json").exists():
        return target
    with locked(target):
        if (target / "build.json").exists():
            return target
        shutil.rmtree(target, ignore_errors=True)  # a half-made one from an interrupted run
        progress(f"installing gpu-slicer's declared dependencies into {target} (once)")
        started = time.monotonic()
        # Made where it stays: a virtual environment cannot be moved once made.
        _run([sys.executable, "-m", "venv", str(target)], "python -m venv")
        _run(
            [str(target / "bin" / "python"), "-m", "pip", "install", "-q", *reqs],
            "pip install of the declared dependencies (" + ", ".join(reqs) + ")",
        )
        record = {"requirements": reqs, "seconds": round(time.monotonic() - started, 1)}
        (target / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    return target


def install(folder: Path, *, cache: Path | None = None, progress: Progress = print) -> Path:
    """A fresh environment in ``folder`` with the tree's package installed as a plain
    ``pip install .`` would; returns ``folder``."""
    deps = ensure_dependencies(cache=cache, progress=progress)
    _run([sys.executable, "-m", "venv", "--without-pip", str(folder)], "python -m venv")
    (_site_packages(folder) / "gpu-slicer-dependencies.pth").write_text(f"{_site_packages(deps)}\n")
    with tempfile.TemporaryDirectory(prefix="gpu-slicer-src-") as scratch:
        source = Path(scratch) / "src"
        shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
        _run(
            [
                str(folder / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                "--no-build-isolation",
                str(source),
            ],
            "pip install of the package",
            cwd=Path(scratch),
        )
    return folder


__all__ = ["dependency_key", "ensure_dependencies", "install", "requirements"]
