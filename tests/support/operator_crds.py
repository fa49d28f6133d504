"""The operators' CRDs as their projects ship them, from their Go modules (the Go module proxy
serves them): the end-to-end tier installs them to see whether converted objects keep their
claims. Fetched into the Go module cache with ``go mod download``; nothing is committed.

Volcano's CRDs (volcano.sh/volcano) and the Kubeflow notebook controller were not served by the
module proxy here, so those kinds stay unchecked (webhook.workloads)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

CRD_SETS: tuple[tuple[str, str], ...] = (
    ("github.com/kubeflow/training-operator@v1.8.1", "manifests/base/crds/*.yaml"),
    ("github.com/kubeflow/training-operator@v1.9.0", "manifests/base/crds/*.yaml"),
    ("github.com/ray-project/kuberay/ray-operator@v1.5.0", "config/crd/bases/*.yaml"),
    ("github.com/kubeflow/trainer/v2@v2.0.0", "manifests/base/crds/*.yaml"),
    ("sigs.k8s.io/jobset@v0.8.2", "config/components/crd/bases/*.yaml"),
    ("sigs.k8s.io/lws@v0.6.1", "config/crd/bases/*.yaml"),
    (
        "github.com/kserve/kserve@v0.15.0",
        "config/crd/full/serving.kserve.io_inferenceservices.yaml",
    ),
)
"""Module@version and the glob of its CRDs, installed one set at a time (two versions of the
training operator define the same CRDs); webhook.workloads names the versions that keep the
claim."""


def crd_sets() -> list[tuple[str, list[dict[str, Any]]]]:
    """(module@version, its CustomResourceDefinitions) for each of :data:`CRD_SETS` (skips, or
    fails under CI, without Go or the module proxy)."""
    return [(module, module_crds(module, pattern)) for module, pattern in CRD_SETS]


def module_crds(module: str, pattern: str) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of ``module`` (``path@version``) whose files match
    ``pattern`` below its root."""
    go = shutil.which("go")
    if go is None:
        _unavailable("Go is not installed to fetch the operators' CRDs")
    result = subprocess.run(
        [str(go), "mod", "download", "-json", module],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).parent,
    )
    if result.returncode != 0:
        _unavailable(f"go mod download {module} failed: {result.stdout[-500:]}")
    directory = Path(json.loads(result.stdout)["Dir"])
    return [
        doc
        for path in sorted(directory.glob(pattern))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition"
    ]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)
