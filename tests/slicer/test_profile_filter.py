"""``--profiles``: which MIG profiles the agent advertises, and what it must keep regardless."""

from __future__ import annotations

import pytest

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import SliceSpec
from gpu_slicer.slicer.inventory import GpuState, plan_pool
from gpu_slicer.slicer.preview import preview_pool
from gpu_slicer.slicer.profile_filter import ProfileFilter, ProfileFilterError
from gpu_slicer.slicer.simulated import SimulatedBackend

A100 = catalog.get_model("A100-80GB")
H100 = catalog.get_model("H100-96GB")


def device_names(slices: list[dict[str, object]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"].get("devices") or ()]  # type: ignore[index,union-attr]


def profiles_of(slices: list[dict[str, object]]) -> set[str]:
    return {
        d["attributes"]["gpu-slicer.io/profile"]["string"]  # type: ignore[index]
        for s in slices
        for d in s["spec"].get("devices") or ()  # type: ignore[index,union-attr]
        if "gpu-slicer.io/profile" in d["attributes"]  # type: ignore[index]
    }


def test_empty_text_means_every_profile() -> None:
    assert ProfileFilter.parse("") is None
    assert ProfileFilter.parse(" , ") is None


def test_a_list_keeps_only_its_profiles_and_patterns_exclude() -> None:
    only = ProfileFilter.parse("1g.10gb, 3g.40gb")
    assert only is not None
    assert only.kept(A100) == ["1g.10gb", "3g.40gb"]
    without = ProfileFilter.parse("-*+me,-1g.20gb")
    assert without is not None
    assert without.kept(A100) == ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert without.text() == "-*+me,-1g.20gb"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1g.10gbb", "did you mean 1g.10gb"),
        ("-9g.*", "'9g.*' is not a MIG profile of any GPU model"),
        ("1g.10gb,-", "excludes nothing"),
    ],
)
def test_a_name_no_model_has_is_refused_with_suggestions(text: str, message: str) -> None:
    with pytest.raises(ProfileFilterError, match=message):
        ProfileFilter.parse(text)


def test_one_setting_serves_several_models_but_must_leave_each_a_profile() -> None:
    both = ProfileFilter.parse("1g.10gb,1g.12gb")
    assert both is not None
    both.check([A100, H100, None])  # 1g.10gb on the A100, 1g.12gb on the H100
    h100_only = ProfileFilter.parse("1g.12gb")
    assert h100_only is not None
    with pytest.raises(ProfileFilterError, match="leaves no MIG profile on this node's A100"):
        h100_only.check([H100, A100])


def test_the_pool_lists_only_the_kept_profiles_with_the_same_counters() -> None:
    kept = ProfileFilter.parse("1g.10gb,2g.20gb,3g.40gb,7g.80gb")
    full = preview_pool("n", "A100-80GB:8", server_version=(1, 37)).slices
    fewer = preview_pool("n", "A100-80GB:8", server_version=(1, 37), profiles=kept).slices
    assert profiles_of(fewer) == {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}
    assert len(device_names(full)) == 200 and len(device_names(fewer)) == 104
    assert set(device_names(fewer)) < set(device_names(full))

    def counters(slices: list[dict[str, object]]) -> list[object]:
        return [s["spec"].get("sharedCounters") for s in slices if s["spec"].get("sharedCounters")]  # type: ignore[index,union-attr]

    assert counters(fewer) == counters(full)


def test_the_whole_gpu_stays_in_dynamic_mode() -> None:
    kept = ProfileFilter.parse("1g.12gb")
    names = device_names(preview_pool("n", "H100-96GB:1", profiles=kept).slices)
    assert "gpu-0" in names
    assert all(n == "gpu-0" or "-mig-1g12gb-" in n for n in names)


def test_devices_a_claim_holds_stay_listed_when_their_profile_is_not() -> None:
    backend = SimulatedBackend("A100-80GB:1", node_name="n")
    backend.set_mig_mode(0, True)
    gi = backend.create_gpu_instance(0, "1g.20gb", 4)
    backend.create_compute_instance(0, gi)
    owned = SliceSpec(0, "1g.20gb", 4)
    allocated = SliceSpec(0, "4g.40gb", 0)
    state = GpuState(
        backend.gpus()[0],
        mode="mig",
        instances=tuple(backend.instances(0)),
        owned=frozenset({owned}),
    )
    kept = ProfileFilter.parse("1g.10gb")
    names = device_names(plan_pool("n", [state], profiles=kept, allocated=[allocated]).slices)
    assert owned.device_name in names and allocated.device_name in names
    assert not any("-mig-1g20gb-" in n and n != owned.device_name for n in names)
    assert {n.split("-mig-")[1].rsplit("-", 1)[0] for n in names} == {"1g10gb", "1g20gb", "4g40gb"}
