"""The container image, built from the Dockerfile by ``sandbox.image``, does what users rely on.

The archive is read and unpacked with the standard library (``sandbox.oci_archive``) and its
entrypoint is run the way a runtime would: chrooted into the layers, as the configured user, in
the configured working folder, with the configured environment only. Building it needs root,
buildah and debootstrap; without them the tests skip with the reason, except under ``CI=true``,
where that fails (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.sandbox import image, oci_archive

ROOT = Path(__file__).resolve().parents[2]
# What a runtime gives every container; the image itself ships an empty /dev.
_DEVICES = {"null": (1, 3), "zero": (1, 5), "random": (1, 8), "urandom": (1, 9)}


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def archive() -> Path:
    try:
        return image.ensure(progress=lambda m: print(f"[image] {m}", file=sys.__stderr__))
    except image.ImageToolsMissing as exc:
        if _under_ci():
            pytest.fail(f"the image tests need their tools under CI: {exc}")
        pytest.skip(f"cannot build the image here: {exc}")


@pytest.fixture(scope="module")
def rootfs(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image") / "rootfs"
    oci_archive.unpack(archive, root)
    for name, (major, minor) in _DEVICES.items():
        os.mknod(root / "dev" / name, 0o20666, os.makedev(major, minor))
        os.chmod(root / "dev" / name, 0o666)
    return root


def _config(archive: Path) -> dict[str, Any]:
    config: dict[str, Any] = oci_archive.read_image(archive).config["config"]
    return config


def _run_image(
    archive: Path,
    rootfs: Path,
    args: list[str] | None = None,
    *,
    entrypoint: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """The image's entrypoint with ``args`` (default: its Cmd), as its configuration says."""
    config = _config(archive)
    user, _, group = config["User"].partition(":")
    env = dict(item.split("=", 1) for item in config["Env"])
    command = (entrypoint or config["Entrypoint"]) + (config["Cmd"] if args is None else args)

    def enter() -> None:
        os.chroot(rootfs)
        os.chdir(config.get("WorkingDir") or "/")
        os.setgroups([])
        os.setgid(int(group or user))
        os.setuid(int(user))

    return subprocess.run(
        command, env=env, preexec_fn=enter, capture_output=True, text=True, check=False, timeout=120
    )


DOCKERFILE = """FROM base AS build
COPY pyproject.toml ./
COPY pkg/ pkg/
FROM base
COPY --from=build /opt /opt
"""


def _context(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    (tmp_path / ".dockerignore").write_text("# comment\n**/__pycache__\n**/*.log\ndocs\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "code.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "debug.log").write_text("noise\n")
    (tmp_path / "docs" / "notes.md").write_text("not copied\n")
    return tmp_path


def test_the_inputs_are_what_the_dockerfile_copies_less_dockerignore(tmp_path: Path) -> None:
    context = _context(tmp_path)
    inputs = {str(path.relative_to(context)) for path in image.image_inputs(context)}
    assert inputs == {"Dockerfile", "pyproject.toml", "pkg/code.py"}


def test_a_copied_file_changes_the_image_and_anything_else_does_not(tmp_path: Path) -> None:
    context = _context(tmp_path)
    first = image.image_digest(context)
    (context / "docs" / "notes.md").write_text("edited\n")
    (context / "pkg" / "debug.log").write_text("more noise\n")
    assert image.image_digest(context) == first
    (context / "pkg" / "code.py").write_text("x = 2\n")
    assert image.image_digest(context) != first


def test_the_checkouts_inputs_are_the_packages_the_dockerfile_copies() -> None:
    tops = {path.relative_to(ROOT).parts[0] for path in image.image_inputs()}
    assert tops == {
        "Dockerfile",
        "pyproject.toml",
        "README.md",
        "gpu_slicer",
        "core",
        "cli",
        "kube",
        "slicer",
        "webhook",
        "certs",
        "sim",
        "status",
        "plan",
    }
    assert not any("__pycache__" in path.parts for path in image.image_inputs())


def test_the_archive_is_named_as_the_manifests_name_the_image(archive: Path) -> None:
    # deploy/ says `image: gpu-slicer` with the chart's version as tag: a node resolves that to
    # docker.io/library/gpu-slicer:<version>, the name containerd's import must give it.
    kustomization = (ROOT / "deploy/base/kustomization.yaml").read_text(encoding="utf-8")
    tag = re.search(r"newTag:\s*(\S+)", kustomization)
    assert tag is not None
    assert oci_archive.read_image(archive).name == f"docker.io/library/gpu-slicer:{tag.group(1)}"


def test_the_image_carries_every_label_the_dockerfile_sets(archive: Path) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    declared = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", dockerfile))
    labels = _config(archive)["Labels"]
    assert declared <= set(labels)
    assert labels["org.opencontainers.image.title"] == "gpu-slicer"
    assert labels["org.opencontainers.image.version"] == image.version()
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"] == image.BASE_NAME
    assert re.fullmatch(r"[0-9a-f]{40}|", labels["org.opencontainers.image.revision"])


def test_the_image_runs_as_the_non_root_user_65532(archive: Path, rootfs: Path) -> None:
    assert _config(archive)["User"] == "65532:65532"
    who = _run_image(
        archive, rootfs, ["-c", "import os; print(os.getuid(), os.getgid())"], entrypoint=["python"]
    )
    assert who.returncode == 0, who.stderr
    assert who.stdout.split() == ["65532", "65532"]


def test_the_entrypoint_prints_the_version(archive: Path, rootfs: Path) -> None:
    result = _run_image(archive, rootfs, ["--version"])
    assert result.returncode == 0, result.stderr
    assert image.version() in result.stdout


def test_the_default_command_is_the_help(archive: Path, rootfs: Path) -> None:
    result = _run_image(archive, rootfs)
    assert result.returncode == 0, result.stderr
    assert "usage: gpu-slicer" in result.stdout


def test_the_agent_command_is_there(archive: Path, rootfs: Path) -> None:
    result = _run_image(archive, rootfs, ["agent", "run", "--help"])
    assert result.returncode == 0, result.stderr
    assert "--backend" in result.stdout


def test_the_webhooks_gunicorn_worker_loads(archive: Path, rootfs: Path) -> None:
    # What `webhook serve` asks gunicorn for; without `packaging` installed it fails with
    # "class uri 'gpu_slicer.webhook.worker.DeadlineGeventWorker' invalid or not found".
    worker = "gpu_slicer.webhook.worker.DeadlineGeventWorker"
    load = f"from gunicorn.util import load_class; load_class({worker!r})"
    result = _run_image(archive, rootfs, ["-c", load], entrypoint=["python"])
    assert result.returncode == 0, result.stderr


def test_the_image_has_no_test_extras(rootfs: Path) -> None:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        extras = tomllib.load(handle)["project"]["optional-dependencies"]["test"]
    runtime = _installed(rootfs)
    assert "gpu-slicer" in runtime and "grpcio" in runtime  # the listing itself works
    only_for_tests = {
        _normalized(re.split(r"[<>=\[;\s]", extra, maxsplit=1)[0]) for extra in extras
    }
    assert "pytest" in only_for_tests
    assert only_for_tests & runtime == set()


def _installed(rootfs: Path) -> set[str]:
    found = (rootfs / "opt/gpu-slicer/lib").glob("python3*/site-packages/*.dist-info")
    return {_normalized(path.name.split("-")[0]) for path in found}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
