"""Build the container image from the unmodified Dockerfile, with no daemon and no registry.

What a cluster installs is the image, so the tests check the image (``tests/sandbox/test_image``)
and a real node can run the chart's agent from it. Machines here have no Docker engine and reach
no container registry, so:

1. **The base** (the Dockerfile's ``PYTHON_IMAGE``) is made from Debian's packages: ``debootstrap
   --variant=minbase`` of bookworm with ``python3`` (3.11), ``python3-venv``,
   ``python-is-python3`` (the Dockerfile calls ``python``) and ``ca-certificates``, trimmed of
   apt's lists and caches, docs and locales, and kept as a root-filesystem tarball.
2. **The image**: buildah (Debian's package) in a private, temporary storage (``vfs`` driver,
   ``chroot`` isolation: root without systemd, cgroup v1) imports the base as
   ``localhost/gpu-slicer-base:python3.11-bookworm`` and runs ``buildah bud --build-arg
   PYTHON_IMAGE=<that>`` on the Dockerfile. Its ``pip install .`` reaches PyPI; the host's CA
   bundle is bind-mounted read-only over the build containers' for the RUN steps, so pip trusts
   what the host trusts (a TLS-inspecting proxy's CA included) and nothing of it enters a layer.
3. **The output**: an OCI archive named ``docker.io/library/gpu-slicer:<version>`` (what the
   manifests' ``image: gpu-slicer`` resolves to) for ``ctr images import``.

Cache (``$GPU_SLICER_CACHE``, see ``sandbox.binaries``)::

    image/base-<hash of the recipe>/{base.tar,build.json}
    image/<hash of Dockerfile, COPY sources, base>/{gpu-slicer-<version>.oci.tar,build.json}

A folder is complete once its ``build.json`` exists; builds run under a file lock in a temporary
folder renamed into place, so a changed Dockerfile, pyproject or source file gives a new image and
an unchanged tree reuses the old one. ``python3 -m sandbox.image`` builds (or finds) it and prints
the archive's path.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpu_slicer.sandbox import oci_archive
from gpu_slicer.sandbox.binaries import Progress, cache_root, locked
from gpu_slicer.sandbox.errors import BuildError

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
BASE_NAME = "localhost/gpu-slicer-base:python3.11-bookworm"
IMAGE_REPOSITORY = "docker.io/library/gpu-slicer"
"""What ``image: gpu-slicer`` in deploy/ resolves to on a node."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"
MIRROR_ENV = "GPU_SLICER_DEBIAN_MIRROR"
KEPT_IMAGES = 3
"""Images kept in the cache; older ones are removed after a build."""
_TRIMMED = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
)
_HOST_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
_IN_IMAGE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_BUILDAH_HOST_PATHS = (
    Path("/var/lib/containers/cache/blob-info-cache-v1.boltdb"),
    Path("/run/containers/networks"),
)
_HOST_TOPS = (Path("/var/lib"), Path("/run"), Path("/"))
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_COPY = re.compile(r"^\s*COPY\s+(?!--from)(.+)$", re.M | re.I)

_Build = Callable[[Path], dict[str, object]]


class ImageToolsMissing(BuildError):
    """buildah or debootstrap is not installed, or this is not root: the image cannot be built."""


