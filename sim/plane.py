"""The modelled control plane: where pods and claims live, and the nodes that go with it.

Through the API (:class:`ApiControlPlane`) every object goes through ``kube.memory``: the
webhook's patch and templates, the pod, the claim controller making claims from templates, the
scheduler's binding; the nodes are :class:`sim.api_node.ApiNode`. On the fast path
(:class:`FastControlPlane`) claims are plain dicts and the nodes are
:class:`sim.fast_node.FastNode`. Both decide the same (tests/sim/test_cluster.py).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import jsonpatch

from gpu_slicer.core.identity import MIGRATION_LABEL, RESOURCE_API
from gpu_slicer.kube import errors as kerrors
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.sim.allocator import Allocation
from gpu_slicer.sim.api_node import ApiNode
from gpu_slicer.sim.demand import Translated
from gpu_slicer.sim.fast_node import FastNode, NodeKinds
from gpu_slicer.sim.kubelet_client import RunningClaim, scratch_dir
from gpu_slicer.sim.node import SimClock, SimNode
from gpu_slicer.sim.pools import Device
from gpu_slicer.sim.scenario import PodSpec, Scenario
from gpu_slicer.slicer.deviceclasses import device_classes

Obj = dict[str, Any]


class SimControlPlane(Protocol):
    """What the strategy needs of the control plane besides the scheduler."""

    description: str
    nodes: dict[str, SimNode]

    def admit(self, pod: PodSpec, translated: Translated) -> list[Obj]:
        """The pod admitted with the webhook's answer; returns its claims."""
        ...

    def bind(
        self, pod: PodSpec, claims: Sequence[Obj], allocation: Allocation
    ) -> list[RunningClaim]:
        """The claims allocated and reserved for the pod, the pod bound to the node; returns
        what the kubelet prepares."""
        ...

    def remove(self, pod: PodSpec, prepared: Sequence[RunningClaim]) -> None:
        """The pod gone, and with it its claims."""
        ...

    def problems(self) -> list[str]:
        """What is left that should not be, once every pod is gone."""
        ...

    def close(self) -> None: ...


def _devices(allocation: Allocation, status: Obj) -> list[Device]:
    """The allocation's devices that one claim's ``status.allocation`` holds."""
    names = {r["device"] for r in status["devices"]["results"]}
    return [d for d in allocation.devices if d.name in names]


class FastControlPlane:
    """Claims as plain dicts, nothing stored: the scheduler's and nodes' state is the truth."""

    description = "fast path: direct backend calls, slices reordered in place"

    def __init__(self, scenario: Scenario, *, device_order: str, clock: SimClock) -> None:
        kinds: NodeKinds = {}
        self.nodes: dict[str, SimNode] = {
            n.name: FastNode(
                n, device_order=device_order, scenario=scenario, clock=clock, kinds=kinds
            )
            for n in scenario.nodes
        }
        self._uids = 0

    def admit(self, pod: PodSpec, translated: Translated) -> list[Obj]:
        self._uids += 1
        claim = {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {
                "name": f"{pod.name}-gpu-slicer",
                "namespace": pod.namespace,
                "uid": f"uid-{self._uids}",
            },
            "spec": translated.claim_spec,
        }
        return [claim]

    def bind(
        self, pod: PodSpec, claims: Sequence[Obj], allocation: Allocation
    ) -> list[RunningClaim]:
        prepared = []
        for claim, status in zip(claims, allocation.allocations, strict=True):
            meta = claim["metadata"]
            devices = _devices(allocation, status)
            prepared.append(RunningClaim(meta["uid"], meta["name"], meta["namespace"], devices))
        return prepared

    def remove(self, pod: PodSpec, prepared: Sequence[RunningClaim]) -> None:
        """Nothing stored: nothing to delete."""

    def problems(self) -> list[str]:
        return []

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


