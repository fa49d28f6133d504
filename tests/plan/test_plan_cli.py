"""``gpu-slicer plan`` against an in-memory cluster: verdicts, the simulation, and reads only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.cli.main import build_parser
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.plan import cli as plan_cli
from tests.support.scaling_cases import RELEASES, check_note

Obj = dict[str, Any]


def _pod_spec(limits: dict[str, Any] | None, annotations: dict[str, str] | None = None) -> Obj:
    container: Obj = {"name": "main", "image": "registry.example/app:1"}
    if limits:
        container["resources"] = {"limits": limits}
    meta: Obj = {"labels": {"app": "x"}}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": [container]}}


def _deployment(
    ns: str,
    name: str,
    replicas: int,
    limits: dict[str, Any] | None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "x"}},
            "template": _pod_spec(limits, annotations),
        },
    }


def _node(name: str, product: str, count: int, mig: dict[str, int] | None = None) -> Obj:
    capacity: Obj = {"cpu": "64"}
    if mig:
        capacity.update({f"nvidia.com/mig-{p}": str(n) for p, n in mig.items()})
    else:
        capacity["nvidia.com/gpu"] = str(count)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count)},
        },
        "status": {"capacity": capacity},
    }


@pytest.fixture
def cluster() -> InMemoryKubeApi:
    api = InMemoryKubeApi(server_version=(1, 36))
    for ns, label in (("inference", None), ("training", "audit"), ("web", None)):
        meta: Obj = {"name": ns}
        if label:
            meta["labels"] = {"gpu-slicer.io/migration": label}
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-slicer"}})
    api.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gpu-slicer-policy", "namespace": "gpu-slicer"},
            "data": {"policy.yaml": "namespaces:\n  inference:\n    gpu: [1g.10gb, 2g.20gb]\n"},
        }
    )
    # One A100 80GB whole (device plugin), one cut into seven 1g.10gb by mig-parted.
    api.create(_node("gpu-a", "NVIDIA-A100-SXM4-80GB", 1))
    api.create(_node("gpu-b", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 1, {"1g.10gb": 7}))
    api.create(_node("cpu-1", "", 0) | {"metadata": {"name": "cpu-1"}})
    api.create(_deployment("inference", "embed", 6, {"nvidia.com/gpu": 1}))
    api.create(_deployment("inference", "frontend", 2, None))
    api.create(_deployment("training", "bad", 1, None, {"gpu-slicer.io/profiles": "9g.999gb"}))
    api.create(
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "training"},
            "spec": {
                "schedule": "0 1 * * *",
                "jobTemplate": {"spec": {"template": _pod_spec({"nvidia.com/mig-3g.40gb": 1})}},
            },
        }
    )
    owned = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "embed-abc",
            "namespace": "inference",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "embed-1", "uid": "u"}
            ],
        },
        **{k: v for k, v in _pod_spec({"nvidia.com/gpu": 1}).items() if k == "spec"},
    }
    api.create(owned)
    api.calls.clear()
    return api


def _run(api: InMemoryKubeApi, argv: list[str]) -> int:
    args = build_parser().parse_args(["plan", *argv])
    code: int = plan_cli.run_plan(args, api_factory=lambda _: api)
    return code


def test_plan_reports_each_workloads_verdict_with_the_installed_policy(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(cluster, ["-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == "ConfigMap gpu-slicer/gpu-slicer-policy"
    verdicts = {(w["namespace"], w["kind"], w["name"]): w for w in report["workloads"]}
    assert set(verdicts) == {
        ("inference", "Deployment", "embed"),
        ("training", "Deployment", "bad"),
        ("training", "CronJob", "nightly"),
    }
    embed = verdicts[("inference", "Deployment", "embed")]
    assert (embed["outcome"], embed["replicas"]) == ("convert", 6)
    assert embed["requests"] == {"nvidia.com/gpu": 1}
    assert embed["becomes"] == ["1 x 1g.10gb | 1 x 2g.20gb"]  # the namespace's right-sizing
    bad = verdicts[("training", "Deployment", "bad")]
    assert bad["outcome"] == "deny" and "9g.999gb" in bad["detail"]
    assert verdicts[("training", "CronJob", "nightly")]["becomes"] == ["1 x 3g.40gb"]
    assert {n["name"]: n["migrationLabel"] for n in report["namespaces"]} == {
        "inference": "-",
        "training": "audit",
    }
    assert {n["name"] for n in report["gpuNodes"]} == {"gpu-a", "gpu-b"}


def test_plan_simulates_the_converted_workloads_as_today_and_with_gpu_slicer(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(cluster, ["-o", "json", "-n", "inference", "-n", "training"]) == 0
    sim = json.loads(capsys.readouterr().out)["simulation"]
    assert sim["gpus"] == 2
    embed = sim["workloads"]["inference/Deployment/embed"]
    # Today: whole GPUs for whole-GPU pods, and the static layout serves only its 1g.10gb
    # devices. With gpu-slicer both GPUs are cut into slices: every embed pod and the nightly
    # 3g.40gb job fit.
    assert embed["pods"] == 6 and embed["runningToday"] < 6
    assert embed["runningWithGpuSlicer"] == 6
    nightly = sim["workloads"]["training/CronJob/nightly"]
    assert nightly["runningToday"] == 0 and nightly["runningWithGpuSlicer"] == 1
    assert sim["withGpuSlicer"]["running"] > sim["today"]["running"]


def test_plan_only_reads_the_cluster(cluster: InMemoryKubeApi) -> None:
    assert _run(cluster, []) == 0
    verbs = {call.verb for call in cluster.calls}
    assert verbs <= {"get", "list", "server_version"}, verbs


def test_the_table_names_verdicts_reasons_and_the_comparison(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(cluster, []) == 0
    out = capsys.readouterr().out
    assert "namespace inference (gpu-slicer.io/migration: -)" in out
    assert "Deployment/embed" in out and "1 x 1g.10gb | 1 x 2g.20gb" in out
    assert "deny" in out and "9g.999gb" in out
    assert "RUNNING TODAY" in out and "WITH GPU-SLICER" in out
    assert "nothing was changed" in out


def test_a_policy_file_overrides_the_installed_one(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("migFallback: larger\n")
    assert _run(cluster, ["-o", "json", "-n", "inference", "--policy", str(policy)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == str(policy)
    [embed] = [w for w in report["workloads"] if w["name"] == "embed"]
    # No right-sizing rule in this policy: a whole GPU, or (on MIG-mode GPUs) the MIG instance
    # that spans one.
    [chain] = embed["becomes"]
    assert chain.startswith("1 x gpu | 1 x gpu as MIG ") and "7g.80gb" in chain


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "Not_A_Namespace"], "is not a namespace name"),
        (["-n", "missing"], "namespace missing does not exist"),
        (["--policy", "/nonexistent/policy.yaml"], "--policy /nonexistent/policy.yaml does not"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig /nonexistent/kubeconfig"),
    ],
    ids=["bad-name", "missing-namespace", "missing-policy", "missing-kubeconfig"],
)
def test_bad_input_is_one_line_and_exit_2(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert _run(cluster, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-slicer plan: ") and message in err
    assert err.count("\n") == 1


def test_an_invalid_installed_policy_is_bad_input_naming_the_configmap(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    config = cluster.get("v1", "ConfigMap", "gpu-slicer-policy", "gpu-slicer")
    config["data"]["policy.yaml"] = "nvlink: sometimes\n"
    cluster.update(config)
    assert _run(cluster, []) == 2
    assert "nvlink" in capsys.readouterr().err


def test_plan_has_help() -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["plan", "--help"])
    assert exc.value.code == 0


def test_args_namespace_type() -> None:
    args = build_parser().parse_args(["plan", "-n", "a", "-n", "b"])
    assert isinstance(args, argparse.Namespace) and args.namespace == ["a", "b"]


def test_a_kubeconfig_the_client_cannot_parse_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [unclosed\n")
    args = build_parser().parse_args(["plan", "--kubeconfig", str(kubeconfig)])
    assert plan_cli.run_plan(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpu-slicer plan: ") and str(kubeconfig) in err


def _operators() -> list[Obj]:
    """Operators' objects (tests/webhook/data/operators.yaml) in namespace ``training``."""
    import yaml

    data = Path(__file__).parents[1] / "webhook" / "data" / "operators.yaml"
    objects = [d for d in yaml.safe_load_all(data.read_text()) if d]
    for obj in objects:
        obj["metadata"]["namespace"] = "training"
    return [o for o in objects if o["kind"] != "ClusterTrainingRuntime"]


