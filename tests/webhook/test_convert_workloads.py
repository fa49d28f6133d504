"""`convert` on operators' objects and foreign kinds: kinds are matched by API group and kind,
every pod template of a known kind is converted, foreign kinds pass through (named when they
ask for GPUs), and audit mode never refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main
from gpu_slicer.webhook.convert import convert_objects
from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.workloads import DEFAULT_TABLE, expand, gpu_requests, lookup
from tests.support.crd_cases import pytorch_crd
from tests.support.webhook_cases import validate

DATA = Path(__file__).parent / "data"
OPERATORS = [d for d in yaml.safe_load_all((DATA / "operators.yaml").read_text()) if d]
UNCHECKED = [o for o in OPERATORS if not DEFAULT_TABLE.lookup(o).checked]  # type: ignore[union-attr]
OPT_IN = load_policy(
    "workloads:\n"
    + "".join(
        f"- {{group: {o['apiVersion'].split('/')[0]}, kind: {o['kind']}}}\n" for o in UNCHECKED
    )
)
"""A policy that opts every kind whose CRD the end-to-end tier could not check in."""


def _pods(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template (as a Pod) and inline pod spec the table names in ``obj``."""
    entry = DEFAULT_TABLE.lookup(obj)
    assert entry is not None
    pods = []
    for path in entry.templates:
        for steps in expand(obj, path):
            template = lookup(obj, steps)
            pods.append({"metadata": template.get("metadata") or {}, "spec": template["spec"]})
    for path in entry.specs:
        for steps in expand(obj, path):
            spec = {k: v for k, v in lookup(obj, steps).items() if k in ("containers",)}
            pods.append({"metadata": {}, "spec": {**spec, **_claims(lookup(obj, steps))}})
    return pods


def _claims(spec: dict[str, Any]) -> dict[str, Any]:
    return {"resourceClaims": spec["resourceClaims"]} if "resourceClaims" in spec else {}


@pytest.mark.parametrize("obj", OPERATORS, ids=[f"{o['kind']}" for o in OPERATORS])
def test_every_pod_template_of_an_operators_object_is_converted(obj: dict[str, Any]) -> None:
    result = convert_objects([obj], policy=OPT_IN, namespace="ml")
    assert result.problems == [] and result.changed == [True]
    (out,) = result.objects
    assert list(gpu_requests(out)) == [], "a GPU request was left behind"
    converted = 0
    for pod in _pods(out):
        if pod["spec"].get("resourceClaims"):
            converted += 1
            name = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            assert name in {t["metadata"]["name"] for t in result.templates}
            validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **pod})
    assert converted == sum(1 for p in _pods(obj) if list(gpu_requests(p)))
    assert out["kind"] == obj["kind"] and out["apiVersion"] == obj["apiVersion"]


def test_kinds_whose_crd_was_not_checked_are_left_alone_and_named_until_opted_in() -> None:
    assert sorted(o["kind"] for o in UNCHECKED) == ["Job", "Notebook"]
    result = convert_objects(UNCHECKED, policy=Policy.default())
    assert result.objects == UNCHECKED and result.templates == [] and result.problems == []
    named = {w.split(":")[0] for w in result.warnings}
    assert named == {"Job ml/gang", "Notebook ml/lab"}
    assert all("its CRD was not checked to keep resourceClaims" in w for w in result.warnings)
    assert all(convert_objects([o], policy=OPT_IN).changed == [True] for o in UNCHECKED)


def test_checked_kinds_are_converted_by_default_with_a_note_on_their_crd() -> None:
    checked = [o for o in OPERATORS if o not in UNCHECKED]
    result = convert_objects(checked, policy=Policy.default(), namespace="ml")
    assert all(result.changed)
    pytorch = [w for w in result.warnings if w.startswith("PyTorchJob ml/bert-finetune:")]
    assert any(
        "its CRD must keep the claim (Kubeflow training operator v1.9.0 (v1.8.1 prunes the "
        "claim): checked)" in w
        for w in pytorch
    ), pytorch


def test_the_policy_can_leave_a_checked_kind_alone() -> None:
    ray = next(o for o in OPERATORS if o["kind"] == "RayCluster")
    policy = load_policy("workloads: [{group: ray.io, kind: RayCluster, convert: false}]")
    result = convert_objects([ray], policy=policy)
    assert result.objects == [ray]
    assert "the policy's workloads leave this kind alone" in result.warnings[0]


