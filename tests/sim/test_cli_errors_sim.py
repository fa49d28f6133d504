"""Bad scenario files and flags given to `gpu-slicer simulate`: exit 2 and a message naming the
problem, never a traceback or a run that does not end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def scenario(tmp_path: Path, change: Any) -> Path:
    """noon-burst with one change applied, written to a file."""
    data = yaml.safe_load((ROOT / "sim" / "scenarios" / "noon-burst.yaml").read_text())
    change(data)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def simulate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["simulate", "--scenario", str(path), "--strategies", "gpu-slicer-best-fit"])
    return code, capsys.readouterr().err


def test_a_scenario_file_that_is_not_utf8_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    code, err = simulate(path, capsys)
    assert code == 2
    assert f"{path}: not UTF-8 text" in err and "utf-8" in err


def test_a_scenario_that_is_not_yaml_says_where_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("nodes: [\n")
    code, err = simulate(path, capsys)
    assert code == 2
    assert f"{path}: not valid YAML" in err and "line 2" in err
    assert "<unicode string>" not in err


def _set_pod(key: str, value: Any) -> Any:
    return lambda d: d["pods"][2].__setitem__(key, value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d.__setitem__("seed", "abc"), "seed: 'abc' must be a whole number"),
        (_set_pod("count", "abc"), "pods[2].count: 'abc'"),
        (_set_pod("count", 0), "pods[2].count: 0"),
        (_set_pod("count", 10**9), "pods[2].count: 1000000000"),
        (_set_pod("duration", 0), "pods[2].duration: 0 must be longer than zero"),
        (lambda d: d["nodes"][0].__setitem__("count", 10**9), "nodes[0].count"),
        (lambda d: d["nodes"][0].__setitem__("gpus", "A100-80GB:100000"), "at most 64 GPUs"),
        (lambda d: d.update(sample="1s", end="9999h"), "sample: '1s' over 9999 h"),
        (
            lambda d: d.__setitem__(
                "generators",
                [
                    {
                        "count": 3,
                        "namespace": "ml",
                        "mix": [{"weight": "x", "resources": {"nvidia.com/gpu": 1}}],
                    }
                ],
            ),
            "generators[0].mix[0].weight: 'x'",
        ),
        (
            lambda d: d.__setitem__(
                "generators",
                [
                    {
                        "count": 3,
                        "namespace": "ml",
                        "duration": {"mean": 0},
                        "mix": [{"resources": {"nvidia.com/gpu": 1}}],
                    }
                ],
            ),
            "generators[0].duration.mean",
        ),
    ],
)
def test_bad_scenario_values_exit_2_naming_the_key(
    change: Any, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = simulate(scenario(tmp_path, change), capsys)
    assert code == 2
    assert named in err


def test_a_plot_path_that_is_a_folder_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    code = main(["simulate", "--plot", str(tmp_path)])
    assert code == 2
    assert "is a folder" in capsys.readouterr().err


def test_a_scenario_nested_too_deeply_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 20000 + "]" * 20000)
    code, err = simulate(path, capsys)
    assert code == 2
    assert f"{path}: refused at line 1" in err and "nested too deeply" in err


def test_a_bad_scenario_policy_is_bad_input_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(tmp_path, lambda d: d.__setitem__("policy", {"migFallback": "sideways"}))
    code, err = simulate(path, capsys)
    assert code == 2
    assert "policy: " in err and "migFallback: 'sideways'" in err
