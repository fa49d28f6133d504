"""Running an operator's controller (built by sandbox.operators) against a sandbox: its
controller-runtime configuration, a self-signed serving certificate for its admission webhooks
on loopback, and their registration with the sandbox's apiserver."""

from __future__ import annotations

import base64
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from gpu_slicer.certs.issue import self_signed
from gpu_slicer.sandbox.process import Component, free_port
from tests.support.e2e_sandbox import Sandbox


@dataclass(frozen=True)
class Hook:
    """One admission webhook the controller serves."""

    kind: str
    """Mutating or Validating."""
    path: str
    group: str
    version: str
    resource: str
    operations: tuple[str, ...] = ("CREATE",)
    object_selector: dict[str, Any] = field(default_factory=dict)


def install_crds(box: Sandbox, crds: list[dict[str, Any]]) -> None:
    """Creates ``crds`` (as their projects ship them, less their metadata but the name) and
    waits until the apiserver serves each: a controller started earlier races its own caches
    against the CRDs and may never serve its webhooks."""
    extensions = k8s.ApiextensionsV1Api(box.client)
    for crd in crds:
        extensions.create_custom_resource_definition(
            {**crd, "metadata": {"name": crd["metadata"]["name"]}}
        )
    for crd in crds:
        name = crd["metadata"]["name"]
        box.wait(
            lambda name=name: any(
                c.type == "Established" and c.status == "True"
                for c in extensions.read_custom_resource_definition(name).status.conditions or []
            ),
            what=f"CRD {name} to be established",
        )


def start_controller(
    box: Sandbox, name: str, binary: Path, config_api: str, hooks: list[Hook], folder: Path
) -> Component:
    """The controller, its webhooks served on loopback and registered with the apiserver."""
    pair = self_signed(["127.0.0.1"], common_name=f"{name}-webhook", days=1)
    certs = folder / "certs"
    certs.mkdir(parents=True)
    (certs / "tls.crt").write_bytes(pair.cert_pem)
    (certs / "tls.key").write_bytes(pair.key_pem)
    port = free_port()
    config = {
        "apiVersion": config_api,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": "0"},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [
        str(binary),
        "--config",
        str(folder / "config.yaml"),
        "--kubeconfig",
        str(box.kubeconfig),
    ]
    controller = Component(name, argv, log_dir=folder)
    controller.start()
    controller.wait_ready(lambda: _listening(port), timeout_s=60, what="its webhook server")
    registrations = k8s.AdmissionregistrationV1Api(box.client)
    ca = base64.b64encode(pair.cert_pem).decode()
    for kind in ("Mutating", "Validating"):
        webhooks = [
            {
                "name": f"{kind[0].lower()}{i}.{name}.example.com",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"url": f"https://127.0.0.1:{port}{hook.path}", "caBundle": ca},
                "objectSelector": hook.object_selector,
                "rules": [
                    {
                        "apiGroups": [hook.group],
                        "apiVersions": [hook.version],
                        "operations": list(hook.operations),
                        "resources": [hook.resource],
                    }
                ],
            }
            for i, hook in enumerate(hooks)
            if hook.kind == kind
        ]
        if webhooks:
            body = {"metadata": {"name": f"{name}-{kind.lower()}"}, "webhooks": webhooks}
            getattr(registrations, f"create_{kind.lower()}_webhook_configuration")(body)
    return controller


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def apply_template(box: Sandbox, namespace: str, template: dict[str, Any]) -> None:
    """As ``kubectl apply`` of a converted tree: the webhook may have made the same
    content-addressed template already; Git's labels then win."""
    resource = k8s.ResourceV1Api(box.client)
    name = template["metadata"]["name"]
    try:
        resource.create_namespaced_resource_claim_template(namespace, template)
    except ApiException as exc:
        if exc.status != 409:
            raise
        labels = {"metadata": {"labels": template["metadata"]["labels"]}}
        resource.patch_namespaced_resource_claim_template(name, namespace, labels)
    stored = resource.read_namespaced_resource_claim_template(name, namespace)
    assert stored.metadata.labels["gpu-slicer.io/origin"] == "convert"


def as_git_keeps_it(box: Sandbox, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` converted by ``gpu-slicer convert`` (the default policy), its templates applied
    as ``kubectl apply`` would: what a GitOps tree holds after the migration."""
    from gpu_slicer.webhook.convert import convert_objects
    from gpu_slicer.webhook.policy import Policy

    converted = convert_objects([body], policy=Policy.default())
    (converted_body,) = converted.objects
    for template in converted.templates:
        apply_template(box, namespace, template)
    return dict(converted_body)


def wait_for_pods_with_slices(
    box: Sandbox, pods: Callable[[], list[dict[str, Any]]], what: str, *, count: int = 2
) -> list[dict[str, Any]]:
    """Until ``count`` of the controller's pods run; then each holds the webhook's claim,
    allocated a 1g.10gb MIG slice. Returns the running pods."""
    running: list[dict[str, Any]] = box.wait(
        lambda: (
            (found := [p for p in pods() if p["status"].get("phase") == "Running"])
            and len(found) == count
            and found
        ),
        what=what,
        timeout_s=120,
    )
    for pod in running:
        (claim,) = pod["spec"]["resourceClaims"]
        assert claim["name"] == "gpu-slicer"
        (allocated,) = box.claims_of(pod)
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        assert "mig-1g10gb" in result["device"]
    return running
