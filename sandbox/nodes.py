"""The sandbox's nodes as a user names them: ``NAME=GPUSPEC``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_slicer.core.errors import GpuSpecError
from gpu_slicer.core.gpuspec import parse_gpu_spec
from gpu_slicer.kube.names import is_dns_label
from gpu_slicer.sandbox.errors import UsageError

DEFAULT_NODES = ("gpu-node-1=H100-80GB:2",)
DEPLOY_DIR = Path(__file__).resolve().parents[1] / "deploy"
"""The checkout's deploy/ folder, whose RBAC, policies and DeviceClasses the sandbox applies."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: str


def parse_node(text: str) -> NodeSpec:
    """``NAME=GPUSPEC`` (e.g. ``a100=A100-80GB:1``), checked."""
    name, sep, spec = text.partition("=")
    if not sep or not name:
        raise UsageError(f"--node {text!r} is not NAME=GPUSPEC (e.g. gpu-node-1=H100-80GB:2)")
    if not is_dns_label(name):
        raise UsageError(
            f"--node {text!r}: {name!r} is not a valid node name (lower-case "
            "letters, digits and '-', at most 63 characters)"
        )
    try:
        parse_gpu_spec(spec)
    except GpuSpecError as exc:
        raise UsageError(f"--node {text!r}: {exc}") from None
    return NodeSpec(name, spec)
