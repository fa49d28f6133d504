"""Pods of other GPU sharing models (HAMi, time-slicing) are left alone, with a warning that
names the resources, through the translation, the admission webhook and `convert`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_slicer.cli.main import main
from gpu_slicer.webhook.engine import answer_review
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.translate import translate_pod
from tests.support.server_fixtures import RecordingTemplates, admission_review
from tests.support.webhook_cases import build_pod, container

HAMI = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
"""A HAMi pod: one GPU's worth of sharing, 3000 MiB and 30% of its compute."""


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        (HAMI, ["nvidia.com/gpumem in main", "nvidia.com/gpucores in main"]),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}, ["gpumem-percentage"]),
        ({"nvidia.com/gpu.shared": 1}, ["nvidia.com/gpu.shared in main"]),
        ({"nvidia.com/mig-1g.10gb.shared": 1}, ["nvidia.com/mig-1g.10gb.shared in main"]),
    ],
    ids=["hami", "hami-percentage", "time-slicing", "time-sliced-mig"],
)
def test_a_pod_of_another_sharing_model_is_not_converted_and_the_warning_names_it(
    limits: dict[str, int], named: list[str]
) -> None:
    pod = build_pod(container(limits=limits))
    conversion = translate_pod(pod, namespace="ml", policy=Policy.default())
    assert conversion.patch == [] and conversion.templates == []
    (warning,) = conversion.warnings
    assert "another GPU sharing model" in warning
    assert all(n in warning for n in named)
    assert len(warning.encode()) < 120


def test_the_sharing_resource_of_any_container_leaves_the_whole_pod() -> None:
    pod = build_pod(
        container("main", limits={"nvidia.com/gpu": 1}),
        container("helper", requests={"nvidia.com/gpumem": 1000}),
    )
    conversion = translate_pod(pod, namespace="ml", policy=Policy.default())
    assert conversion.patch == []
    assert "nvidia.com/gpumem in helper" in conversion.warnings[0]


def test_the_webhook_admits_it_unchanged_and_warns_in_an_enabled_namespace() -> None:
    templates = RecordingTemplates()
    result = answer_review(
        admission_review(build_pod(container(limits=HAMI))),
        policy=Policy.default(),
        mode_for_namespace=lambda namespace: "enabled",
        native_extended=frozenset(),
        ensure_templates=templates,
    )
    assert result.response["allowed"] is True and "patch" not in result.response
    assert any("nvidia.com/gpumem in main" in w for w in result.response["warnings"])
    assert templates.calls == []


def test_convert_keeps_the_document_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = yaml.safe_dump(build_pod(container(limits=HAMI), namespace="ml"), sort_keys=False)
    source = tmp_path / "hami.yaml"
    source.write_text(text)
    assert main(["convert", str(source)]) == 0
    out, err = capsys.readouterr()
    assert out == text
    assert "Pod ml/pod: not converted, another GPU sharing model: nvidia.com/gpumem" in err
