"""CDI specs: the CDI specification's rules, device nodes for MIG and whole GPUs, atomic files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from slicer.cdi import (
    CDI_VERSION,
    CdiDirectory,
    DeviceEdits,
    claim_spec,
    device_id,
    validate_spec,
)

UID = "0f8b6c1e-3d2a-4c5b-9e7f-1a2b3c4d5e6f"
MIG = DeviceEdits("gpu-0-mig-1g10gb-6", 0, "MIG-1234", (30, 31))
WHOLE = DeviceEdits("gpu-1", 1, "GPU-abcd")


def test_a_mig_device_gets_the_parent_control_uvm_and_both_capability_nodes() -> None:
    spec = claim_spec(UID, [MIG])
    edits = spec["devices"][0]["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
        "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31",
    ]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=MIG-1234"]


def test_a_whole_gpu_gets_no_capability_nodes_and_its_gpu_uuid() -> None:
    edits = claim_spec(UID, [WHOLE])["devices"][0]["containerEdits"]
    assert not any("nvidia-caps" in n["path"] for n in edits["deviceNodes"])
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-abcd"]


def test_device_ids_name_the_claim_and_device_under_our_vendor_and_class() -> None:
    assert device_id(UID, "gpu-1") == f"k8s.gpu-slicer.io/claim={UID}-gpu-1"
    spec = claim_spec(UID, [MIG, WHOLE])
    names = [d["name"] for d in spec["devices"]]
    assert [f"{spec['kind']}={n}" for n in names] == [
        device_id(UID, "gpu-0-mig-1g10gb-6"), device_id(UID, "gpu-1")]


def test_generated_specs_follow_the_cdi_rules() -> None:
    spec = claim_spec(UID, [MIG, WHOLE])
    assert spec["cdiVersion"] == CDI_VERSION
    assert validate_spec(spec) == []


def _spec(**changes: Any) -> dict[str, Any]:
    spec = claim_spec(UID, [MIG])
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (_spec(cdiVersion="0.4.0"), "predates"),
        (_spec(cdiVersion="six"), "semantic version"),
        (_spec(kind="k8s.gpu-slicer.io"), "kind"),
        (_spec(kind="1vendor/claim"), "kind"),
        (_spec(devices=[]), "non-empty"),
        (_spec(devices=[{"name": "bad name!", "containerEdits": {"env": ["A=1"]}}]), "name"),
        (_spec(devices=[{"name": "a", "containerEdits": {}}]), "containerEdits"),
        (_spec(devices=[{"name": "a", "containerEdits": {"env": ["NOEQUALS"]}}]), "KEY=VALUE"),
        (_spec(devices=[{"name": "a", "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}}]),
         "absolute"),
        (_spec(devices=[{"name": "a", "containerEdits": {"env": ["A=1"]}}] * 2), "unique"),
    ],
    ids=["old-version", "bad-version", "no-class", "vendor-digit", "no-devices", "device-charset",
         "empty-edits", "env-shape", "relative-node", "duplicate"],
)
def test_the_validator_catches_specs_that_break_the_rules(spec: Any, problem: str) -> None:
    problems = validate_spec(spec)
    assert any(problem in p for p in problems), problems


def test_spec_files_are_written_atomically_one_per_claim_and_removed_idempotently(
    tmp_path: Path,
) -> None:
    cdi = CdiDirectory(tmp_path)
    path = cdi.write(UID, [MIG])
    cdi.write("other", [WHOLE])
    assert path.name == f"k8s.gpu-slicer.io-claim_{UID}.json"
    assert json.loads(path.read_text()) == claim_spec(UID, [MIG])
    assert cdi.claim_uids() == {UID, "other"}
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, cdi.path_for("other").name])
    assert cdi.remove(UID) is True
    assert cdi.remove(UID) is False
    assert cdi.claim_uids() == {"other"}
