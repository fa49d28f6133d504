"""Device names are canonical: every slice the catalog allows names itself and parses back."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import (
    MigInstance,
    SliceSpec,
    WholeGpu,
    parse_device_name,
    profile_token,
)
from gpu_slicer.core.errors import DeviceNameError

# DRA device names are DNS labels: lower-case alphanumerics and '-', at most 63 characters.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

every_placement = st.sampled_from(
    [(m.key, name, start) for m in catalog.MODELS for name, start in catalog.all_placements(m)]
)
gpu_indices = st.integers(min_value=0, max_value=4095)


@settings(max_examples=200, deadline=None)
@given(gpu_indices, every_placement)
def test_every_slice_of_every_model_round_trips_through_its_name(
    gpu: int, placement: tuple[str, str, int]
) -> None:
    _, profile, start = placement
    spec = SliceSpec(gpu, profile, start)
    name = spec.device_name
    assert parse_device_name(name) == spec
    assert DNS_LABEL.match(name) and len(name) <= 63


@settings(max_examples=50, deadline=None)
@given(gpu_indices)
def test_whole_gpus_round_trip(gpu: int) -> None:
    assert parse_device_name(WholeGpu(gpu).device_name) == WholeGpu(gpu)
    assert WholeGpu(gpu).device_name == f"gpu-{gpu}"


def test_names_follow_the_documented_examples() -> None:
    assert SliceSpec(0, "1g.10gb", 6).device_name == "gpu-0-mig-1g10gb-6"
    assert SliceSpec(0, "1g.10gb+me", 0).device_name == "gpu-0-mig-1g10gbme-0"
    assert SliceSpec(12, "7g.141gb", 0).device_name == "gpu-12-mig-7g141gb-0"


def test_every_catalog_profile_has_a_distinct_token_per_model() -> None:
    for model in catalog.MODELS:
        tokens = [profile_token(p.name) for p in model.profiles]
        assert len(tokens) == len(set(tokens)), model.key


@pytest.mark.parametrize(
    "name",
    [
        "",
        "gpu",
        "gpu-",
        "gpu-01",
        "gpu--1",
        "gpu-a",
        "GPU-0",
        "nvidia0",
        "gpu-0-mig-1g.10gb-6",
        "gpu-0-mig-1g10gb",
        "gpu-0-mig-1g10gb-06",
        "gpu-0-mig-1g10gb-6-",
        "gpu-0-mig-1g10gb+me-0",
        "gpu-0-mig-g10gb-0",
        "gpu-0-mig-1g10-0",
        "gpu-0-mig-1g10gbxx-0",
        "gpu-0-1g10gb-0",
        "MIG-7c3e5a7e-2f4a-5b8e-9d3c-1a2b3c4d5e6f",
        "gpu-0 ",
        " gpu-0",
    ],
)
def test_names_that_are_not_ours_are_rejected_with_the_expected_forms(name: str) -> None:
    with pytest.raises(DeviceNameError, match="gpu-<index>-mig-<profile>-<start>"):
        parse_device_name(name)


@pytest.mark.parametrize("profile", ["1g10gb", "1g.10GB", "g.10gb", "1g.10gb+mex", "7g.80gb "])
def test_a_malformed_profile_has_no_token(profile: str) -> None:
    with pytest.raises(DeviceNameError, match="not a MIG profile name"):
        profile_token(profile)


def test_a_live_instance_knows_its_spec_and_memory_slices() -> None:
    mig = MigInstance(
        gpu_index=2, profile="3g.40gb", start=4, size=4, gi_id=2, ci_id=0, uuid="MIG-x"
    )
    assert mig.spec == SliceSpec(2, "3g.40gb", 4)
    assert list(mig.memory_slices) == [4, 5, 6, 7]


def test_specs_sort_by_gpu_then_profile_then_start() -> None:
    specs = [SliceSpec(1, "1g.10gb", 0), SliceSpec(0, "2g.20gb", 2), SliceSpec(0, "1g.10gb", 5)]
    assert sorted(specs) == [specs[2], specs[1], specs[0]]