def version(root: Path = ROOT) -> str:
    """The project's version (pyproject), which the image is tagged with."""
    with open(root / "pyproject.toml", "rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def image_name(root: Path = ROOT) -> str:
    return f"{IMAGE_REPOSITORY}:{version(root)}"


def ensure(*, cache: Path | None = None, progress: Progress = print, root: Path = ROOT) -> Path:
    """The image's OCI archive: from the cache, or built now (minutes the first time).
    ``root``: the source tree to build (an earlier release's, :mod:`sandbox.releases`)."""
    folder = (cache or cache_root()) / "image"
    target = folder / image_digest(root)
    if (target / "build.json").exists():
        return target / archive_name(root)
    buildah, debootstrap = _tools()
    base = _cached(
        folder / f"base-{_base_digest()}",
        progress,
        "the Debian base",
        lambda work: _build_base(debootstrap, work, progress),
    )
    _cached(
        target,
        progress,
        "the image",
        lambda work: _build_image(buildah, base / "base.tar", work, progress, root),
    )
    _prune(folder)
    return target / archive_name(root)


def _prune(folder: Path) -> None:
    """Keep the newest few images (each source change makes one of about 100 MB)."""
    images = [
        path
        for path in folder.iterdir()
        if re.fullmatch(r"[0-9a-f]{16}", path.name) and (path / "build.json").exists()
    ]
    images.sort(key=lambda path: (path / "build.json").stat().st_mtime, reverse=True)
    for old in images[KEPT_IMAGES:]:
        shutil.rmtree(old, ignore_errors=True)


def archive_name(root: Path = ROOT) -> str:
    return f"gpu-slicer-{version(root)}.oci.tar"


def _tools() -> tuple[str, str]:
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        raise ImageToolsMissing(
            f"{' and '.join(missing)} not installed; on Debian: apt-get install buildah debootstrap"
        )
    if os.geteuid() != 0:
        raise ImageToolsMissing("building the image needs root (debootstrap and buildah chroot)")
    return str(shutil.which("buildah")), str(shutil.which("debootstrap"))


def _cached(target: Path, progress: Progress, what: str, build: _Build) -> Path:
    """``target`` once complete (its build.json exists), built under the lock if it is not."""
    if (target / "build.json").exists():
        return target
    with locked(target):
        if (target / "build.json").exists():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
            work = Path(tmp) / "out"
            work.mkdir()
            started = time.monotonic()
            progress(f"building {what} into {target} (minutes)")
            record = build(work)
            record["seconds"] = round(time.monotonic() - started, 1)
            (work / "build.json").write_text(json.dumps(record, indent=2) + "\n")
            work.rename(target)
            progress(f"built {what} in {record['seconds']} s")
    return target


# --- the base: Debian bookworm with Python 3.11 -------------------------------------------


def _mirror() -> str:
    return os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR


def _base_digest() -> str:
    recipe = {"suite": SUITE, "packages": BASE_PACKAGES, "trimmed": _TRIMMED, "mirror": _mirror()}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _build_base(debootstrap: str, work: Path, progress: Progress) -> dict[str, object]:
    root = work / "rootfs"
    progress(f"debootstrap {SUITE} ({', '.join(BASE_PACKAGES)}) from {_mirror()}")
    include = f"--include={','.join(BASE_PACKAGES)}"
    try:
        _run(
            [debootstrap, "--variant=minbase", include, SUITE, str(root), _mirror()], "debootstrap"
        )
    finally:
        _unmount_below(root)  # debootstrap mounts /proc and /sys in the root; never delete those
    packages = _run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}=${Version}\n"], "dpkg-query"
    ).split()
    python = _run(["chroot", str(root), "python", "--version"], "python in the base").strip()
    if not python.startswith("Python 3.11."):
        raise BuildError(f"{SUITE}'s python is {python}; {BASE_NAME} promises 3.11")
    for relative in _TRIMMED:
        for child in (root / relative).glob("*"):
            oci_archive.remove(child)
    for child in (root / "dev").iterdir():  # a runtime provides /dev
        oci_archive.remove(child)
    tar = ["tar", "--numeric-owner", "--xattrs", "--sort=name", "-C", str(root)]
    _run([*tar, "-cf", str(work / "base.tar"), "."], "tar of the base")
    shutil.rmtree(root)
    return {"suite": SUITE, "mirror": _mirror(), "python": python, "packages": packages}


def _unmount_below(root: Path) -> None:
    with open("/proc/self/mounts", encoding="utf-8") as handle:
        points = [line.split()[1] for line in handle]
    for point in sorted(points, reverse=True):
        if point == str(root) or point.startswith(f"{root}/"):
            subprocess.run(["umount", "--lazy", point], check=False)


# --- the image: buildah bud of the Dockerfile ---------------------------------------------


def image_digest(root: Path = ROOT) -> str:
    """Changes with the Dockerfile, a file it copies, or the base's recipe."""
    digest = hashlib.sha256(_base_digest().encode())
    for path in image_inputs(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def image_inputs(root: Path = ROOT) -> list[Path]:
    """The Dockerfile and every file its COPY lines take from the context, less .dockerignore's."""
    dockerfile = root / DOCKERFILE.name
    ignored = _dockerignore(root)
    files = {dockerfile}
    for line in _COPY.findall(dockerfile.read_text(encoding="utf-8")):
        for source in line.split()[:-1]:
            path = root / source
            candidates = path.rglob("*") if path.is_dir() else [path]
            files.update(
                p for p in candidates if p.is_file() and not _ignored(p.relative_to(root), ignored)
            )
    return sorted(files)


def _dockerignore(root: Path) -> list[str]:
    path = root / ".dockerignore"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(relative: Path, patterns: list[str]) -> bool:
    """As the builder reads .dockerignore: a pattern names a path from the context's root (a
    folder's files with it); ``**/`` matches at any depth."""
    parts = relative.parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    suffixes = [
        "/".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)
    ]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(s, pattern[3:]) for s in suffixes):
                return True
        elif any(fnmatch.fnmatchcase(p, pattern.lstrip("/")) for p in prefixes):
            return True
    return False


