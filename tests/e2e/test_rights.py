"""The webhook and the agents run with exactly deploy/'s rights, and its admission policy holds
an agent to its own node's ResourceSlices."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from gpu_slicer.core.identity import DRIVER
from gpu_slicer.sandbox.cluster import api_client
from tests.support.e2e_sandbox import Sandbox


def _slice(node: str, driver: str = DRIVER) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"intruder-{node}-{driver.replace('.', '-')}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


@pytest.mark.parametrize(
    ("target", "driver", "message"),
    [
        ("h100", DRIVER, "may only write ResourceSlices of that node"),
        ("a100", "gpu.nvidia.com", "may only write ResourceSlices of driver z.gpu-slicer.io"),
        ("a100", "gpu-slicer.io", "may only write ResourceSlices of driver z.gpu-slicer.io"),
    ],
    ids=["another node", "another driver", "its earlier name"],
)
def test_an_agent_cannot_write_slices_it_does_not_own(
    sandbox: Sandbox, target: str, driver: str, message: str
) -> None:
    agent = api_client(sandbox.dir / "kubeconfigs" / "agent-a100")
    try:
        with pytest.raises(ApiException) as refused:
            k8s.ResourceV1Api(agent).create_resource_slice(_slice(target, driver))
        assert refused.value.status in (403, 422)
        assert message in str(refused.value.body)
    finally:
        agent.close()


def test_the_agent_token_carries_its_node_and_writes_its_own_slices(sandbox: Sandbox) -> None:
    agent = api_client(sandbox.dir / "kubeconfigs" / "agent-a100")
    try:
        api = k8s.ResourceV1Api(agent)
        created = api.create_resource_slice(_slice("a100"), dry_run="All")
        assert created.spec.node_name == "a100"
    finally:
        agent.close()


def test_the_agent_deletes_its_nodes_slices_of_the_earlier_driver_name(sandbox: Sandbox) -> None:
    """What an upgrade from 0.1 needs: the new agent removes the pool 0.1 published under
    ``gpu-slicer.io`` on its node (only there: another node's stays)."""
    agent = api_client(sandbox.dir / "kubeconfigs" / "agent-a100")
    admin = sandbox.resource
    old_here, old_there = _slice("a100", "gpu-slicer.io"), _slice("h100", "gpu-slicer.io")
    try:
        for obj in (old_here, old_there):
            admin.create_resource_slice(obj)
        api = k8s.ResourceV1Api(agent)
        api.delete_resource_slice(old_here["metadata"]["name"])  # type: ignore[index]
        with pytest.raises(ApiException) as refused:
            api.delete_resource_slice(old_there["metadata"]["name"])  # type: ignore[index]
        assert "may only write ResourceSlices of that node" in str(refused.value.body)
    finally:
        agent.close()
        for obj in (old_here, old_there):
            try:
                admin.delete_resource_slice(obj["metadata"]["name"])  # type: ignore[index]
            except ApiException as exc:
                assert exc.status == 404


def test_the_webhook_account_cannot_read_secrets_or_write_foreign_templates(
    sandbox: Sandbox,
) -> None:
    webhook = api_client(sandbox.dir / "kubeconfigs" / "webhook")
    try:
        with pytest.raises(ApiException) as refused:
            k8s.CoreV1Api(webhook).list_namespaced_secret("gpu-slicer")
        assert refused.value.status == 403
    finally:
        webhook.close()
