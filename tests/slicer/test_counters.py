"""Which counters a GPU's counter set publishes: only those that can refuse a set of devices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import SliceSpec
from gpu_slicer.core.gpu_model import GpuModel
from gpu_slicer.slicer import counters
from gpu_slicer.slicer.counters import binding_counters, memory_slice_counter
from gpu_slicer.slicer.inventory import GpuState, build_slices

MODEL_KEYS = [m.key for m in catalog.MODELS]


def every_counter(model: GpuModel) -> tuple[str, ...]:
    """What the counter set held before budgets that never bind were left out."""
    slices = tuple(memory_slice_counter(i) for i in range(model.memory_slices))
    return slices + counters.ENGINE_COUNTERS


def admitted(states: list[GpuState], pool_view: Callable[..., Any]) -> set[frozenset[str]]:
    return pool_view(build_slices("n", states, server_version=(1, 37))).admitted_sets()


@pytest.mark.parametrize("model_key", MODEL_KEYS)
def test_catalog_models_publish_their_memory_slices_and_the_ofa_engine_only(
    model_key: str,
) -> None:
    model = catalog.get_model(model_key)
    slices = tuple(memory_slice_counter(i) for i in range(model.memory_slices))
    assert binding_counters(model) == (*slices, "ofa-engines")


@pytest.mark.parametrize("model_key", ["A30-24GB", "A100-80GB", "H100-80GB", "B200-180GB"])
@pytest.mark.parametrize("foreign", ["none", "smallest", "media"])
def test_leaving_the_other_budgets_out_admits_exactly_the_same_sets(
    make_states: Callable[..., list[GpuState]],
    pool_view: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    model_key: str,
    foreign: str,
) -> None:
    """Also beside an instance the agent did not make, whose share comes off the counters."""
    model = catalog.get_model(model_key)
    smallest = min(model.profiles, key=lambda p: (p.memory_slices, p.media_exclusive))
    media = next(p for p in model.profiles if p.media_exclusive)
    placed = {
        "none": [],
        "smallest": [(smallest.name, smallest.starts[1])],
        "media": [(media.name, media.starts[0])],
    }[foreign]
    states = make_states(f"{model_key}:1", instances={0: placed})
    published = admitted(states, pool_view)
    monkeypatch.setattr(counters, "binding_counters", every_counter)
    assert admitted(states, pool_view) == published
    assert len(published) > 5  # the comparison covers real combinations


def test_a_budget_that_can_refuse_a_set_is_published(
    make_states: Callable[..., list[GpuState]],
    pool_view: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seven 1g.10gb take 98 multiprocessors; a GPU with 84 can host six of them at most.
    model = replace(catalog.get_model("A100-80GB"), multiprocessors=84)
    assert "multiprocessors" in binding_counters(model)
    states = [replace(s, info=replace(s.info, mig_model=model)) for s in make_states("A100-80GB:1")]
    published = admitted(states, pool_view)
    seven = frozenset(SliceSpec(0, "1g.10gb", start).device_name for start in range(7))
    assert seven not in published
    assert any(len(s) == 6 and s < seven for s in published)
    monkeypatch.setattr(counters, "binding_counters", every_counter)
    assert admitted(states, pool_view) == published
