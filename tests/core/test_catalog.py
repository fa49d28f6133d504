"""The MIG catalog holds the geometry NVML enforces, written out here table by table.

The tables below are the project's MIG facts (docs/mig-geometry.md) typed in independently of
``slicer/catalog.py``, so a slip in either shows up as a difference.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_slicer.cli.main import main
from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.errors import CatalogError

GIB = 1024**3

# kind: (NVML constant suffix, typical id, starts, size in memory slices, max count, compute)
EIGHT_SLICE = {
    "1g": ("1_SLICE", 19, (0, 1, 2, 3, 4, 5, 6), 1, 7, 1),
    "1g+me": ("1_SLICE_REV1", 20, (0, 1, 2, 3, 4, 5, 6), 1, 1, 1),
    "1g2": ("1_SLICE_REV2", 15, (0, 2, 4, 6), 2, 4, 1),
    "2g": ("2_SLICE", 14, (0, 2, 4), 2, 3, 2),
    "3g": ("3_SLICE", 9, (0, 4), 4, 2, 3),
    "4g": ("4_SLICE", 5, (0,), 4, 1, 4),
    "7g": ("7_SLICE", 0, (0,), 8, 1, 7),
}

# profile: (NVML constant suffix, typical id, starts, size, max count, compute)
A30 = {
    "1g.6gb": ("1_SLICE", 14, (0, 1, 2, 3), 1, 4, 1),
    "1g.6gb+me": ("1_SLICE_REV1", 21, (0, 1, 2, 3), 1, 1, 1),
    "2g.12gb": ("2_SLICE", 5, (0, 2), 2, 2, 2),
    "2g.12gb+me": ("2_SLICE_REV1", 6, (0, 2), 2, 1, 2),
    "4g.24gb": ("4_SLICE", 0, (0,), 4, 1, 4),
}

# The RTX PRO 6000 Blackwell as the catalog keeps it (the MIG user guide's plain profiles and
# 1g.24gb+me; NVML reports the +gfx, +me.all and -me variants at run time).
RTX_PRO_6000 = {
    "1g.24gb": ("1_SLICE", 14, (0, 1, 2, 3), 1, 4, 1),
    "1g.24gb+me": ("1_SLICE_REV1", 21, (0, 1, 2, 3), 1, 1, 1),
    "2g.48gb": ("2_SLICE", 5, (0, 2), 2, 2, 2),
    "4g.96gb": ("4_SLICE", 0, (0,), 4, 1, 4),
}
FOUR_SLICE = {"A30-24GB": A30, "RTX-PRO-6000-96GB": RTX_PRO_6000}

# model: names of the 1g, 1g double-memory, 2g, 3g, 4g and 7g profiles
EIGHT_SLICE_NAMES = {
    "A100-40GB": ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-NVL-94GB": ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H100-96GB": ("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    "H200-141GB": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    "GH200-144GB": ("1g.18gb", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"),
    "B200-180GB": ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    "H800-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H20-96GB": ("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    "GB200-186GB": ("1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
    "B300-288GB": ("1g.34gb", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"),
    "GB300-288GB": ("1g.35gb", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"),
}
KINDS = ("1g", "1g2", "2g", "3g", "4g", "7g")

# SM counts as seen on hardware (only where known)
SMS = {
    "A100-40GB": {"1g": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98},
    "A100-80GB": {"1g": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98},
    "H100-80GB": {"1g": 16, "1g2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132},
    "H100-NVL-94GB": {"1g": 16, "1g2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132},
    "H200-141GB": {"2g": 32, "3g": 60},
}
A30_SMS = {"1g.6gb": 14, "2g.12gb": 28, "4g.24gb": 56}

# memory of the smallest profile as seen on hardware, in GiB
SMALLEST_GIB = {"A100-40GB": 4.75, "A100-80GB": 9.5, "H100-80GB": 9.75, "A30-24GB": 5.81}

# Memory as `nvidia-smi mig -lgip` shows it (GiB), the figures the issue and the MIG user guide
# cite; where drivers differ, the smallest (a memory-based chain must not promise more).
LGIP_GIB = {
    ("A100-40GB", "1g.5gb"): 4.75,
    ("A100-40GB", "2g.10gb"): 9.62,
    ("A100-40GB", "3g.20gb"): 19.62,
    ("A100-40GB", "7g.40gb"): 39.5,
    ("A100-80GB", "2g.20gb"): 19.5,
    ("A100-80GB", "3g.40gb"): 39.25,
    ("A100-80GB", "7g.80gb"): 78.5,
    ("H100-80GB", "1g.10gb"): 9.75,
    ("H100-80GB", "3g.40gb"): 39.5,
    ("H100-80GB", "7g.80gb"): 79.25,
    ("A30-24GB", "1g.6gb"): 5.81,
    ("A30-24GB", "4g.24gb"): 23.44,
}

PCI_IDS = {
    "A100-40GB": {0x20B0},
    "A100-80GB": {0x20B2, 0x20B5},
    "A30-24GB": {0x20B7},
    "H100-80GB": {0x2330, 0x2331},
    "H100-NVL-94GB": {0x2321},
    "H100-96GB": {0x2342, 0x233D},
    "H200-141GB": {0x2335, 0x233B},
    "GH200-144GB": {0x2348},
    "B200-180GB": {0x2901},
    "H800-80GB": set(),
    "H20-96GB": set(),
    "GB200-186GB": {0x2941},
    "B300-288GB": {0x3182},
    "GB300-288GB": {0x31C2},
    "RTX-PRO-6000-96GB": {0x2BB5},
}

# Models with a value not read off hardware (H100 NVL: memory per profile).
UNCONFIRMED = {
    "H100-96GB",
    "H200-141GB",
    "GH200-144GB",
    "B200-180GB",
    "H800-80GB",
    "H20-96GB",
    "GB200-186GB",
    "B300-288GB",
    "GB300-288GB",
    "RTX-PRO-6000-96GB",
    "H100-NVL-94GB",
}
# Models of which nothing but the placements is confirmed.
GEOMETRY_ONLY = UNCONFIRMED - {"H100-NVL-94GB", "RTX-PRO-6000-96GB"}
ARCHITECTURES = {
    "A100-40GB": "Ampere",
    "A100-80GB": "Ampere",
    "A30-24GB": "Ampere",
    "H100-80GB": "Hopper",
    "H100-NVL-94GB": "Hopper",
    "H100-96GB": "Hopper",
    "H200-141GB": "Hopper",
    "GH200-144GB": "Hopper",
    "B200-180GB": "Blackwell",
    "H800-80GB": "Hopper",
    "H20-96GB": "Hopper",
    "GB200-186GB": "Blackwell",
    "B300-288GB": "Blackwell",
    "GB300-288GB": "Blackwell",
    "RTX-PRO-6000-96GB": "Blackwell",
}


def expected_profiles(key: str) -> dict[str, tuple[str, int, tuple[int, ...], int, int, int]]:
    """profile name -> (constant suffix, typical id, starts, size, max, compute) for a model."""
    if key in FOUR_SLICE:
        return FOUR_SLICE[key]
    names = dict(zip(KINDS, EIGHT_SLICE_NAMES[key], strict=True))
    table = {names[kind]: EIGHT_SLICE[kind] for kind in KINDS}
    table[names["1g"] + "+me"] = EIGHT_SLICE["1g+me"]
    return table


def test_the_catalog_has_exactly_the_documented_models() -> None:
    assert set(catalog.model_keys()) == set(PCI_IDS)
    assert len(catalog.model_keys()) == len(catalog.MODELS)


@pytest.mark.parametrize("model", catalog.MODELS, ids=lambda m: m.key)
def test_every_profile_has_the_documented_placements_counts_and_slices(
    model: gpu_model.GpuModel,
) -> None:
    expected = expected_profiles(model.key)
    assert {p.name for p in model.profiles} == set(expected)
    for profile in model.profiles:
        constant, typical_id, starts, size, max_count, compute = expected[profile.name]
        assert profile.nvml_constant == "NVML_GPU_INSTANCE_PROFILE_" + constant, profile.name
        assert profile.typical_id == typical_id, profile.name
        assert profile.starts == starts, profile.name
        assert profile.memory_slices == size, profile.name
        assert profile.max_count == max_count, profile.name
        assert profile.compute_slices == compute, profile.name
        assert profile.ci_nvml_constant == f"NVML_COMPUTE_INSTANCE_PROFILE_{compute}_SLICE"
        assert profile.media_exclusive == profile.name.endswith("+me")
        assert catalog.placements(model, profile.name) == [(s, size) for s in starts]


@pytest.mark.parametrize("model", catalog.MODELS, ids=lambda m: m.key)
def test_models_have_the_documented_slices_architecture_and_pci_ids(
    model: gpu_model.GpuModel,
) -> None:
    if model.key in FOUR_SLICE:
        assert (model.memory_slices, model.compute_slices) == (4, 4)
    else:
        assert (model.memory_slices, model.compute_slices) == (8, 7)
    assert model.architecture == ARCHITECTURES[model.key]
    assert PCI_IDS[model.key] <= set(model.pci_device_ids)
    assert model.supports_dynamic_mig == (model.architecture != "Ampere")


@pytest.mark.parametrize("key", sorted(SMS))
def test_sm_counts_match_what_hardware_reports(key: str) -> None:
    model = catalog.get_model(key)
    names = dict(zip(KINDS, EIGHT_SLICE_NAMES[key], strict=True))
    for kind, sms in SMS[key].items():
        assert model.profile(names[kind]).multiprocessors == sms, kind
    a30 = catalog.get_model("A30")
    for name, sms in A30_SMS.items():
        assert a30.profile(name).multiprocessors == sms


@pytest.mark.parametrize(("key", "gib"), sorted(SMALLEST_GIB.items()))
def test_the_smallest_profile_has_the_memory_hardware_reports(key: str, gib: float) -> None:
    model = catalog.get_model(key)
    smallest = min(model.profiles, key=lambda p: p.memory_bytes)
    assert round(smallest.memory_bytes / GIB, 2) == gib


@pytest.mark.parametrize("model", catalog.MODELS, ids=lambda m: m.key)
def test_memory_grows_with_memory_slices_and_the_largest_profile_is_the_whole_gpu(
    model: gpu_model.GpuModel,
) -> None:
    for small in model.profiles:
        for large in model.profiles:
            if small.memory_slices < large.memory_slices:
                assert small.memory_bytes < large.memory_bytes
    largest = max(model.profiles, key=lambda p: p.memory_slices)
    assert largest.memory_bytes <= model.memory_bytes
    assert largest.compute_slices == model.compute_slices


@pytest.mark.parametrize("model", catalog.MODELS, ids=lambda m: m.key)
def test_values_not_seen_on_hardware_are_marked_unconfirmed(model: gpu_model.GpuModel) -> None:
    if model.key in UNCONFIRMED:
        assert not model.confirmed
        assert not any(p.confirmed for p in model.profiles)
        assert all("memory" in p.unconfirmed for p in model.profiles)
    else:
        assert model.confirmed
    if model.key in GEOMETRY_ONLY:
        assert all(
            p.unconfirmed == {"memory", "multiprocessors", "engines"} for p in model.profiles
        )
    if model.key == "H100-NVL-94GB":
        assert all(p.unconfirmed == {"memory"} for p in model.profiles)
    assert all(p.unconfirmed <= gpu_model.VALUE_KINDS for p in model.profiles)


@pytest.mark.parametrize(
    ("key", "profile", "gib"), [(k, p, g) for (k, p), g in sorted(LGIP_GIB.items())]
)
def test_memory_is_what_nvidia_smi_mig_lgip_shows(key: str, profile: str, gib: float) -> None:
    memory = catalog.get_model(key).profile(profile).memory_bytes
    assert round(memory / GIB, 2) == gib


def test_a30_1g_6gb_has_no_decoder_and_media_profiles_take_the_single_ofa() -> None:
    a30 = catalog.get_model("A30")
    assert a30.profile("1g.6gb").engines == gpu_model.Engines(1, 0, 0, 0, 0)
    assert a30.profile("1g.6gb+me").engines == gpu_model.Engines(1, 1, 0, 1, 1)
    assert a30.profile("2g.12gb").engines == gpu_model.Engines(2, 2, 0, 0, 0)


# --- lookups -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "key"),
    [(pci, key) for key, ids in sorted(PCI_IDS.items()) for pci in sorted(ids)],
    ids=lambda v: f"{v:#06x}" if isinstance(v, int) else v,
)
def test_models_are_found_by_pci_device_id_with_or_without_the_vendor_half(
    device_id: int, key: str
) -> None:
    assert catalog.model_by_pci_device_id(device_id).key == key
    assert catalog.model_by_pci_device_id(device_id << 16 | 0x10DE).key == key


def test_an_unknown_pci_device_id_is_a_catalog_error() -> None:
    with pytest.raises(CatalogError, match="0x1db6"):
        catalog.model_by_pci_device_id(0x1DB610DE)


@pytest.mark.parametrize("model", catalog.MODELS, ids=lambda m: m.key)
def test_models_are_found_by_every_product_name_nvml_reports(model: gpu_model.GpuModel) -> None:
    for name in model.product_names:
        assert catalog.model_by_product_name(name) is model
        assert catalog.model_by_product_name("  " + name.upper().replace(" ", "  ")) is model


def test_an_unknown_product_name_is_a_catalog_error() -> None:
    with pytest.raises(CatalogError, match="Tesla V100"):
        catalog.model_by_product_name("Tesla V100-SXM2-16GB")


def test_models_are_found_by_key_or_alias_in_any_case() -> None:
    assert catalog.get_model("h100-nvl").key == "H100-NVL-94GB"
    assert catalog.get_model(" A30 ").key == "A30-24GB"
    assert catalog.get_model("gh200-96gb").key == "H100-96GB"
    with pytest.raises(CatalogError) as info:
        catalog.get_model("V100")
    for key in catalog.model_keys():
        assert key in str(info.value)


def test_an_unknown_profile_names_the_profiles_the_model_offers() -> None:
    with pytest.raises(CatalogError, match="1g.6gb, 1g.6gb\\+me, 2g.12gb"):
        catalog.get_model("A30").profile("3g.20gb")


def test_all_profile_names_are_listed_once() -> None:
    names = catalog.all_profile_names()
    assert len(names) == len(set(names))
    assert {p.name for m in catalog.MODELS for p in m.profiles} == set(names)


# --- profiles by memory --------------------------------------------------------------------


def test_profiles_with_memory_are_smallest_first_without_media_variants() -> None:
    a30 = catalog.get_model("A30")
    assert [p.name for _, p in catalog.profiles_with_memory(0, [a30])] == [
        "1g.6gb",
        "2g.12gb",
        "4g.24gb",
    ]
    assert [p.name for _, p in catalog.profiles_with_memory(6 * GIB, [a30])] == [
        "2g.12gb",
        "4g.24gb",
    ]
    assert catalog.profiles_with_memory(300 * GIB) == []


def test_equal_memory_prefers_fewer_compute_slices() -> None:
    h100 = catalog.get_model("H100-80GB")
    found = [p.name for _, p in catalog.profiles_with_memory(19 * GIB, [h100])]
    assert found[:2] == ["1g.20gb", "2g.20gb"]


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=0, max_value=300 * GIB))
def test_profiles_with_memory_are_exactly_those_that_fit_in_a_fixed_order(min_bytes: int) -> None:
    found = catalog.profiles_with_memory(min_bytes)
    expected = {
        (m.key, p.name)
        for m in catalog.MODELS
        for p in m.profiles
        if p.memory_bytes >= min_bytes and not p.media_exclusive
    }
    assert {(m.key, p.name) for m, p in found} == expected
    order = [(p.memory_bytes, p.compute_slices, m.key) for m, p in found]
    assert order == sorted(order)


# --- validity ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ([("1g.10gb", s) for s in range(7)], []),
        ([("3g.40gb", 0), ("3g.40gb", 4)], []),
        ([("4g.40gb", 0), ("3g.40gb", 4)], []),
        ([("1g.20gb", s) for s in (0, 2, 4, 6)], []),
        ([("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)], []),
        ([("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)], []),
        ([("7g.80gb", 0)], []),
        ([("5g.50gb", 0)], ["has no MIG profile '5g.50gb'"]),
        ([("2g.20gb", 1)], ["cannot start at memory slice 1", "legal starts: [0, 2, 4]"]),
        ([("1g.10gb", 7)], ["cannot start at memory slice 7"]),
        ([("4g.40gb", 0), ("1g.10gb", 3)], ["1g.10gb@3 overlaps 4g.40gb@0 on memory slice 3"]),
        ([("3g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 4)], ["overlaps"]),
        (
            [("1g.10gb+me", 0), ("1g.10gb+me", 1)],
            ["2 x 1g.10gb+me exceeds its limit of 1 per GPU", "more than one +me"],
        ),
    ],
    ids=[
        "seven-1g",
        "two-3g",
        "4g-and-3g",
        "four-1g-double",
        "three-2g-and-1g",
        "3g-2g-1g-1g",
        "7g",
        "unknown-profile",
        "illegal-start",
        "slice-7-unreachable-by-1g",
        "overlap",
        "overlap-after-full",
        "two-media",
    ],
)
def test_violations_explain_what_cannot_coexist(
    layout: list[catalog.Placement], expected: list[str]
) -> None:
    model = catalog.get_model("A100-80GB")
    problems = catalog.violations(model, layout)
    assert catalog.is_valid(model, layout) == (not expected)
    text = "\n".join(problems)
    for fragment in expected:
        assert fragment in text
    if not expected:
        assert problems == []


def test_the_compute_budget_is_checked_on_its_own() -> None:
    # On every catalog model, memory slices that do not overlap never hold more compute slices
    # than the GPU has, so a smaller budget stands in to show the check works by itself.
    model = dataclasses.replace(catalog.get_model("A100-80GB"), compute_slices=6)
    assert catalog.is_valid(model, [("3g.40gb", 0), ("3g.40gb", 4)])
    assert catalog.violations(model, [("4g.40gb", 0), ("3g.40gb", 4)]) == [
        "7 compute slices exceed the 6 of A100-80GB"
    ]


@pytest.mark.parametrize("model", catalog.MODELS, ids=lambda m: m.key)
def test_no_layout_of_disjoint_placements_exceeds_the_compute_budget(
    model: gpu_model.GpuModel,
) -> None:
    def fill(layout: list[catalog.Placement], free: set[int]) -> int:
        best = sum(model.profile(n).compute_slices for n, _ in layout)
        for name, start in catalog.all_placements(model):
            covers = set(model.profile(name).covers(start))
            if covers <= free and (not layout or (name, start) > layout[-1]):
                best = max(best, fill([*layout, (name, start)], free - covers))
        return best

    assert fill([], set(range(model.memory_slices))) == model.compute_slices


def test_an_eighth_single_slice_instance_is_refused() -> None:
    model = catalog.get_model("H100-80GB")
    layout = [("1g.10gb", s) for s in range(7)]
    assert catalog.remaining_placements(model, layout) == []


def test_two_different_media_profiles_cannot_coexist_on_an_a30() -> None:
    problems = catalog.violations(catalog.get_model("A30"), [("1g.6gb+me", 0), ("2g.12gb+me", 2)])
    assert problems == ["more than one +me profile: media engines belong to one instance"]


def test_check_placement_returns_the_profile_or_names_the_legal_starts() -> None:
    model = catalog.get_model("H200")
    assert catalog.check_placement(model, "3g.71gb", 4).name == "3g.71gb"
    with pytest.raises(CatalogError, match="legal starts: \\[0, 4\\]"):
        catalog.check_placement(model, "3g.71gb", 2)


def test_remaining_placements_next_to_a_3g_are_the_other_half() -> None:
    model = catalog.get_model("A100-80GB")
    assert catalog.remaining_placements(model, [("3g.40gb", 0)]) == [
        ("1g.10gb", 4),
        ("1g.10gb", 5),
        ("1g.10gb", 6),
        ("1g.10gb+me", 4),
        ("1g.10gb+me", 5),
        ("1g.10gb+me", 6),
        ("1g.20gb", 4),
        ("1g.20gb", 6),
        ("2g.20gb", 4),
        ("3g.40gb", 4),
    ]
    assert catalog.remaining_placements(model, []) == catalog.all_placements(model)
    assert catalog.remaining_placements(model, [("7g.80gb", 0)]) == []


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(catalog.MODELS), st.data())
def test_any_remaining_placement_keeps_memory_slices_disjoint(
    model: gpu_model.GpuModel, data: st.DataObject
) -> None:
    layout: list[catalog.Placement] = []
    while True:
        remaining = catalog.remaining_placements(model, layout)
        if not remaining or data.draw(st.booleans()):
            break
        layout.append(data.draw(st.sampled_from(remaining)))
    covered = [s for name, start in layout for s in model.profile(name).covers(start)]
    assert len(covered) == len(set(covered))
    assert max(covered, default=0) < model.memory_slices
    assert sum(model.profile(n).compute_slices for n, _ in layout) <= model.compute_slices
    assert sum(model.profile(n).media_exclusive for n, _ in layout) <= 1


# --- the catalog command -------------------------------------------------------------------


def test_catalog_json_lists_every_model_with_its_placements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["catalog", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in listed] == catalog.model_keys()
    for entry in listed:
        expected = expected_profiles(entry["model"])
        assert {int(i, 16) for i in entry["pciDeviceIds"]} >= PCI_IDS[entry["model"]]
        assert entry["confirmed"] == (entry["model"] not in UNCONFIRMED)
        for profile in entry["profiles"]:
            _, typical_id, starts, size, max_count, compute = expected[profile["name"]]
            assert profile["placementStarts"] == list(starts)
            assert profile["placementSize"] == size
            assert profile["maxCount"] == max_count
            assert profile["computeSlices"] == compute
            assert profile["typicalId"] == typical_id


def test_catalog_for_one_model_by_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--gpu", "h200", "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    assert entry["model"] == "H200-141GB"


def test_catalog_table_marks_unconfirmed_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--gpu", "B200"]) == 0
    out = capsys.readouterr().out
    assert "B200-180GB" in out and "not confirmed" in out
    assert "7g.180gb" in out


def test_catalog_for_an_unknown_model_exits_2_and_lists_the_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["catalog", "--gpu", "V100"]) == 2
    err = capsys.readouterr().err
    assert "V100" in err
    for key in catalog.model_keys():
        assert key in err


# --- NVIDIA's published tables ----------------------------------------------------------------

PUBLISHED = json.loads((Path(__file__).parent / "data/nvidia_published_profiles.json").read_text())
ALL_PCI_IDS = {i for m in catalog.MODELS for i in m.pci_device_ids}
VARIANTS = ("+gfx", "+me.all", "-me")
"""Variants the catalog does not keep: the NVML backend advertises them when the GPU has them."""


@pytest.mark.parametrize("group", PUBLISHED["groups"], ids=lambda g: g["label"])
def test_the_catalog_names_each_published_gpu_as_nvidia_does(group: dict[str, Any]) -> None:
    published = set(group["profiles"])
    ids = [int(i, 16) for i in group["pci_ids"]]
    known = [catalog.model_by_pci_device_id(i) for i in ids if i in ALL_PCI_IDS]
    assert known, f"no PCI id of {group['label']} is in the catalog"
    for model in known:
        ours = {p.name for p in model.profiles}
        missing = {n for n in published - ours if not n.endswith(VARIANTS)}
        assert missing == set(), model.key
        extra = {n for n in ours - published if f"{model.key} {n}" not in catalog.NOT_PUBLISHED}
        assert extra == set(), model.key


def test_every_model_is_in_the_published_tables_or_says_why_not() -> None:
    published_ids = {int(i, 16) for g in PUBLISHED["groups"] for i in g["pci_ids"]}
    for model in catalog.MODELS:
        if model.key in catalog.NOT_PUBLISHED:
            assert not model.pci_device_ids, model.key
            continue
        assert model.pci_device_ids, model.key
        assert set(model.pci_device_ids) <= published_ids, model.key
    for entry in catalog.NOT_PUBLISHED:
        key, _, profile = entry.partition(" ")
        assert not profile or catalog.get_model(key).has_profile(profile), entry


def test_catalog_says_what_nvidias_tables_do_not_confirm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["catalog", "--gpu", "RTX-PRO-6000", "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    assert entry["notInNvidiaTables"] is None
    marked = {p["name"]: p["notInNvidiaTables"] for p in entry["profiles"]}
    assert marked["1g.24gb"] is None and "+me.all" in marked["1g.24gb+me"]
    assert main(["catalog", "--gpu", "H20"]) == 0
    out = capsys.readouterr().out
    assert "not in NVIDIA's published tables: NVIDIA's tables group the H20" in out
    assert main(["catalog", "--gpu", "RTX-PRO-6000"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("1g.24gb+me")]
    assert line.endswith("* +")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_known_violations_answer_as_the_rules_do_each_time(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(catalog.MODELS))
    placements = st.sampled_from(catalog.all_placements(model))
    sets = data.draw(st.lists(st.lists(placements, max_size=5), min_size=1, max_size=6))
    known = catalog.KnownViolations()
    for instances in [*sets, *sets]:  # each set asked twice: the second answer is remembered
        assert known(model, instances) == catalog.violations(model, instances)
