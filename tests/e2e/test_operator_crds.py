"""Operators' CRDs as their projects ship them, on the real apiserver: a converted object is
applied and read back, and its claims must survive the CRD's pruning. Kinds whose claims survive
are the kinds `convert` converts by default (webhook.workloads ``checked``); a CRD whose schema
predates ``resourceClaims`` shows what pruning does to the others."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.support.e2e_sandbox import Sandbox
from tests.support.operator_crds import MODULES, crd_documents
from webhook.convert import convert_objects
from webhook.policy import Policy
from webhook.workloads import DEFAULT_TABLE, OPERATORS, WorkloadTable, expand, lookup

NAMESPACE = "e2e-operators"
DATA = Path(__file__).parents[1] / "webhook" / "data" / "operators.yaml"
EVERY_KIND = WorkloadTable(tuple(replace(w, checked=w.checked or "this test") for w in OPERATORS))


def _claims(obj: dict[str, Any], table: WorkloadTable) -> dict[str, Any]:
    """Per pod template (or inline spec): its resourceClaims and its containers' claims."""
    entry = table.lookup(obj)
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


def _install(sandbox: Sandbox, crds: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """Creates the CRDs, waits until each is served; (group, kind) -> (version, plural)."""
    extensions = k8s.ApiextensionsV1Api(sandbox.client)
    served: dict[tuple[str, str], Any] = {}
    for crd in crds:
        crd = copy.deepcopy(crd)
        crd["metadata"].pop("annotations", None)
        extensions.create_custom_resource_definition(crd)
        name = crd["metadata"]["name"]
        sandbox.wait(
            lambda name=name: any(
                c.type == "Established" and c.status == "True"
                for c in extensions.read_custom_resource_definition(name).status.conditions or []
            ),
            what=f"CRD {name} to be established",
        )
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("storage"))
        served[(spec["group"], spec["names"]["kind"])] = (version, spec["names"]["plural"])
    return served


def _round_trip(sandbox: Sandbox, obj: dict[str, Any], version: str, plural: str) -> Any:
    group = obj["apiVersion"].split("/")[0]
    custom = k8s.CustomObjectsApi(sandbox.client)
    custom.create_namespaced_custom_object(group, version, NAMESPACE, plural, obj)
    return custom.get_namespaced_custom_object(
        group, version, NAMESPACE, plural, obj["metadata"]["name"]
    )


@pytest.fixture(scope="module")
def operators(sandbox: Sandbox) -> dict[tuple[str, str], Any]:
    crds = crd_documents()
    sandbox.core.create_namespace({"metadata": {"name": NAMESPACE}})
    return _install(sandbox, crds)


def test_exactly_the_kinds_whose_claims_survive_their_shipped_crd_are_converted(
    sandbox: Sandbox, operators: dict[tuple[str, str], Any]
) -> None:
    kept: dict[str, bool] = {}
    for obj in (d for d in yaml.safe_load_all(DATA.read_text()) if d):
        key = (obj["apiVersion"].split("/")[0], obj["kind"])
        if key not in operators:
            continue
        version, plural = operators[key]
        obj["apiVersion"] = f"{key[0]}/{version}"
        obj["metadata"]["namespace"] = NAMESPACE
        (converted,) = convert_objects([obj], policy=Policy.default(), table=EVERY_KIND).objects
        sent = _claims(converted, EVERY_KIND)
        assert any(r for r, _ in sent.values()), f"{obj['kind']} was not converted"
        stored = _round_trip(sandbox, converted, version, plural)
        kept[obj["kind"]] = _claims(stored, EVERY_KIND) == sent
    assert sorted(kept) == [
        "MPIJob",
        "PaddleJob",
        "PyTorchJob",
        "RayCluster",
        "RayJob",
        "RayService",
        "TFJob",
        "XGBoostJob",
    ], sorted(MODULES)
    marked = {kind: bool(DEFAULT_TABLE.lookup(_of(kind)).checked) for kind in kept}  # type: ignore[union-attr]
    assert marked == kept, f"claims kept per kind {kept}; the table converts {marked}"


def _of(kind: str) -> dict[str, str]:
    group = "ray.io" if kind.startswith("Ray") else "kubeflow.org"
    return {"apiVersion": f"{group}/v1", "kind": kind}


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


def test_a_crd_from_an_older_pod_spec_prunes_the_claims(sandbox: Sandbox) -> None:
    """Why unchecked kinds are left alone: the apiserver drops what the schema does not know,
    and the converted pod would run with neither the legacy request nor the claim."""
    if not _namespace_exists(sandbox):
        sandbox.core.create_namespace({"metadata": {"name": NAMESPACE}})
    served = _install(sandbox, [yaml.safe_load(OLD_SCHEMA_CRD)])
    trainer = {
        "apiVersion": "training.example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "old", "namespace": NAMESPACE},
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
    from webhook.policy import load_policy

    policy = load_policy(
        "workloads: [{group: training.example.com, kind: Trainer, podTemplates: [spec.template]}]"
    )
    (converted,) = convert_objects([trainer], policy=policy).objects
    assert converted["spec"]["template"]["spec"]["resourceClaims"]
    version, plural = served[("training.example.com", "Trainer")]
    stored = _round_trip(sandbox, converted, version, plural)
    spec = stored["spec"]["template"]["spec"]
    assert "resourceClaims" not in spec
    assert spec["containers"][0]["resources"] == {}, "neither the GPU request nor the claim"


def _namespace_exists(sandbox: Sandbox) -> bool:
    return any(n.metadata.name == NAMESPACE for n in sandbox.core.list_namespace().items)
