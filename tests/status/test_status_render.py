"""The terminal picture and the JSON document of ``gpu-slicer status``."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from gpu_slicer.slicer.demand import EVERY_PROFILE, Advertised
from gpu_slicer.status.render import advertised_line, as_json, cell_width, picture, table
from gpu_slicer.status.view import ClusterStatus, build_status
from tests.support.status_fixtures import INFER, STATUS_SCHEMA, claim, node_slices, sandbox_like

Obj = dict[str, Any]


def _sandbox(**kwargs: Any) -> ClusterStatus:
    d = sandbox_like()
    return build_status(d["slices"], d["claims"], d["pods"], d["namespaces"], **kwargs)


def test_the_report_draws_one_row_per_gpu_with_instances_grouped_then_holders_and_namespaces() -> (
    None
):
    assert (
        table(_sandbox(), width=80)
        == """\
a100: 1 GPU A100-SXM4-80GB, 1 of 8 memory slices free
  0  mig      |free   |1g.10gb|1g.10gb|1g.10gb|3g.40gb                        |
              |       |~dlqzb |~ss84s |~zpnn4 |train                          |
h100: 2 GPUs H100 80GB HBM3, 8 of 16 memory slices free
  0  dynamic  |gpu                                                            |
              |whole                                                          |
  1  dynamic  |free   |free   |free   |free   |free   |free   |free   |free   |
              |       |       |       |       |       |       |       |       |

NODE  GPU  DEVICE              PROFILE    SLICES  POD
a100  0    gpu-0-mig-1g10gb-1  1g.10gb    1       ml/infer-749bf8c799-dlqzb
a100  0    gpu-0-mig-1g10gb-2  1g.10gb    2       ml/infer-749bf8c799-ss84s
a100  0    gpu-0-mig-1g10gb-3  1g.10gb    3       ml/infer-749bf8c799-zpnn4
a100  0    gpu-0-mig-3g40gb-4  3g.40gb    4-7     ml/train
h100  0    gpu-0               whole GPU  0-7     ml/whole

NAMESPACE  MIGRATION  CONVERTED PODS  HOLDING A DEVICE  LEGACY PODS
aud        audit      0               0                 1
ml         enabled    5               5                 0
"""
    )


def test_a_shared_instance_a_blocked_slice_and_a_small_gpu_in_a_narrow_terminal() -> None:
    slices = node_slices("n", "A30:1", foreign={0: [("1g.6gb", 3)]})
    shared = claim("ml", "c", "n", ["gpu-0-mig-2g12gb-0"], pods=INFER[:2])
    status = build_status(slices, [shared], INFER, [])
    assert (
        picture(status.nodes, width=40)
        == """\
n: 1 GPU A30, 1 of 4 memory slices free
  0  mig  |2g.12gb      |free  |######|
          |infer-dlqzb+1|      |######|
