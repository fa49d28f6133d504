"""The webhook, agent and certs workloads: security settings, probes and wiring that must agree."""

from __future__ import annotations

import pytest

from gpu_slicer.slicer.plugin import dra_socket
from tests.support.deploy_cases import (
    INSTALLABLE,
    Obj,
    arg_value,
    container,
    find,
    of_kind,
    pod_spec,
    render,
)

WEBHOOK = ("Deployment", "gpu-slicer-webhook")
AGENT = ("DaemonSet", "gpu-slicer-agent")
LABELS = {"app.kubernetes.io/name": "gpu-slicer"}


@pytest.fixture(params=("base", *INSTALLABLE))
def objects(request: pytest.FixtureRequest) -> list[Obj]:
    return render(request.param)


def _mounts(workload: Obj, name: str) -> dict[str, Obj]:
    return {m["mountPath"]: m for m in container(workload, name).get("volumeMounts", [])}


def _volumes(workload: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod_spec(workload).get("volumes", [])}


def _restricted(workload: Obj, name: str) -> None:
    """The pod-security "restricted" profile, checked field by field."""
    pod = pod_spec(workload)
    ctx = container(workload, name)["securityContext"]
    assert pod["securityContext"].get("runAsNonRoot") or ctx.get("runAsNonRoot")
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert not ctx["capabilities"].get("add")
    assert "privileged" not in ctx
    seccomp = ctx.get("seccompProfile") or pod["securityContext"].get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert all("hostPath" not in v for v in pod.get("volumes", []))


def test_the_webhook_runs_restricted(objects: list[Obj]) -> None:
    _restricted(find(objects, *WEBHOOK), "webhook")


def test_the_webhook_has_two_replicas_spread_over_nodes(objects: list[Obj]) -> None:
    deployment = find(objects, *WEBHOOK)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    term = pod_spec(deployment)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_disruption_budget_keeps_one_webhook_replica(objects: list[Obj]) -> None:
    deployment = find(objects, *WEBHOOK)
    pdb = find(objects, "PodDisruptionBudget", "gpu-slicer-webhook")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_webhook_probes_use_healthz_and_readyz_over_https(objects: list[Obj]) -> None:
    webhook = container(find(objects, *WEBHOOK), "webhook")
    port_names = {p["name"] for p in webhook["ports"]}
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        get = webhook[probe]["httpGet"]
        assert (get["path"], get["scheme"]) == (path, "HTTPS")
        assert get["port"] in port_names


