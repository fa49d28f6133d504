"""An earlier release of gpu-slicer, from the repository's own history, for the upgrade tests.

:data:`PREVIOUS` names the release before this one and the commit it was made from. Its tree is
exported with ``git archive`` (nothing of the current tree mixes in) and its image is built from
that tree's Dockerfile, exactly as :mod:`sandbox.image` builds the current one; its chart is the
tree's ``deploy/helm/gpu-slicer``. ``tests/e2e/test_upgrade.py`` installs it on the real node,
runs pods on it and upgrades to the current release.

Cache (``$GPU_SLICER_CACHE``)::

    releases/<version>-<commit>/{src/,build.json}   the exported tree (``src/REVISION``: the commit)
    image/<digest>/...                              its image, as sandbox.image keeps any image

``python3 -m sandbox.releases`` exports and builds it and prints the image archive's path.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpu_slicer.sandbox import image
from gpu_slicer.sandbox.binaries import Progress, cache_root, locked
from gpu_slicer.sandbox.errors import BuildError

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Release:
    version: str
    commit: str


PREVIOUS = Release("0.1.0", "de5c47d90492d307785e8700c8b66128dfa48e62")
"""0.1: the driver was ``gpu-slicer.io`` (0.2 renamed it ``z.gpu-slicer.io``, docs/upgrading.md)."""


class HistoryMissing(BuildError):
    """The checkout does not hold the release's commit (a shallow clone, or an export)."""


def source(release: Release = PREVIOUS, *, cache: Path | None = None) -> Path:
    """The release's source tree, exported from the repository's history once."""
    target = (cache or cache_root()) / "releases" / f"{release.version}-{release.commit[:12]}"
    tree = target / "src"
    if (target / "build.json").exists():
        return tree
    with locked(target):
        if not (target / "build.json").exists():
            _export(release, target)
    return tree


def image_archive(
    release: Release = PREVIOUS, *, cache: Path | None = None, progress: Progress = print
) -> Path:
    """The release's image (an OCI archive tagged ``gpu-slicer:<version>``), built once."""
    return image.ensure(cache=cache, progress=progress, root=source(release, cache=cache))


def _export(release: Release, target: Path) -> None:
    probe = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{release.commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        raise HistoryMissing(
            f"release {release.version} is commit {release.commit}, which this checkout does not "
            "hold (a shallow clone?): run 'git fetch --unshallow' to build the earlier release"
        )
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".export-") as work:
        archive = Path(work) / "src.tar"
        with archive.open("wb") as out:
            subprocess.run(
                ["git", "-C", str(ROOT), "archive", "--format=tar", release.commit],
                stdout=out,
                check=True,
            )
        tree = Path(work) / "src"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        (tree / "REVISION").write_text(release.commit + "\n", encoding="utf-8")
        found = image.version(tree)
        if found != release.version:
            raise BuildError(
                f"commit {release.commit} is version {found}, not {release.version} as "
                "sandbox.releases says"
            )
        archive.unlink()
        shutil.rmtree(target / "src", ignore_errors=True)  # a run stopped half way
        tree.rename(target / "src")
    done = {"version": release.version, "commit": release.commit}
    (target / "build.json").write_text(json.dumps(done))


if __name__ == "__main__":
    try:
        print(image_archive(progress=lambda m: print(f"sandbox.releases: {m}", file=sys.stderr)))
    except BuildError as exc:
        print(f"sandbox.releases: {exc}", file=sys.stderr)
        sys.exit(1)