###: blocked (a MIG instance gpu-slicer did not make, or outside every device)
"""
    )


def test_an_empty_cluster_says_what_is_missing() -> None:
    assert table(build_status([], [], [], []), width=80) == (
        "no node publishes gpu-slicer.io ResourceSlices (is the agent installed?)\n\n"
        "no namespace is labelled gpu-slicer.io/migration\n"
    )


@pytest.mark.parametrize("width", [26, 30, 40, 50, 60, 72, 80, 100, 120, 160, 240])
def test_gpu_rows_never_exceed_the_terminal_width(width: int) -> None:
    slices = node_slices("mixed", "H100-80GB:2,A30", unhealthy=[1])
    claims = [claim("ml", "c", "mixed", ["gpu-0-mig-1g10gbme-3"], pods=INFER[:1])]
    status = build_status(sandbox_like()["slices"] + slices, claims, INFER, [])
    lines = picture(status.nodes, width=width).splitlines()
    rows = [line for line in lines if line.rstrip().endswith("|")]
    assert len(rows) == 2 * 6  # two lines per GPU
    assert max(len(line) for line in rows) <= width
    assert all(line.isascii() for line in lines)


@pytest.mark.parametrize(
    ("width", "top", "bottom"),
    [
        (120, "1g.10gb+me", "infer-dlqzb"),
        (80, "1g+me", "~dlqzb"),
        (60, "1g", "~qzb"),
        (40, "1g", "~zb"),
    ],
    ids=["whole", "wide", "medium", "narrow"],
)
def test_labels_shrink_profile_first_to_its_compute_size_and_pod_names_keep_their_tail(
    width: int,
    top: str,
    bottom: str,
) -> None:
    slices = node_slices("n", "H100-80GB:1")
    claims = [claim("ml", "c", "n", ["gpu-0-mig-1g10gbme-0"], pods=INFER[:1])]
    first, second = picture(
        build_status(slices, claims, INFER, []).nodes, width=width
    ).splitlines()[1:3]
    first_cell = first[first.index("|") :].split("|")[1]
    second_cell = second[second.index("|") :].split("|")[1]
    assert (first_cell.rstrip(), second_cell.rstrip()) == (top, bottom)


def test_cells_are_as_wide_as_the_width_allows_within_bounds() -> None:
    assert cell_width(8, 73) == 8  # 8 cells of 8 and 9 bars
    assert cell_width(8, 10) == 1
    assert cell_width(1, 500) == 24


def test_each_node_says_which_profiles_it_advertises_and_why() -> None:
    reasons = {"3g.40gb": "floor", "1g.10gb": "asked", "2g.20gb": "recent"}
    assert (
        advertised_line(Advertised(reasons))  # type: ignore[arg-type]
        == "  advertises 1g.10gb (asked), 2g.20gb (recent), 3g.40gb (floor)"
    )
    assert "every profile" in advertised_line(EVERY_PROFILE)
    assert "no MIG profile" in advertised_line(Advertised())
    slices = node_slices("n", "A100-80GB:1", profiles=Advertised({"1g.10gb": "asked"}))
    text = table(build_status(slices, [], [], []), width=80)
    assert text.splitlines()[:2] == [
        "n: 1 GPU A100-SXM4-80GB, 8 of 8 memory slices free",
        "  advertises 1g.10gb (asked)",
    ]
    node = as_json(build_status(slices, [], [], []))["nodes"][0]
    assert node["advertised"] == {"everyProfile": False, "profiles": {"1g.10gb": "asked"}}


def test_the_json_document_follows_its_schema_in_every_mode() -> None:
    objects = sandbox_like()
    objects["slices"] += node_slices(
        "static", "A100-80GB:1", static=True, made={0: [("3g.40gb", 4)]}
    )
    objects["slices"] += node_slices("full", "H100-80GB:1", mode="full", unhealthy=[0])
    objects["claims"].append(claim("ml", "gone", "nowhere", ["gpu-0"]))
    status = build_status(
        objects["slices"], objects["claims"], objects["pods"], objects["namespaces"]
    )
    document = json.loads(json.dumps(as_json(status)))
    jsonschema.validate(document, STATUS_SCHEMA)
    modes = {n["name"]: [g["mode"] for g in n["gpus"]] for n in document["nodes"]}
    assert modes == {
        "a100": ["mig"],
        "full": ["full"],
        "h100": ["dynamic", "dynamic"],
        "nowhere": ["unknown"],
        "static": ["static"],
    }
    train = document["nodes"][0]["gpus"][0]["instances"][3]
    assert train == {
        "device": "gpu-0-mig-3g40gb-4",
        "profile": "3g.40gb",
        "wholeGpu": False,
        "placementStart": 4,
        "placementSize": 4,
        "claim": {"namespace": "ml", "name": "train-gpu-slicer-gnw8k"},
        "request": "main",
        "pods": [{"namespace": "ml", "name": "train"}],
    }
    assert document["namespaces"][0] == {
        "name": "aud",
        "migration": "audit",
        "convertedPods": 0,
        "podsHoldingDevices": 0,
        "legacyPods": 1,
    }
