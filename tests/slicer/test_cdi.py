"""CDI specs: the CDI specification's rules, device nodes for MIG and whole GPUs, atomic files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.slicer.cdi import (
    CDI_VERSION,
    CdiDirectory,
    CdiError,
    DeviceEdits,
    claim_spec,
    device_id,
    find_toolkit_spec,
    load_toolkit_spec,
    toolkit_spec_from_ctk,
    validate_spec,
)

TOOLKIT_SPEC = Path(__file__).parent / "data" / "nvidia-toolkit-cdi.yaml"

UID = "0f8b6c1e-3d2a-4c5b-9e7f-1a2b3c4d5e6f"
MIG = DeviceEdits("gpu-0-mig-1g10gb-6", 0, "MIG-1234", (30, 31))
WHOLE = DeviceEdits("gpu-1", 1, "GPU-abcd")


def test_a_mig_device_gets_the_parent_control_uvm_and_both_capability_nodes() -> None:
    spec = claim_spec(UID, [MIG])
    edits = spec["devices"][0]["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap30",
        "/dev/nvidia-caps/nvidia-cap31",
    ]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=MIG-1234"]
    # Without a toolkit spec the common edits are the control and UVM nodes only.
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


# --- the NVIDIA Container Toolkit's common edits ---------------------------------------------


def test_a_claim_spec_carries_the_toolkit_s_libraries_nodes_and_hooks() -> None:
    common = load_toolkit_spec(TOOLKIT_SPEC)
    assert common.from_toolkit and common.source == str(TOOLKIT_SPEC)
    spec = claim_spec(UID, [MIG, WHOLE], common)
    shared = spec["containerEdits"]
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= {
        n["path"] for n in shared["deviceNodes"]
    }
    assert any(m["containerPath"].endswith("libcuda.so.580.65.06") for m in shared["mounts"])
    hooks = [h["args"][1] for h in shared["hooks"]]
    assert "update-ldcache" in hooks and "create-symlinks" in hooks
    # The device says which GPU: the toolkit's 'void' must not compete with it.
    assert "NVIDIA_VISIBLE_DEVICES=void" not in shared["env"]
    assert "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu" in shared["env"]
    mig = spec["devices"][0]["containerEdits"]
    assert [n["path"] for n in mig["deviceNodes"]] == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap30",
        "/dev/nvidia-caps/nvidia-cap31",
    ]
    # The toolkit's own per-GPU devices ("0", "0:0", "all") are not copied.
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0-mig-1g10gb-6", f"{UID}-gpu-1"]
    assert validate_spec(spec) == []
    assert spec["cdiVersion"] == CDI_VERSION


def test_a_newer_toolkit_spec_raises_the_claim_spec_s_cdi_version(tmp_path: Path) -> None:
    newer = tmp_path / "nvidia.yaml"
    newer.write_text(TOOLKIT_SPEC.read_text().replace("cdiVersion: 0.5.0", "cdiVersion: 0.8.0"))
    assert claim_spec(UID, [MIG], load_toolkit_spec(newer))["cdiVersion"] == "0.8.0"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: '0', containerEdits: "
            "{deviceNodes: [{path: /dev/nvidia0}]}}]\n",
            "no spec-level containerEdits",
        ),
        ("[1, 2]\n", "a CDI spec is a mapping"),
        (
            "cdiVersion: 0.5.0\nkind: nvidia.com\ndevices: []\ncontainerEdits: {env: [A=1]}\n",
            "not a valid CDI spec",
        ),
        ("a: [\n", "toolkit CDI spec"),
    ],
    ids=["no-common-edits", "not-a-mapping", "invalid", "bad-yaml"],
)
def test_an_unusable_toolkit_spec_is_named_with_the_reason(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(text)
    with pytest.raises(CdiError, match=problem):
        load_toolkit_spec(path)


def test_the_toolkit_spec_is_found_in_the_first_usual_place_that_has_one(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc-nvidia.yaml", tmp_path / "run-nvidia.json"
    assert find_toolkit_spec([etc, run]) is None
    run.write_text("{}")
    assert find_toolkit_spec([etc, run]) == run
    etc.write_text("{}")
    assert find_toolkit_spec([etc, run]) == etc


def test_nvidia_ctk_generates_the_common_edits(tmp_path: Path) -> None:
    import yaml

    ctk = tmp_path / "nvidia-ctk"
    (tmp_path / "spec.json").write_text(json.dumps(yaml.safe_load(TOOLKIT_SPEC.read_text())))
    ctk.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2 $3" = "cdi generate --format=json" ] || exit 3\n'
        f"cat {tmp_path / 'spec.json'}\n"
    )
    ctk.chmod(0o755)
    common = toolkit_spec_from_ctk(str(ctk))
    assert common.source == f"{ctk} cdi generate --format=json"
    assert common.edits == load_toolkit_spec(TOOLKIT_SPEC).edits


def test_a_failing_nvidia_ctk_is_named_with_its_message(tmp_path: Path) -> None:
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\necho 'failed to initialize NVML' >&2\nexit 1\n")
    ctk.chmod(0o755)
    with pytest.raises(CdiError, match="exit code 1: failed to initialize NVML"):
        toolkit_spec_from_ctk(str(ctk))
    with pytest.raises(CdiError, match="cannot run"):
        toolkit_spec_from_ctk(str(tmp_path / "missing"))


def test_a_whole_gpu_gets_no_capability_nodes_and_its_gpu_uuid() -> None:
    edits = claim_spec(UID, [WHOLE])["devices"][0]["containerEdits"]
    assert not any("nvidia-caps" in n["path"] for n in edits["deviceNodes"])
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-abcd"]


def test_device_ids_name_the_claim_and_device_under_our_vendor_and_class() -> None:
    assert device_id(UID, "gpu-1") == f"k8s.gpu-slicer.io/claim={UID}-gpu-1"
    spec = claim_spec(UID, [MIG, WHOLE])
    names = [d["name"] for d in spec["devices"]]
    assert [f"{spec['kind']}={n}" for n in names] == [
        device_id(UID, "gpu-0-mig-1g10gb-6"),
        device_id(UID, "gpu-1"),
    ]


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
        (
            _spec(devices=[{"name": "a", "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}}]),
            "absolute",
        ),
        (_spec(devices=[{"name": "a", "containerEdits": {"env": ["A=1"]}}] * 2), "unique"),
        (_spec(containerEdits={"hooks": [{"hookName": "later", "path": "/bin/x"}]}), "hookName"),
        (
            _spec(containerEdits={"hooks": [{"hookName": "createContainer", "path": "x"}]}),
            "absolute",
        ),
        (_spec(containerEdits={"mounts": [{"hostPath": "/usr/lib/x"}]}), "containerPath"),
    ],
    ids=[
        "old-version",
        "bad-version",
        "no-class",
        "vendor-digit",
        "no-devices",
        "device-charset",
        "empty-edits",
        "env-shape",
        "relative-node",
        "duplicate",
        "hook-name",
        "hook-path",
        "mount",
    ],
)
def test_the_validator_catches_specs_that_break_the_rules(spec: Any, problem: str) -> None:
    problems = validate_spec(spec)
    assert any(problem in p for p in problems), problems


def test_spec_files_are_written_atomically_one_per_claim_and_removed_idempotently(
    tmp_path: Path,
) -> None:
    common = load_toolkit_spec(TOOLKIT_SPEC)
    cdi = CdiDirectory(tmp_path, common)
    path = cdi.write(UID, [MIG])
    cdi.write("other", [WHOLE])
    assert path.name == f"k8s.gpu-slicer.io-claim_{UID}.json"
    assert json.loads(path.read_text()) == claim_spec(UID, [MIG], common)
    assert cdi.claim_uids() == {UID, "other"}
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, cdi.path_for("other").name])
    assert cdi.remove(UID) is True
    assert cdi.remove(UID) is False
    assert cdi.claim_uids() == {"other"}


def test_a_uid_that_is_not_one_never_names_a_spec_file(tmp_path: Path) -> None:
    cdi = CdiDirectory(tmp_path / "cdi")
    for bad in ("../checkpoint", "a/b", "x\x00y", "u" * 65, "", "-lead", "a.b"):
        with pytest.raises(CdiError, match="is not a Kubernetes UID"):
            cdi.path_for(bad)
    assert cdi.path_for("6f1c2d3e-0a4b-4c5d-8e9f-0123456789ab").parent == tmp_path / "cdi"


def test_spec_files_whose_names_hold_no_uid_are_not_the_agents(tmp_path: Path) -> None:
    cdi = CdiDirectory(tmp_path)
    cdi.write("u-1", [DeviceEdits("gpu-0", 0, "GPU-0")])
    (tmp_path / f"{CdiDirectory.PREFIX}not a uid.json").write_text("{}")
    assert cdi.claim_uids() == {"u-1"}
