"""The real node's configuration files, as this machine's kind needs them (pure)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

from gpu_slicer.sandbox import realnode
from gpu_slicer.sandbox.node_host import is_static_elf, path_without
from gpu_slicer.sandbox.node_namespace import nvidia_device_nodes
from gpu_slicer.sandbox.sandbox import TOOLKIT_CDI_SPEC
from gpu_slicer.slicer.cdi import common_edits_from_spec, validate_spec
from gpu_slicer.slicer.simulated import capability_minor_range


def test_containerd_config_is_version_3_toml_with_cdi_and_the_local_pause_image() -> None:
    text = realnode.containerd_config(
        root=Path("/s/root"),
        state=Path("/s/state"),
        address=Path("/s/containerd.sock"),
        cdi_dirs=[Path("/s/etc-cdi"), Path("/s/cdi")],
        cni_bin=Path("/usr/lib/cni"),
        cni_conf=Path("/s/net.d"),
        runc=Path("/usr/sbin/runc"),
        pause_image="gpu-slicer.local/pause:v1.36.3",
        registry_dir=Path("/s/certs.d"),
    )
    config = tomllib.loads(text)
    assert config["version"] == 3
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == ["/s/etc-cdi", "/s/cdi"]
    assert runtime["restrict_oom_score_adj"] is True  # root here lacks CAP_SYS_RESOURCE
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "gpu-slicer.local/pause:v1.36.3"
    assert images["registry"]["config_path"] == "/s/certs.d"


def test_every_registry_resolves_to_a_closed_local_port() -> None:
    hosts = tomllib.loads(realnode.closed_registry_hosts())
    assert hosts["server"].startswith("http://127.0.0.1:")
    assert list(hosts["host"]) == [hosts["server"]]


def test_the_pods_bridge_has_no_gateway_and_no_masquerading() -> None:
    [bridge] = realnode.cni_config(bridge="gsl0", subnet="10.200.1.0/24", data_dir=Path("/d"))[
        "plugins"
    ]
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["dataDir"] == "/d"


def test_kubelet_config_accepts_cgroup_v1_with_cgroupfs_and_its_own_root() -> None:
    config = realnode.kubelet_config(
        cgroup_root="gpu-slicer-real-abc123",
        runtime_endpoint=Path("/s/containerd.sock"),
        node_ip="192.0.2.2",
        port=10250,
        healthz_port=10248,
        client_ca=Path("/s/ca.crt"),
        pod_logs=Path("/s/pod-logs"),
        volume_plugins=Path("/s/volume-plugins"),
        gates={"DRAPartitionableDevices": True},
    )
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/gpu-slicer-real-abc123"
    assert config["containerRuntimeEndpoint"] == "unix:///s/containerd.sock"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["featureGates"] == {"DRAPartitionableDevices": True}


def test_the_runtime_toolkit_spec_keeps_only_device_nodes_and_environment() -> None:
    spec = realnode.runtime_toolkit_spec(yaml.safe_load(TOOLKIT_CDI_SPEC.read_text()))
    assert validate_spec(spec, min_version=(0, 3, 0)) == []
    text = str(spec)
    assert "hooks" not in text and "mounts" not in text and "/dev/dri" not in text
    edits = common_edits_from_spec(spec, "runtime spec").edits
    assert {n["path"] for n in edits["deviceNodes"]} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    }


def test_the_namespace_has_a_node_for_every_path_the_agent_and_toolkit_name() -> None:
    nodes = {
        n.path
        for n in nvidia_device_nodes(2, [*capability_minor_range(0), *capability_minor_range(1)])
    }
    spec = realnode.runtime_toolkit_spec(yaml.safe_load(TOOLKIT_CDI_SPEC.read_text()))
    named = {n["path"] for n in spec["containerEdits"]["deviceNodes"]}
    named |= {n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}
    assert named <= nodes
    assert {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap3"} <= nodes
    # The last CI access cap of GPU 1's last GI.
    assert f"/dev/nvidia-caps/nvidia-cap{max(capability_minor_range(1))}" in nodes


def test_machine_wide_names_differ_per_sandbox_and_node() -> None:
    ids = {
        realnode.short_id(Path(folder), node)
        for folder in ("/tmp/a/sb", "/tmp/b/sb")
        for node in ("real", "other")
    }
    assert len(ids) == 4


def test_static_elf_detection_reads_the_program_headers() -> None:
    assert is_static_elf(Path("/bin/sh").read_bytes()) is False  # dynamically linked
    assert is_static_elf(b"#!/bin/sh\n") is False


def test_the_kubelet_path_leaves_out_folders_holding_iptables(tmp_path: Path) -> None:
    (tmp_path / "sbin").mkdir()
    (tmp_path / "sbin" / "iptables").write_text("")
    (tmp_path / "bin").mkdir()
    path = f"{tmp_path / 'bin'}:{tmp_path / 'sbin'}"
    assert path_without(path, ["iptables", "ip6tables"]) == str(tmp_path / "bin")
