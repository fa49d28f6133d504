"""webhook.tree_files: a tree walked, read and written without ever following a symlink out
of it, every write atomic and keeping the source's mode."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from gpu_slicer.webhook import tree_files
from gpu_slicer.webhook.errors import TreeFileError


def test_the_walk_sorts_files_into_manifests_copies_and_links(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    outside = tmp_path / "outside.yaml"
    outside.write_text("kind: Secret\n")
    for name in ("apps/a.yaml", "apps/a.gpu-slicer.yaml", ".sops.yaml", ".github/ci.yml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x: 1\n")
    (root / "chart" / "templates").mkdir(parents=True)
    (root / "chart" / "Chart.yaml").write_text("name: c\n")
    (root / "chart" / "templates" / "job.yaml").write_text("{{ .Values.x }}\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "overlays" / "prod").mkdir(parents=True)
    (root / "overlays" / "prod" / "base").symlink_to("../../apps")
    (root / "apps" / "same.yaml").symlink_to("a.yaml")
    (root / "apps" / "secret.yaml").symlink_to(outside)
    (root / "apps" / "gone.yaml").symlink_to("nowhere.yaml")
    os.mkfifo(root / "apps" / "pipe.yaml")

    walked = tree_files.walk(root)

    assert [str(p) for p in walked.manifests] == ["apps/a.yaml", "chart/Chart.yaml"]
    assert sorted(str(p) for p in walked.others) == [
        ".github/ci.yml",
        ".sops.yaml",
        "apps/a.gpu-slicer.yaml",
        "chart/templates/job.yaml",
    ]
    assert walked.links == {
        PurePosixPath("overlays/prod/base"): "../../apps",
        PurePosixPath("apps/same.yaml"): "a.yaml",
    }
    warnings = "\n".join(walked.warnings)
    assert f"apps/secret.yaml: a symlink to {outside}, outside the tree: not followed" in warnings
    assert "apps/gone.yaml: a symlink to nowhere.yaml, which does not exist" in warnings
    assert "apps/pipe.yaml: not a regular file; left out" in warnings
    assert walked.notes == [
        "chart/templates/: a Helm chart's templates, copied as they are: render the chart and "
        "convert its output (helm's --post-renderer)"
    ]


def test_an_absolute_symlink_inside_the_tree_is_recreated_relative(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "base").symlink_to(tmp_path / "base")
    assert tree_files.walk(tmp_path).links == {PurePosixPath("overlay/base"): "../base"}


def test_a_file_that_became_a_symlink_or_vanished_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "outside").write_text("secret\n")
    (tmp_path / "a.yaml").symlink_to(tmp_path / "outside")
    with pytest.raises(TreeFileError, match="became a symlink during the run: not followed"):
        tree_files.read(tmp_path, PurePosixPath("a.yaml"))
    with pytest.raises(TreeFileError, match="deleted during the run"):
        tree_files.read(tmp_path, PurePosixPath("b.yaml"))
    (tmp_path / "c.yaml").write_bytes(b"\xff")
    with pytest.raises(TreeFileError, match="not UTF-8 text"):
        tree_files.read_text(tmp_path, PurePosixPath("c.yaml"))


def test_a_write_replaces_a_symlink_and_never_writes_through_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (out / "a.yaml").symlink_to(victim)
    hard = out / "b.yaml"
    os.link(victim, hard)  # the same inode: writing in place would change the victim
    writer = tree_files.Writer(out)
    writer.write(PurePosixPath("a.yaml"), b"new\n", 0o640)
    writer.write(PurePosixPath("b.yaml"), b"new\n", 0o640)
    assert victim.read_text() == "precious\n"
    assert not (out / "a.yaml").is_symlink()
    assert (out / "a.yaml").read_text() == "new\n"
    assert (out / "a.yaml").stat().st_mode & 0o777 == 0o640


def test_a_symlinked_folder_in_the_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "apps").symlink_to(elsewhere)
    with pytest.raises(TreeFileError, match=r"out/apps is a symlink: not written through"):
        tree_files.Writer(out).write(PurePosixPath("apps/x/a.yaml"), b"x\n", 0o644)
    assert list(elsewhere.iterdir()) == []


def test_an_interrupted_write_leaves_the_old_file_and_no_debris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.yaml").write_text("old\n")

    def interrupted(src: str, dst: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(TreeFileError, match=r"cannot write .*a\.yaml: Input/output error"):
        tree_files.Writer(tmp_path).write(PurePosixPath("a.yaml"), b"new\n", 0o644)
    assert [p.name for p in tmp_path.iterdir()] == ["a.yaml"]
    assert (tmp_path / "a.yaml").read_text() == "old\n"


def test_links_are_recreated_and_replaced(tmp_path: Path) -> None:
    writer = tree_files.Writer(tmp_path)
    writer.link(PurePosixPath("overlays/prod/base"), "../../base")
    writer.link(PurePosixPath("overlays/prod/base"), "../../base")  # a second run
    assert os.readlink(tmp_path / "overlays/prod/base") == "../../base"
