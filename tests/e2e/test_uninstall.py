"""Opting out and uninstalling with converted pods running, on the real node with the chart's pods.

A sandbox of its own, as ``test_agent_pod.py``'s (``--real-node real --install helm --agent-pod
--webhook-pod``): the real kubelet runs the chart's agent and webhook from the project's image and
converted pods whose busybox reports every 2 s what it sees from inside its container.

What the real kubelet (1.36) does when the agent is gone, measured here first: ``helm uninstall``
deletes the agent's DaemonSet at once; the kubelet unregisters the plugin and, about 30 s later,
deletes the node's ResourceSlices; running pods keep running (containers, devices, instances and
CDI files untouched). A converted pod deleted then has its container killed, but the kubelet's
unprepare fails (``unprepare dynamic resources: DRA driver z.gpu-slicer.io is not registered``,
retried about every 10 s): the pod stays Terminating and its MIG instance, CDI file and claim
stay, until an agent registers again, when the kubelet finishes it within seconds.

So the chart refuses: its pre-delete hook (``gpu-slicer uninstall-check``) fails ``helm
uninstall`` before anything is deleted while a claim of the driver is allocated. The tests run
the procedure docs/install-kubernetes.md ("Uninstall") gives, and the recovery it gives for an
uninstall that skipped the check: ``helm uninstall --no-hooks``, and ``kubectl delete -k`` of the
self-managed overlay run by the real kubectl (built from the control plane's release) against
the chart's objects, which have the overlay's names.

Skipped with the reason where the machine cannot run containers or the kubelet, containerd or the
image cannot be built; under ``CI=true`` that is a failure.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_slicer.sandbox import binaries, chart_pods
from tests.support.chart_release import (
    RELEASE_NAMESPACE,
    cdi_claims,
    checkpoint_claims,
    driver_claims,
    helm,
    pod_log,
    release_pods,
    run_kubectl,
    started,
)
from tests.support.e2e_sandbox import (
    ENABLED,
    Obj,
    Sandbox,
    chart_pods_sandbox,
)
from tests.support.real_node_probe import latest_report, probe_pod

NODE = "real"
GPUS = "A100-80GB:1"
LIMITS = {"nvidia.com/mig-1g.10gb": "1"}
OPTED_OUT = "e2e-opted-out"
"""Opted in, then its label removed."""
DISABLED = "e2e-disabled"
"""Opted in, then its label set to ``disabled``."""
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CHART = DEPLOY / "helm" / "gpu-slicer"
OVERLAY = DEPLOY / "overlays" / "self-managed"
NOT_REGISTERED = "unprepare dynamic resources: DRA driver z.gpu-slicer.io is not registered"
"""The real kubelet's error for a deleted pod's claims while no agent is registered."""


def _probe(name: str) -> Obj:
    """A converted-to-be pod that reports what it sees every 2 s. Deleted with a grace period
    (3 s), as pods are: the sandbox's usual 0 makes every deletion a forced one, which removes
    the pod from the API at once whatever the kubelet does."""
    pod = probe_pod(name, NODE, LIMITS, repeat=True)
    pod["spec"]["terminationGracePeriodSeconds"] = 3
    return pod


def _converts(box: Sandbox, namespace: str) -> bool:
    """Whether the webhook converts a GPU pod in ``namespace`` now (a server-side dry run)."""
    created = box.core.create_namespaced_pod(
        namespace, probe_pod("dry", NODE, LIMITS), dry_run="All"
    )
    return bool(created.spec.resource_claims)


@pytest.fixture(scope="module")
def box(kube_binaries: binaries.Binaries) -> Iterator[Sandbox]:
    with chart_pods_sandbox("gs-uninstall-", NODE, GPUS, "--agent-pod", "--webhook-pod") as running:
        for namespace in (ENABLED, OPTED_OUT, DISABLED):
            running.core.create_namespace(
                {"metadata": {"name": namespace, "labels": {"gpu-slicer.io/migration": "enabled"}}}
            )
            running.wait(
                lambda n=namespace: running.core.read_namespaced_service_account("default", n),
                what=f"{namespace}'s default ServiceAccount",
            )
            running.wait(
                lambda n=namespace: _converts(running, n),
                what=f"the webhook converting in {namespace}",
            )
        yield running


# --- what the tests read ------------------------------------------------------------------------


def _install(box: Sandbox) -> None:
    """``helm install`` again with the values the sandbox installed, until the agent pod has
    registered with the kubelet and the webhook pod serves."""
    done = helm(
        box, "install", "gpu-slicer", str(CHART), "--values", str(box.dir / "helm-values.yaml")
    )
    assert done.returncode == 0, done.stderr
    box.wait(
        lambda: (
            (pods := release_pods(box, "agent"))
            and pods[0]["status"].get("phase") == "Running"
            and "registered with the kubelet" in pod_log(box, pods[0])
        ),
        what="the reinstalled agent pod registered with the kubelet",
        timeout_s=180,
    )
    chart_pods.wait_webhook_pod(box.kubeconfig, 180)


def _undisturbed(box: Sandbox, pods: dict[str, Obj]) -> None:
    """Each pod still runs its first container and sees, in a report made now, what it saw at
    first; its claim's instance and CDI file are there."""
    for namespace, first in pods.items():
        name = first["name"]
        number, seen = latest_report(box, name, namespace, after=first["report"][0])
        assert seen == first["report"][1], f"{namespace}/{name} sees other devices now"
        assert started(box, namespace, name) == first["started"]
        assert f"k8s.gpu-slicer.io-claim_{first['claim']}.json" in cdi_claims(box, NODE)
        first["report"] = (number, seen)


