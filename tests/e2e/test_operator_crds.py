"""Operators' CRDs as their projects ship them, on the real apiserver: each converted object is
applied and read back. Its claims must survive exactly where webhook.crd_schema says the CRD
keeps them, and the kinds `convert` converts by default are those whose newest CRDs checked
keep them (webhook.workloads ``checked``); a CRD from an older PodSpec shows the pruning."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from gpu_slicer.webhook.convert import convert_objects
from gpu_slicer.webhook.crd_schema import pruned_fields
from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.workloads import DEFAULT_TABLE, OPERATORS, WorkloadTable, expand, lookup
from tests.support.e2e_sandbox import Sandbox
from tests.support.operator_crds import CRD_SETS, crd_sets

NAMESPACE = "e2e-operators"
DATA = Path(__file__).parents[1] / "webhook" / "data" / "operators.yaml"
EVERY_KIND = WorkloadTable(tuple(replace(w, checked=w.checked or "this test") for w in OPERATORS))


def _claims(obj: dict[str, Any]) -> dict[str, Any]:
    """Per pod template (or inline spec): its resourceClaims and its containers' claims."""
    entry = EVERY_KIND.lookup(obj)
    assert entry is not None
    out: dict[str, Any] = {}
    for path, inline in [(p, False) for p in entry.templates] + [(p, True) for p in entry.specs]:
        for steps in expand(obj, path):
            spec = lookup(obj, steps) if inline else lookup(obj, steps).get("spec") or {}
            out[str(steps)] = (
                spec.get("resourceClaims"),
                [(c.get("resources") or {}).get("claims") for c in spec.get("containers") or []],
            )
    return out