class ApiControlPlane:
    """The in-memory apiserver, a claim controller, and nodes running the agent's parts."""

    description = "through the in-memory API and the agent's gRPC services"

    def __init__(self, scenario: Scenario, *, device_order: str, clock: SimClock) -> None:
        self.api = InMemoryKubeApi()
        self.api.set_server_version(*scenario.kubernetes)
        self.root: Path | None = Path(tempfile.mkdtemp(prefix="gpu-slicer-sim-", dir=scratch_dir()))
        for obj in device_classes():
            self.api.create(obj)
        for ns, mode in scenario.namespaces.items():
            labels = {MIGRATION_LABEL: mode} if mode != "disabled" else {}
            self.api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "labels": labels},
                }
            )
        for node in scenario.nodes:
            self.api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name}})
        self.nodes: dict[str, SimNode] = {
            n.name: ApiNode(
                n,
                device_order=device_order,
                scenario=scenario,
                clock=clock,
                api=self.api,
                root=self.root,
            )
            for n in scenario.nodes
        }

    def admit(self, pod: PodSpec, translated: Translated) -> list[Obj]:
        """Webhook patch + templates, pod creation, and the claim controller."""
        conversion = translated.conversion
        assert conversion is not None
        manifest = pod.manifest()
        mutated = jsonpatch.apply_patch(manifest, conversion.patch)
        for template in conversion.templates:
            try:
                self.api.create(template)
            except kerrors.AlreadyExists:
                pass
        stored = self.api.create(mutated)
        claims: list[Obj] = []
        statuses: list[Obj] = []
        for entry in stored["spec"].get("resourceClaims") or []:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name:
                continue
            claim = self._claim_from_template(pod, stored, entry["name"], template_name)
            claims.append(claim)
            statuses.append({"name": entry["name"], "resourceClaimName": claim["metadata"]["name"]})
        self.api.patch(
            "v1",
            "Pod",
            pod.name,
            {"status": {"resourceClaimStatuses": statuses}},
            namespace=pod.namespace,
        )
        return claims

    def _claim_from_template(self, pod: PodSpec, stored: Obj, entry: str, template: str) -> Obj:
        """What the claim controller makes for one of the pod's claim entries."""
        found = self.api.get(RESOURCE_API, "ResourceClaimTemplate", template, pod.namespace)
        return self.api.create(
            {
                "apiVersion": RESOURCE_API,
                "kind": "ResourceClaim",
                "metadata": {
                    "name": f"{pod.name}-{entry}",
                    "namespace": pod.namespace,
                    "annotations": {"resource.kubernetes.io/pod-claim-name": entry},
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": pod.name,
                            "uid": stored["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": found["spec"]["spec"],
            }
        )

    def bind(
        self, pod: PodSpec, claims: Sequence[Obj], allocation: Allocation
    ) -> list[RunningClaim]:
        prepared = []
        for claim, status in zip(claims, allocation.allocations, strict=True):
            devices = _devices(allocation, status)
            meta = claim["metadata"]
            stored = self.api.get(RESOURCE_API, "ResourceClaim", meta["name"], meta["namespace"])
            stored["status"] = {
                "allocation": status,
                "reservedFor": [{"resource": "pods", "name": pod.name}],
            }
            meta = self.api.update(stored)["metadata"]
            prepared.append(RunningClaim(meta["uid"], meta["name"], meta["namespace"], devices))
        self.api.patch(
            "v1", "Pod", pod.name, {"spec": {"nodeName": allocation.node}}, namespace=pod.namespace
        )
        return prepared

    def remove(self, pod: PodSpec, prepared: Sequence[RunningClaim]) -> None:
        self.api.delete("v1", "Pod", pod.name, pod.namespace)
        for claim in prepared:  # the claim controller: owner gone, claim goes
            self.api.delete(RESOURCE_API, "ResourceClaim", claim.name, claim.namespace)

    def problems(self) -> list[str]:
        allocated = [
            c
            for c in self.api.list(RESOURCE_API, "ResourceClaim").items
            if (c.get("status") or {}).get("allocation")
        ]
        return [f"{len(allocated)} claims still allocated in the API"] if allocated else []

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
