"""The Helm chart (deploy/helm/gpu-slicer): lint, render per certificate mode, validate against
the 1.34-1.37 schemas, and render what the Kustomize overlays render.

helm comes from the PATH or is built from tools/helm (sandbox/helm.py). Under CI a
helm that cannot be had fails these tests; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_slicer.slicer.profile_filter import ProfileFilter
from gpu_slicer.slicer.settings import AgentSettings
from gpu_slicer.webhook import policy as webhook_policy
from gpu_slicer.webhook.errors import PolicyError
from tests.support import go_tools
from tests.support.deploy_cases import (
    DEPLOY,
    NAMESPACE,
    SCHEMALESS,
    VERSIONS,
    Obj,
    find,
    of_kind,
    render,
)

CHART = DEPLOY / "helm" / "gpu-slicer"
MODES = ("self-managed", "cert-manager", "openshift")
# Kustomize overlay -> the chart values that render the same installation.
EQUIVALENT: dict[str, list[str]] = {
    "overlays/self-managed": ["certificates.mode=self-managed"],
    "overlays/cert-manager": ["certificates.mode=cert-manager"],
    "overlays/openshift": ["certificates.mode=openshift"],
    "overlays/extended-resources": [
        "certificates.mode=self-managed",
        "deviceClasses.extendedResourceName=true",
    ],
}
MONITORING = [
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
]
MONITORING_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
# Labels Helm convention adds to every object (the Kustomize render has none of them), and
# part-of, which the chart puts on every object and Kustomize only on those of base.
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/part-of",
}


def _helm() -> Path:
    return go_tools.helm()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_helm()), *args], capture_output=True, text=True, check=False, timeout=120
    )


@functools.cache
def _template_text(sets: tuple[str, ...], namespace: str, kube: str) -> str:
    args = ["template", "gpu-slicer", str(CHART), "--namespace", namespace, "--kube-version", kube]
    for item in sets:
        args += ["--set", item]
    result = _run(*args)
    if result.returncode != 0:
        raise RuntimeError(f"helm template {' '.join(sets)} failed:\n{result.stderr}")
    return result.stdout


def template(sets: list[str], *, namespace: str = NAMESPACE, kube: str = "1.36.0") -> list[Obj]:
    """The objects ``helm template`` renders with these ``--set`` values (fresh copies)."""
    text = _template_text(tuple(sets), namespace, kube)
    return copy.deepcopy([doc for doc in yaml.safe_load_all(text) if doc])


def _normalized(obj: Obj) -> Obj:
    """``obj`` without what only Helm adds, and with the policy compared as data, not text."""
    obj = copy.deepcopy(obj)
    labels: dict[str, str] = obj["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    if labels.get("app.kubernetes.io/managed-by") == "Helm":
        del labels["app.kubernetes.io/managed-by"]
    if not labels:
        obj["metadata"].pop("labels", None)
    if obj["kind"] == "ConfigMap" and "policy.yaml" in obj.get("data", {}):
        obj["data"]["policy.yaml"] = yaml.safe_load(obj["data"]["policy.yaml"])
    return obj


def _differences(helm: Any, kustomize: Any, path: str = "") -> list[str]:
    """Where two rendered objects differ, as readable paths (a drift report, not a dump)."""
    if isinstance(helm, dict) and isinstance(kustomize, dict):
        found = []
        for key in sorted(set(helm) | set(kustomize)):
            where = f"{path}.{key}"
            if key not in helm:
                found.append(f"{where}: only in Kustomize: {kustomize[key]!r}")
            elif key not in kustomize:
                found.append(f"{where}: only in the chart: {helm[key]!r}")
            else:
                found += _differences(helm[key], kustomize[key], where)
        return found
    if isinstance(helm, list) and isinstance(kustomize, list) and len(helm) == len(kustomize):
        return [
            d
            for i, (h, k) in enumerate(zip(helm, kustomize, strict=True))
            for d in _differences(h, k, f"{path}[{i}]")
        ]
    return [] if helm == kustomize else [f"{path}: chart {helm!r} != Kustomize {kustomize!r}"]


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def test_helm_lint_passes_strictly_in_every_mode_with_monitoring() -> None:
    for mode in MODES:
        args = ["lint", "--strict", str(CHART), "--set", f"certificates.mode={mode}"]
        for item in MONITORING:
            args += ["--set", item]
        result = _run(*args)
        assert result.returncode == 0, f"{mode}:\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize("overlay", sorted(EQUIVALENT))
def test_the_chart_renders_what_the_kustomize_overlay_renders(overlay: str) -> None:
    kustomize = {_key(o): _normalized(o) for o in render(overlay)}
    # Helm's hooks (the pre-delete uninstall check) have no Kustomize counterpart: an admin
    # runs `gpu-slicer uninstall-check` before `kubectl delete -k` (docs/install-kubernetes.md).
    helm = {
        _key(o): _normalized(o)
        for o in template([*EQUIVALENT[overlay], "namespace.create=true"])
        if "helm.sh/hook" not in o["metadata"].get("annotations", {})
    }
    assert sorted(helm) == sorted(kustomize), "the chart and the overlay render different objects"
    drift = [
        f"{kind} {name}{d}"
        for (kind, name), expected in sorted(kustomize.items())
        for d in _differences(helm[(kind, name)], expected)
    ]
    assert not drift, f"the chart drifted from deploy/{overlay}:\n" + "\n".join(drift)


def _all_renders() -> list[Obj]:
    objects = []
    for mode in MODES:
        objects += template([f"certificates.mode={mode}", "namespace.create=true", *MONITORING])
    objects += template(EQUIVALENT["overlays/extended-resources"])
    objects += template(NODE_NETWORK)
    return objects


NODE_NETWORK = [
    "agent.hostNetwork=true",
    "agent.k8sServiceHost=10.0.0.1",
    "agent.k8sServicePort=6443",
    "agent.toolkitCdiDir=/var/run/cdi",
    "webhook.hostNetwork=true",
    "webhook.port=9443",
    "webhook.k8sServiceHost=10.0.0.1",
    "webhook.k8sServicePort=6443",
]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_validates_strictly_against_the_schema(version: str) -> None:
    failures = []
    for obj in _all_renders():
        kind = (obj["apiVersion"], obj["kind"])
        if kind in SCHEMALESS or kind in MONITORING_KINDS:
            continue  # field-checked below and in test_overlays.py
        if "extendedResourceName" in obj.get("spec", {}) and version < "1.36":
            continue  # the chart refuses it there (next test)
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert not failures, "\n".join(failures)


def test_extended_resource_device_classes_are_refused_below_1_36() -> None:
    with pytest.raises(RuntimeError, match="1.36 or newer"):
        template(["deviceClasses.extendedResourceName=true"], kube="1.35.0")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["certificates.mode=vault"], 'certificates.mode "vault" is not one of'),
        (["webhook.enabled=false"], "needs webhook.url"),
        (["webhook.url=https://127.0.0.1:8443/mutate-pods"], "set webhook.enabled false"),
        (["certificates.mode=external"], "needs webhook.caBundle"),
    ],
    ids=["unknown-mode", "no-webhook-no-url", "url-with-webhook", "external-no-ca"],
)
def test_inconsistent_values_fail_with_a_message_naming_the_value(
    sets: list[str], message: str
) -> None:
    with pytest.raises(RuntimeError, match=message):
        template(sets)


def test_another_release_namespace_is_used_everywhere_the_overlays_name_gpu_slicer() -> None:
    objects = template(
        ["certificates.mode=cert-manager", "namespace.create=true", *MONITORING],
        namespace="gpu-ops",
    )
    text = yaml.safe_dump_all(objects)
    assert "gpu-slicer.svc" not in text and ":gpu-slicer:" not in text
    for obj in objects:
        if "namespace" in obj["metadata"]:
            assert obj["metadata"]["namespace"] == "gpu-ops", _key(obj)
    config = find(objects, "MutatingWebhookConfiguration", "gpu-slicer")
    hook = config["webhooks"][0]
    assert hook["clientConfig"]["service"]["namespace"] == "gpu-ops"
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "gpu-ops/gpu-slicer-webhook"
    )
    [excluded] = [
        e
        for e in hook["namespaceSelector"]["matchExpressions"]
        if e["key"] == "kubernetes.io/metadata.name"
    ]
    assert excluded["values"] == ["kube-system", "gpu-ops"]
    policy = find(objects, "ValidatingAdmissionPolicy", "gpu-slicer-agent-resourceslices")
    assert (
        "system:serviceaccount:gpu-ops:gpu-slicer-agent"
        in (policy["spec"]["matchConditions"][0]["expression"])
    )
    cert = find(objects, "Certificate", "gpu-slicer-webhook")
    assert cert["spec"]["dnsNames"][0] == "gpu-slicer-webhook.gpu-ops.svc"


def test_a_webhook_outside_the_cluster_gets_a_url_and_no_in_cluster_webhook_objects() -> None:
    objects = template(
        [
            "webhook.enabled=false",
            "certificates.mode=external",
            "webhook.url=https://127.0.0.1:8443/mutate-pods",
            "webhook.caBundle=Q0E=",
        ]
    )
    assert not [
        o
        for o in objects
        if o["metadata"]["name"].startswith("gpu-slicer-webhook")
        and o["kind"] in {"Deployment", "Service", "PodDisruptionBudget"}
    ]
    assert not [o for o in objects if o["metadata"]["name"] == "gpu-slicer-certs"]
    hook = find(objects, "MutatingWebhookConfiguration", "gpu-slicer")["webhooks"][0]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:8443/mutate-pods", "caBundle": "Q0E="}
    find(objects, "DaemonSet", "gpu-slicer-agent")


def test_agent_values_reach_the_daemonset_and_the_policy_values_are_a_valid_policy() -> None:
    objects = template(
        [
            "agent.nodeSelector.nvidia\\.com/gpu\\.present=true",
            "agent.tolerations=null",
            "policy.nvlink=strict",
            "policy.migFallback=larger",
            "image.repository=registry.example/gpu-slicer",
            "image.tag=1.2.3",
            "agent.profiles=-*+me\\,-1g.20gb",
            "agent.attributes=minimal",
            "agent.advertisedProfiles=asked",
            "agent.alwaysAdvertise=1g.10gb\\,3g.40gb",
            "agent.withdrawAfter=600",
        ]
    )
    daemonset = find(objects, "DaemonSet", "gpu-slicer-agent")
    spec = daemonset["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["GPU_SLICER_PROFILES"] == "-*+me,-1g.20gb"
    assert env["GPU_SLICER_ATTRIBUTES"] == "minimal"
    assert ProfileFilter.parse(env["GPU_SLICER_PROFILES"]) == ProfileFilter((), ("*+me", "1g.20gb"))
    # the agent reads them as it reads its own environment
    settings, _ = AgentSettings.from_sources({}, {k: v for k, v in env.items() if v is not None})
    assert (settings.advertised_profiles, settings.always_advertise) == ("asked", "1g.10gb,3g.40gb")
    assert float(settings.withdraw_after) == 600.0
    assert spec["nodeSelector"] == {
        "gpu-slicer.io/agent": "enabled",
        "nvidia.com/gpu.present": "true",
    }
    assert "tolerations" not in spec
    assert {
        c["image"]
        for o in of_kind(objects, "Deployment") + [daemonset]
        for c in o["spec"]["template"]["spec"]["containers"]
    } == {"registry.example/gpu-slicer:1.2.3"}
    text = find(objects, "ConfigMap", "gpu-slicer-policy")["data"]["policy.yaml"]
    loaded = webhook_policy.load_policy(text)
    assert (loaded.nvlink, loaded.mig_fallback.mode) == ("strict", "larger")


def test_an_agent_without_kube_proxy_reaches_the_apiserver_it_is_given() -> None:
    spec = find(template(NODE_NETWORK), "DaemonSet", "gpu-slicer-agent")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.0.0.1", "6443")
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    [etc_cdi] = [v for v in spec["volumes"] if v["name"] == "etc-cdi"]
    assert etc_cdi["hostPath"]["path"] == "/var/run/cdi"
    default = find(template([]), "DaemonSet", "gpu-slicer-agent")["spec"]["template"]["spec"]
    assert "hostNetwork" not in default
    assert not {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} & {
        e["name"] for e in default["containers"][0]["env"]
    }


def test_a_webhook_on_the_node_network_listens_where_its_service_sends() -> None:
    objects = template(NODE_NETWORK)
    spec = find(objects, "Deployment", "gpu-slicer-webhook")["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "--bind=0.0.0.0:9443" in container["args"]
    [port] = container["ports"]
    assert (port["name"], port["containerPort"]) == ("https", 9443)
    [service_port] = find(objects, "Service", "gpu-slicer-webhook")["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (443, "https")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.0.0.1", "6443")
    default = find(template([]), "Deployment", "gpu-slicer-webhook")["spec"]["template"]["spec"]
    assert "hostNetwork" not in default
    assert "--bind=0.0.0.0:8443" in default["containers"][0]["args"]
    assert not {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} & {
        e["name"] for e in default["containers"][0]["env"]
    }


def test_a_policy_value_the_webhook_would_refuse_is_refused_by_its_loader() -> None:
    objects = template(["policy.nvlink=sometimes"])
    text = find(objects, "ConfigMap", "gpu-slicer-policy")["data"]["policy.yaml"]
    with pytest.raises(PolicyError, match="nvlink"):
        webhook_policy.load_policy(text)


def _monitoring() -> dict[tuple[str, str], Obj]:
    objects = template(["certificates.mode=self-managed", *MONITORING])
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_monitoring_objects_are_off_by_default_and_complete_when_enabled() -> None:
    default_kinds = {o["kind"] for o in template([])}
    assert not default_kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    objects = _monitoring()
    assert {k for k, _ in objects} >= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert "gpu-slicer-dashboard" in {n for k, n in objects if k == "ConfigMap"}


def test_service_and_pod_monitors_select_the_pods_and_ports_the_chart_runs() -> None:
    objects = _monitoring()
    monitor = objects[("ServiceMonitor", "gpu-slicer-webhook")]
    service = objects[("Service", "gpu-slicer-webhook")]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    assert endpoint["tlsConfig"]["serverName"] == f"gpu-slicer-webhook.{NAMESPACE}.svc"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {
        "name": "gpu-slicer-webhook-tls",
        "key": "ca.crt",
    }
    pod_monitor = objects[("PodMonitor", "gpu-slicer-agent")]
    agent = objects[("DaemonSet", "gpu-slicer-agent")]
    template_labels = agent["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    [pod_endpoint] = pod_monitor["spec"]["podMetricsEndpoints"]
    ports = {
        p["name"]
        for c in agent["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
    }
    assert pod_endpoint["port"] in ports
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        pod_endpoint["relabelings"]
    )


def test_the_prometheus_rule_has_well_formed_groups_and_alerts() -> None:
    rule = _monitoring()[("PrometheusRule", "gpu-slicer")]
    assert set(rule["spec"]) == {"groups"}
    names: list[str] = []
    for group in rule["spec"]["groups"]:
        assert set(group) == {"name", "rules"}
        for alert in group["rules"]:
            assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}
            assert alert["labels"]["severity"] in {"critical", "warning", "info"}
            assert alert["annotations"]["summary"] and alert["annotations"]["description"]
            names.append(alert["alert"])
    assert len(names) == len(set(names))


def test_openshift_monitoring_trusts_the_service_ca_bundle() -> None:
    objects = {
        (o["kind"], o["metadata"]["name"]): o
        for o in template(["certificates.mode=openshift", *MONITORING])
    }
    monitor = objects[("ServiceMonitor", "gpu-slicer-webhook")]
    ca = monitor["spec"]["endpoints"][0]["tlsConfig"]["ca"]
    bundle = objects[("ConfigMap", ca["configMap"]["name"])]
    assert bundle["metadata"]["annotations"] == {
        "service.beta.openshift.io/inject-cabundle": "true"
    }
    assert ca["configMap"]["key"] == "service-ca.crt"


def _dashboard_json() -> dict[str, Any]:
    import json

    config = _monitoring()[("ConfigMap", "gpu-slicer-dashboard")]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    loaded: dict[str, Any] = json.loads(config["data"]["gpu-slicer.json"])
    return loaded


def test_the_dashboard_configmap_carries_the_dashboard_file_unchanged() -> None:
    import json

    shipped = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    assert _dashboard_json() == shipped


def test_the_install_notes_give_the_scheduler_scaling_facts_the_agent_uses() -> None:
    # NOTES.txt is shown after `helm install`; it must say what slicer.scaling says.
    from gpu_slicer.slicer.scaling import DEGRADES_AT_NODES, SCALES_FROM

    notes = (CHART / "templates" / "NOTES.txt").read_text()
    fixed = f"{SCALES_FROM[0]}.{SCALES_FROM[1]}"
    assert f'semverCompare "<{fixed}.0-0" .Capabilities.KubeVersion.Version' in notes
    assert f"(fixed in {fixed})" in notes and f"Past about\n{DEGRADES_AT_NODES} GPU nodes" in notes
    assert "--advertise,static" in notes and "--kube-api-qps=100" in notes


def test_helm_uninstall_first_runs_the_check_that_refuses_while_claims_are_allocated() -> None:
    objects = template(
        [
            "uninstallCheck.waitSeconds=30",
            "uninstallCheck.k8sServiceHost=10.0.0.1",
            "uninstallCheck.k8sServicePort=6443",
            "uninstallCheck.hostNetwork=true",
        ]
    )
    job = find(objects, "Job", "gpu-slicer-uninstall-check")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    # Kept when it fails, so that its log (the pods holding claims) can be read.
    assert "hook-failed" not in job["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert job["spec"]["backoffLimit"] == 0
    spec = job["spec"]["template"]["spec"]
    # An account that exists until the hook passes and may list claims in every namespace.
    assert spec["serviceAccountName"] == "gpu-slicer-agent"
    role = find(objects, "ClusterRole", "gpu-slicer-agent")
    assert any("resourceclaims" in r["resources"] and "list" in r["verbs"] for r in role["rules"])
    [check] = spec["containers"]
    assert check["args"] == ["uninstall-check", "--wait=30"]
    assert {e["name"]: e["value"] for e in check["env"]} == {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
    }
    assert spec["hostNetwork"] is True
    assert job["spec"]["activeDeadlineSeconds"] > 30
    assert not [o for o in template(["uninstallCheck.enabled=false"]) if o["kind"] == "Job"]


@pytest.mark.parametrize(("replicas", "budget"), [("1", False), ("2", True), ("3", True)])
def test_the_webhook_disruption_budget_never_blocks_a_drain(replicas: str, budget: bool) -> None:
    """minAvailable 1 with one replica would refuse every eviction of it: no drain of its node
    could finish. With more, it keeps one answering."""
    objects = template([f"webhook.replicas={replicas}"])
    pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert bool(pdbs) == budget
    for pdb in pdbs:
        assert pdb["spec"]["minAvailable"] < int(replicas)
