"""Scenario files: the shipped ones load, generators are seeded, and mistakes name their key."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_slicer.sim.errors import ScenarioError, UnknownNameError
from gpu_slicer.sim.scenario import builtin_names, load_scenario, parse_duration, parse_scenario

BASE: dict[str, Any] = {
    "nodes": [{"name": "n", "gpus": "A100-80GB:1"}],
    "namespaces": {"ml": "enabled"},
}


def with_(**extra: Any) -> dict[str, Any]:
    return {**BASE, **extra}


def test_the_shipped_scenarios_are_there_and_load() -> None:
    assert {"noon-burst", "mixed-day", "large"} <= set(builtin_names())
    noon = load_scenario("noon-burst")
    assert noon.gpu_count == 1
    assert sum(1 for p in noon.pods if p.workload == "noon-burst") == 7


def test_large_describes_a_thousand_nodes_and_a_hundred_thousand_pod_events() -> None:
    large = load_scenario("large")
    assert len(large.nodes) == 1000
    assert all(len(n.models) == 8 for n in large.nodes)
    assert large.events == 100_000


def test_generators_give_the_same_trace_for_the_same_seed_and_another_for_another() -> None:
    first = load_scenario("mixed-day", seed=1)
    again = load_scenario("mixed-day", seed=1)
    other = load_scenario("mixed-day", seed=2)
    assert first.pods == again.pods
    assert [p.arrival for p in first.pods] != [p.arrival for p in other.pods]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
    ],
)
def test_durations_read_as_people_write_them(text: Any, seconds: float) -> None:
    assert parse_duration(text, "x") == seconds


def test_clock_times_count_from_the_scenario_clock() -> None:
    scenario = parse_scenario(
        with_(
            clock="08:00",
            pods=[
                {
                    "name": "p",
                    "namespace": "ml",
                    "at": "12:00",
                    "duration": "1h",
                    "resources": {"nvidia.com/mig-1g.10gb": 1},
                }
            ],
        )
    )
    assert scenario.pods[0].arrival == 4 * 3600
    assert scenario.clock(4 * 3600) == "12:00"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        (with_(nodez=[]), "nodez"),
        ({"namespaces": {}}, "nodes"),
        (with_(nodes=[{"name": "n", "gpus": "Z100:1"}]), "nodes[0].gpus"),
        (
            with_(
                pods=[
                    {
                        "name": "p",
                        "at": 0,
                        "duration": "soon",
                        "resources": {"nvidia.com/gpu": 1},
                        "namespace": "ml",
                    }
                ]
            ),
            "pods[0].duration",
        ),
        (
            with_(
                pods=[
                    {
                        "name": "p",
                        "at": 0,
                        "duration": 1,
                        "namespace": "other",
                        "resources": {"nvidia.com/gpu": 1},
                    }
                ]
            ),
            "pods[0].namespace",
        ),
        (with_(pods=[{"name": "p", "at": 0, "duration": 1, "namespace": "ml"}]), "pods[0]"),
        (with_(layouts={"bad": ["4g", "4g"]}), "layouts.bad"),
        (with_(scheduler={"nodeRule": "random"}), "scheduler.nodeRule"),
        (with_(generators=[{"count": 0, "mix": []}]), "generators[0].count"),
        (
            with_(generators=[{"count": 3, "namespace": "ml", "mix": [{"resources": {"cpu": 1}}]}]),
            "generators[0].mix[0].resources",
        ),
    ],
)
def test_a_mistake_is_reported_with_its_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ScenarioError, match=key.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(data)


def test_an_unknown_scenario_name_lists_the_shipped_ones() -> None:
    with pytest.raises(UnknownNameError, match="noon-burst"):
        load_scenario("no-such-scenario")


def test_a_layout_of_kinds_resolves_per_model() -> None:
    scenario = parse_scenario(
        with_(
            nodes=[{"name": "a", "gpus": "A100-80GB:1"}, {"name": "h", "gpus": "H100-NVL-94GB:1"}],
            layouts={"mine": ["3g", "3g"]},
        )
    )
    assert scenario.layouts["mine"].for_gpu("h", 0) == ("3g", "3g")


def _noon_burst_with(layout: Any) -> Any:
    from importlib import resources

    import yaml

    text = resources.files("gpu_slicer.sim").joinpath("scenarios/noon-burst.yaml").read_text()
    data = yaml.safe_load(text)
    data["layouts"] = {"balanced": layout}
    return parse_scenario(data)


def test_a_layout_in_the_agents_file_format_places_exactly_those_instances() -> None:
    # The format of `agent run --static-layout` and `slices --static-layout`, in a scenario.
    from gpu_slicer.sim.compare import compare

    exact = {"default": ["3g.40gb@4", "2g.20gb@2", "1g.10gb@0", "1g.10gb@1"]}
    scenario = _noon_burst_with(exact)
    assert scenario.layouts["balanced"].placements is not None
    (placed,) = compare(scenario, ["static-balanced"]).results
    (packed,) = compare(
        _noon_burst_with(["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]), ["static-balanced"]
    ).results
    assert placed.starts == packed.starts  # the layout the packer makes, given exactly
    assert placed.creations == packed.creations == 4


def test_a_layout_in_the_agents_format_that_cannot_be_built_names_the_gpu() -> None:
    with pytest.raises(ScenarioError, match=r"layouts\.balanced: .*2g\.20gb cannot start"):
        _noon_burst_with({"default": ["2g.20gb@6"]})
