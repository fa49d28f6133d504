"""`convert` where GitOps tools expect a transformation: a Helm post-renderer (the real helm)
and a kustomize KRM exec function (the real kustomize; kubectl's embedded one runs no exec
functions)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main
from gpu_slicer.webhook import krm
from tests.support import go_tools

BIN = Path(sys.executable).parent
JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-train
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: registry.example/train:1
        resources:
          limits:
            nvidia.com/gpu: {{ .Values.gpus }}
"""


def _docs(text: str) -> list[Any]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _tool(name: str) -> Path:
    found = BIN / name
    if not found.exists():
        found = Path(shutil.which(name) or name)
    return found


def test_convert_is_a_helm_post_renderer(tmp_path: Path) -> None:
    chart = tmp_path / "train"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: train\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("gpus: 2\n")
    (chart / "templates" / "job.yaml").write_text(JOB)
    result = subprocess.run(
        [
            str(go_tools.helm()),
            "template",
            "nightly",
            str(chart),
            "--namespace",
            "ml",
            "--post-renderer",
            str(_tool("gpu-slicer")),
            "--post-renderer-args",
            "convert",
            "--post-renderer-args",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    job, template = _docs(result.stdout)
    spec = job["spec"]["template"]["spec"]
    assert spec["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]
    assert "nvidia.com/gpu" not in str(spec["containers"])
    assert template["kind"] == "ResourceClaimTemplate"


KUSTOMIZATION = """\
resources: [job.yaml]
transformers: [gpu-slicer.yaml]
"""
FUNCTION = """\
apiVersion: gpu-slicer.io/v1alpha1
kind: Convert
metadata:
  name: gpu-slicer
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: {path}
spec:
  namespace: ml
  policy:
    namespaces:
      ml: {{gpu: [1g.10gb, 2g.20gb]}}
"""


def test_convert_is_a_kustomize_krm_function(tmp_path: Path) -> None:
    job = JOB.replace("{{ .Release.Name }}", "nightly").replace("{{ .Values.gpus }}", "1")
    (tmp_path / "kustomization.yaml").write_text(KUSTOMIZATION)
    (tmp_path / "job.yaml").write_text(job)
    (tmp_path / "gpu-slicer.yaml").write_text(FUNCTION.format(path=_tool("gpu-slicer-krm")))
    result = subprocess.run(
        [str(go_tools.kustomize()), "build", "--enable-alpha-plugins", "--enable-exec", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    built = _docs(result.stdout)
    (converted,) = [d for d in built if d["kind"] == "Job"]
    (template,) = [d for d in built if d["kind"] == "ResourceClaimTemplate"]
    assert template["metadata"]["namespace"] == "ml"
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert [s["name"] for s in request["firstAvailable"]] == ["1g-10gb", "2g-20gb"]
    claims = converted["spec"]["template"]["spec"]["resourceClaims"]
    assert claims[0]["resourceClaimTemplateName"] == template["metadata"]["name"]


def _resource_list(items: list[Any], spec: Any = None) -> str:
    body: dict[str, Any] = {"apiVersion": krm.API_VERSION, "kind": krm.KIND, "items": items}
    if spec is not None:
        body["functionConfig"] = {"apiVersion": "gpu-slicer.io/v1alpha1", "kind": "Convert"}
        body["functionConfig"]["spec"] = spec
    return yaml.safe_dump(body)


def test_convert_reading_a_resource_list_answers_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = yaml.safe_load(JOB.replace("{{ .Release.Name }}", "n").replace("{{ .Values.gpus }}", "1"))
    monkeypatch.setattr("sys.stdin", io.StringIO(_resource_list([job], {"namespace": "ml"})))
    assert main(["convert", "-"]) == 0
    answer = yaml.safe_load(capsys.readouterr().out)
    assert answer["kind"] == "ResourceList"
    assert [i["kind"] for i in answer["items"]] == ["Job", "ResourceClaimTemplate"]
    assert any("converted nvidia.com/gpu" in r["message"] for r in answer["results"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"mode": "off"}, "functionConfig.spec.mode: enabled or audit"),
        ({"colour": 1}, "functionConfig.spec.colour: unknown key"),
        ({"policy": {"nvlink": "always"}}, "nvlink"),
    ],
)
def test_a_bad_function_config_is_named(
    spec: dict[str, Any],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(_resource_list([], spec)))
    assert krm.main() == 1
    assert message in capsys.readouterr().err


def _stdin_bytes(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("items: 5\n", "standard input: items: must be a list of objects, not number 5"),
        ("items: abc\n", "standard input: items: must be a list of objects, not string 'abc'"),
        (
            "items: []\nfunctionConfig: {spec: {namespace: Bad_NS}}\n",
            "functionConfig.spec.namespace: 'Bad_NS' is not a namespace name",
        ),
        (
            "items:\n- &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"- &{n} [{', '.join([f'*{p}'] * 10)}]\n"
                for p, n in zip("abcdef", "bcdefg", strict=True)
            ),
            "standard input: refused at line 1, column 1: its aliases expand it",
        ),
    ],
    ids=["items-number", "items-string", "namespace", "alias-bomb"],
)
def test_the_krm_function_validates_its_resource_list(
    body: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    head = f"apiVersion: {krm.API_VERSION}\nkind: {krm.KIND}\n"
    _stdin_bytes(monkeypatch, (head + body).encode())
    assert krm.main() == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"gpu-slicer-krm: {message}")
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1


def test_the_krm_function_names_input_that_is_not_utf8(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin_bytes(
        monkeypatch, f"apiVersion: {krm.API_VERSION}\nkind: {krm.KIND}\n# \xe9\n".encode("latin-1")
    )
    assert krm.main() == 1
    assert capsys.readouterr().err.startswith("gpu-slicer-krm: standard input: not UTF-8 text")


def test_a_namespace_from_the_function_config_names_the_templates(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = yaml.safe_load(JOB.replace("{{ .Release.Name }}", "n").replace("{{ .Values.gpus }}", "1"))
    _stdin_bytes(monkeypatch, _resource_list([job], {"namespace": "ml-2"}).encode())
    assert krm.main() == 0
    items = yaml.safe_load(capsys.readouterr().out)["items"]
    assert items[-1]["metadata"]["namespace"] == "ml-2"
