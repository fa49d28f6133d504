"""sim.scheduler_cost: the real scheduler's measured cost, interpolated, and the outlook the
simulator prints for a scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_slicer.cli.main import main
from gpu_slicer.sim import scheduler_cost
from gpu_slicer.sim.agreement import MIXED_KINDS
from gpu_slicer.sim.errors import ScenarioError
from gpu_slicer.sim.scenario import load_scenario
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.translate import translate_pod


@pytest.fixture
def model(tmp_path: Path) -> scheduler_cost.CostModel:
    path = tmp_path / "cost.yaml"
    scheduler_cost.write(
        path,
        "test figures",
        [
            ("1.37", 20, "single", 10.0),
            ("1.37", 100, "single", 50.0),
            ("1.37", 20, "plain", 5.0),
            ("1.37", 100, "plain", 5.0),
            ("1.36", 20, "single", 100.0),
            ("1.36", 100, "single", 2500.0),
        ],
    )
    return scheduler_cost.load(path)


def test_measured_points_come_back_exactly_and_between_them_as_a_power_law(
    model: scheduler_cost.CostModel,
) -> None:
    assert model.cpu_ms("1.37", "single", 20) == (10.0, False)
    assert model.cpu_ms("1.37", "single", 100) == (50.0, False)
    # linear in nodes between (20, 10) and (100, 50): 50 nodes cost 25 ms
    value, beyond = model.cpu_ms("1.37", "single", 50)
    assert value == pytest.approx(25.0) and not beyond
    # quadratic on 1.36 (x5 nodes, x25 CPU): 200 nodes extrapolate to 10,000 ms, flagged
    value, beyond = model.cpu_ms("1.36", "single", 200)
    assert value == pytest.approx(10_000.0) and beyond
    # below the smallest cluster measured: its cost, flagged
    assert model.cpu_ms("1.36", "single", 5) == (100.0, True)


def test_an_unmeasured_release_uses_the_nearest_measured_one(
    model: scheduler_cost.CostModel,
) -> None:
    assert model.release_for((1, 37)) == "1.37"
    assert model.release_for((1, 38)) == "1.37"
    assert model.release_for((1, 35)) == "1.36"


@pytest.mark.parametrize(
    ("label", "shape"),
    [
        ("mig-1g", "single"),
        ("mig-1g-x2", "single"),
        ("profiles", "fallback"),
        ("mem-15Gi", "memory"),
        ("gpu-1", "whole"),
    ],
)
def test_a_converted_pod_is_costed_as_the_benchmark_shape_it_resembles(
    label: str, shape: str
) -> None:
    kinds = {k[0]: k for k in MIXED_KINDS["A100-80GB"]}
    _label, containers, annotations = kinds[label]
    body = [
        {"name": f"c{i}", "image": "app:1", "resources": {"limits": dict(r)}}
        for i, r in enumerate(containers)
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": dict(annotations)},
        "spec": {"containers": body},
    }
    conversion = translate_pod(pod, namespace="ml", policy=Policy.default())
    assert scheduler_cost.shape_of(conversion.requests) == shape


def test_nvlink_pods_are_costed_as_nvlink() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]},
    }
    conversion = translate_pod(pod, namespace="ml", policy=Policy.default())
    assert scheduler_cost.shape_of(conversion.requests) == "nvlink"


def test_the_busiest_minute_counts_arrivals_in_any_sixty_second_window() -> None:
    assert scheduler_cost.busiest_minute([]) == 0
    assert scheduler_cost.busiest_minute([0, 10, 59.9, 60, 61, 200]) == 4
    assert scheduler_cost.busiest_minute([5.0] * 7) == 7


def test_the_outlook_says_whether_one_core_keeps_up(model: scheduler_cost.CostModel) -> None:
    calm = scheduler_cost.outlook(model, (1, 37), 100, {"single": 10}, [0, 30, 90])
    assert calm is not None
    assert calm.cpu_ms == 50.0 and calm.per_core_per_s == 20.0
    assert calm.plain_cpu_ms == 5.0
    assert "one core keeps up" in "\n".join(calm.lines())
    burst = scheduler_cost.outlook(model, (1, 36), 100, {"single": 100}, [1.0] * 100)
    assert burst is not None
    text = "\n".join(burst.lines())
    assert "needs 4.2 cores" in text  # 100 pods in a minute at 2.5 s of CPU each
    assert scheduler_cost.outlook(model, (1, 37), 100, {}, []) is None


def test_agents_advertising_what_is_asked_are_costed_by_the_asked_runs(tmp_path: Path) -> None:
    path = tmp_path / "cost.yaml"
    runs = [
        ("1.37", 100, "single", 70.0),
        ("1.37", 100, "single-asked", 40.0),
        ("1.37", 100, "memory", 70.0),
        ("1.37", 100, "nic", 7.0),
        ("1.37", 100, "nic-gs", 380.0),
        ("1.37", 100, "nic-asked", 200.0),
    ]
    scheduler_cost.write(path, "test figures", runs)
    model = scheduler_cost.load(path)
    mix = {"single": 2, "memory": 2}  # no memory-asked run: memory's own figure
    asked = scheduler_cost.outlook(model, (1, 37), 100, mix, [0.0], advertised_profiles="asked")
    every = scheduler_cost.outlook(model, (1, 37), 100, mix, [0.0])
    assert asked is not None and every is not None
    assert (asked.cpu_ms, every.cpu_ms) == (55.0, 70.0)
    assert (asked.neighbour_ms, every.neighbour_ms) == ((7.0, 200.0), (7.0, 380.0))
    assert "7.0 ms alone, 200.0 ms beside gpu-slicer's slices" in "\n".join(asked.lines())


def test_a_new_run_adds_to_the_cost_model_and_replaces_only_what_it_measured(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cost.yaml"
    scheduler_cost.write(
        path, "first", [("1.36", 100, "single", 9.0), ("1.37", 100, "single", 8.0)]
    )
    scheduler_cost.write(
        path, "second", [("1.37", 100, "single", 5.0), ("1.37", 250, "nic", 3.0)], merge=True
    )
    model = scheduler_cost.load(path)
    assert model.measured == "first; second"
    assert model.cpu_ms("1.36", "single", 100) == (9.0, False)
    assert model.cpu_ms("1.37", "single", 100) == (5.0, False)
    assert model.cpu_ms("1.37", "nic", 250) == (3.0, False)


def test_a_cost_model_that_cannot_be_read_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "cost.yaml"
    path.write_text("releases: [1, 2]\n")
    with pytest.raises(ScenarioError, match="scheduler cost model"):
        scheduler_cost.load(path)


def test_the_shipped_cost_model_covers_every_benchmark_shape_on_each_release() -> None:
    model = scheduler_cost.load()
    assert model.releases
    for shapes in model.releases.values():
        assert {"plain", *scheduler_cost.SHAPES} <= set(shapes)


def test_simulate_prints_what_the_real_scheduler_would_sustain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--strategies", "gpu-slicer-best-fit"]) == 0
    out = capsys.readouterr().out
    scenario = load_scenario("noon-burst")
    release = scheduler_cost.load().release_for(scenario.kubernetes)
    assert f"real kube-scheduler, Kubernetes {release}" in out
    assert "one scheduler core sustains about" in out
    assert main(["simulate", "--json", "--strategies", "gpu-slicer-best-fit"]) == 0
    document = json.loads(capsys.readouterr().out)
    outlook = document["scheduler"]
    assert outlook["nodes"] == len(scenario.nodes) and outlook["cpuMsPerPod"] > 0
    assert sum(outlook["mix"].values()) > 0
