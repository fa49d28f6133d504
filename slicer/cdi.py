"""CDI specs: how the container runtime learns which device nodes and environment a claim gets.

One spec file per claim, ``<cdi dir>/k8s.gpu-slicer.io-claim_<claim uid>.json``, kind
``k8s.gpu-slicer.io/claim``, one CDI device per allocated device named
``<claim uid>-<device name>``; the kubelet hands the runtime the fully qualified ids
``k8s.gpu-slicer.io/claim=<claim uid>-<device name>`` that NodePrepareResources returned.

Each spec is the node's *common* edits plus each device's own:

* common (spec-level ``containerEdits``, applied whenever a device of the spec is injected): taken
  from the NVIDIA Container Toolkit's CDI spec for the node (:func:`load_toolkit_spec`: the file
  ``nvidia-ctk cdi generate`` writes, or its output): the driver's libraries and binaries as
  mounts, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` (and whatever else
  the toolkit deems common), and its hooks (``nvidia-cdi-hook update-ldcache``,
  ``create-symlinks``, ...). Its ``NVIDIA_VISIBLE_DEVICES`` is dropped: the device sets its own.
  Without a toolkit spec the common edits are only ``nvidiactl`` and the UVM nodes: a container
  starts, but without the driver's libraries CUDA does not run in it (the agent says so).
* per device: the parent GPU's node ``/dev/nvidia<minor>``, for a MIG device *both* capability
  nodes (GI access and CI access; without them the container sees the parent GPU or nothing),
  and ``NVIDIA_VISIBLE_DEVICES`` with the MIG UUID (the GPU UUID for a whole GPU).

Building a spec (:func:`claim_spec`) and checking one against the CDI specification's rules
(:func:`validate_spec`) are pure; :class:`CdiDirectory` owns the files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_slicer.kube import documents
from gpu_slicer.kube.atomic_files import ensure_dir, write_atomically
from gpu_slicer.slicer.errors import SlicerError

CDI_VERSION = "0.6.0"
VENDOR = "k8s.gpu-slicer.io"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"

# From the CDI specification (container-device-interface, SPEC.md and pkg/parser).
_VENDOR_RE = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$")
_DEVICE_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_EDIT_KEYS = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"}
_HOOK_NAMES = {
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
}
_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
TOOLKIT_SPEC_PATHS = (
    Path("/etc/cdi/nvidia.yaml"),
    Path("/etc/cdi/nvidia.json"),
    Path("/var/run/cdi/nvidia.yaml"),
    Path("/var/run/cdi/nvidia.json"),
)
"""Where the NVIDIA Container Toolkit keeps its generated spec (``nvidia-ctk cdi generate``)."""


DIR_MODE = 0o755
"""The CDI folder's mode when the agent creates it (the container runtime and CDI tools read it)."""
SPEC_MODE = 0o644
"""A claim's spec file: readable by CDI tools, as the toolkit's own specs are."""
CLAIM_UID_MAX = 64
"""A claim uid is at most this long (the apiserver's are 36-character UUIDs)."""
_CLAIM_UID_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?$")


class CdiError(SlicerError, ValueError):
    """A toolkit CDI spec that cannot be read or used; the message names the file and the fix."""


def shown(value: str, limit: int = 60) -> str:
    """``value`` quoted for a message: control characters escaped, a long one cut short."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def claim_uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot be a claim's uid, or None when it can (pure).

    The uid names the claim's CDI spec file and its CDI devices, so it is checked before it
    reaches either: letters, digits and '-' (a UUID's characters), starting and ending with a
    letter or digit, at most :data:`CLAIM_UID_MAX` characters. No '/', '.', NUL or space.
    """
    if len(uid) <= CLAIM_UID_MAX and _CLAIM_UID_RE.match(uid):
        return None
    return (
        f"claim uid {shown(uid)} is not a Kubernetes UID: letters, digits and '-', starting and "
        f"ending with a letter or digit, at most {CLAIM_UID_MAX} characters (the apiserver's are "
        "UUIDs such as 6f1c2d3e-0a4b-4c5d-8e9f-0123456789ab)"
    )


@dataclass(frozen=True)
class CommonEdits:
    """The container edits every claim's spec carries, and where they came from."""

    edits: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    """The toolkit spec file or ``nvidia-ctk`` command; empty: no toolkit spec was found."""
    cdi_version: str = "0.5.0"

    @property
    def from_toolkit(self) -> bool:
        return bool(self.source)


FALLBACK_EDITS = CommonEdits({"deviceNodes": [{"path": p} for p in _CONTROL_NODES]})
"""Without a toolkit spec: the control and UVM nodes only (no driver libraries)."""


