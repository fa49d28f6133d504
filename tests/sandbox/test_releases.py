"""The earlier release the upgrade tests install, exported from the repository's history."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.sandbox import image, releases


def test_the_previous_release_is_exported_whole_from_its_commit(tmp_path: Path) -> None:
    tree = releases.source(cache=tmp_path)
    assert image.version(tree) == releases.PREVIOUS.version
    assert (tree / "REVISION").read_text().strip() == releases.PREVIOUS.commit
    # Its own chart and agent, not this tree's: 0.1 published under the driver gpu-slicer.io.
    assert 'DRIVER = "gpu-slicer.io"' in (tree / "slicer" / "identity.py").read_text()
    assert (tree / "deploy" / "helm" / "gpu-slicer" / "Chart.yaml").is_file()
    assert image.image_name(tree).endswith(":0.1.0")
    assert releases.source(cache=tmp_path) == tree  # once


def test_a_commit_the_checkout_lacks_is_named_with_the_way_out(tmp_path: Path) -> None:
    missing = releases.Release("0.0.1", "0" * 40)
    with pytest.raises(releases.HistoryMissing, match="git fetch --unshallow"):
        releases.source(missing, cache=tmp_path)
    assert not any((tmp_path / "releases").glob("*/build.json"))
