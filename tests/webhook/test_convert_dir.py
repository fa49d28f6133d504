"""`gpu-slicer convert DIR`: a GitOps repository converted file by file, printed, written
beside the sources or into an output folder as a whole tree; a bad file is named and kept."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main

DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: infer, namespace: ml}
spec:
  selector: {matchLabels: {app: infer}}
  template:
    metadata: {labels: {app: infer}}
    spec:
      containers:
        - name: main
          image: registry.example/infer:1
          resources: {limits: {nvidia.com/mig-1g.10gb: 1}}
"""
CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: ml}\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "apps" / "infer").mkdir(parents=True)
    (root / "apps" / "infer" / "deployment.yaml").write_text(DEPLOYMENT)
    (root / "apps" / "config.yml").write_text(CONFIGMAP)
    (root / ".git").mkdir()
    (root / ".git" / "junk.yaml").write_text("not: [valid")
    (root / "README.md").write_text("# not a manifest\n")
    return root


def test_a_folder_is_read_recursively_and_printed_like_one_stream(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", str(repo)]) == 0
    captured = capsys.readouterr()
    kinds = [d["kind"] for d in yaml.safe_load_all(captured.out) if d]
    assert sorted(kinds) == ["ConfigMap", "Deployment", "ResourceClaimTemplate"]
    assert "apps/infer/deployment.yaml" in captured.err


def test_out_dir_writes_the_whole_tree_converting_only_what_asks_for_gpus(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 0
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == ["README.md", "apps/config.yml", "apps/infer/deployment.yaml"]
    docs = list(yaml.safe_load_all((out / "apps/infer/deployment.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Deployment", "ResourceClaimTemplate"]
    assert "resourceClaims" in docs[0]["spec"]["template"]["spec"]
    assert (out / "apps/config.yml").read_text() == CONFIGMAP
    assert (out / "README.md").read_text() == "# not a manifest\n"
    assert "unchanged: apps/config.yml" in capsys.readouterr().err


def test_an_out_dir_inside_the_tree_is_not_read_again(repo: Path) -> None:
    out = repo / "converted"
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 0
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 0  # a second run
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == ["README.md", "apps/config.yml", "apps/infer/deployment.yaml"]


def test_beside_writes_next_to_each_source_in_the_chosen_format(repo: Path) -> None:
    assert main(["convert", str(repo), "--beside", "-o", "json"]) == 0
    target = repo / "apps" / "infer" / "deployment.gpu-slicer.json"
    import json

    listed = json.loads(target.read_text())
    assert listed["kind"] == "List"
    assert [i["kind"] for i in listed["items"]] == ["Deployment", "ResourceClaimTemplate"]
    assert not (repo / "apps" / "config.gpu-slicer.json").exists()
    assert (repo / "apps" / "infer" / "deployment.yaml").read_text() == DEPLOYMENT


def test_a_bad_file_is_named_and_kept_while_the_rest_is_written(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "apps" / "broken.yaml").write_text("kind: [unclosed\n")
    out = tmp_path / "out"
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"gpu-slicer convert: {repo / 'apps' / 'broken.yaml'}: " in err
    assert (out / "apps" / "broken.yaml").read_text() == "kind: [unclosed\n"
    docs = list(yaml.safe_load_all((out / "apps/infer/deployment.yaml").read_text()))
    assert "resourceClaims" in docs[0]["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{file}", "--beside"], "give a folder"),
        (["{empty}"], "holds no .yaml, .yml or .json files"),
        (["{repo}", "--out-dir", "{file}"], "is a file, not a folder"),
    ],
    ids=["beside-with-a-file", "empty-folder", "out-dir-is-a-file"],
)
def test_bad_folder_usage_is_exit_2_with_one_line(
    repo: Path,
    tmp_path: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    file = repo / "apps" / "config.yml"
    args = [a.format(repo=repo, empty=empty, file=file) for a in argv]
    assert main(["convert", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-slicer convert: ") and message in err and err.count("\n") == 1


def test_out_dir_and_beside_exclude_each_other(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(repo), "--beside", "--out-dir", "x"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_symlink_out_of_the_tree_is_named_and_never_read_copied_or_written(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside.yaml"
    outside.write_text(DEPLOYMENT)
    (repo / "apps" / "linked.yaml").symlink_to(outside)
    assert main(["convert", str(repo), "--beside"]) == 0
    assert main(["convert", str(repo), "--out-dir", str(tmp_path / "out")]) == 0
    assert main(["convert", str(repo)]) == 0
    captured = capsys.readouterr()
    assert outside.read_text() == DEPLOYMENT
    assert not (repo / "apps" / "linked.gpu-slicer.yaml").exists()
    assert not (tmp_path / "out" / "apps" / "linked.yaml").exists()
    warning = f"apps/linked.yaml: a symlink to {outside}, outside the tree: not followed"
    assert captured.err.count(warning) == 3
    assert captured.out.count("kind: Deployment") == 1


def test_a_symlinked_folder_in_the_out_dir_is_not_written_through(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "apps").symlink_to(elsewhere)
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert (
        f"{repo / 'apps' / 'config.yml'}: {out / 'apps'} is a symlink: not written through" in err
    )
    assert list(elsewhere.iterdir()) == []
    assert (out / "README.md").read_text() == "# not a manifest\n"


def test_out_dir_keeps_hidden_files_folder_symlinks_and_modes(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / ".sops.yaml").write_text("creation_rules: []\n")
    (repo / "apps" / ".gitignore").write_text("*.tmp\n")
    (repo / "overlays" / "prod").mkdir(parents=True)
    (repo / "overlays" / "prod" / "base").symlink_to("../../apps")
    (repo / "apps" / "infer" / "deployment.yaml").chmod(0o600)
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    out = tmp_path / "out"
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 0
    assert (out / ".sops.yaml").read_text() == "creation_rules: []\n"
    assert (out / "apps" / ".gitignore").read_text() == "*.tmp\n"
    assert os.readlink(out / "overlays" / "prod" / "base") == "../../apps"
    assert (out / "overlays" / "prod" / "base" / "config.yml").read_text() == CONFIGMAP
    assert (out / "apps" / "infer" / "deployment.yaml").stat().st_mode & 0o777 == 0o600
    assert (out / "run.sh").stat().st_mode & 0o777 == 0o755
    assert not (out / ".git").exists()
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 0  # again, over the links
    assert os.readlink(out / "overlays" / "prod" / "base") == "../../apps"


def test_an_unreadable_file_is_named_and_the_stream_stays_valid(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "apps" / "latin1.yaml").write_bytes("kind: caf\xe9\n".encode("latin-1"))
    (repo / "apps" / "broken.yaml").write_text("kind: [unclosed\nraw: text\n")
    assert main(["convert", str(repo)]) == 1
    captured = capsys.readouterr()
    kinds = [d["kind"] for d in yaml.safe_load_all(captured.out) if d]
    assert sorted(kinds) == ["ConfigMap", "Deployment", "ResourceClaimTemplate"]
    assert "unclosed" not in captured.out and "raw: text" not in captured.out
    assert f"{repo / 'apps' / 'latin1.yaml'}: not UTF-8 text" in captured.err
    assert f"{repo / 'apps' / 'broken.yaml'}: not valid YAML" in captured.err


def test_a_file_deleted_during_the_run_is_reported_as_such(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_slicer.webhook import gitops

    convert_tree = gitops.convert_tree

    def then_deleted(*args: Any, **kwargs: Any) -> gitops.Tree:
        tree = convert_tree(*args, **kwargs)
        (repo / "apps" / "infer" / "deployment.yaml").unlink()
        return tree

    monkeypatch.setattr(gitops, "convert_tree", then_deleted)
    assert main(["convert", str(repo), "--beside"]) == 1
    err = capsys.readouterr().err
    deployment = repo / "apps" / "infer" / "deployment.yaml"
    assert f"{deployment}: deleted during the run: its conversion is not written" in err
    assert "wrote" not in err
    assert not (repo / "apps" / "infer" / "deployment.gpu-slicer.yaml").exists()


def test_beside_outputs_are_not_read_as_sources_again(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", str(repo), "--beside"]) == 0
    assert main(["convert", str(repo), "--beside"]) == 0
    assert main(["convert", str(repo)]) == 0
    captured = capsys.readouterr()
    assert not list(repo.rglob("*.gpu-slicer.gpu-slicer.*"))
    assert captured.out.count("kind: Deployment") == 1


def test_a_helm_template_is_never_converted_in_place(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = repo / "charts" / "infer"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: infer\nversion: 0.1.0\n")
    (chart / "templates" / "deployment.yaml").write_text(DEPLOYMENT)  # valid YAML, still a template
    templated = DEPLOYMENT.replace("infer:1", "infer:{{ .Values.tag }}")
    (repo / "apps" / "templated.yaml").write_text(templated)
    out = tmp_path / "out"
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert (out / "charts/infer/templates/deployment.yaml").read_text() == DEPLOYMENT
    assert (out / "apps" / "templated.yaml").read_text() == templated
    assert "charts/infer/templates/: a Helm chart's templates, copied as they are" in err
    assert f"{repo / 'apps' / 'templated.yaml'}: holds '{{{{'" in err
    assert "not converted in place" in err
    assert "apps/templated.yaml: Deployment" not in err  # no claim of a conversion


def test_an_out_dir_that_cannot_be_created_is_exit_2(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["convert", str(repo), "--out-dir", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"gpu-slicer convert: --out-dir {tmp_path / 'file' / 'out'}: cannot create"
    )


def test_audit_exits_0_on_what_it_would_deny_and_1_on_a_file_it_could_not_read(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    denied = DEPLOYMENT.replace("mig-1g.10gb", "mig-9g.999gb")
    (repo / "apps" / "denied.yaml").write_text(denied)
    assert main(["convert", str(repo), "--mode", "audit"]) == 0
    captured = capsys.readouterr()
    assert "gpu-slicer audit: would deny:" in captured.err
    assert denied in captured.out  # printed unchanged
    (repo / "apps" / "broken.yaml").write_text("kind: [unclosed\n")
    assert main(["convert", str(repo), "--mode", "audit"]) == 1
    captured = capsys.readouterr()
    assert f"{repo / 'apps' / 'broken.yaml'}: not valid YAML" in captured.err
    assert [d["kind"] for d in yaml.safe_load_all(captured.out) if d].count("Deployment") == 2


def test_a_file_that_cannot_be_written_is_named_and_the_rest_written(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "apps" / "config.yml").mkdir(parents=True)  # a folder where the file goes
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{repo / 'apps' / 'config.yml'}: {out / 'apps' / 'config.yml'} is a folder" in err
    assert "resourceClaims" in (out / "apps" / "infer" / "deployment.yaml").read_text()
    assert (out / "README.md").exists()


DEVICE_CLASS = """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  extendedResourceName: nvidia.com/gpu
  selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com'"}}]
"""


def test_a_device_class_in_the_tree_decides_as_the_webhook_would(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "classes.yaml").write_text(DEVICE_CLASS)
    whole = DEPLOYMENT.replace("name: infer,", "name: whole,").replace(
        "nvidia.com/mig-1g.10gb", "nvidia.com/gpu"
    )
    (repo / "apps" / "whole.yaml").write_text(whole)
    assert main(["convert", str(repo)]) == 0
    captured = capsys.readouterr()
    assert whole in captured.out  # left to the scheduler, byte for byte
    assert "nvidia.com/gpu in main not converted: a DeviceClass serves it (KEP-5004" in (
        captured.err
    )
    converted = [d for d in yaml.safe_load_all(captured.out) if d and d["kind"] == "Deployment"]
    infer = next(d for d in converted if d["metadata"]["name"] == "infer")
    assert "resourceClaims" in infer["spec"]["template"]["spec"]  # MIG is still converted


def test_a_printed_tree_leaves_out_kustomizations_and_chart_files_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "repo"
    (root / "base").mkdir(parents=True)
    (root / "chart" / "templates").mkdir(parents=True)
    (root / "base" / "deployment.yaml").write_text(DEPLOYMENT)
    (root / "base" / "kustomization.yaml").write_text("resources:\n- deployment.yaml\n")
    (root / "chart" / "Chart.yaml").write_text("apiVersion: v2\nname: train\nversion: 0.1.0\n")
    (root / "chart" / "values.yaml").write_text("gpus: 2\n")
    (root / "chart" / "values-prod.yaml").write_text("gpus: 4\n")
    (root / "values.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: values}\n"
    )  # not beside a Chart.yaml: an object like any other
    for output in ("yaml", "json"):
        assert main(["convert", str(root), "-o", output]) == 0
        captured = capsys.readouterr()
        if output == "yaml":
            docs = [d for d in yaml.safe_load_all(captured.out) if d]
        else:
            docs = yaml.safe_load(captured.out)["items"]
        assert sorted(d.get("kind") for d in docs) == [
            "ConfigMap",
            "Deployment",
            "ResourceClaimTemplate",
        ]
        for left_out in (
            "base/kustomization.yaml",
            "chart/Chart.yaml",
            "chart/values.yaml",
            "chart/values-prod.yaml",
        ):
            assert f"{left_out}: left out of the printed stream" in captured.err
    out = tmp_path / "out"
    assert main(["convert", str(root), "--out-dir", str(out)]) == 0
    assert (out / "base" / "kustomization.yaml").read_text() == "resources:\n- deployment.yaml\n"
    assert (out / "chart" / "values.yaml").read_text() == "gpus: 2\n"
