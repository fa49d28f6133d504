"""What the deploy tests share: the Kustomize targets, rendering, and lookups in the output."""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TARGETS = (
    "base",
    "overlays/self-managed",
    "overlays/cert-manager",
    "overlays/openshift",
    "overlays/extended-resources",
)
INSTALLABLE = TARGETS[1:]  # base alone has no certificate provider
VERSIONS = ("1.34", "1.35", "1.36", "1.37")
NAMESPACE = "gpu-slicer"
# Kinds whose schemas kubernetes-validate does not ship; each gets field checks of its own.
SCHEMALESS = {
    ("security.openshift.io/v1", "SecurityContextConstraints"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "DeviceClass",
    "SecurityContextConstraints",
}

Obj = dict[str, Any]


@functools.cache
def _render_text(target: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl (with kustomize) is needed to render deploy/; install it")
    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize deploy/{target} failed:\n{result.stderr}")
    return result.stdout


@functools.cache
def _parsed(target: str) -> tuple[Obj, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(doc for doc in yaml.load_all(_render_text(target), Loader=loader) if doc)


def render(target: str) -> list[Obj]:
    """The objects ``kubectl kustomize deploy/<target>`` prints (fresh copies each call)."""
    return copy.deepcopy(list(_parsed(target)))


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Obj, name: str) -> Obj:
    for candidate in pod_spec(workload)["containers"]:
        if candidate["name"] == name:
            found: Obj = candidate
            return found
    raise AssertionError(f"{workload['metadata']['name']} has no container {name}")


def webhook(objects: list[Obj]) -> Obj:
    config = find(objects, "MutatingWebhookConfiguration", "gpu-slicer")
    assert len(config["webhooks"]) == 1
    hook: Obj = config["webhooks"][0]
    return hook


def arg_value(args: list[str], flag: str) -> str:
    for arg in args:
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} is not among {args}")