def common_edits_from_spec(spec: Any, source: str) -> CommonEdits:
    """The toolkit spec's spec-level edits, without ``NVIDIA_VISIBLE_DEVICES`` (pure)."""
    if not isinstance(spec, dict):
        raise CdiError(f"{source}: a CDI spec is a mapping with cdiVersion, kind, devices")
    problems = validate_spec(spec, min_version=(0, 3, 0))
    if problems:
        raise CdiError(f"{source} is not a valid CDI spec: " + "; ".join(problems[:3]))
    edits = dict(spec.get("containerEdits") or {})
    if not edits:
        raise CdiError(
            f"{source} has no spec-level containerEdits; regenerate it with "
            "'nvidia-ctk cdi generate'"
        )
    env = [e for e in edits.get("env", []) if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    if env:
        edits["env"] = env
    else:
        edits.pop("env", None)
    return CommonEdits(edits, source, str(spec["cdiVersion"]))


def load_toolkit_spec(path: Path) -> CommonEdits:
    """Common edits from the toolkit's spec file (YAML or JSON)."""
    try:
        spec = documents.parse(documents.read_text(path))
    except documents.DocumentError as exc:
        raise CdiError(f"toolkit CDI spec {path}: {exc}") from exc
    return common_edits_from_spec(spec, str(path))


def toolkit_spec_from_ctk(
    binary: str,
    *,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    timeout_s: float = 120.0,
) -> CommonEdits:
    """Common edits from ``<binary> cdi generate --format=json`` (the toolkit's own generator)."""
    command = [binary, "cdi", "generate", "--format=json"]
    where = " ".join(command)
    try:
        done = run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CdiError(f"cannot run {where}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no message"]
        raise CdiError(f"{where} failed with exit code {done.returncode}: {tail[0]}")
    try:
        spec = json.loads(done.stdout)
    except ValueError as exc:
        raise CdiError(f"{where} printed no JSON CDI spec: {exc}") from exc
    return common_edits_from_spec(spec, where)


def find_toolkit_spec(candidates: Sequence[Path] = TOOLKIT_SPEC_PATHS) -> Path | None:
    """The first toolkit spec that exists among the usual places, or None."""
    return next((p for p in candidates if p.is_file()), None)


_NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}


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
    """The device's own nodes: its parent GPU and, for a MIG device, its two capabilities."""
    nodes = [f"/dev/nvidia{edits.parent_minor}"]
    if edits.capability_minors is not None:
        gi_minor, ci_minor = edits.capability_minors
        nodes += [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (gi_minor, ci_minor)]
    return nodes


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def claim_spec(
    claim_uid: str, devices: list[DeviceEdits], common: CommonEdits = FALLBACK_EDITS
) -> dict[str, Any]:
    """The CDI spec for one claim: ``common`` edits plus each device's own (pure).

    ``cdiVersion`` is ours (0.6.0: annotations) or the toolkit spec's if that is newer, since
    the copied edits may use fields only a newer version has.
    """
    version = max(CDI_VERSION, common.cdi_version, key=_version)
    return {
        "cdiVersion": version,
        "kind": KIND,
        "annotations": {"gpu-slicer.io/claim-uid": claim_uid},
        "containerEdits": dict(common.edits),
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


def validate_spec(spec: Any, *, min_version: tuple[int, int, int] = (0, 5, 0)) -> list[str]:
    """Problems with a spec under the CDI specification's rules; empty when it is valid."""
    problems: list[str] = []
    if not isinstance(spec, dict):
        return ["a CDI spec is a JSON object"]
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        problems.append(f"cdiVersion {version!r} is not a semantic version")
    elif _version(version) < min_version:
        problems.append(
            f"cdiVersion {version} predates {'.'.join(map(str, min_version))}, "
            "which the fields used need"
        )
    kind = spec.get("kind")
    vendor, _, klass = str(kind).partition("/")
    if not isinstance(kind, str) or not _VENDOR_RE.match(vendor) or not _CLASS_RE.match(klass):
        problems.append(
            f"kind {kind!r} is not <vendor>/<class> (vendor: letters first, "
            "then [A-Za-z0-9_.-]; class: [A-Za-z0-9_-])"
        )
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
    hooks = edits.get("hooks", [])
    for j, hook in enumerate(hooks if isinstance(hooks, list) else [None]):
        if not isinstance(hook, dict) or hook.get("hookName") not in _HOOK_NAMES:
            problems.append(f"{where}.hooks[{j}] needs a hookName, one of {sorted(_HOOK_NAMES)}")
        elif not str(hook.get("path", "")).startswith("/"):
            problems.append(f"{where}.hooks[{j}].path must be absolute")
    mounts = edits.get("mounts", [])
    for j, mount in enumerate(mounts if isinstance(mounts, list) else [None]):
        if (
            not isinstance(mount, dict)
            or not mount.get("hostPath")
            or not mount.get("containerPath")
        ):
            problems.append(f"{where}.mounts[{j}] needs hostPath and containerPath")
    return problems


class CdiDirectory:
    """The per-claim spec files in one CDI directory (``/var/run/cdi`` on a node)."""

    PREFIX = f"{VENDOR}-{CLASS}_"

    def __init__(self, directory: Path | str, common: CommonEdits = FALLBACK_EDITS) -> None:
        self.directory = Path(directory)
        self.common = common

    def path_for(self, claim_uid: str) -> Path:
        """The claim's spec file; CdiError for a uid that is not one (it never names a path)."""
        problem = claim_uid_problem(claim_uid)
        if problem is not None:
            raise CdiError(problem)
        return self.directory / f"{self.PREFIX}{claim_uid}.json"

    def write(self, claim_uid: str, devices: list[DeviceEdits]) -> Path:
        """Write (or replace) the claim's spec atomically and return its path."""
        spec = claim_spec(claim_uid, devices, self.common)
        path = self.path_for(claim_uid)
        ensure_dir(self.directory, DIR_MODE)
        # Atomic (the runtime never reads half a spec) but not fsynced: CDI specs live on tmpfs
        # on nodes, and after a power loss the boot id changes and every spec is rewritten.
        write_atomically(path, json.dumps(spec, indent=2).encode(), mode=SPEC_MODE, durable=False)
        return path

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's spec; False when it was not there (already removed)."""
        try:
            os.unlink(self.path_for(claim_uid))
        except FileNotFoundError:
            return False
        return True

    def claim_uids(self) -> set[str]:
        """Claims that have a spec file here (for the reconciler); a file whose name holds no
        valid uid is not the agent's and is left out."""
        if not self.directory.is_dir():
            return set()
        found = (
            p.name[len(self.PREFIX) : -len(".json")]
            for p in self.directory.iterdir()
            if p.name.startswith(self.PREFIX) and p.name.endswith(".json")
        )
        return {uid for uid in found if claim_uid_problem(uid) is None}