def test_a_crd_in_the_tree_that_would_prune_the_claim_leaves_its_kind_alone() -> None:
    pytorch = next(o for o in OPERATORS if o["kind"] == "PyTorchJob")
    old = pytorch_crd(["name", "source"])  # the claim entry of a PodSpec before the DRA API
    result = convert_objects([old, pytorch], policy=Policy.default())
    assert result.objects == [old, pytorch]
    assert any(
        "its CustomResourceDefinition in this tree would prune "
        "spec.pytorchReplicaSpecs.*.template.spec.resourceClaims[].resourceClaimTemplateName" in w
        for w in result.warnings
    ), result.warnings
    new = pytorch_crd(["name", "resourceClaimName", "resourceClaimTemplateName"])
    result = convert_objects([new, pytorch], policy=Policy.default())
    assert result.changed == [False, True]
    assert not any("must keep the claim" in w for w in result.warnings)


def test_a_volcano_job_is_not_read_as_a_batch_job() -> None:
    volcano = next(o for o in OPERATORS if o["apiVersion"].startswith("batch.volcano.sh"))
    result = convert_objects([volcano], policy=OPT_IN)
    assert result.problems == []
    worker = result.objects[0]["spec"]["tasks"][1]["template"]["spec"]
    assert worker["resourceClaims"][0]["name"] == "gpu-slicer"
    ps = result.objects[0]["spec"]["tasks"][0]["template"]["spec"]
    assert "resourceClaims" not in ps


FOREIGN = """apiVersion: training.example.com/v1
kind: Trainer
metadata: {name: custom, namespace: ml}
spec:
  runner:
    template:
      spec:
        containers:
        - {name: main, image: registry.example/t:1, resources: {limits: {nvidia.com/gpu: 1}}}
"""


def test_a_foreign_kind_passes_through_and_its_gpu_requests_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "trainer.yaml"
    source.write_text(FOREIGN)
    assert main(["convert", str(source)]) == 0
    out, err = capsys.readouterr()
    assert out == FOREIGN
    assert (
        "Trainer ml/custom: left alone: asks for nvidia.com/gpu at "
        "spec.runner.template.spec.containers[0].resources.limits" in err
    )


def test_the_policy_adds_paths_for_other_kinds() -> None:
    policy = load_policy(
        "workloads:\n- group: training.example.com\n  kind: Trainer\n"
        "  podTemplates: [spec.runner.template]\n"
    )
    result = convert_objects(list(yaml.safe_load_all(FOREIGN)), policy=policy)
    (out,) = result.objects
    assert out["spec"]["runner"]["template"]["spec"]["resourceClaims"][0]["name"] == "gpu-slicer"
    assert result.warnings == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("workloads: {a: 1}", "workloads: must be a list"),
        ("workloads: [{kind: X, podTemplates: [spec.template]}]", None),
        ("workloads: [{group: a/b, kind: X, podTemplates: [x]}]", "workloads[0].group"),
        ("workloads: [{group: a.io, kind: X}]", "give podTemplates or podSpecs"),
        ("workloads: [{group: kubeflow.org, kind: Notebook}]", None),
        ("workloads: [{group: ray.io, kind: RayJob, convert: 'no'}]", "convert: must be true"),
        ("workloads: [{group: a.io, kind: X, podTemplates: ['spec..x']}]", "podTemplates[0]"),
        ("workloads: [{group: a.io, kind: X, podTemplates: [a], extra: 1}]", "extra: unknown"),
    ],
)
def test_policy_workloads_are_checked(text: str, problem: str | None) -> None:
    from gpu_slicer.webhook.errors import PolicyError

    if problem is None:
        (workload,) = load_policy(text).workloads
        assert workload.kind in ("X", "Notebook") and workload.checked == "policy"
        return
    with pytest.raises(PolicyError) as exc:
        load_policy(text)
    assert any(problem in p for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            """apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: ft, namespace: ml}
spec:
  runtimeRef: {name: torch-distributed}
  trainer:
    numNodes: 2
    resourcesPerNode: {limits: {nvidia.com/gpu: 2}}
""",
            "asks for nvidia.com/gpu at spec.trainer.resourcesPerNode.limits: a TrainJob",
        ),
        (
            """apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: eval-, namespace: ml}
spec:
  entrypoint: eval
  templates:
  - name: eval
    container:
      image: registry.example/eval:1
      resources: {limits: {nvidia.com/mig-1g.10gb: 1}}
""",
            "at spec.templates[0].container.resources.limits: Argo templates hold containers",
        ),
    ],
    ids=["TrainJob", "Workflow"],
)
def test_kinds_without_pod_templates_are_left_alone_with_the_reason(
    text: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(text)
    assert main(["convert", str(source)]) == 0
    out, err = capsys.readouterr()
    assert out == text
    assert named in err


def test_audit_mode_prints_what_would_be_denied_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ml}\nspec:\n  containers:\n"
        "  - {name: main, image: x, resources: {limits: {nvidia.com/mig-9g.1tb: 1}}}\n"
    )
    source = tmp_path / "pod.yaml"
    source.write_text(text)
    assert main(["convert", str(source), "--mode", "audit"]) == 0
    out, err = capsys.readouterr()
    assert out == text
    assert "Pod ml/p: gpu-slicer audit: would deny: " in err and "9g.1tb" in err
    assert main(["convert", str(source)]) == 1


