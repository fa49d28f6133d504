"""Simulated-GPU specs: ``H100-80GB:2,A100-80GB:1`` names the models of GPUs 0, 1, 2."""

from __future__ import annotations

import pytest

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.errors import GpuSpecError
from gpu_slicer.core.gpuspec import parse_gpu_spec


def keys(models: list[gpu_model.GpuModel]) -> list[str]:
    return [m.key for m in models]


def test_counts_expand_into_gpus_in_index_order() -> None:
    assert keys(parse_gpu_spec("H100-80GB:2,A100-80GB:1")) == [
        "H100-80GB",
        "H100-80GB",
        "A100-80GB",
    ]


def test_a_missing_count_means_one_gpu() -> None:
    assert keys(parse_gpu_spec("A30")) == ["A30-24GB"]
    assert keys(parse_gpu_spec("B200,A30:2")) == ["B200-180GB", "A30-24GB", "A30-24GB"]


def test_models_are_matched_by_alias_case_insensitively_and_spaces_are_ignored() -> None:
    assert keys(parse_gpu_spec(" h100-nvl : 2 , gh200-96gb ")) == [
        "H100-NVL-94GB",
        "H100-NVL-94GB",
        "H100-96GB",
    ]


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("", "empty spec"),
        ("   ", "empty spec"),
        ("H100-80GB:2,,A30", "empty part"),
        ("H100-80GB:0", "'H100-80GB:0'"),
        ("H100-80GB:-1", "'H100-80GB:-1'"),
        ("H100-80GB:two", "'two'"),
        ("H100-80GB:", "'H100-80GB:'"),
        (":2", "no model"),
        ("H100-80GB:1,V100:2", "unknown model 'V100'"),
    ],
    ids=[
        "empty",
        "blank",
        "double-comma",
        "zero",
        "negative",
        "word-count",
        "no-count",
        "no-model",
        "unknown-model",
    ],
)
def test_a_bad_spec_names_the_bad_part_and_lists_known_models(spec: str, names: str) -> None:
    with pytest.raises(GpuSpecError) as info:
        parse_gpu_spec(spec)
    message = str(info.value)
    assert names in message
    for key in catalog.model_keys():
        assert key in message