def test_plan_reads_operators_workloads_template_by_template(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    for obj in _operators():
        cluster.create(obj)
    made_by_jobset = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "pretrain-workers-0",
            "namespace": "training",
            "ownerReferences": [
                {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "pretrain"}
            ],
        },
        "spec": {"template": _pod_spec({"nvidia.com/gpu": 4})},
    }
    cluster.create(made_by_jobset)
    assert _run(cluster, ["-n", "training", "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(w["kind"], w["name"], w["template"]): w for w in report["workloads"]}
    worker = rows[("PyTorchJob", "bert-finetune", "spec.pytorchReplicaSpecs.Worker.template")]
    assert (worker["outcome"], worker["replicas"], worker["requests"]) == (
        "convert",
        3,
        {"nvidia.com/gpu": 2},
    )
    ray = rows[("RayCluster", "serve-pool", "spec.workerGroupSpecs[0].template")]
    assert (ray["replicas"], ray["becomes"]) == (4, ["1 x 1g.10gb"])
    volcano = rows[("Job", "gang", "spec.tasks[1].template")]
    assert volcano["outcome"] == "convert"
    assert ("InferenceService", "classifier", "spec.predictor") in rows
    assert not any(name == "pretrain-workers-0" for _, name, _ in rows)
    assert ("Job", "pretrain", "spec.replicatedJobs[0].template.spec.template") not in rows
    assert ("JobSet", "pretrain", "spec.replicatedJobs[0].template.spec.template") in rows
    assert (
        "training/PyTorchJob/bert-finetune/spec.pytorchReplicaSpecs.Worker.template"
        in (report["simulation"]["workloads"])
    )


def test_plan_lists_gpu_quotas_and_the_dra_lines_that_keep_them(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": "training"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "4", "requests.cpu": "64"}},
        }
    )
    cluster.create(_deployment("training", "trainer", 2, {"nvidia.com/gpu": 1}))
    assert _run(cluster, ["-n", "training", "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["quotas"]["training"] == {
        "legacy": {"requests.nvidia.com/gpu": 4},
        "devices": {},
        "keepWith": {
            "gpu.gpu-slicer.io.deviceclass.resource.k8s.io/devices": 4,
            "mig.gpu-slicer.io.deviceclass.resource.k8s.io/devices": 4,
        },
    }
    trainer = next(w for w in report["workloads"] if w["name"] == "trainer")
    assert (
        trainer["outcome"] == "leave"
        and "quota limits requests.nvidia.com/gpu: 4" in (trainer["detail"])
    )
    assert _run(cluster, ["-n", "training"]) == 0
    text = capsys.readouterr().out
    assert "GPU quota: requests.nvidia.com/gpu: 4" in text
    assert "    mig.gpu-slicer.io.deviceclass.resource.k8s.io/devices: 4" in text


def test_a_namespace_right_sized_to_slices_keeps_its_limit_on_the_mig_class(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": "inference"},
            "spec": {"hard": {"requests.nvidia.com/gpu": 6}},
        }
    )
    assert _run(cluster, ["-n", "inference", "-o", "json"]) == 0
    keep = json.loads(capsys.readouterr().out)["quotas"]["inference"]["keepWith"]
    assert keep == {"mig.gpu-slicer.io.deviceclass.resource.k8s.io/devices": 6}


def test_plan_checks_that_installed_crds_keep_the_claim(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.crd_cases import pytorch_crd

    for obj in _operators():
        if obj["kind"] in ("PyTorchJob", "TFJob"):
            cluster.create(obj)
    cluster.create(pytorch_crd(["name", "source"]))  # a PodSpec before the DRA API
    tfjobs = pytorch_crd(["name", "resourceClaimTemplateName"])
    tfjobs["metadata"]["name"] = "tfjobs.kubeflow.org"
    tfjobs["spec"]["names"] = {"kind": "TFJob", "plural": "tfjobs"}
    schema = tfjobs["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema["properties"]["tfReplicaSpecs"] = schema["properties"].pop("pytorchReplicaSpecs")
    cluster.create(tfjobs)
    assert _run(cluster, ["-n", "training", "-o", "json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(
        n.startswith("CRD pytorchjobs.kubeflow.org prunes spec.pytorchReplicaSpecs.*.template")
        and "would run without a GPU" in n
        for n in notes
    ), notes
    assert "CRD tfjobs.kubeflow.org keeps the claim: TFJob objects can be converted in Git" in notes


@pytest.mark.parametrize(("version", "warned"), RELEASES)
def test_plan_says_when_the_release_schedules_counters_with_quadratic_cost(
    cluster: InMemoryKubeApi,
    capsys: pytest.CaptureFixture[str],
    version: tuple[int, int],
    warned: bool,
) -> None:
    cluster.server_version = lambda: version  # type: ignore[method-assign]
    assert _run(cluster, ["-o", "json"]) == 0
    check_note(json.loads(capsys.readouterr().out)["notes"], warned=warned, nodes=2)


def test_plan_says_which_profiles_the_nodes_would_advertise_for_the_converted_workloads(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    # embed's chain asks for 1g.10gb then 2g.20gb (the namespace's right-sizing); nightly for
    # 3g.40gb; the denied workload asks for nothing
    assert _run(cluster, ["-o", "json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    advertised = [n for n in notes if "would advertise" in n]
    assert len(advertised) == 1, notes
    assert advertised[0].startswith(
        "A100-80GB nodes would advertise 1g.10gb, 2g.20gb, 3g.40gb (3 of"
    )
    assert _run(cluster, ["-n", "web", "-o", "json"]) == 0  # nothing converted: nothing to say
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "would advertise" in n]