class Crds:
    """Installing and removing CRDs on the sandbox, and custom objects round trips."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.extensions = k8s.ApiextensionsV1Api(sandbox.client)
        self.custom = k8s.CustomObjectsApi(sandbox.client)

    def install(self, crd: dict[str, Any]) -> None:
        crd = copy.deepcopy(crd)
        crd["metadata"] = {"name": crd["metadata"]["name"]}
        self.extensions.create_custom_resource_definition(crd)
        name = crd["metadata"]["name"]
        self.sandbox.wait(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in self.extensions.read_custom_resource_definition(name).status.conditions
                or []
            ),
            what=f"CRD {name} to be established",
        )

    def remove(self, crd: dict[str, Any]) -> None:
        name = crd["metadata"]["name"]
        self.extensions.delete_custom_resource_definition(name)

        def gone() -> bool:
            try:
                self.extensions.read_custom_resource_definition(name)
            except ApiException as exc:
                return exc.status == 404
            return False

        self.sandbox.wait(gone, what=f"CRD {name} to be removed")

    def round_trip(self, crd: dict[str, Any], obj: dict[str, Any]) -> Any:
        spec = crd["spec"]
        group, plural = spec["group"], spec["names"]["plural"]
        version = obj["apiVersion"].split("/")[1]
        name = obj["metadata"]["name"]
        if spec["scope"] == "Cluster":
            obj["metadata"].pop("namespace", None)
            self.custom.create_cluster_custom_object(group, version, plural, obj)
            return self.custom.get_cluster_custom_object(group, version, plural, name)
        obj["metadata"]["namespace"] = NAMESPACE
        self.custom.create_namespaced_custom_object(group, version, NAMESPACE, plural, obj)
        return self.custom.get_namespaced_custom_object(group, version, NAMESPACE, plural, name)


@pytest.fixture(scope="module")
def crds(sandbox: Sandbox) -> Crds:
    if not any(n.metadata.name == NAMESPACE for n in sandbox.core.list_namespace().items):
        sandbox.core.create_namespace({"metadata": {"name": NAMESPACE}})
    return Crds(sandbox)


def test_claims_survive_exactly_where_the_schema_says_and_checked_kinds_keep_them(
    crds: Crds,
) -> None:
    objects = [d for d in yaml.safe_load_all(DATA.read_text()) if d]
    kept: dict[str, dict[str, bool]] = {}
    for module, definitions in crd_sets():
        by_kind = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c for c in definitions}
        for crd in definitions:
            crds.install(crd)
        for obj in objects:
            key = (obj["apiVersion"].split("/")[0], obj["kind"])
            if key not in by_kind:
                continue
            crd = by_kind[key]
            version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
            sent = copy.deepcopy(obj)
            sent["apiVersion"] = f"{key[0]}/{version}"
            # A cluster-scoped runtime (ClusterTrainingRuntime) is converted only for the
            # namespace its TrainJobs run in, given as convert's -n.
            (converted,) = convert_objects(
                [sent], policy=Policy.default(), table=EVERY_KIND, crds={}, namespace=NAMESPACE
            ).objects
            claims = _claims(converted)
            assert any(r for r, _ in claims.values()), f"{obj['kind']} was not converted"
            stored = crds.round_trip(crd, copy.deepcopy(converted))
            survived = _claims(stored) == claims
            entry = EVERY_KIND.lookup(sent)
            assert entry is not None
            predicted = pruned_fields(crd, entry) == []
            assert survived == predicted, f"{module} {obj['kind']}: the schema check is wrong"
            kept.setdefault(module, {})[obj["kind"]] = survived
        for crd in definitions:
            crds.remove(crd)
    assert sorted(kept) == sorted(m for m, _ in CRD_SETS)
    assert not any(kept["github.com/kubeflow/training-operator@v1.8.1"].values())
    newest = {m: k for m, k in kept.items() if not m.endswith("@v1.8.1")}
    for module, kinds in newest.items():
        version = module.rsplit("@", 1)[1]
        for kind, survived in kinds.items():
            assert survived, f"{module}: {kind} loses its claim"
            entry = DEFAULT_TABLE.lookup(next(o for o in objects if o["kind"] == kind))
            assert entry is not None and version in entry.checked, (kind, entry)


OLD_SCHEMA_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: trainers.training.example.com}
spec:
  group: training.example.com
  scope: Namespaced
  names: {kind: Trainer, plural: trainers, singular: trainer, listKind: TrainerList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              template:
                type: object
                properties:
                  spec:
                    type: object
                    properties:
                      restartPolicy: {type: string}
                      containers:
                        type: array
                        items:
                          type: object
                          properties:
                            name: {type: string}
                            image: {type: string}
                            resources:
                              type: object
                              properties:
                                limits:
                                  type: object
                                  additionalProperties: {x-kubernetes-int-or-string: true}
"""
TRAINER = {
    "apiVersion": "training.example.com/v1",
    "kind": "Trainer",
    "metadata": {"name": "old"},
    "spec": {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/t:1",
                        "resources": {"limits": {"nvidia.com/gpu": 1}},
                    }
                ]
            }
        }
    },
}


def test_a_crd_from_an_older_pod_spec_prunes_the_claim_and_convert_sees_it(crds: Crds) -> None:
    """Why unchecked kinds are left alone: the apiserver drops what the schema does not know,
    and the converted pod would run with neither the legacy request nor the claim."""
    crd = yaml.safe_load(OLD_SCHEMA_CRD)
    crds.install(crd)
    policy = load_policy(
        "workloads: [{group: training.example.com, kind: Trainer, podTemplates: [spec.template]}]"
    )
    (converted,) = convert_objects([copy.deepcopy(TRAINER)], policy=policy, crds={}).objects
    assert converted["spec"]["template"]["spec"]["resourceClaims"]
    stored = crds.round_trip(crd, converted)
    spec = stored["spec"]["template"]["spec"]
    assert "resourceClaims" not in spec
    assert spec["containers"][0]["resources"] == {}, "neither the GPU request nor the claim"
    with_crd = convert_objects([crd, copy.deepcopy(TRAINER)], policy=policy)
    assert with_crd.changed == [False, False]
    assert any("would prune spec.template.spec.resourceClaims" in w for w in with_crd.warnings)
