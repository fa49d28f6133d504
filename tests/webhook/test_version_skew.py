"""Version skew between the webhook and the agents during a rolling upgrade from 0.1.

While the chart rolls, 0.1's webhook may convert a pod that 0.2's agent prepares, and the other
way round. Both agents serve a claim template when its requests name the DeviceClasses and the
attribute domain that both releases' classes and pools carry (``gpu.gpu-slicer.io``,
``mig.gpu-slicer.io``, ``device.attributes["gpu-slicer.io"]``; docs/upgrading.md). The
simplest proof that the two webhooks agree is that they write the same bytes: this runs 0.1's
own translation (its tree exported from the repository's history, ``sandbox.releases``) and this
release's on the project's real-shaped manifests and compares what ``convert`` prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_slicer.sandbox import releases

DATA = Path(__file__).resolve().parent / "data"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def previous() -> Path:
    try:
        return releases.source()
    except releases.HistoryMissing as exc:
        pytest.skip(str(exc))


def _convert(tree: Path, path: Path) -> subprocess.CompletedProcess[str]:
    """``gpu-slicer convert PATH`` with the code of ``tree`` (0.1 installed its packages at the
    top level, this release under ``gpu_slicer``)."""
    main = "gpu_slicer.cli.main" if (tree / "gpu_slicer").is_dir() else "cli.main"
    return subprocess.run(
        [sys.executable, "-m", main, "convert", str(path)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "manifest",
    [p.relative_to(DATA) for p in sorted(DATA.rglob("*.yaml"))],
    ids=str,
)
def test_0_1_s_webhook_and_this_one_write_the_same_claims(previous: Path, manifest: Path) -> None:
    old, new = _convert(previous, DATA / manifest), _convert(ROOT, DATA / manifest)
    assert (old.returncode, new.returncode) == (0, 0), old.stderr + new.stderr
    assert "resourceClaimTemplateName" in new.stdout
    assert new.stdout == old.stdout