def _nothing_left(box: Sandbox) -> None:
    """After an uninstall: no MIG instance, no claim CDI file, no claim in the checkpoint, no
    ResourceSlice of the driver (the kubelet deletes them after the plugin left), no chart pod."""
    assert box.instances(NODE) == []
    assert cdi_claims(box, NODE) == []
    assert checkpoint_claims(box, NODE) == {}
    assert driver_claims(box) == []
    box.wait(lambda: not release_pods(box, "agent"), what="the agent pod gone")
    box.wait(lambda: not release_pods(box, "webhook"), what="the webhook pod gone")
    box.wait(
        lambda: (
            not box.resource.list_resource_slice(field_selector="spec.driver=z.gpu-slicer.io").items
        ),
        what="the kubelet deleting the node's z.gpu-slicer.io ResourceSlices",
        timeout_s=120,
    )


@pytest.fixture(scope="module")
def running(box: Sandbox) -> dict[str, Obj]:
    """A converted pod running on its MIG slice in each namespace that will opt out: what it
    saw first, its container and its claim."""
    pods: dict[str, Obj] = {}
    for namespace in (OPTED_OUT, DISABLED):
        box.create_pod(namespace, _probe("kept"))
        pod = box.wait_running(namespace, "kept", timeout_s=150)
        [claim] = box.claims_of(pod)
        pods[namespace] = {
            "name": "kept",
            "report": latest_report(box, "kept", namespace),
            "started": started(box, namespace, "kept"),
            "claim": claim["metadata"]["uid"],
        }
    return pods


# --- the tests ----------------------------------------------------------------------------------


def test_a_namespace_that_opts_out_keeps_its_running_pod_untouched(
    box: Sandbox, running: dict[str, Obj]
) -> None:
    instances = box.instances(NODE)
    assert len(instances) == 2
    box.core.patch_namespace(OPTED_OUT, {"metadata": {"labels": {"gpu-slicer.io/migration": None}}})
    box.core.patch_namespace(
        DISABLED, {"metadata": {"labels": {"gpu-slicer.io/migration": "disabled"}}}
    )
    for namespace in (OPTED_OUT, DISABLED):
        box.wait(
            lambda n=namespace: not _converts(box, n), what=f"the webhook leaving {namespace} alone"
        )

    _undisturbed(box, running)
    assert box.instances(NODE) == instances
    for namespace, first in running.items():
        [claim] = box.claims_of(box.pod(namespace, "kept"))
        assert claim["metadata"]["uid"] == first["claim"]
        assert claim["status"]["reservedFor"][0]["name"] == "kept"


def test_helm_uninstall_refuses_while_converted_pods_hold_their_slices(
    box: Sandbox, running: dict[str, Obj]
) -> None:
    instances = box.instances(NODE)
    [agent] = release_pods(box, "agent")

    done = helm(box, "uninstall", "gpu-slicer", "--timeout", "3m")

    assert done.returncode != 0
    assert "job gpu-slicer-uninstall-check failed" in done.stderr, done.stderr
    [check] = release_pods(box, "uninstall-check")  # kept, for its log
    said = pod_log(box, check)
    for namespace in running:
        assert f"pod {namespace}/kept" in said, said
    # Nothing was deleted: the release, the agent that serves these pods, the webhook.
    assert helm(box, "status", "gpu-slicer").returncode == 0
    [still] = release_pods(box, "agent")
    assert still["metadata"]["uid"] == agent["metadata"]["uid"]
    assert still["status"]["phase"] == "Running"
    assert release_pods(box, "webhook")
    k8s.AdmissionregistrationV1Api(box.client).read_mutating_webhook_configuration("gpu-slicer")
    _undisturbed(box, running)
    assert box.instances(NODE) == instances


