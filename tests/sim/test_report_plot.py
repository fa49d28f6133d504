"""The picture and the table of ``simulate``: what a person came to see, drawn without one
strategy hiding another, and columns that stay apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.cli.main import main
from gpu_slicer.sim.compare import compare
from gpu_slicer.sim.report import table, timelines
from gpu_slicer.sim.scenario import load_scenario, parse_scenario


@pytest.fixture(scope="module")
def noon() -> object:
    scenario = load_scenario("noon-burst")
    return compare(
        scenario,
        ["device-plugin", "static-1g", "gpu-slicer-name", "gpu-slicer-best-fit", "oracle"],
        through_api=False,
    )


def test_strategies_that_start_every_pod_at_the_same_moment_share_one_labelled_line(
    noon: object,
) -> None:
    lines = {line.label: line for line in timelines(noon)}  # type: ignore[arg-type]
    [shared] = [label for label in lines if "gpu-slicer-best-fit" in label]
    starts = {r.strategy: r.starts for r in noon.results}  # type: ignore[attr-defined]
    members = shared.split(" = ")
    assert all(starts[m] == starts[members[0]] for m in members)
    others = [label for label in lines if label != shared]
    assert all(starts[o.split(" = ")[0]] != starts[members[0]] for o in others)


def test_the_device_plugin_holds_whole_gpus_but_its_pods_need_far_less(noon: object) -> None:
    lines = {line.label.split(" = ")[0]: line for line in timelines(noon)}  # type: ignore[arg-type]
    plugin = lines["device-plugin"]
    assert plugin.held_mean > 0.9 and plugin.needed_mean < 0.5 * plugin.held_mean
    # 10 pods: the device plugin starts one on arrival; gpu-slicer starts six, the training pod
    # after a wait, and the first pod of each of the three profiles the day asks for once the
    # agents advertise it (the scenario's demandLatency, 2 s).
    assert (plugin.on_arrival, plugin.on_arrival + plugin.later + plugin.never) == (1, 10)
    [slicer] = [line for line in lines.values() if "gpu-slicer-best-fit" in line.label]
    assert (slicer.on_arrival, slicer.later, slicer.never) == (6, 4, 0)
    # At 12:05 the burst waits under the device plugin and not under gpu-slicer.
    at = slicer.times_h.index(next(t for t in slicer.times_h if t >= 12 + 5 / 60))
    assert slicer.waiting[at] == 0 and plugin.waiting[at] >= 7


@pytest.mark.parametrize("name", ["plot.png", "plot.svg"])
def test_the_plot_is_written_in_the_format_its_extension_names(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / name
    assert (
        main(
            ["simulate", "--strategies", "device-plugin,gpu-slicer-best-fit", "--plot", str(target)]
        )
        == 0
    )
    head = target.read_bytes()[:200]
    assert (
        head.startswith(b"\x89PNG")
        if name.endswith(".png")
        else b"<svg" in head or b"<?xml" in head
    )
    assert f"plot written to {target}" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["plot.jpg", "plot"])
def test_a_plot_name_without_a_known_extension_is_refused_before_the_run(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    assert main(["simulate", "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert ".png" in err and err.count("\n") == 1
    assert not (tmp_path / name).exists() and not (tmp_path / f"{name}.png").exists()


def test_per_workload_columns_stay_apart_whatever_the_names() -> None:
    long_a, long_b = "a-workload-with-a-very-long-name-indeed", "b"
    scenario = parse_scenario(
        {
            "nodes": [{"name": "n", "gpus": "A100-80GB:1"}],
            "pods": [
                {
                    "name": "p1",
                    "workload": long_a,
                    "at": "0s",
                    "duration": "1h",
                    "resources": {"nvidia.com/mig-1g.10gb": 1},
                },
                {
                    "name": "p2",
                    "workload": long_b,
                    "at": "0s",
                    "duration": "1h",
                    "resources": {"nvidia.com/mig-1g.10gb": 1},
                },
            ],
        }
    )
    text = table(compare(scenario, ["gpu-slicer-best-fit"], through_api=False))
    lines = text.split("served / total (mean wait) per workload:\n")[1].splitlines()
    header, row = lines[0], lines[1]
    assert header.split() == ["strategy", long_a, long_b]
    assert row.split()[:2] == ["gpu-slicer-best-fit", "1/1"]
    # every cell ends where its header ends, two spaces at least between columns
    wait = row.split()[2]  # "(2s)": the profile waited for the agents to advertise it
    assert row.index(wait) + len(wait) == header.index(long_a) + len(long_a)
    assert "  " + long_a in header
