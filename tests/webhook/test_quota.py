"""Legacy GPU quotas across the move to DRA: a converted pod never escapes its namespace's quota.

How Kubernetes counts a claim per DeviceClass, the quota lines read from ResourceQuotas (also
through the watch-backed cache), and the webhook's answer in a namespace that limits legacy
GPUs with and without matching DRA lines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_slicer.kube.api import Obj
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.webhook.caches import NamespaceQuotas
from gpu_slicer.webhook.engine import answer_review
from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.quota import NO_QUOTA, NamespaceQuota, device_counts, read_quotas
from gpu_slicer.webhook.translate import translate_pod
from tests.support.server_fixtures import RecordingTemplates, admission_review
from tests.support.webhook_cases import build_pod, container

GPU_CLASS = "gpu.gpu-slicer.io.deviceclass.resource.k8s.io/devices"
MIG_CLASS = "mig.gpu-slicer.io.deviceclass.resource.k8s.io/devices"


def quota(hard: dict[str, Any], name: str = "gpus", namespace: str = "ml") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": hard},
    }


def test_a_first_available_request_counts_its_largest_alternative_per_class() -> None:
    one_gpu = translate_pod(
        build_pod(container(limits={"nvidia.com/gpu": 2})), namespace="ml", policy=Policy.default()
    )
    # gpu-nvlink, gpu (2 each, class gpu), then the spanning MIG instances (2 each, class mig)
    assert device_counts(one_gpu.templates[0]) == {"gpu.gpu-slicer.io": 2, "mig.gpu-slicer.io": 2}
    two = translate_pod(
        build_pod(
            container("a", limits={"nvidia.com/mig-1g.10gb": 1}),
            container("b", limits={"nvidia.com/mig-2g.20gb": 3}),
        ),
        namespace="ml",
        policy=Policy.default(),
    )
    assert device_counts(two.templates[0]) == {"mig.gpu-slicer.io": 4}


def test_the_gpu_lines_of_every_quota_are_read_and_the_lowest_wins() -> None:
    read = read_quotas(
        [
            quota({"requests.nvidia.com/gpu": "4", "requests.cpu": "10", MIG_CLASS: 7}),
            quota({"requests.nvidia.com/gpu": 2, "requests.nvidia.com/mig-1g.10gb": "3"}, "b"),
            quota({"pods": "10"}, "other"),
        ]
    )
    assert dict(read.legacy) == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 3}
    assert dict(read.devices) == {"mig.gpu-slicer.io": 7}
    assert read_quotas([quota({"pods": 3})]) == NO_QUOTA


def _review(
    quotas: NamespaceQuota, *, mode: str = "enabled", policy: Policy | None = None
) -> dict[str, Any]:
    result = answer_review(
        admission_review(build_pod(container(limits={"nvidia.com/gpu": 1}))),
        policy=policy or Policy.default(),
        mode_for_namespace=lambda namespace: mode,  # type: ignore[arg-type,return-value]
        native_extended=frozenset(),
        ensure_templates=RecordingTemplates(),
        quota_for_namespace=lambda namespace: quotas,
    )
    return result.response


def test_a_pod_whose_legacy_gpus_a_quota_limits_is_left_unconverted_and_told_why() -> None:
    response = _review(read_quotas([quota({"requests.nvidia.com/gpu": 1})]))
    assert response["allowed"] is True and "patch" not in response
    (warning,) = response["warnings"]
    assert warning.startswith("not converted: quota limits requests.nvidia.com/gpu: 1 but not")
    assert "class gpu.gpu-slicer.io, mig.gpu-slicer.io devices" in warning


def test_with_dra_lines_for_every_class_of_the_claim_the_pod_is_converted() -> None:
    only_gpu = read_quotas([quota({"requests.nvidia.com/gpu": 1, GPU_CLASS: 1})])
    assert "patch" not in _review(only_gpu)  # the spanning MIG alternative is not limited
    both = read_quotas([quota({"requests.nvidia.com/gpu": 1, GPU_CLASS: 1, MIG_CLASS: 1})])
    assert "patch" in _review(both)


def test_a_namespace_without_gpu_quota_converts_as_before() -> None:
    assert "patch" in _review(read_quotas([quota({"requests.cpu": 4})]))


def test_the_policy_can_deny_instead_and_audit_only_warns() -> None:
    limited = read_quotas([quota({"requests.nvidia.com/gpu": 1})])
    deny = load_policy("quotaWithoutDeviceLimit: deny")
    denied = _review(limited, policy=deny)
    assert (
        denied["allowed"] is False and "requests.nvidia.com/gpu: 1" in denied["status"]["message"]
    )
    audited = _review(limited, mode="audit")
    assert audited["allowed"] is True
    assert audited["warnings"][0].startswith("gpu-slicer audit: would not convert: ")
    assert _review(limited, mode="audit", policy=deny)["allowed"] is True


@pytest.fixture
def api() -> Iterator[InMemoryKubeApi]:
    memory = InMemoryKubeApi()
    yield memory
    memory.close()


def _eventually(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_the_cache_follows_quotas_per_namespace(api: InMemoryKubeApi) -> None:
    api.create(quota({"requests.nvidia.com/gpu": 4}))
    api.create(quota({"requests.nvidia.com/gpu": 8}, namespace="other"))
    quotas = NamespaceQuotas(api)
    quotas.start()
    try:
        _eventually(lambda: quotas.synced)
        assert dict(quotas.quota("ml").legacy) == {"nvidia.com/gpu": 4}
        api.create(quota({GPU_CLASS: 4}, name="dra"))
        _eventually(lambda: dict(quotas.quota("ml").devices) == {"gpu.gpu-slicer.io": 4})
        api.delete("v1", "ResourceQuota", "gpus", "ml")
        _eventually(lambda: not quotas.quota("ml").legacy)
        assert quotas.quota("web") == NO_QUOTA
        assert dict(quotas.quota("other").legacy) == {"nvidia.com/gpu": 8}
    finally:
        quotas.stop()


def test_convert_leaves_pods_whose_quota_in_the_tree_would_be_escaped(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_slicer.cli.main import main

    (tmp_path / "quota.yaml").write_text(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: gpus, namespace: ml}\n"
        "spec:\n  hard: {requests.nvidia.com/gpu: '1'}\n"
    )
    job = (
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: train, namespace: ml}\nspec:\n"
        "  template:\n    spec:\n      restartPolicy: Never\n      containers:\n"
        "      - {name: main, image: x, resources: {limits: {nvidia.com/gpu: 1}}}\n"
    )
    (tmp_path / "job.yaml").write_text(job)
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path), "--out-dir", str(out)]) == 0
    assert (out / "job.yaml").read_text() == job
    assert "Job ml/train: not converted: quota limits requests.nvidia.com/gpu: 1" in (
        capsys.readouterr().err
    )
    (tmp_path / "quota.yaml").write_text(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: gpus, namespace: ml}\n"
        f"spec:\n  hard: {{requests.nvidia.com/gpu: '1', {GPU_CLASS}: 1, {MIG_CLASS}: 1}}\n"
    )
    assert main(["convert", str(tmp_path), "--out-dir", str(tmp_path / "out2")]) == 0
    assert "resourceClaims" in (tmp_path / "out2" / "job.yaml").read_text()
