"""`gpu-slicer convert` on hostile or unusual input: each problem named with its file and a
message a user can act on, the rest of the tree converted, never an internal error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from gpu_slicer.cli.main import main
from tests.kube.test_documents import BOMB

GPU_POD = """apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  containers:
  - name: main
    image: registry.example/train:1
    env:
    - {name: SINCE, value: 2024-01-01}
    resources: {limits: {nvidia.com/gpu: 1}}
"""


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_dates_and_binary_values_are_written_as_json_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\nbinaryData: {b: !!binary aGk=}\n"
    )
    _stdin(monkeypatch, f"{GPU_POD}---\n{config}")
    assert main(["convert", "-", "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert items[0]["spec"]["containers"][0]["env"][0]["value"] == "2024-01-01"
    assert items[1]["binaryData"] == {"b": "aGk="}


def test_a_converted_document_keeps_its_dates_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pod.yaml").write_text(GPU_POD)
    assert main(["convert", str(tmp_path / "pod.yaml")]) == 0
    assert "- {name: SINCE, value: 2024-01-01}\n" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BOMB, "refused at line 1, column 1: its aliases expand it by more than"),
        ("a: " + "[" * 400 + "]" * 400 + "\n", "refused at line 1, column 103: nested too deeply"),
        ("a: " + "7" * 4400 + "\n", "refused at line 1, column 4: an integer of 4400 characters"),
    ],
    ids=["alias bomb", "deep", "long integer"],
)
def test_a_hostile_file_in_a_tree_is_named_and_the_rest_converted(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a-bad.yaml").write_text(text)
    (tree / "b-pod.yaml").write_text(GPU_POD)
    out = tmp_path / "out"
    assert main(["convert", str(tree), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{tree / 'a-bad.yaml'}: {message}" in err
    assert "resourceClaims" in (out / "b-pod.yaml").read_text()
    assert (out / "a-bad.yaml").read_text() == text


def test_an_alias_bomb_on_stdin_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, BOMB)
    assert main(["convert", "-", "-o", "json"]) == 1
    assert "<stdin>: refused at line 1" in capsys.readouterr().err


def test_a_crd_with_malformed_versions_leaves_its_kind_alone_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "pytorchjobs.kubeflow.org"},
        "spec": {"group": "kubeflow.org", "names": {"kind": "PyTorchJob"}, "versions": [5, "x"]},
    }
    container = {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j"},
        "spec": {
            "pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [container]}}}}
        },
    }
    (tmp_path / "crd.yaml").write_text(yaml.safe_dump_all([crd, job]))
    assert main(["convert", str(tmp_path / "crd.yaml")]) == 0
    captured = capsys.readouterr()
    assert "PyTorchJob j: left alone" in captured.err
    assert "has no storage version with a schema" in captured.err
    assert "resourceClaims" not in captured.out


def test_a_null_count_says_a_quantity_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pod.yaml").write_text(GPU_POD.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: null"))
    assert main(["convert", str(tmp_path / "pod.yaml")]) == 1
    err = capsys.readouterr().err
    assert "limits[nvidia.com/gpu]: no value (null) where a quantity is expected" in err
    assert "None" not in err
