"""What each overlay adds: certificate providers, OpenShift constraints, DeviceClasses, policy."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import celpy
import kubernetes_validate
import pytest
import yaml

from gpu_slicer.certs import cli as certs_cli
from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.certs.ensure import ensure
from gpu_slicer.cli.main import build_parser
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer import deviceclasses
from gpu_slicer.webhook import policy
from tests.support.deploy_cases import (
    DEPLOY,
    NAMESPACE,
    VERSIONS,
    Obj,
    container,
    find,
    of_kind,
    pod_spec,
    render,
)


def _webhook_secret(objects: list[Obj]) -> str:
    deployment = find(objects, "Deployment", "gpu-slicer-webhook")
    (tls,) = [v for v in pod_spec(deployment)["volumes"] if v["name"] == "tls"]
    name: str = tls["secret"]["secretName"]
    return name


# ------------------------------------------------------------------ self-managed
def test_self_managed_runs_certs_ensure_for_the_objects_base_defines(
    self_managed: list[Obj],
) -> None:
    certs = find(self_managed, "Deployment", "gpu-slicer-certs")
    args = container(certs, "certs")["args"]
    assert args[:2] == ["certs", "ensure"]
    parsed = build_parser().parse_args([a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in args])
    settings = certs_cli.settings_from(parsed)
    settings.check()  # the CLI would accept these flags
    assert settings.secret == _webhook_secret(self_managed)
    find(self_managed, "MutatingWebhookConfiguration", settings.webhook_config)
    find(self_managed, "Service", settings.service)
    assert parsed.interval and parsed.interval <= 24 * 3600
    env = {e["name"]: e for e in container(certs, "certs")["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert pod_spec(certs)["serviceAccountName"] == "gpu-slicer-certs"


def test_self_managed_certs_job_runs_restricted(self_managed: list[Obj]) -> None:
    certs = find(self_managed, "Deployment", "gpu-slicer-certs")
    ctx = container(certs, "certs")["securityContext"]
    assert pod_spec(certs)["securityContext"]["runAsNonRoot"] is True
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod_spec(certs).get("volumes")


# ------------------------------------------------------------------ cert-manager
def test_cert_manager_issues_the_serving_secret_for_the_service_names(
    cert_manager: list[Obj],
) -> None:
    certificate = find(cert_manager, "Certificate", "gpu-slicer-webhook")["spec"]
    assert certificate["secretName"] == _webhook_secret(cert_manager)
    assert certificate["dnsNames"] == list(
        certs_issue.serving_names("gpu-slicer-webhook", NAMESPACE)
    )
    assert "server auth" in certificate["usages"]
    assert certificate["privateKey"] == {
        "algorithm": "ECDSA",
        "size": 256,
        "rotationPolicy": "Always",
    }
    issuer = find(cert_manager, "Issuer", certificate["issuerRef"]["name"])
    ca_cert = find(cert_manager, "Certificate", "gpu-slicer-ca")["spec"]
    assert issuer["spec"]["ca"]["secretName"] == ca_cert["secretName"]
    assert ca_cert["isCA"] is True
    root = find(cert_manager, "Issuer", ca_cert["issuerRef"]["name"])
    assert root["spec"] == {"selfSigned": {}}


def test_cert_manager_injects_the_ca_of_that_certificate(cert_manager: list[Obj]) -> None:
    config = find(cert_manager, "MutatingWebhookConfiguration", "gpu-slicer")
    source = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, _, name = source.partition("/")
    certificate = find(cert_manager, "Certificate", name)
    assert namespace == certificate["metadata"]["namespace"] == NAMESPACE


def test_cert_manager_durations_renew_well_before_expiry(cert_manager: list[Obj]) -> None:
    spec = find(cert_manager, "Certificate", "gpu-slicer-webhook")["spec"]
    hours = {k: int(spec[k].removesuffix("h")) for k in ("duration", "renewBefore")}
    assert 0 < hours["renewBefore"] < hours["duration"] / 2


# ------------------------------------------------------------------ openshift
def test_openshift_service_ca_writes_the_secret_the_webhook_mounts(openshift: list[Obj]) -> None:
    service = find(openshift, "Service", "gpu-slicer-webhook")
    annotation = service["metadata"]["annotations"][
        "service.beta.openshift.io/serving-cert-secret-name"
    ]
    assert annotation == _webhook_secret(openshift)
    config = find(openshift, "MutatingWebhookConfiguration", "gpu-slicer")
    assert config["metadata"]["annotations"]["service.beta.openshift.io/inject-cabundle"] == "true"


def test_openshift_webhook_leaves_the_uid_to_restricted_v2(openshift: list[Obj]) -> None:
    pod = pod_spec(find(openshift, "Deployment", "gpu-slicer-webhook"))
    assert {"runAsUser", "runAsGroup", "fsGroup"}.isdisjoint(pod["securityContext"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    ctx = container(find(openshift, "Deployment", "gpu-slicer-webhook"), "webhook")[
        "securityContext"
    ]
    assert "runAsUser" not in ctx and ctx["capabilities"]["drop"] == ["ALL"]


def test_openshift_agent_constraints_allow_what_the_daemonset_asks_and_no_more(
    openshift: list[Obj],
) -> None:
    scc = find(openshift, "SecurityContextConstraints", "gpu-slicer-agent")
    assert scc["apiVersion"] == "security.openshift.io/v1"
    assert "namespace" not in scc["metadata"]
    assert scc["allowPrivilegedContainer"] is True and scc["allowHostDirVolumePlugin"] is True
    for flag in ("allowHostNetwork", "allowHostPID", "allowHostIPC", "allowHostPorts"):
        assert scc[flag] is False, flag
    assert scc["users"] == [] and scc["groups"] == []
    agent = find(openshift, "DaemonSet", "gpu-slicer-agent")
    used = {key for v in pod_spec(agent)["volumes"] for key in v if key != "name"}
    allowed = {"hostPath", "emptyDir", "projected", "configMap", "secret", "downwardAPI"}
    assert set(scc["volumes"]) == allowed and used <= allowed
    for field in ("runAsUser", "seLinuxContext", "fsGroup", "supplementalGroups"):
        assert scc[field]["type"] in ("RunAsAny", "MustRunAs", "MustRunAsRange"), field
    role = find(openshift, "ClusterRole", "gpu-slicer-agent-scc")
    assert role["rules"] == [
        {
            "apiGroups": ["security.openshift.io"],
            "resources": ["securitycontextconstraints"],
            "resourceNames": ["gpu-slicer-agent"],
            "verbs": ["use"],
        }
    ]
    binding = find(openshift, "ClusterRoleBinding", "gpu-slicer-agent-scc")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-slicer-agent", "namespace": NAMESPACE}
    ]


def test_openshift_keeps_the_namespace_pod_security_labels(openshift: list[Obj]) -> None:
    labels = find(openshift, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["security.openshift.io/scc.podSecurityLabelSync"] == "false"


# ------------------------------------------------------------------ DeviceClasses
def _device(driver: str, device_type: str) -> Obj:
    return {
        "driver": driver,
        "attributes": {driver: {"type": device_type, "index": 0}},
        "capacity": {},
        "allowMultipleAllocations": False,
    }


@pytest.mark.parametrize(
    ("class_name", "device", "selected"),
    [
        ("gpu.gpu-slicer.io", _device("gpu-slicer.io", "gpu"), True),
        ("gpu.gpu-slicer.io", _device("gpu-slicer.io", "mig"), False),
        ("gpu.gpu-slicer.io", _device("gpu.nvidia.com", "gpu"), False),
        ("mig.gpu-slicer.io", _device("gpu-slicer.io", "mig"), True),
        ("mig.gpu-slicer.io", _device("gpu-slicer.io", "gpu"), False),
        ("mig.gpu-slicer.io", _device("gpu.nvidia.com", "mig"), False),
    ],
    ids=[
        "gpu/whole GPU",
        "gpu/MIG slice",
        "gpu/NVIDIA's driver",
        "mig/MIG slice",
        "mig/whole GPU",
        "mig/NVIDIA's driver",
    ],
)
def test_device_classes_select_their_type_of_our_driver_only(
    base: list[Obj], class_name: str, device: Obj, selected: bool
) -> None:
    (selector,) = find(base, "DeviceClass", class_name)["spec"]["selectors"]
    env = celpy.Environment()
    program = env.program(env.compile(selector["cel"]["expression"]))
    assert bool(program.evaluate({"device": celpy.json_to_cel(device)})) is selected


def test_device_classes_match_the_ones_the_agent_code_defines(
    base: list[Obj], extended: list[Obj]
) -> None:
    for objects, extended_resources in ((base, False), (extended, True)):
        expected = {
            c["metadata"]["name"]: c["spec"]
            for c in deviceclasses.device_classes(extended_resources=extended_resources)
        }
        rendered = {c["metadata"]["name"]: c["spec"] for c in of_kind(objects, "DeviceClass")}
        assert rendered == expected


# ------------------------------------------------------------------ policy
def test_the_policy_config_map_holds_a_valid_policy(base: list[Obj]) -> None:
    text = find(base, "ConfigMap", "gpu-slicer-policy")["data"]["policy.yaml"]
    loaded = policy.load_policy(text, source="deploy/base/policy-configmap.yaml")
    assert loaded == policy.Policy.default()
    assert "# namespaces:" in text  # the per-namespace example stays commented out


@pytest.mark.parametrize("overlay", ["cert-manager", "openshift"])
def test_the_extended_resources_component_combines_with_other_overlays(
    overlay: str, tmp_path: Path
) -> None:
    deploy = Path(os.path.relpath(DEPLOY, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {deploy / 'overlays' / overlay}\n"
        f"components:\n  - {deploy / 'components' / 'extended-resources'}\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    gpu = find(objects, "DeviceClass", "gpu.gpu-slicer.io")
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert len(objects) == len(render(f"overlays/{overlay}"))


def test_certs_ensure_fills_the_rendered_configuration_and_it_stays_valid(
    self_managed: list[Obj],
) -> None:
    api = InMemoryKubeApi()
    config = find(self_managed, "MutatingWebhookConfiguration", "gpu-slicer")
    api.create(config)
    certs = find(self_managed, "Deployment", "gpu-slicer-certs")
    args = [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in container(certs, "certs")["args"]]
    ensure(api, certs_cli.settings_from(build_parser().parse_args(args)))
    patched = api.get(
        "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "gpu-slicer"
    )
    bundle = base64.b64decode(patched["webhooks"][0]["clientConfig"]["caBundle"])
    assert len(certs_issue.load_certificates(bundle)) == 1
    secret = api.get("v1", "Secret", _webhook_secret(self_managed), NAMESPACE)
    for version in VERSIONS:
        for obj in (patched, secret):
            kubernetes_validate.validate(obj, version, strict=True)
    (hook,) = patched["webhooks"]
    expected = {k: v for k, v in config["webhooks"][0].items() if k != "clientConfig"}
    assert {k: v for k, v in hook.items() if k != "clientConfig"} == expected