def test_the_documented_procedure_uninstalls_and_leaves_nothing_behind(
    box: Sandbox, running: dict[str, Obj]
) -> None:
    # 1. The namespaces are set back (the first test). 2. Their converted pods are replaced
    # (here deleted): the agent still runs, so each terminates normally.
    for namespace in running:
        box.delete_pod(namespace, "kept")
    box.wait(lambda: box.instances(NODE) == [], what="the pods' instances destroyed")
    # 3. The check the hook runs, by hand, as before `kubectl delete -k`.
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_slicer.cli.main",
            "uninstall-check",
            "--wait",
            "60",
            "--kubeconfig",
            str(box.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    # 4. helm uninstall: the hook passes and is deleted with everything else.
    done = helm(box, "uninstall", "gpu-slicer", "--timeout", "3m")
    assert done.returncode == 0, done.stderr
    assert release_pods(box, "uninstall-check") == []
    _nothing_left(box)


def _delete_without_the_check(box: Sandbox, kubectl: Path, how: str) -> None:
    """Everything deleted at once while a converted pod runs: ``helm uninstall --no-hooks``, or
    ``kubectl delete -k`` of the self-managed overlay (kubectl's own kustomize) as a Kustomize
    install's admin runs it. The chart's objects have the overlay's names (tests/deploy), so
    kubectl deletes what it would delete there, in its order, the namespace with the release's
    record in it; ``--ignore-not-found`` for what the sandbox's release leaves out (the
    certificates' Deployment, the network policies). The sandbox's own parts are then put back
    as the sandbox made them before its install (the namespace and the webhook's certificate)."""
    if how == "helm uninstall --no-hooks":
        done = helm(box, "uninstall", "gpu-slicer", "--no-hooks", "--timeout", "3m")
        assert done.returncode == 0, done.stderr
        return
    done = run_kubectl(
        box,
        kubectl,
        "delete",
        "-k",
        str(OVERLAY),
        "--ignore-not-found",
        "--timeout=180s",
        timeout_s=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'daemonset.apps "gpu-slicer-agent" deleted' in done.stdout, done.stdout
    assert 'namespace "gpu-slicer" deleted' in done.stdout, done.stdout
    box.wait(
        lambda: RELEASE_NAMESPACE not in [n.metadata.name for n in box.core.list_namespace().items],
        what="the release's namespace gone",
        timeout_s=180,
    )
    box.core.create_namespace(yaml.safe_load((DEPLOY / "base" / "namespace.yaml").read_text()))
    box.core.create_namespaced_secret(
        RELEASE_NAMESPACE, chart_pods.webhook_tls_secret(box.dir / "webhook-tls")
    )


@pytest.mark.parametrize("how", ["helm uninstall --no-hooks", "kubectl delete -k"])
def test_an_uninstall_without_the_check_strands_a_deleted_pod_until_the_agent_is_back(
    box: Sandbox, kubectl: Path, how: str
) -> None:
    _install(box)
    box.wait(lambda: _converts(box, ENABLED), what="the reinstalled webhook converting")
    box.create_pod(ENABLED, _probe("stranded"))
    pod = box.wait_running(ENABLED, "stranded", timeout_s=150)
    [claim] = box.claims_of(pod)
    first = {
        ENABLED: {
            "name": "stranded",
            "report": latest_report(box, "stranded", ENABLED),
            "started": started(box, ENABLED, "stranded"),
            "claim": claim["metadata"]["uid"],
        }
    }
    instances = box.instances(NODE)
    assert len(instances) == 1

    _delete_without_the_check(box, kubectl, how)
    box.wait(lambda: not release_pods(box, "agent"), what="the agent pod gone")
    _undisturbed(box, first)  # the running pod does not notice
    assert box.instances(NODE) == instances

    box.core.delete_namespaced_pod("stranded", ENABLED)
    kubelet_log = f"kubelet-{NODE}"
    box.wait(
        lambda: (
            NOT_REGISTERED in box.log(kubelet_log)
            and "stranded" in box.log(kubelet_log).split(NOT_REGISTERED, 1)[1].split("\n", 1)[0]
        ),
        what="the kubelet failing to unprepare the deleted pod's claim",
        timeout_s=90,
    )
    stuck = box.pod(ENABLED, "stranded")  # Terminating: the kubelet retries, it does not give up
    assert stuck["metadata"]["deletionTimestamp"]
    assert box.instances(NODE) == instances
    assert f"k8s.gpu-slicer.io-claim_{claim['metadata']['uid']}.json" in cdi_claims(box, NODE)

    # The recovery: the agent back (the same release, the same values), the kubelet finishes.
    _install(box)
    box.wait_gone(ENABLED, "stranded", timeout_s=90)
    box.wait(lambda: box.instances(NODE) == [], what="the stranded pod's instance destroyed")
    assert cdi_claims(box, NODE) == []
    done = helm(box, "uninstall", "gpu-slicer", "--timeout", "3m")
    assert done.returncode == 0, done.stderr
    _nothing_left(box)
    with pytest.raises(ApiException) as gone:
        k8s.AdmissionregistrationV1Api(box.client).read_mutating_webhook_configuration("gpu-slicer")
    assert gone.value.status == 404