def test_operators_objects_in_audit_mode_say_where_each_conversion_would_happen(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["convert", str(DATA / "operators.yaml"), "--mode", "audit"]) == 0
    out, err = capsys.readouterr()
    assert out == (DATA / "operators.yaml").read_text()
    assert "would convert nvidia.com/gpu in pytorch" in err
    assert "spec.pytorchReplicaSpecs.Worker.template" in err
    assert "Notebook ml/lab: left alone: asks for nvidia.com/mig-1g.10gb" in err


SERVING = [d for d in yaml.safe_load_all((DATA / "serving.yaml").read_text()) if d]


@pytest.mark.parametrize("namespace", [None, "ml"])
def test_every_gpu_request_left_after_conversion_is_named_with_its_path(
    namespace: str | None,
) -> None:
    for obj in [*OPERATORS, *SERVING]:
        result = convert_objects([obj], policy=Policy.default(), namespace=namespace)
        (out,) = result.objects
        for place, resource in gpu_requests(out):
            assert any(f"asks for {resource} at {place}:" in w for w in result.warnings), (
                f"{obj['kind']} {obj['metadata']['name']}: {place} is neither converted nor named"
            )


def test_kserve_shortcuts_are_named_and_its_containers_converted() -> None:
    service = next(o for o in SERVING if o["kind"] == "InferenceService")
    result = convert_objects([service], policy=Policy.default())
    (out,) = result.objects
    assert "resourceClaims" in out["spec"]["transformer"]
    assert "resourceClaims" in out["spec"]["explainer"]
    model = [w for w in result.warnings if "spec.predictor.model.resources.limits" in w]
    assert len(model) == 1 and "KServe builds this container from a model" in model[0]
    assert out["spec"]["predictor"]["model"] == service["spec"]["predictor"]["model"]


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("ServingRuntime", "a KServe serving runtime's containers are merged"),
        ("ClusterServingRuntime", "a KServe serving runtime's containers are merged"),
        ("Service", "Knative Serving accepts only the PodSpec fields"),
    ],
)
def test_serving_kinds_without_a_place_for_the_claim_are_named(kind: str, reason: str) -> None:
    obj = next(o for o in SERVING if o["kind"] == kind)
    result = convert_objects([obj], policy=Policy.default())
    assert result.objects == [obj] and result.templates == []
    assert result.warnings and all(reason in w for w in result.warnings)


def test_a_cluster_scoped_runtime_needs_the_namespace_its_pods_run_in() -> None:
    runtime = next(o for o in OPERATORS if o["kind"] == "ClusterTrainingRuntime")
    alone = convert_objects([runtime], policy=Policy.default())
    assert alone.objects == [runtime] and alone.templates == []
    assert "cluster-scoped and its pods run in the namespace of each TrainJob" in alone.warnings[0]
    assert "give -n NAMESPACE" in alone.warnings[0]
    placed = convert_objects([runtime], policy=Policy.default(), namespace="ml")
    assert placed.changed == [True]
    assert [t["metadata"]["namespace"] for t in placed.templates] == ["ml"]
    assert any("written for namespace ml only" in w for w in placed.warnings)