def _build_image(
    buildah: str, base_tar: Path, work: Path, progress: Progress, root: Path = ROOT
) -> dict[str, object]:
    tmp = work.parent
    layout = tmp / "layout"
    name = image_name(root)
    with _storage(tmp) as storage:
        bah = [buildah, *storage]
        _import_base(bah, base_tar, tmp)
        progress(f"buildah bud of {DOCKERFILE.name} in {root} with PYTHON_IMAGE={BASE_NAME}")
        revision = _git_revision(root)
        command = [
            *bah,
            "bud",
            "--isolation=chroot",
            "--network=host",
            "--pull=never",
            "--layers=false",
            "--build-arg",
            f"PYTHON_IMAGE={BASE_NAME}",
            "--build-arg",
            f"VERSION={version(root)}",
            "--build-arg",
            f"REVISION={revision}",
            "--tag",
            name,
            "--file",
            str(root / DOCKERFILE.name),
        ]
        bundle = _host_ca_bundle()
        if bundle is not None:
            command += ["--volume", f"{bundle}:{_IN_IMAGE_CA_BUNDLE}:ro"]
        _run([*command, str(root)], "buildah bud", log=work / "bud.log", tmp=tmp)
        target = f"oci:{layout}:{name}"
        _run([*bah, "push", name, target], "buildah push", tmp=tmp)
    oci_archive.name_layout(layout, name)
    oci_archive.pack_layout(layout, work / archive_name(root))
    shutil.rmtree(layout)
    image = oci_archive.read_image(work / archive_name(root))
    return {
        "name": name,
        "base": BASE_NAME,
        "revision": revision,
        "layers": [layer["digest"] for layer in image.manifest["layers"]],
    }


def _import_base(bah: list[str], base_tar: Path, tmp: Path) -> None:
    """The base tarball as the image ``BASE_NAME`` in the build's storage."""
    container = _run(
        [*bah, "from", "--pull=never", "scratch"], "buildah from scratch", tmp=tmp
    ).strip()
    _run([*bah, "add", container, str(base_tar), "/"], "buildah add of the base", tmp=tmp)
    config = [*bah, "config", "--env", f"PATH={_PATH}", "--env", "LANG=C.UTF-8", "--cmd", "python3"]
    _run([*config, container], "buildah config of the base", tmp=tmp)
    _run([*bah, "commit", "--rm", container, BASE_NAME], "buildah commit of the base", tmp=tmp)


@contextmanager
def _storage(scratch: Path) -> Iterator[list[str]]:
    """buildah's global flags for a storage of its own in ``scratch`` (not /var/lib/containers),
    removed afterwards: only the archive is kept. What buildah writes outside it whatever its
    flags (its blob-info cache, its network folder) is removed again if it was not there before."""
    folders = (scratch / "storage", scratch / "run")
    created = [path for path in _BUILDAH_HOST_PATHS if not path.exists()]
    try:
        yield ["--root", str(folders[0]), "--runroot", str(folders[1]), "--storage-driver", "vfs"]
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        for path in created:
            _remove_with_empty_parents(path)


def _remove_with_empty_parents(path: Path) -> None:
    if path.is_file():
        path.unlink()
        path = path.parent
    for folder in (path, *path.parents):
        if folder in _HOST_TOPS:
            return
        try:
            folder.rmdir()  # only when empty: never anything another program put there
        except OSError:
            return


def _host_ca_bundle() -> Path | None:
    for candidate in (os.environ.get("SSL_CERT_FILE", ""), *_HOST_CA_BUNDLES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _git_revision(root: Path = ROOT) -> str:
    """The commit the tree is: HEAD of a checkout, or what an exported release recorded."""
    recorded = root / "REVISION"
    if recorded.is_file():
        return recorded.read_text(encoding="utf-8").strip()
    result = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _run(command: list[str], what: str, *, log: Path | None = None, tmp: Path | None = None) -> str:
    """Run a build step; ``tmp`` is its TMPDIR (buildah's big temporary files go there)."""
    env = {**os.environ, "TMPDIR": str(tmp)} if tmp is not None else None
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if log is not None:
        log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        raise BuildError(f"{what} failed (exit {result.returncode}):\n{tail}")
    return result.stdout


if __name__ == "__main__":
    try:
        print(ensure(progress=lambda message: print(f"sandbox.image: {message}", file=sys.stderr)))
    except BuildError as exc:
        print(f"sandbox.image: {exc}", file=sys.stderr)
        sys.exit(1)
