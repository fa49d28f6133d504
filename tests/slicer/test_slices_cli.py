"""``gpu-slicer slices``: output for any model and count is valid, within limits, and complete."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.core import catalog
from gpu_slicer.slicer import cli as slicer_cli
from gpu_slicer.slicer.inventory import check_limits

VERSIONS = ("1.34", "1.35", "1.36", "1.37")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu-slicer")
    slicer_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def vt(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


@pytest.mark.parametrize("version", VERSIONS)
def test_json_output_is_one_list_whose_items_validate_and_respect_the_limits(
    capsys: pytest.CaptureFixture[str],
    validate: Callable[[dict[str, Any], str], None],
    version: str,
) -> None:
    code = run(
        [
            "slices",
            "--node",
            "gpu-node-1",
            "--gpus",
            "H200-141GB:8,A30:1",
            "--k8s-version",
            version,
            "--device-classes",
            "-o",
            "json",
        ]
    )
    assert code == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["kind"] == "List" and listing["apiVersion"] == "v1"
    kinds = [o["kind"] for o in listing["items"]]
    assert kinds[:2] == ["DeviceClass", "DeviceClass"] and set(kinds[2:]) == {"ResourceSlice"}
    for obj in listing["items"]:
        validate(obj, version)
    slices = listing["items"][2:]
    assert check_limits(slices, vt(version)) == []
    devices = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
    h200, a30 = catalog.get_model("H200"), catalog.get_model("A30")
    assert len(devices) == 8 * (1 + len(catalog.all_placements(h200))) + len(
        catalog.all_placements(a30)
    )


@pytest.mark.parametrize("model_key", [m.key for m in catalog.MODELS])
def test_output_for_sixteen_gpus_of_each_model_stays_within_the_limits(
    capsys: pytest.CaptureFixture[str], model_key: str
) -> None:
    assert (
        run(
            [
                "slices",
                "--node",
                "n",
                "--gpus",
                f"{model_key}:16",
                "--k8s-version",
                "1.35",
                "-o",
                "json",
            ]
        )
        == 0
    )
    slices = json.loads(capsys.readouterr().out)["items"]
    assert slices and check_limits(slices, (1, 35)) == []


def test_yaml_output_is_a_stream_of_the_same_objects(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["slices", "--node", "n", "--gpus", "A100-40GB:2", "--device-classes"]
    assert run(argv) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert run([*argv, "-o", "json"]) == 0
    assert documents == json.loads(capsys.readouterr().out)["items"]


def test_mode_order_and_generation_reach_the_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(
            [
                "slices",
                "--node",
                "n",
                "--gpus",
                "H100-80GB:2",
                "--mode",
                "full",
                "--order",
                "name",
                "--generation",
                "4",
                "-o",
                "json",
            ]
        )
        == 0
    )
    items = json.loads(capsys.readouterr().out)["items"]
    assert [d["name"] for s in items for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert {s["spec"]["pool"]["generation"] for s in items} == {4}


def test_the_extended_resources_variant_is_printed_on_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        run(
            [
                "slices",
                "--node",
                "n",
                "--gpus",
                "B200",
                "--device-classes",
                "--extended-resources",
                "-o",
                "json",
            ]
        )
        == 0
    )
    items = json.loads(capsys.readouterr().out)["items"]
    assert items[0]["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_a_static_layout_file_lists_just_its_instances_without_counters(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text('default: ["3g.40gb@4", "1g.10gb@0"]\ngpus:\n  "1": []\n')
    assert (
        run(
            [
                "slices",
                "--node",
                "n",
                "--gpus",
                "H100-80GB:2",
                "--static-layout",
                str(layout),
                "-o",
                "json",
            ]
        )
        == 0
    )
    items = json.loads(capsys.readouterr().out)["items"]
    assert sorted(d["name"] for s in items for d in s["spec"]["devices"]) == [
        "gpu-0-mig-1g10gb-0",
        "gpu-0-mig-3g40gb-4",
        "gpu-1",
    ]
    assert all("sharedCounters" not in s["spec"] for s in items)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--gpus", "H900:2"], "unknown model 'H900'"),
        (["--gpus", "H100-80GB:0"], "use a whole number >= 1"),
    ],
)
def test_a_bad_gpu_spec_exits_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert run(["slices", "--node", "n", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_impossible_static_layout_exits_2_naming_the_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text('gpus:\n  "0": ["4g.40gb@0", "3g.40gb@0"]\n')
    assert (
        run(["slices", "--node", "n", "--gpus", "H100-80GB", "--static-layout", str(layout)]) == 2
    )
    assert "GPU 0 (H100-80GB)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--k8s-version", "1.33"),
        ("--order", "random"),
        ("--mode", "half"),
        ("--attributes", "lean"),
    ],
)
def test_a_bad_version_policy_or_mode_exits_2_with_usage(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(["slices", "--node", "n", "--gpus", "H100-80GB", flag, value])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_minimal_attributes_print_the_same_pool_with_fewer_attributes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["slices", "--node", "n", "--gpus", "H100-80GB:1", "-o", "json"]
    assert run(base) == 0
    full = json.loads(capsys.readouterr().out)["items"]
    assert run([*base, "--attributes", "minimal"]) == 0
    minimal = json.loads(capsys.readouterr().out)["items"]
    assert [s["metadata"]["name"] for s in minimal] == [s["metadata"]["name"] for s in full]
    pairs = [
        (f, m)
        for fs, ms in zip(full, minimal, strict=True)
        for f, m in zip(fs["spec"].get("devices", ()), ms["spec"].get("devices", ()), strict=True)
    ]
    assert pairs
    for f, m in pairs:
        assert m["name"] == f["name"] and m["consumesCounters"] == f["consumesCounters"]
        assert "gpu-slicer.io/architecture" in f["attributes"]
        assert "gpu-slicer.io/architecture" not in m["attributes"]
        assert m["capacity"] == {"gpu-slicer.io/memory": f["capacity"]["gpu-slicer.io/memory"]}


def test_profiles_lists_only_those_and_a_bad_list_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["slices", "--node", "n", "--gpus", "A100-80GB:2", "-o", "json"]
    assert run([*base, "--profiles=-*+me,-1g.20gb"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    profiles = {
        d["attributes"]["gpu-slicer.io/profile"]["string"]
        for s in items
        for d in s["spec"].get("devices", [])
    }
    assert profiles == {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
    assert run([*base, "--profiles", "1g.12gb"]) == 2
    assert "leaves no MIG profile on this node's A100-80GB GPUs" in capsys.readouterr().err


def test_allocated_devices_leave_out_what_they_rule_out_and_bad_ones_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["slices", "--node", "n", "--gpus", "A100-80GB:2", "-o", "json"]

    def names() -> set[str]:
        items = json.loads(capsys.readouterr().out)["items"]
        return {d["name"] for s in items for d in s["spec"].get("devices", [])}

    assert run(base) == 0
    everything = names()
    assert run([*base, "--allocated", "gpu-1-mig-4g40gb-0"]) == 0
    busy = names()
    assert "gpu-1-mig-4g40gb-0" in busy and "gpu-1-mig-3g40gb-4" in busy
    assert everything - busy == {
        n for n in everything if n.startswith("gpu-1-") and n.endswith(("-0", "-1", "-2", "-3"))
    } - {"gpu-1-mig-4g40gb-0"}
    for bad, why in (
        ("gpu-1-mig-4g40gb-0,gpu-1-mig-7g80gb-0", "no claim can hold it beside"),
        ("gpu-7", "gpu-7: the node does not publish such a device"),
        ("nvidia0", "--allocated: 'nvidia0' is not a gpu-slicer device name"),
    ):
        assert run([*base, "--allocated", bad]) == 2
        assert why in capsys.readouterr().err, bad


def test_demand_lists_what_is_asked_and_nothing_asked_leaves_only_whole_gpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--demand`` previews the agent's default: the profiles asked (plus whole GPUs where the
    mode offers them); ``--demand ''`` is a node whose cluster asks for no profile."""

    def published(gpus: str, demand: str) -> tuple[set[str], set[str]]:
        argv = ["slices", "--node", "n", "--gpus", gpus, "--demand", demand, "-o", "json"]
        assert run(argv) == 0
        items = json.loads(capsys.readouterr().out)["items"]
        devices = [d for s in items for d in s["spec"].get("devices", [])]
        profiles = {d["attributes"].get("gpu-slicer.io/profile", {}).get("string") for d in devices}
        notes = {s["metadata"]["annotations"]["gpu-slicer.io/advertised-profiles"] for s in items}
        return profiles, notes

    assert published("A100-80GB:2", "1g.10gb,3g.40gb") == (
        {"1g.10gb", "3g.40gb"},
        {"1g.10gb=asked,3g.40gb=asked"},
    )
    assert published("A100-80GB:2", "") == (set(), {""})  # MIG mode: no whole GPU either
    assert published("H100-80GB:1", "") == ({None}, {""})  # dynamic: the whole GPU alone
    assert run(["slices", "--node", "n", "--gpus", "A100-80GB:1", "--demand", "2g.21gb"]) == 2
    assert "'2g.21gb' is not a MIG profile" in capsys.readouterr().err
