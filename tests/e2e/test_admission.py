"""Who is converted and who is left alone, through the real apiserver's admission chain."""

from __future__ import annotations

import time

from tests.support.e2e_sandbox import AUDIT, ENABLED, PLAIN, Sandbox, pod_manifest

LIMITS = {"nvidia.com/mig-1g.10gb": "1"}


def _untouched(pod: dict[str, object]) -> bool:
    spec = pod["spec"]
    container = spec["containers"][0]  # type: ignore[index]
    return (
        not spec.get("resourceClaims")  # type: ignore[union-attr]
        and container["resources"]["limits"] == LIMITS
        and "gpu-slicer.io/converted" not in (pod["metadata"].get("annotations") or {})
    )  # type: ignore[union-attr]


def test_an_audit_namespace_admits_the_pod_unchanged_with_a_warning(sandbox: Sandbox) -> None:
    pod, warnings = sandbox.create_pod(AUDIT, pod_manifest("audited", limits=LIMITS))
    assert _untouched(pod)
    assert any("gpu-slicer" in w for w in warnings), warnings
    sandbox.core.delete_namespaced_pod("audited", AUDIT, grace_period_seconds=0)


def test_a_namespace_that_did_not_opt_in_is_not_converted(sandbox: Sandbox) -> None:
    pod, warnings = sandbox.create_pod(PLAIN, pod_manifest("plain", limits=LIMITS))
    assert _untouched(pod)
    assert not warnings
    sandbox.core.delete_namespaced_pod("plain", PLAIN, grace_period_seconds=0)


def test_a_pod_with_the_skip_label_is_not_converted(sandbox: Sandbox) -> None:
    pod, _ = sandbox.create_pod(
        ENABLED, pod_manifest("skipped", limits=LIMITS, labels={"gpu-slicer.io/skip": "true"})
    )
    assert _untouched(pod)
    sandbox.core.delete_namespaced_pod("skipped", ENABLED, grace_period_seconds=0)


def test_a_pod_of_another_sharing_model_is_left_alone_with_a_warning(sandbox: Sandbox) -> None:
    hami = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"}  # the canonical form
    pod, warnings = sandbox.create_pod(ENABLED, pod_manifest("hami", limits=hami))
    assert not pod["spec"].get("resourceClaims")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == hami
    assert any("another GPU sharing model: nvidia.com/gpumem in main" in w for w in warnings)
    sandbox.core.delete_namespaced_pod("hami", ENABLED, grace_period_seconds=0)


def test_a_converted_pod_names_a_template_that_exists(sandbox: Sandbox) -> None:
    pod, _ = sandbox.create_pod(ENABLED, pod_manifest("converted", limits=LIMITS))
    [claim_ref] = pod["spec"]["resourceClaims"]
    template = sandbox.resource.read_namespaced_resource_claim_template(
        claim_ref["resourceClaimTemplateName"], ENABLED
    )
    assert template.metadata.labels["app.kubernetes.io/managed-by"] == "gpu-slicer"
    assert "nvidia.com/mig-1g.10gb" not in (
        pod["spec"]["containers"][0]["resources"].get("limits") or {}
    )
    sandbox.core.delete_namespaced_pod("converted", ENABLED, grace_period_seconds=0)


def test_with_the_webhook_down_the_failure_policy_admits_pods_unconverted(
    sandbox: Sandbox,
) -> None:
    sandbox.pause("webhook")
    try:
        sandbox.wait(lambda: _webhook_down(sandbox), what="the webhook to stop")
        started = time.monotonic()
        pod, _ = sandbox.create_pod(ENABLED, pod_manifest("unconverted", limits=LIMITS))
        assert _untouched(pod)
        assert time.monotonic() - started < 30
        sandbox.core.delete_namespaced_pod("unconverted", ENABLED, grace_period_seconds=0)
    finally:
        sandbox.resume("webhook")
    sandbox.wait(lambda: _converts(sandbox), what="the webhook back", timeout_s=90)


def _webhook_down(box: Sandbox) -> bool:
    import ssl
    import urllib.request

    context = ssl._create_unverified_context()
    try:
        urllib.request.urlopen(f"{box.ready['webhook']}/healthz", context=context, timeout=1)
    except OSError:
        return True
    return False


def _converts(box: Sandbox) -> bool:
    created = box.core.create_namespaced_pod(
        ENABLED, pod_manifest("probe", limits=LIMITS), dry_run="All"
    )
    return bool(created.spec.resource_claims)
