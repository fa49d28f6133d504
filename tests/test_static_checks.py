"""The code stays lint-clean and type-checked: CI runs ruff and mypy as part of the test suite."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_finds_nothing_to_fix() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tree_is_ruff_formatted() -> None:
    result = _run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_accepts_every_package() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_package_of_the_namespace_is_in_a_layer() -> None:
    # A package linked into gpu_slicer/ but missing from the layers would escape the contract.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    layered = {p.strip() for layer in layers for p in layer.split("|")}
    linked = {f"gpu_slicer.{p.name}" for p in (ROOT / "gpu_slicer").iterdir() if p.is_symlink()}
    assert linked == layered
    assert all((ROOT / "gpu_slicer" / p.split(".")[1]).resolve().parent == ROOT for p in linked)


def test_the_layers_hold() -> None:
    # The layers contract in pyproject.toml ([tool.importlinter]): core under the API layer
    # under the components; the webhook and the agent never import each other.
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_test_modules_have_unique_names() -> None:
    # The test folders are not packages: pytest refuses a whole run when two of them hold a
    # module of the same name (it imports both as one top-level module).
    root = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in root.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.parent.relative_to(root)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