def test_every_container_has_requests_and_a_memory_limit(objects: list[Obj]) -> None:
    for workload in [*of_kind(objects, "Deployment"), *of_kind(objects, "DaemonSet")]:
        for c in pod_spec(workload)["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
            assert "memory" in c["resources"]["limits"], c["name"]


def test_the_service_reaches_the_webhook_port(objects: list[Obj]) -> None:
    deployment = find(objects, *WEBHOOK)
    service = find(objects, "Service", "gpu-slicer-webhook")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    webhook = container(deployment, "webhook")
    (named,) = [p for p in webhook["ports"] if p["name"] == port["targetPort"]]
    assert arg_value(webhook["args"], "--bind").endswith(f":{named['containerPort']}")


def test_webhook_arguments_point_into_its_mounts(objects: list[Obj]) -> None:
    deployment = find(objects, *WEBHOOK)
    webhook = container(deployment, "webhook")
    mounts = _mounts(deployment, "webhook")
    volumes = _volumes(deployment)
    assert webhook["args"][:2] == ["webhook", "serve"]
    for flag, volume_kind in (
        ("--tls-cert", "secret"),
        ("--tls-key", "secret"),
        ("--policy", "configMap"),
    ):
        path = arg_value(webhook["args"], flag)
        folder, _, file_name = path.rpartition("/")
        assert folder in mounts, flag
        volume = volumes[mounts[folder]["name"]]
        assert volume_kind in volume
        items = volume[volume_kind].get("items")
        assert items is None or file_name in {i["path"] for i in items}
    assert volumes["tls"]["secret"]["secretName"] == "gpu-slicer-webhook-tls"
    policy_map = find(objects, "ConfigMap", volumes["policy"]["configMap"]["name"])
    assert arg_value(webhook["args"], "--policy").rpartition("/")[2] in policy_map["data"]


def test_writable_paths_of_the_webhook_are_memory_backed_empty_dirs(objects: list[Obj]) -> None:
    deployment = find(objects, *WEBHOOK)
    mounts = _mounts(deployment, "webhook")
    volumes = _volumes(deployment)
    env = {e["name"]: e.get("value") for e in container(deployment, "webhook")["env"]}
    for path in ("/tmp", env["GPU_SLICER_RUNTIME_DIR"]):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    assert env["PROMETHEUS_MULTIPROC_DIR"].startswith(env["GPU_SLICER_RUNTIME_DIR"] + "/")
    writable = [p for p, m in mounts.items() if not m.get("readOnly")]
    assert all("emptyDir" in volumes[mounts[p]["name"]] for p in writable)


def test_the_agent_runs_only_on_labelled_gpu_nodes(objects: list[Obj]) -> None:
    agent = find(objects, *AGENT)
    assert pod_spec(agent)["nodeSelector"] == {"gpu-slicer.io/agent": "enabled"}


def test_the_agent_gets_privileges_for_nvml_and_nothing_of_the_host_network(
    objects: list[Obj],
) -> None:
    agent = find(objects, *AGENT)
    pod = pod_spec(agent)
    ctx = container(agent, "agent")["securityContext"]
    assert ctx["privileged"] is True  # MIG management: see the comment in agent-daemonset.yaml
    assert ctx["readOnlyRootFilesystem"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert not any("hostPort" in p for p in container(agent, "agent").get("ports", []))


def test_the_agent_mounts_exactly_the_kubelet_cdi_and_checkpoint_folders(
    objects: list[Obj],
) -> None:
    agent = find(objects, *AGENT)
    volumes = _volumes(agent)
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert host_paths == {
        "/var/lib/kubelet/plugins/z.gpu-slicer.io",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/etc/cdi",  # the toolkit's spec, whose common edits claim specs carry
        "/var/lib/gpu-slicer",
    }
    mounts = _mounts(agent, "agent")
    assert mounts["/etc/cdi"].get("readOnly") is True
    for path, mount in mounts.items():
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            assert volume["hostPath"]["path"] == path  # same path inside: sockets are dialled
    args = container(agent, "agent")["args"]
    assert args[:2] == ["agent", "run"]
    assert str(dra_socket(arg_value(args, "--plugins-dir")).parent) in mounts
    for flag in ("--registry-dir", "--cdi-dir", "--checkpoint-dir"):
        assert arg_value(args, flag) in mounts, flag
    assert arg_value(args, "--backend") == "nvml"


def test_the_agent_learns_its_node_from_the_downward_api(objects: list[Obj]) -> None:
    agent = container(find(objects, *AGENT), "agent")
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert arg_value(agent["args"], "--node") == "$(NODE_NAME)"


def test_network_policies_deny_ingress_except_the_admission_and_metrics_ports(
    objects: list[Obj],
) -> None:
    policies = {p["metadata"]["name"]: p for p in of_kind(objects, "NetworkPolicy")}
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny
    webhook_rule = policies["gpu-slicer-webhook"]["spec"]["ingress"]
    assert webhook_rule == [{"ports": [{"port": "https", "protocol": "TCP"}]}]  # any source
    metrics = policies["gpu-slicer-agent-metrics"]["spec"]["ingress"][0]
    assert metrics["from"][0]["namespaceSelector"]["matchLabels"] == {
        "gpu-slicer.io/metrics-scraper": "true"
    }
    agent_ports = {p["name"] for p in container(find(objects, *AGENT), "agent")["ports"]}
    assert {p["port"] for p in metrics["ports"]} <= agent_ports
    for name, policy in policies.items():
        selector = policy["spec"]["podSelector"].get("matchLabels", {})
        assert LABELS.items() <= selector.items() or selector == {}, name


def test_the_namespace_admits_the_privileged_agent_but_warns_on_anything_else(
    base: list[Obj],
) -> None:
    labels = find(base, "Namespace", "gpu-slicer")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "baseline"
