"""Every Kustomize target renders, and every object it yields is valid for Kubernetes 1.34-1.37."""

from __future__ import annotations

import json
from collections import Counter

import kubernetes_validate
import pytest

from tests.support.deploy_cases import (
    CLUSTER_SCOPED,
    INSTALLABLE,
    NAMESPACE,
    SCHEMALESS,
    TARGETS,
    VERSIONS,
    Obj,
    find,
    render,
)


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _supported(obj: Obj, version: str) -> bool:
    """Objects that need a newer Kubernetes say so in an annotation; older ones are skipped."""
    minimum = (obj["metadata"].get("annotations") or {}).get(
        "gpu-slicer.io/minimum-kubernetes-version"
    )
    return minimum is None or _version_tuple(version) >= _version_tuple(minimum)


@pytest.mark.parametrize("target", TARGETS)
def test_the_target_renders_with_kubectl_kustomize(target: str) -> None:
    objects = render(target)
    assert objects
    keys = Counter(
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        for o in objects
    )
    assert [k for k, n in keys.items() if n > 1] == []


def _unique_objects() -> dict[str, tuple[str, Obj]]:
    """Every distinct rendered object once (overlays repeat most of base), with one target."""
    unique: dict[str, tuple[str, Obj]] = {}
    for target in TARGETS:
        for obj in render(target):
            unique.setdefault(json.dumps(obj, sort_keys=True), (target, obj))
    return unique


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_validates_strictly_against_the_schema(version: str) -> None:
    checked = 0
    for target, obj in _unique_objects().values():
        if (obj["apiVersion"], obj["kind"]) in SCHEMALESS or not _supported(obj, version):
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"deploy/{target}: {obj['kind']} {obj['metadata']['name']} invalid in "
                f"{version}: {exc.message} at {list(exc.absolute_path)}"
            )
        checked += 1
    assert checked >= 25  # about 30 distinct objects with a schema across the five targets


def test_only_kinds_known_to_lack_a_schema_are_left_to_field_checks() -> None:
    for target, obj in _unique_objects().values():
        key = (obj["apiVersion"], obj["kind"])
        try:
            kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert key in SCHEMALESS, f"deploy/{target}: {key} has no schema and no field checks"
        else:
            assert key not in SCHEMALESS


@pytest.mark.parametrize("target", TARGETS)
def test_namespaced_objects_live_in_gpu_slicer_and_cluster_objects_have_no_namespace(
    target: str,
) -> None:
    for obj in render(target):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{obj['kind']} {obj['metadata']['name']}"
        else:
            assert namespace == NAMESPACE, f"{obj['kind']} {obj['metadata']['name']}"


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_runs_the_one_gpu_slicer_image(target: str) -> None:
    images = {
        c["image"]
        for o in render(target)
        if o["kind"] in ("Deployment", "DaemonSet")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"gpu-slicer:0.2.0"}


@pytest.mark.parametrize("target", INSTALLABLE)
def test_each_installable_overlay_provides_the_serving_certificate_and_ca_bundle(
    target: str,
) -> None:
    objects = render(target)
    config = find(objects, "MutatingWebhookConfiguration", "gpu-slicer")
    annotations = config["metadata"].get("annotations") or {}
    service = find(objects, "Service", "gpu-slicer-webhook")
    providers = [
        "cert-manager.io/inject-ca-from" in annotations,
        annotations.get("service.beta.openshift.io/inject-cabundle") == "true",
        any(
            o["kind"] == "Deployment" and o["metadata"]["name"] == "gpu-slicer-certs"
            for o in objects
        ),
    ]
    assert providers.count(True) == 1
    if providers[1]:
        assert (service["metadata"].get("annotations") or {}).get(
            "service.beta.openshift.io/serving-cert-secret-name"
        ) == "gpu-slicer-webhook-tls"


def test_the_extended_resource_field_needs_a_kubernetes_that_serves_it(
    extended: list[Obj],
) -> None:
    gpu = find(extended, "DeviceClass", "gpu.gpu-slicer.io")
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    minimum = gpu["metadata"]["annotations"]["gpu-slicer.io/minimum-kubernetes-version"]
    assert minimum == "1.36"  # DRAExtendedResource: alpha (off) in 1.34/1.35, beta (on) in 1.36
    assert [v for v in VERSIONS if _supported(gpu, v)] == ["1.36", "1.37"]
    assert "extendedResourceName" not in find(extended, "DeviceClass", "mig.gpu-slicer.io")["spec"]
