"""slicer.demand: which MIG profiles a node advertises, read from what claims ask for.

Claims come from the webhook's own translation (``sim.agreement.claim_spec_for``), so these
tests read exactly what converted pods' templates say."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpu_slicer.sim.agreement import claim_spec_for
from gpu_slicer.slicer.demand import (
    NOTHING,
    ClaimAsks,
    Demand,
    DeviceMenu,
    asked_for,
    read_claim_spec,
    read_template,
)
from gpu_slicer.slicer.profile_filter import ProfileFilter
from gpu_slicer.slicer.simulated import SimulatedBackend

A100 = "A100-80GB:2"


def menu(spec: str = A100) -> DeviceMenu:
    return DeviceMenu(SimulatedBackend(spec, node_name="n").gpus())


def claim(
    resources: Mapping[str, int] | None = None, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return claim_spec_for([dict(resources or {})], annotations=dict(annotations or {}))


def hand_written(*alternatives: dict[str, Any]) -> dict[str, Any]:
    if len(alternatives) == 1:
        return {"devices": {"requests": [{"name": "r", "exactly": alternatives[0]}]}}
    return {"devices": {"requests": [{"name": "r", "firstAvailable": list(alternatives)}]}}


def selecting(expression: str, device_class: str = "mig.gpu-slicer.io") -> dict[str, Any]:
    return {"deviceClassName": device_class, "selectors": [{"cel": {"expression": expression}}]}


# ------------------------------------------------------------------ reading claims
def test_a_mig_request_asks_for_its_profile() -> None:
    asks = read_claim_spec(claim({"nvidia.com/mig-1g.10gb": 1}), menu())
    assert asks == ClaimAsks(frozenset({"1g.10gb"}), frozenset({"1g.10gb"}))


def test_a_chain_of_named_profiles_asks_for_every_one() -> None:
    asks = read_claim_spec(
        claim(annotations={"gpu-slicer.io/profiles": "1g.10gb,2g.20gb,3g.40gb"}), menu()
    )
    assert asks.asked == {"1g.10gb", "2g.20gb", "3g.40gb"}


def test_a_memory_chain_asks_for_the_smallest_fit_and_only_follows_the_larger_ones() -> None:
    asks = read_claim_spec(claim(annotations={"gpu-slicer.io/gpu-memory": "20Gi"}), menu())
    # 1g.20gb and 2g.20gb hold a little under 20Gi on an A100 80GB: 3g.40gb is the first fit.
    assert asks.asked == {"3g.40gb"}
    assert asks.selectable == {"3g.40gb", "4g.40gb", "7g.80gb"}


def test_a_whole_gpu_asks_for_the_instance_that_spans_an_ampere_gpu() -> None:
    asks = read_claim_spec(claim({"nvidia.com/gpu": 1}), menu())
    assert asks.asked == {"7g.80gb"}


def test_profiles_are_those_this_nodes_models_offer() -> None:
    asks = read_claim_spec(
        claim(annotations={"gpu-slicer.io/gpu-memory": "20Gi"}), menu("H200-141GB:1")
    )
    assert asks.asked and not asks.asked & {"3g.40gb"}
    assert asks.asked <= menu("H200-141GB:1").profiles


def test_a_hand_written_claim_is_read_by_what_its_selector_accepts() -> None:
    spec = hand_written(
        selecting('device.capacity["gpu-slicer.io"].memory.compareTo(quantity("30Gi")) >= 0')
    )
    asked = read_claim_spec(spec, menu()).asked
    assert asked == {"3g.40gb", "4g.40gb", "7g.80gb"}


def test_a_claim_for_any_mig_slice_asks_for_every_profile() -> None:
    spec = hand_written({"deviceClassName": "mig.gpu-slicer.io"})
    assert read_claim_spec(spec, menu()).asked == menu().profiles


@pytest.mark.parametrize(
    "spec",
    [
        hand_written({"deviceClassName": "gpu.gpu-slicer.io"}),
        hand_written(
            selecting('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"', "mig.nvidia.com")
        ),
        hand_written(selecting('device.attributes["gpu-slicer.io"].nope == 1')),
        hand_written(selecting("this is not CEL")),
        {"devices": {"requests": "nonsense"}},
        {"devices": None},
        None,
        "text",
    ],
    ids=[
        "whole-gpu",
        "other-driver",
        "runtime-error",
        "parse-error",
        "bad-requests",
        "null",
        "none",
        "text",
    ],
)
def test_claims_that_ask_for_no_mig_slice_of_ours_ask_for_nothing(spec: Any) -> None:
    assert read_claim_spec(spec, menu()) == NOTHING


def test_a_template_asks_but_holds_nothing() -> None:
    template = {"spec": {"spec": claim({"nvidia.com/mig-2g.20gb": 1})}}
    assert read_template(template, menu()) == ClaimAsks(frozenset({"2g.20gb"}))


# ------------------------------------------------------------------ over time
def demand(**options: Any) -> Demand:
    return Demand(menu().profiles, withdraw_after_s=100.0, **options)


def advertised(d: Demand, now: float) -> set[str]:
    chosen = d.advertised(now)
    return {p for p in d.offered if chosen.allows(p)}


def test_what_is_asked_is_advertised_and_withdrawn_only_after_the_delay() -> None:
    d = demand()
    d.observe(ClaimAsks(frozenset({"1g.10gb"})), 0.0)
    assert advertised(d, 0.0) == {"1g.10gb"}
    d.observe(NOTHING, 10.0)
    assert advertised(d, 10.0) == {"1g.10gb"}
    assert d.advertised(10.0).reasons == {"1g.10gb": "recent"}
    assert d.next_withdrawal_in(10.0) == pytest.approx(90.0)
    assert advertised(d, 100.0) == set()
    assert d.next_withdrawal_in(100.0) is None


def test_a_claim_that_could_still_be_given_a_profile_keeps_it() -> None:
    d = demand()
    d.observe(ClaimAsks(frozenset({"4g.40gb"})), 0.0)
    for now in (50.0, 120.0, 300.0):  # a memory claim's later tier: selectable while it lives
        d.observe(ClaimAsks(frozenset(), frozenset({"4g.40gb"})), now)
        assert advertised(d, now) == {"4g.40gb"}
    d.observe(NOTHING, 300.0)
    assert advertised(d, 399.0) == {"4g.40gb"} and advertised(d, 400.0) == set()


def test_a_profile_only_selectable_is_never_brought_back() -> None:
    d = demand()
    d.observe(ClaimAsks(frozenset({"3g.40gb"}), frozenset({"3g.40gb", "7g.80gb"})), 0.0)
    assert advertised(d, 0.0) == {"3g.40gb"}


def test_the_floor_is_always_advertised_and_the_limit_always_holds() -> None:
    d = demand(floor=ProfileFilter.parse("1g.10gb,2g.20gb"), limit=ProfileFilter.parse("-2g.20gb"))
    assert advertised(d, 0.0) == {"1g.10gb"}
    d.observe(ClaimAsks(frozenset({"2g.20gb", "3g.40gb"})), 0.0)
    assert advertised(d, 0.0) == {"1g.10gb", "3g.40gb"}
    assert d.advertised(0.0).reasons["1g.10gb"] == "floor"
    assert d.next_withdrawal_in(0.0) is None


def test_profiles_published_before_a_restart_stay_for_the_delay() -> None:
    d = demand()
    d.adopt(["1g.10gb", "9g.900gb"], 5.0)
    assert advertised(d, 5.0) == {"1g.10gb"}
    assert advertised(d, 105.0) == set()


def test_asked_for_is_what_slices_demand_publishes() -> None:
    gpus = SimulatedBackend(A100, node_name="n").gpus()
    chosen = asked_for("1g.10gb,3g.40gb", gpus)
    assert chosen.text() == "1g.10gb=asked,3g.40gb=asked"
    limited = asked_for("1g.10gb,3g.40gb", gpus, limit=ProfileFilter.parse("3g.40gb"))
    assert limited.allows("3g.40gb") and not limited.allows("1g.10gb")
