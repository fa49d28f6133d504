"""CDI specs: how the container runtime learns which device nodes and environment a claim gets.

One spec file per claim, ``<cdi dir>/k8s.gpu-slicer.io-claim_<claim uid>.json``, kind
``k8s.gpu-slicer.io/claim``, one CDI device per allocated device named
``<claim uid>-<device name>``; the kubelet hands the runtime the fully qualified ids
``k8s.gpu-slicer.io/claim=<claim uid>-<device name>`` that NodePrepareResources returned.

A MIG device needs the parent GPU's node, ``nvidiactl``, the UVM nodes and *both* capability
nodes (GI access and CI access); leaving the capability nodes out makes the container see the
parent GPU or nothing. ``NVIDIA_VISIBLE_DEVICES`` carries the MIG UUID (the GPU UUID for a whole
GPU) for the NVIDIA container toolkit.

Building a spec (:func:`claim_spec`) and checking one against the CDI specification's rules
(:func:`validate_spec`) are pure; :class:`CdiDirectory` owns the files.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slicer.checkpoint import write_atomically

CDI_VERSION = "0.6.0"
VENDOR = "k8s.gpu-slicer.io"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"

# From the CDI specification (container-device-interface, SPEC.md and pkg/parser).
_VENDOR_RE = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$")
_DEVICE_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_EDIT_KEYS = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids"}
_NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid",
              "gid"}


@dataclass(frozen=True)
class DeviceEdits:
    """What one allocated device adds to a container."""

    device_name: str
    parent_minor: int
    visible_uuid: str
    """MIG UUID for a slice, GPU UUID for a whole GPU."""
    capability_minors: tuple[int, int] | None = None
    """(GI access, CI access) minors of ``/dev/nvidia-caps/nvidia-cap<M>``; None: whole GPU."""


def cdi_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def device_id(claim_uid: str, device_name: str) -> str:
    """The fully qualified CDI device id NodePrepareResources returns for a device."""
    return f"{KIND}={cdi_name(claim_uid, device_name)}"


def device_nodes(edits: DeviceEdits) -> list[str]:
    nodes = [
        f"/dev/nvidia{edits.parent_minor}",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    if edits.capability_minors is not None:
        gi_minor, ci_minor = edits.capability_minors
        nodes += [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (gi_minor, ci_minor)]
    return nodes


def claim_spec(claim_uid: str, devices: list[DeviceEdits]) -> dict[str, Any]:
    """The CDI spec for one claim (pure)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "annotations": {"gpu-slicer.io/claim-uid": claim_uid},
        "devices": [
            {
                "name": cdi_name(claim_uid, d.device_name),
                "containerEdits": {
                    "env": [f"NVIDIA_VISIBLE_DEVICES={d.visible_uuid}"],
                    "deviceNodes": [{"path": p} for p in device_nodes(d)],
                },
            }
            for d in devices
        ],
    }


def validate_spec(spec: Any) -> list[str]:
    """Problems with a spec under the CDI specification's rules; empty when it is valid."""
    problems: list[str] = []
    if not isinstance(spec, dict):
        return ["a CDI spec is a JSON object"]
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        problems.append(f"cdiVersion {version!r} is not a semantic version")
    elif tuple(int(p) for p in version.split(".")) < (0, 5, 0):
        problems.append(f"cdiVersion {version} predates 0.5.0, which gpu-slicer's fields need")
    kind = spec.get("kind")
    vendor, _, klass = str(kind).partition("/")
    if not isinstance(kind, str) or not _VENDOR_RE.match(vendor) or not _CLASS_RE.match(klass):
        problems.append(f"kind {kind!r} is not <vendor>/<class> (vendor: letters first, "
                        "then [A-Za-z0-9_.-]; class: [A-Za-z0-9_-])")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        problems.append("devices must be a non-empty list")
        devices = []
    names: set[str] = set()
    for i, device in enumerate(devices):
        where = f"devices[{i}]"
        if not isinstance(device, dict):
            problems.append(f"{where} is not an object")
            continue
        name = device.get("name")
        if not isinstance(name, str) or not _DEVICE_RE.match(name):
            problems.append(f"{where}.name {name!r} must match [A-Za-z0-9][A-Za-z0-9_.:-]*")
        elif name in names:
            problems.append(f"{where}.name {name!r} is not unique")
        else:
            names.add(name)
        edits = device.get("containerEdits")
        if not isinstance(edits, dict) or not edits:
            problems.append(f"{where}.containerEdits must be a non-empty object")
            continue
        problems += _edit_problems(f"{where}.containerEdits", edits)
    if "containerEdits" in spec:
        problems += _edit_problems("containerEdits", spec["containerEdits"])
    return problems


def _edit_problems(where: str, edits: Any) -> list[str]:
    if not isinstance(edits, dict):
        return [f"{where} is not an object"]
    problems = [f"{where}.{k} is not a CDI container edit" for k in edits if k not in _EDIT_KEYS]
    env = edits.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
        problems.append(f"{where}.env must be a list of KEY=VALUE strings")
    nodes = edits.get("deviceNodes", [])
    if not isinstance(nodes, list):
        problems.append(f"{where}.deviceNodes must be a list")
        nodes = []
    for j, node in enumerate(nodes):
        if not isinstance(node, dict) or not isinstance(node.get("path"), str):
            problems.append(f"{where}.deviceNodes[{j}] needs a string path")
            continue
        if not node["path"].startswith("/"):
            problems.append(f"{where}.deviceNodes[{j}].path must be absolute")
        unknown = [k for k in node if k not in _NODE_KEYS]
        problems += [f"{where}.deviceNodes[{j}].{k} is unknown" for k in unknown]
    return problems


class CdiDirectory:
    """The per-claim spec files in one CDI directory (``/var/run/cdi`` on a node)."""

    PREFIX = f"{VENDOR}-{CLASS}_"

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def path_for(self, claim_uid: str) -> Path:
        return self.directory / f"{self.PREFIX}{claim_uid}.json"

    def write(self, claim_uid: str, devices: list[DeviceEdits]) -> Path:
        """Write (or replace) the claim's spec atomically and return its path."""
        spec = claim_spec(claim_uid, devices)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(claim_uid)
        # Atomic (the runtime never reads half a spec) but not fsynced: CDI specs live on tmpfs
        # on nodes, and after a power loss the boot id changes and every spec is rewritten.
        write_atomically(path, json.dumps(spec, indent=2).encode(), durable=False)
        return path

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's spec; False when it was not there (already removed)."""
        try:
            os.unlink(self.path_for(claim_uid))
        except FileNotFoundError:
            return False
        return True

    def claim_uids(self) -> set[str]:
        """Claims that have a spec file here (for the reconciler)."""
        if not self.directory.is_dir():
            return set()
        return {
            p.name[len(self.PREFIX):-len(".json")]
            for p in self.directory.iterdir()
            if p.name.startswith(self.PREFIX) and p.name.endswith(".json")
        }
