"""`gpu-slicer plan` on a real cluster: what a namespace would become, with nothing changed."""

from __future__ import annotations

import json
import subprocess
import sys

from kubernetes import client as k8s

from tests.support.e2e_sandbox import NODES, PLAIN, Sandbox


def test_plan_reports_a_legacy_deployment_and_changes_nothing(sandbox: Sandbox) -> None:
    apps = k8s.AppsV1Api(sandbox.client)
    apps.create_namespaced_deployment(
        PLAIN,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "legacy-infer"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "legacy-infer"}},
                "template": {
                    "metadata": {"labels": {"app": "legacy-infer"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
                            }
                        ]
                    },
                },
            },
        },
    )
    before = apps.read_namespaced_deployment("legacy-infer", PLAIN).metadata.generation
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_slicer.cli.main",
            "plan",
            "--kubeconfig",
            str(sandbox.kubeconfig),
            "-n",
            PLAIN,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    [workload] = [w for w in plan["workloads"] if w["name"] == "legacy-infer"]
    assert workload["outcome"] == "convert"
    assert workload["becomes"] == ["1 x 1g.10gb"]
    # The sandbox's nodes carry GPU Feature Discovery's labels, so plan finds them all.
    assert {n["name"] if isinstance(n, dict) else n for n in plan["gpuNodes"]} >= set(NODES)
    # The spec is untouched (status updates by the deployment controller do not count).
    assert apps.read_namespaced_deployment("legacy-infer", PLAIN).metadata.generation == before
    assert not sandbox.resource.list_namespaced_resource_claim_template(PLAIN).items
    apps.delete_namespaced_deployment("legacy-infer", PLAIN)
