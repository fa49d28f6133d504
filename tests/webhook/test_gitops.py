"""`convert` on files as GitOps keeps them: comments and block text kept, unchanged documents
byte for byte, names and formats kept, the whole tree under --out-dir, each template once, a
kustomize overlay whose patch asks for GPUs still builds with the real `kubectl kustomize`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main

DEPLOYMENT = """\
# The inference service of team ml.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: infer   # owned by team ml
  namespace: ml
  annotations:
    description: |
      Serves the classifier.
      Two lines of block text.
spec:
  replicas: 2
  selector:
    matchLabels: {app: infer}
  template:
    metadata:
      labels:
        app: infer
    spec:
      containers:
        - name: main
          image: "registry.example/infer:1"   # pinned
          args: ["--port", "8080"]
          resources:
            limits:
              cpu: "2"
              nvidia.com/mig-1g.10gb: 1
---
# Nothing to convert here: kept byte for byte.
apiVersion: v1
kind: ConfigMap
metadata: {name: infer-config, namespace: ml}
data:
  key:   "value"
"""


def _docs(text: str) -> list[Any]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def test_comments_block_text_and_styles_are_kept_and_only_gpu_lines_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "infer.yml"
    source.write_text(DEPLOYMENT)
    assert main(["convert", str(source)]) == 0
    out = capsys.readouterr().out
    for kept in (
        "# The inference service of team ml.",
        "  name: infer   # owned by team ml",
        "    description: |\n      Serves the classifier.\n      Two lines of block text.",
        '          image: "registry.example/infer:1"   # pinned',
        '          args: ["--port", "8080"]',
        "    matchLabels: {app: infer}",
    ):
        assert kept in out
    second = DEPLOYMENT[DEPLOYMENT.index("# Nothing to convert") :]
    assert second in out
    assert "nvidia.com/mig-1g.10gb: 1" not in out
    deployment, config, template = _docs(out)
    assert deployment["spec"]["template"]["spec"]["resourceClaims"][0]["name"] == "gpu-slicer"
    assert config == _docs(DEPLOYMENT)[1]
    assert template["kind"] == "ResourceClaimTemplate"


def test_a_file_with_nothing_to_convert_is_printed_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = DEPLOYMENT.replace("nvidia.com/mig-1g.10gb: 1", "memory: 1Gi")
    source = tmp_path / "cpu.yaml"
    source.write_text(text)
    assert main(["convert", str(source)]) == 0
    assert capsys.readouterr().out == text


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _kustomize(folder: Path) -> list[Any]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    result = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return _docs(result.stdout)


def _job(name: str) -> str:
    return f"""\
apiVersion: batch/v1
kind: Job
metadata: {{name: {name}, namespace: ml}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: registry.example/train:1
        resources: {{limits: {{nvidia.com/mig-1g.10gb: 1}}}}
"""


def test_a_template_several_files_need_is_written_once_and_the_tree_builds(
    tmp_path: Path,
) -> None:
    repo = _tree(
        tmp_path / "repo",
        {
            "kustomization.yaml": "resources:\n- jobs/a.yaml\n- jobs/b.yml\n",
            "jobs/a.yaml": _job("a"),
            "jobs/b.yml": _job("b"),
            "README.md": "how to deploy\n",
        },
    )
    out = tmp_path / "out"
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "README.md",
        "jobs/a.yaml",
        "jobs/b.yml",
        "kustomization.yaml",
    ]
    built = _kustomize(out)
    assert [d["kind"] for d in built].count("ResourceClaimTemplate") == 1
    jobs = [d for d in built if d["kind"] == "Job"]
    assert all(j["spec"]["template"]["spec"]["resourceClaims"] for j in jobs) and len(jobs) == 2


BASE_DEPLOYMENT = """\
apiVersion: apps/v1
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
"""
GPU_PATCH = """\
# prod runs on a MIG slice
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer, namespace: ml}
spec:
  template:
    spec:
      containers:
      - name: main
        resources:
          limits: {nvidia.com/mig-1g.10gb: 1}
"""


def test_a_kustomize_overlay_whose_patch_asks_for_gpus_still_builds(tmp_path: Path) -> None:
    repo = _tree(
        tmp_path / "repo",
        {
            "base/kustomization.yaml": "resources:\n- deployment.yaml\n",
            "base/deployment.yaml": BASE_DEPLOYMENT,
            "overlays/prod/kustomization.yaml": (
                "# prod\nresources:\n- ../../base\npatches:\n- path: gpu.yaml\n"
            ),
            "overlays/prod/gpu.yaml": GPU_PATCH,
        },
    )
    out = tmp_path / "out"
    assert main(["convert", str(repo), "--out-dir", str(out)]) == 0
    patch_text = (out / "overlays/prod/gpu.yaml").read_text()
    assert "# prod runs on a MIG slice" in patch_text
    assert "ResourceClaimTemplate" not in patch_text
    kustomization = (out / "overlays/prod/kustomization.yaml").read_text()
    assert kustomization.startswith("# prod\n") and "gpu-slicer-templates.yaml" in kustomization
    built = _kustomize(out / "overlays/prod")
    (deployment,) = [d for d in built if d["kind"] == "Deployment"]
    (template,) = [d for d in built if d["kind"] == "ResourceClaimTemplate"]
    spec = deployment["spec"]["template"]["spec"]
    assert spec["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]
    assert spec["containers"][0]["image"] == "registry.example/infer:1"
    assert "nvidia.com/mig-1g.10gb" not in str(spec["containers"])
    assert (out / "base/deployment.yaml").read_text() == BASE_DEPLOYMENT


def test_a_json6902_patch_is_kept_quietly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _tree(
        tmp_path / "repo",
        {
            "kustomization.yaml": (
                "resources: [d.yaml]\npatches:\n- path: ops.yaml\n"
                "  target: {kind: Deployment, name: infer}\n"
            ),
            "d.yaml": BASE_DEPLOYMENT,
            "ops.yaml": "- {op: replace, path: /spec/replicas, value: 3}\n",
        },
    )
    assert main(["convert", str(repo), "--out-dir", str(tmp_path / "out")]) == 0
    assert "gpu-slicer convert:" not in capsys.readouterr().err


def test_a_document_only_pyyaml_reads_is_still_converted_without_its_comments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ruamel.yaml refuses duplicate keys, which kubectl's YAML reader accepts (last wins)."""
    text = _job("dup").replace(
        "spec:\n  template:", "spec:\n  parallelism: 1\n  parallelism: 2\n  template:"
    )
    source = tmp_path / "dup.yaml"
    source.write_text(text)
    assert main(["convert", str(source)]) == 0
    job, template = _docs(capsys.readouterr().out)
    assert job["spec"]["parallelism"] == 2
    assert (
        job["spec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        == (template["metadata"]["name"])
    )
