"""`gpu-slicer simulate`: exit codes, the table, JSON and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_slicer.cli.main import main


def test_no_arguments_runs_noon_burst_and_prints_the_comparison(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "scenario noon-burst" in out
    for strategy in (
        "device-plugin",
        "static-balanced",
        "static-1g",
        "instaslice",
        "gpu-slicer-name",
        "gpu-slicer-anti-fragmentation",
        "gpu-slicer-best-fit",
        "oracle",
    ):
        assert strategy in out


def test_json_output_carries_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--json", "--strategies", "static-balanced,gpu-slicer-best-fit"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scenario"]["name"] == "noon-burst"
    names = [r["strategy"] for r in data["results"]]
    assert names == ["static-balanced", "gpu-slicer-best-fit"]
    best = data["results"][1]
    assert best["pods"]["served"] == best["pods"]["total"] == 10
    assert set(best) >= {
        "waitSeconds",
        "utilization",
        "fragmentation",
        "mig",
        "series",
        "problems",
        "startedOnArrival",
    }
    # The burst's first pod waits for the agents to advertise 1g.10gb, new at noon.
    assert best["startedOnArrival"]["noon-burst"] == 6
    assert data["results"][0]["startedOnArrival"]["noon-burst"] == 2
    assert best["problems"] == []


def test_an_unknown_strategy_exits_2_and_lists_the_valid_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--strategies", "oracle,best-guess"]) == 2
    err = capsys.readouterr().err
    assert "best-guess" in err and "gpu-slicer-best-fit" in err and "instaslice" in err


def test_an_unknown_scenario_exits_2_and_lists_the_shipped_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--scenario", "tuesday"]) == 2
    err = capsys.readouterr().err
    assert "noon-burst" in err and "mixed-day" in err and "large" in err


def test_a_broken_scenario_file_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("nodes:\n  - name: n\n    gpus: A100-80GB:1\n    colour: red\n")
    assert main(["simulate", "--scenario", str(path)]) == 2
    assert "nodes[0].colour" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path: Path) -> None:
    target = tmp_path / "u.png"
    assert main(["simulate", "--strategies", "static-1g,oracle", "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_into_a_missing_folder_exits_2_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "no-such-folder" / "u.png"
    assert main(["simulate", "--plot", str(target)]) == 2
    captured = capsys.readouterr()
    assert "does not exist" in captured.err
    assert captured.out == ""  # nothing was simulated
