"""Translation remembers the claim per GPU shape and the patch per standing: never a stale answer.

Pods that ask for the same devices share the derived claim; pods that also have their maps and
lists in the same places share the patch (a fresh copy each). Whatever order pods of one shape
arrive in, each gets exactly what translating it alone, with nothing remembered, gives.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_slicer.core.identity import CONVERTED_ANNOTATION
from gpu_slicer.webhook import translate
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.remembered import Remembered

LEGACY = "nvidia.com/mig-1g.10gb"
MISSING = object()

claims_values = st.sampled_from([MISSING, None, [], [{"name": "x"}], "not-a-list", {"a": 1}])
sections = st.sampled_from(
    [MISSING, {LEGACY: "1"}, {LEGACY: "1", "cpu": "2"}, {"memory": "1Gi"}, {}]
)
annotations = st.sampled_from([MISSING, None, {}, {"x": "y"}, "not-a-map"])
pod_claims = st.sampled_from([MISSING, None, [], [{"name": "mine", "resourceClaimName": "c"}]])


def _set(target: dict[str, Any], key: str, value: Any) -> None:
    if value is not MISSING:
        target[key] = copy.deepcopy(value)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """One GPU shape (``main`` asks for one 1g.10gb in limits, ``side`` for nothing), its maps
    and lists wherever they may be."""
    resources: dict[str, Any] = {
        "limits": {LEGACY: "1"} | draw(st.sampled_from([{}, {"cpu": "1"}]))
    }
    _set(resources, "requests", draw(sections))
    _set(resources, "claims", draw(claims_values))
    metadata: dict[str, Any] = {"generateName": "p-"}
    _set(metadata, "annotations", draw(annotations))
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "resources": resources},
            {"name": "side", "resources": {"limits": {"cpu": "1"}}},
        ]
    }
    _set(spec, "resourceClaims", draw(pod_claims))
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "spec": spec}
    if draw(st.booleans()):
        pod["metadata"] = metadata
    return pod


def _fields(conversion: translate.Conversion) -> tuple[Any, ...]:
    return (
        conversion.patch,
        conversion.templates,
        conversion.warnings,
        conversion.changes,
        conversion.summary,
    )


def _check_applied(pod: dict[str, Any], conversion: translate.Conversion) -> None:
    """The patch applies to this pod, converts ``main`` and keeps everything else it had."""
    out = jsonpatch.apply_patch(pod, conversion.patch)
    main = out["spec"]["containers"][0]["resources"]
    before = pod["spec"]["containers"][0]["resources"]
    for section in ("limits", "requests"):
        kept = {k: v for k, v in (before.get(section) or {}).items() if k != LEGACY}
        assert main.get(section, {}) == kept
    old_refs = before.get("claims") if isinstance(before.get("claims"), list) else []
    assert main["claims"] == [*old_refs, {"name": "gpu-slicer", "request": "main"}]
    claims = pod["spec"].get("resourceClaims") or []
    assert out["spec"]["resourceClaims"][:-1] == claims
    assert out["spec"]["resourceClaims"][-1]["name"] == "gpu-slicer"
    meta = pod.get("metadata") or {}
    old = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    assert set(out["metadata"]["annotations"]) == {*old, CONVERTED_ANNOTATION}
    assert {k: v for k, v in out["metadata"].items() if k != "annotations"} == {
        k: v for k, v in meta.items() if k != "annotations"
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pods(), min_size=2, max_size=8))
def test_pods_of_one_shape_in_any_order_get_what_each_alone_gets(batch: list[Any]) -> None:
    policy = Policy.default()
    remembered = Remembered()
    warm = [
        translate.translate_pod(p, namespace="ml", policy=policy, remembered=remembered)
        for p in batch
    ]
    for pod, warmed in zip(batch, warm, strict=True):
        _check_applied(pod, warmed)
        alone = translate.translate_pod(pod, namespace="ml", policy=policy)  # nothing kept
        assert _fields(warmed) == _fields(alone)
    assert 0 < len(remembered.derived_claims) <= len(batch)


def test_a_remembered_patch_is_a_fresh_copy_each_time() -> None:
    policy = Policy.default()
    pod = {
        "spec": {"containers": [{"name": "main", "resources": {"limits": {LEGACY: "1"}}}]},
    }
    remembered = Remembered()
    first = translate.translate_pod(pod, namespace="ml", policy=policy, remembered=remembered)
    first.patch[0]["path"] = "/changed"
    first.patch.append({"op": "test"})
    first.templates[0]["spec"]["spec"]["devices"]["requests"].clear()
    again = translate.translate_pod(pod, namespace="ml", policy=policy, remembered=remembered)
    assert len(remembered.patches) == 1
    assert again.patch[0]["path"] == "/spec/containers/0/resources/limits"
    assert len(again.patch) == 4
    assert again.templates[0]["spec"]["spec"]["devices"]["requests"]


def test_a_shape_too_large_to_keep_is_derived_each_time() -> None:
    policy = Policy.default()
    long_name = "c" * (translate.SHAPE_CACHE_TEXT_MAX + 1)
    pod = {"spec": {"containers": [{"name": long_name, "resources": {"limits": {LEGACY: "1"}}}]}}
    remembered = Remembered()
    translate.translate_pod(pod, namespace="ml", policy=policy, remembered=remembered)
    assert len(remembered.derived_claims) == 0


def test_annotation_values_that_are_not_text_are_translated_without_being_kept() -> None:
    # A pod read from YAML (gpu-slicer convert) may carry a number or a list where the API
    # has a string: translated all the same, never kept (a list cannot key the cache at all).
    policy = Policy.default()

    def pod(annotations: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {LEGACY: "1"}}}]},
        }

    remembered = Remembered()
    sized = translate.translate_pod(
        pod({"gpu-slicer.io/gpu-memory": 10 * 2**30}),
        namespace="ml",
        policy=policy,
        remembered=remembered,
    )
    assert sized.templates and len(remembered.derived_claims) == 0
    with pytest.raises(Denied, match="no container named"):
        translate.translate_pod(
            pod({"gpu-slicer.io/containers": ["main"]}),
            namespace="ml",
            policy=policy,
            remembered=remembered,
        )
