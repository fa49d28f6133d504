"""`gpu-slicer convert DIR`: a GitOps repository converted file by file, printed, written
beside the sources or into an output folder as a whole tree; a bad file is named and kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.main import main

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
