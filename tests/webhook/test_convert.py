"""`gpu-slicer convert`: manifests of every workload kind, multi-document, YAML and JSON output."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main
from gpu_slicer.webhook.convert import POD_TEMPLATE_PATHS, convert_objects, load_documents
from gpu_slicer.webhook.errors import ManifestError
from gpu_slicer.webhook.policy import Policy
from tests.support.webhook_cases import container, validate

POD_SPEC = {"containers": [container("main", limits={"nvidia.com/mig-1g.10gb": 1})]}
TEMPLATE = {"metadata": {"labels": {"app": "gpu"}}, "spec": POD_SPEC}


def workload(kind: str) -> dict[str, Any]:
    """A valid object of ``kind`` whose pod template asks for a MIG slice (a fresh copy)."""
    return copy.deepcopy(_workload(kind))


def _workload(kind: str) -> dict[str, Any]:
    meta = {"name": kind.lower(), "namespace": "ml"}
    selector = {"matchLabels": {"app": "gpu"}}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": POD_SPEC}
    if kind == "CronJob":
        job = {"template": {**TEMPLATE, "spec": {**POD_SPEC, "restartPolicy": "Never"}}}
        return {
            "apiVersion": "batch/v1",
            "kind": kind,
            "metadata": meta,
            "spec": {"schedule": "@daily", "jobTemplate": {"spec": job}},
        }
    if kind == "Job":
        template = {**TEMPLATE, "spec": {**POD_SPEC, "restartPolicy": "Never"}}
        return {
            "apiVersion": "batch/v1",
            "kind": kind,
            "metadata": meta,
            "spec": {"template": template},
        }
    if kind == "PodTemplate":
        return {"apiVersion": "v1", "kind": kind, "metadata": meta, "template": TEMPLATE}
    if kind == "ReplicationController":
        return {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": meta,
            "spec": {"selector": {"app": "gpu"}, "template": TEMPLATE},
        }
    spec: dict[str, Any] = {"selector": selector, "template": TEMPLATE}
    if kind == "StatefulSet":
        spec["serviceName"] = "gpu"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": spec}


KINDS = ["Pod", *POD_TEMPLATE_PATHS]
PASSTHROUGH = [
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}},
    {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80}]},
    },
    {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "cpu-only"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [container()]},
            },
        },
    },
]


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "Pod":
        return obj["spec"]  # type: ignore[no-any-return]
    node: Any = obj
    for key in POD_TEMPLATE_PATHS[obj["kind"]]:
        node = node[key]
    return node["spec"]  # type: ignore[no-any-return]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("kind", KINDS)
def test_every_workload_kind_is_converted_and_stays_valid(kind: str) -> None:
    result = convert_objects([workload(kind)], policy=Policy.default())
    (obj,) = result.objects
    spec = pod_spec_of(obj)
    assert spec["resourceClaims"][0]["name"] == "gpu-slicer"
    assert spec["containers"][0]["resources"] == {
        "claims": [{"name": "gpu-slicer", "request": "main"}]
    }
    (template,) = result.templates
    assert template["metadata"]["namespace"] == "ml"
    validate(obj)
    validate(template)


def test_objects_without_gpu_requests_pass_through_unchanged() -> None:
    result = convert_objects(PASSTHROUGH, policy=Policy.default())
    assert result.objects == PASSTHROUGH
    assert result.templates == []


def test_the_cli_converts_a_multi_document_stream_with_every_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = [workload(k) for k in KINDS] + PASSTHROUGH
    source = tmp_path / "all.yaml"
    source.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    code, out, err = run(["convert", str(source)], capsys)
    assert code == 0, err
    items = [d for d in yaml.safe_load_all(out) if d is not None]
    assert [d["kind"] for d in items] == [
        *KINDS,
        "ConfigMap",
        "Service",
        "Deployment",
        "ResourceClaimTemplate",
    ]
    assert items[len(KINDS) : -1] == PASSTHROUGH
    template_name = items[-1]["metadata"]["name"]
    for obj in items[: len(KINDS)]:
        assert pod_spec_of(obj)["resourceClaims"][0]["resourceClaimTemplateName"] == template_name
    assert "converted nvidia.com/mig-1g.10gb" in err


def test_the_cli_prints_a_json_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "pod.json"
    source.write_text(json.dumps(workload("Pod")))
    code, out, _err = run(["convert", str(source), "-o", "json"], capsys)
    assert code == 0
    listing = json.loads(out)
    assert listing["kind"] == "List"
    assert [i["kind"] for i in listing["items"]] == ["Pod", "ResourceClaimTemplate"]


def test_the_cli_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(workload("Deployment"))))
    code, out, _err = run(["convert", "-"], capsys)
    assert code == 0
    assert "ResourceClaimTemplate" in out


def test_audit_mode_prints_objects_unchanged_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "d.yaml"
    source.write_text(yaml.safe_dump(workload("Deployment")))
    code, out, err = run(["convert", str(source), "--mode", "audit"], capsys)
    assert code == 0
    assert list(yaml.safe_load_all(out)) == [workload("Deployment")]
    assert "would convert nvidia.com/mig-1g.10gb in main" in err


def test_the_policy_and_namespace_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("namespaces: {embeddings: {gpu: [1g.10gb, 2g.20gb]}}\n")
    pod = workload("Pod")
    del pod["metadata"]["namespace"]
    pod["spec"] = {"containers": [container(limits={"nvidia.com/gpu": 1})]}
    source = tmp_path / "pod.yaml"
    source.write_text(yaml.safe_dump(pod))
    code, out, _err = run(
        ["convert", str(source), "--policy", str(policy), "-n", "embeddings"], capsys
    )
    assert code == 0
    template = list(yaml.safe_load_all(out))[-1]
    assert template["metadata"]["namespace"] == "embeddings"
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert [s["name"] for s in request["firstAvailable"]] == ["1g-10gb", "2g-20gb"]


def test_identical_templates_are_printed_once() -> None:
    result = convert_objects([workload("Pod"), workload("Deployment")], policy=Policy.default())
    assert len(result.templates) == 1


def test_converting_converted_manifests_changes_nothing() -> None:
    first = convert_objects([workload("Deployment")], policy=Policy.default())
    second = convert_objects(first.objects, policy=Policy.default())
    assert second.objects == first.objects
    assert second.templates == []


def test_a_denied_document_is_named_kept_as_it_was_and_the_rest_converted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = workload("Job")
    bad["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/mig-9g.1tb": 1}
    }
    source = tmp_path / "bad.yaml"
    source.write_text(yaml.safe_dump_all([workload("Pod"), bad]))
    code, out, err = run(["convert", str(source)], capsys)
    assert code == 1
    pod, job, template = [d for d in yaml.safe_load_all(out) if d]
    assert pod["spec"]["resourceClaims"][0]["name"] == "gpu-slicer"
    assert job == bad
    assert template["kind"] == "ResourceClaimTemplate"
    assert f"{source}: document 2 (Job ml/job)" in err and "9g.1tb" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "{dir}/missing.yaml"], "cannot read"),
        ([], "cannot read"),
    ],
    ids=["missing policy", "missing input"],
)
def test_unreadable_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    source = tmp_path / "in.yaml"
    if args:
        source.write_text(yaml.safe_dump(workload("Pod")))
    argv = ["convert", str(source if args else tmp_path / "nope.yaml")]
    argv += [a.format(dir=tmp_path) for a in args]
    code, _out, err = run(argv, capsys)
    assert code == 2
    assert message in err


def test_bad_yaml_is_a_manifest_error() -> None:
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_documents("a: [")


def test_a_list_of_objects_is_converted_item_by_item() -> None:
    listing = {"apiVersion": "v1", "kind": "List", "items": [workload("Pod"), PASSTHROUGH[0]]}
    result = convert_objects([listing], policy=Policy.default())
    (out,) = result.objects
    assert out["items"][0]["spec"]["resourceClaims"][0]["name"] == "gpu-slicer"
    assert out["items"][1] == PASSTHROUGH[0]


@pytest.mark.parametrize(
    "obj",
    [
        {"limits": {"nvidia.com/gpu": 1}},
        {"a": [{"b": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}]},
        {"limits": {"nvidia.com/gpu.shared": 1, "cpu": 1}},
        {"limits": {"nvidia.com/gpumem": 1}},
        {'x"\\é': {"limits": {"nvidia.com/gpucores": 1}}},
        {1: {"limits": {"nvidia.com/gpu": 1}}, None: 2, 1.5: 3, False: 4},
        {("a", "b"): 1, "limits": {"nvidia.com/gpu": 1}},  # no JSON for a tuple key
        {"when": __import__("datetime").date(2024, 1, 1), "limits": {"nvidia.com/gpu": 1}},
    ],
)
def test_an_object_left_alone_is_still_searched_for_gpu_requests(obj: dict[str, Any]) -> None:
    """The JSON check that spares the walk of most objects never hides a GPU request."""
    from gpu_slicer.webhook import convert
    from gpu_slicer.webhook.workloads import gpu_requests

    assert list(gpu_requests(obj))
    assert convert._may_name_gpus(obj)
    assert convert._left_alone(obj, "why", ())


def test_an_object_without_gpu_names_is_not_walked() -> None:
    from gpu_slicer.webhook import convert

    assert not convert._may_name_gpus({"limits": {"example.com/gpu": 1}, "nvidia.com": "x"})
    assert convert._left_alone({"limits": {"cpu": 1}}, "why", ()) == []
