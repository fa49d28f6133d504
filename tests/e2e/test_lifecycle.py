"""A slice's life: prepared for a pod, destroyed when it goes, reused by the next; an agent that
restarts under running pods loses and leaks nothing."""

from __future__ import annotations

import os
import signal

from tests.support.e2e_sandbox import ENABLED, Sandbox, pod_manifest

NODE = "h100-life"
LIMITS = {"nvidia.com/mig-3g.40gb": "1"}


def test_deleting_a_pod_unprepares_destroys_releases_and_the_next_pod_reuses_the_slice(
    sandbox: Sandbox,
) -> None:
    sandbox.create_pod(ENABLED, pod_manifest("first", node=NODE, limits=LIMITS))
    pod = sandbox.wait_running(ENABLED, "first")
    [claim] = sandbox.claims_of(pod)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert [p for _, p, _ in sandbox.instances(NODE)] == ["3g.40gb"]

    sandbox.delete_pod(ENABLED, "first")
    sandbox.wait(lambda: sandbox.instances(NODE) == [], what="the instance destroyed")
    claim_name = claim["metadata"]["name"]
    sandbox.wait(
        lambda: (
            not any(
                c.metadata.name == claim_name
                for c in sandbox.resource.list_namespaced_resource_claim(ENABLED).items
            )
        ),
        what="the claim released and deleted",
    )
    assert not any(
        f"claim_{claim['metadata']['uid']}" in p.name
        for p in (sandbox.dir / "nodes" / NODE / "cdi").iterdir()
    )

    sandbox.create_pod(ENABLED, pod_manifest("second", node=NODE, limits=LIMITS))
    pod = sandbox.wait_running(ENABLED, "second")
    [claim] = sandbox.claims_of(pod)
    [again] = claim["status"]["allocation"]["devices"]["results"]
    assert again["device"] == result["device"]
    sandbox.delete_pod(ENABLED, "second")
    sandbox.wait(lambda: sandbox.instances(NODE) == [], what="the instance destroyed")


def test_an_agent_restart_under_running_pods_loses_and_leaks_nothing(sandbox: Sandbox) -> None:
    small = {"nvidia.com/mig-1g.10gb": "1"}
    names = ["keep-a", "keep-b"]
    for name in names:
        sandbox.create_pod(ENABLED, pod_manifest(name, node=NODE, limits=small))
    for name in names:
        sandbox.wait_running(ENABLED, name)
    before = sandbox.instances(NODE)
    assert len(before) == 2

    component = f"agent-{NODE}"
    old = sandbox.pid(component)
    os.kill(old, signal.SIGKILL)
    sandbox.wait(lambda: sandbox.pid(component) != old, what="the agent restarted")
    # Registered again with the kubelet, its slices published: a new pod gets prepared.
    sandbox.create_pod(ENABLED, pod_manifest("after-restart", node=NODE, limits=small))
    sandbox.wait_running(ENABLED, "after-restart", timeout_s=90)
    assert set(before) <= set(sandbox.instances(NODE))
    assert len(sandbox.instances(NODE)) == 3
    for name in names:
        assert sandbox.pod(ENABLED, name)["status"]["phase"] == "Running"

    for name in [*names, "after-restart"]:
        sandbox.delete_pod(ENABLED, name)
    sandbox.wait(
        lambda: sandbox.instances(NODE) == [], what="every instance destroyed", timeout_s=90
    )


def test_a_claim_shared_by_two_pods_is_unprepared_only_after_the_last_one(
    sandbox: Sandbox,
) -> None:
    node = "h100"
    sandbox.resource.create_namespaced_resource_claim(
        ENABLED,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "slice",
                            "exactly": {
                                "deviceClassName": "mig.gpu-slicer.io",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": (
                                                'device.attributes["gpu-slicer.io"]'
                                                '.profile == "1g.10gb"'
                                            )
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            },
        },
    )
    for name in ("user-a", "user-b"):
        manifest = pod_manifest(name, node=node)
        manifest["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
        manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
        sandbox.create_pod(ENABLED, manifest)
    for name in ("user-a", "user-b"):
        sandbox.wait_running(ENABLED, name)
    assert [p for _, p, _ in sandbox.instances(node)] == ["1g.10gb"]
    first = sandbox.container_runtime(node, ENABLED, "user-a", "main")["cdiDevices"]
    assert first == sandbox.container_runtime(node, ENABLED, "user-b", "main")["cdiDevices"]

    sandbox.delete_pod(ENABLED, "user-a")
    assert [p for _, p, _ in sandbox.instances(node)] == ["1g.10gb"]  # user-b still runs on it
    sandbox.delete_pod(ENABLED, "user-b")
    sandbox.wait(lambda: sandbox.instances(node) == [], what="the shared instance destroyed")
    sandbox.resource.delete_namespaced_resource_claim("shared", ENABLED)
