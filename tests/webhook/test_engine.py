"""The admission engine, called directly: AdmissionReview in, response out, no HTTP."""

from __future__ import annotations

import base64
import copy
import json
import marshal
import re
from collections.abc import Callable
from typing import Any

import pytest

from gpu_slicer.core.identity import NamespaceMode
from gpu_slicer.webhook.engine import (
    AdmissionEngine,
    ReviewResult,
    TranslationMemo,
    answer_review,
    compact_json,
    limit_warnings,
    pod_key,
    review_key,
)
from gpu_slicer.webhook.errors import BadReview, TemplateError
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.translate import translate_pod
from tests.support.server_fixtures import (
    RecordingTemplates,
    admission_review,
    decoded_patch,
    mig_pod,
    patched,
    plain_pod,
)
from tests.support.webhook_cases import validate

NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def run(
    body: Any,
    *,
    mode: NamespaceMode = "enabled",
    templates: RecordingTemplates | None = None,
    native: frozenset[str] = frozenset(),
    policy: Policy | None = None,
) -> ReviewResult:
    return answer_review(
        body,
        policy=policy or Policy.default(),
        mode_for_namespace=lambda namespace: mode,
        native_extended=native,
        ensure_templates=templates if templates is not None else RecordingTemplates(),
    )


def test_a_converted_pod_gets_a_base64_json_patch_and_its_uid_back() -> None:
    pod = mig_pod("1g.10gb")
    result = run(admission_review(pod, uid="abc-123"))
    response = result.response
    assert result.body["apiVersion"] == "admission.k8s.io/v1"
    assert result.body["kind"] == "AdmissionReview"
    assert response["uid"] == "abc-123"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    after = patched(pod, response)
    container = after["spec"]["containers"][0]
    assert "nvidia.com/mig-1g.10gb" not in container["resources"].get("limits", {})
    assert container["resources"]["claims"] == [{"name": "gpu-slicer", "request": "main"}]
    claim = after["spec"]["resourceClaims"][0]
    assert claim["resourceClaimTemplateName"].startswith("gpu-slicer-")
    assert "gpu-slicer.io/converted" in after["metadata"]["annotations"]
    assert result.outcome == "patched"
    assert result.changes == (("main", "nvidia.com/mig-1g.10gb"),)


def test_the_patched_pod_is_valid_for_every_supported_kubernetes_version() -> None:
    pod = mig_pod("3g.40gb")
    pod["metadata"] = {"name": "trainer-0", "namespace": "ml"}
    after = patched(pod, run(admission_review(pod)).response)
    validate(after)


def test_the_template_the_patch_names_is_ensured_in_the_request_namespace() -> None:
    pod = mig_pod()
    assert "namespace" not in pod["metadata"]  # controllers leave it empty
    templates = RecordingTemplates()
    result = run(admission_review(pod, namespace="team-a"), templates=templates)
    name = patched(pod, result.response)["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    assert templates.calls == [([name], False)]


def test_a_pod_with_nothing_to_convert_gets_no_patch_and_no_patch_type() -> None:
    templates = RecordingTemplates()
    result = run(admission_review(plain_pod()), templates=templates)
    assert result.response == {"uid": result.response["uid"], "allowed": True}
    assert result.outcome == "unchanged"
    assert templates.calls == []


def test_reinvocation_adds_nothing() -> None:
    pod = mig_pod("2g.20gb")
    first = run(admission_review(pod)).response
    again = run(admission_review(patched(pod, first)))
    assert "patch" not in again.response and "patchType" not in again.response
    assert again.outcome == "unchanged"


def test_dry_run_patches_but_never_creates_templates() -> None:
    templates = RecordingTemplates()
    result = run(admission_review(mig_pod(), dry_run=True), templates=templates)
    assert decoded_patch(result.response)
    assert templates.created == []
    assert all(dry for _names, dry in templates.calls)
    assert result.response["auditAnnotations"]["dry-run"] == "templates not created"


def test_audit_mode_returns_warnings_only() -> None:
    templates = RecordingTemplates()
    result = run(admission_review(mig_pod("1g.10gb")), mode="audit", templates=templates)
    response = result.response
    assert "patch" not in response and "patchType" not in response
    assert any("nvidia.com/mig-1g.10gb" in w for w in response["warnings"])
    assert templates.calls == []
    assert result.outcome == "audited" and result.mode == "audit"
    assert result.changes == (("main", "nvidia.com/mig-1g.10gb"),)


def test_a_namespace_that_has_not_opted_in_is_admitted_unchanged() -> None:
    templates = RecordingTemplates()
    result = run(admission_review(mig_pod()), mode="disabled", templates=templates)
    assert result.response == {"uid": result.response["uid"], "allowed": True}
    assert (result.outcome, result.mode) == ("skipped", "disabled")
    assert templates.calls == []


def test_a_bad_annotation_is_denied_with_403_and_a_message() -> None:
    pod = mig_pod(annotations={"gpu-slicer.io/profiles": "9g.1tb"})
    result = run(admission_review(pod))
    response = result.response
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "9g.1tb" in response["status"]["message"]
    assert "patch" not in response
    assert result.outcome == "denied"


def test_audit_mode_admits_what_enabled_would_deny_and_says_why() -> None:
    pod = mig_pod(annotations={"gpu-slicer.io/profiles": "9g.1tb"})
    result = run(admission_review(pod), mode="audit")
    response = result.response
    assert response["allowed"] is True
    assert "patch" not in response and "status" not in response
    assert any("would deny" in w and "9g.1tb" in w for w in response["warnings"])
    assert result.outcome == "would-deny" and result.mode == "audit"


@pytest.mark.parametrize(
    ("operation", "kind", "sub_resource"),
    [
        ("UPDATE", "Pod", None),
        ("DELETE", "Pod", None),
        ("CREATE", "Pod", "binding"),
        ("CREATE", "ConfigMap", None),
    ],
    ids=["update", "delete", "subresource", "other-kind"],
)
def test_only_pod_creation_is_reviewed(operation: str, kind: str, sub_resource: str | None) -> None:
    result = run(
        admission_review(mig_pod(), operation=operation, kind=kind, sub_resource=sub_resource)
    )
    assert result.response == {"uid": result.response["uid"], "allowed": True}
    assert result.outcome == "skipped"


def test_mirror_pods_are_left_alone() -> None:
    pod = mig_pod(annotations={"kubernetes.io/config.mirror": "abc"})
    assert "patch" not in run(admission_review(pod)).response


def test_a_template_failure_propagates_so_failure_policy_decides() -> None:
    templates = RecordingTemplates(fail=TemplateError("apiserver unreachable"))
    with pytest.raises(TemplateError):
        run(admission_review(mig_pod()), templates=templates)


def _review_with(path: list[str | int], value: Any) -> dict[str, Any]:
    body = admission_review(mig_pod())
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "body"),
        (
            {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
            "admissionReviewVersions",
        ),
        (_review_with(["request"], None), "request"),
        (_review_with(["request", "uid"], ""), "request.uid"),
        (_review_with(["request", "uid"], 7), "request.uid"),
        (_review_with(["request", "object"], "pod"), "request.object"),
        (_review_with(["request", "object", "spec"], None), "request.object.spec"),
        (_review_with(["request", "object", "spec", "containers"], {}), "containers"),
        (_review_with(["request", "object", "spec", "containers", 0], 3), "containers[0]"),
        (
            _review_with(["request", "object", "spec", "containers", 0, "resources"], []),
            "resources",
        ),
        (
            _review_with(
                ["request", "object", "spec", "containers", 0, "resources", "limits"],
                {"nvidia.com/gpu": [1]},
            ),
            "limits",
        ),
        (_review_with(["request", "object", "metadata", "labels"], {"a": 1}), "labels"),
        (_review_with(["request", "object", "metadata", "annotations"], "x"), "annotations"),
        (_review_with(["request", "object", "spec", "resourceClaims"], {}), "resourceClaims"),
        (_review_with(["request", "dryRun"], "yes"), "dryRun"),
        (_review_with(["request", "namespace"], None), "namespace"),
    ],
    ids=[
        "not-an-object",
        "v1beta1",
        "no-request",
        "empty-uid",
        "numeric-uid",
        "object-string",
        "no-spec",
        "containers-map",
        "container-number",
        "resources-list",
        "quantity-list",
        "label-number",
        "annotations-string",
        "claims-map",
        "dryrun-string",
        "no-namespace",
    ],
)
def test_a_malformed_review_is_a_bad_review_naming_the_field(body: Any, fragment: str) -> None:
    with pytest.raises(BadReview) as caught:
        run(body)
    assert fragment in caught.value.message


def test_audit_annotation_keys_are_valid_name_parts() -> None:
    modes: tuple[NamespaceMode, ...] = ("enabled", "audit")
    for mode in modes:
        response = run(admission_review(mig_pod()), mode=mode).response
        assert response["auditAnnotations"]
        for key, value in response["auditAnnotations"].items():
            assert NAME_PART.match(key), key
            assert isinstance(value, str) and value


def test_each_warning_stays_under_120_and_all_under_4096_bytes() -> None:
    many = [f"warning {i} " * 10 for i in range(80)]
    warnings = ["ü" * 200, "plain", "x" * 119, "a\nb\tc", *many]
    limited = limit_warnings(warnings)
    assert all(len(w.encode()) < 120 for w in limited)
    assert sum(len(w.encode()) for w in limited) < 4096
    assert limited[0].endswith("...") and limited[0].startswith("ü")
    limited[0].encode("utf-8")  # no split character
    assert limited[3] == "a b c"
    assert "more warnings not shown" in limited[-1]


def test_warnings_carry_no_control_characters_of_any_kind() -> None:
    # The apiserver drops a warning whose text has a Unicode control character (Go's
    # unicode.IsControl: C0, DEL and C1), e.g. from an annotation value quoted in a denial.
    limited = limit_warnings(["bad value 'main\x85x\x9f' and \x7f"])
    assert limited == ["bad value 'main x ' and"]


def test_short_warnings_pass_unchanged() -> None:
    assert limit_warnings(["one", "two"]) == ["one", "two"]


def test_the_engine_reads_its_sources_at_each_review() -> None:
    modes: dict[str, NamespaceMode] = {"ml": "audit"}
    engine = AdmissionEngine(
        policy=Policy.default,
        mode_for_namespace=lambda ns: modes.get(ns, "disabled"),
        native_extended=frozenset,
        templates=RecordingTemplates(),
    )
    assert engine.review(admission_review(mig_pod())).outcome == "audited"
    modes["ml"] = "enabled"
    assert engine.review(admission_review(mig_pod())).outcome == "patched"


def test_native_extended_names_are_deferred_when_the_policy_says_so() -> None:
    pod = copy.deepcopy(mig_pod())
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    result = run(admission_review(pod), native=frozenset({"nvidia.com/gpu"}))
    assert "patch" not in result.response
    converted = run(admission_review(pod))
    assert json.loads(base64.b64decode(converted.response["patch"]))


def enabled_engine(policy: Callable[[], Policy]) -> AdmissionEngine:
    """An engine (with its translation memo) for which every namespace is enabled."""
    return AdmissionEngine(
        policy=policy,
        mode_for_namespace=lambda ns: "enabled",
        native_extended=frozenset,
        templates=RecordingTemplates(),
    )


def test_identical_pods_reuse_the_translation_and_get_the_same_answer() -> None:
    policy = Policy.default()
    engine = enabled_engine(lambda: policy)
    first = engine.review(admission_review(mig_pod(), uid="1"))
    second = engine.review(admission_review(mig_pod(), uid="2"))
    engine.review(admission_review(mig_pod(), uid="3", namespace="other"))
    assert engine.memo.hits == 1 and engine.memo.misses == 2
    assert second.response["uid"] == "2"
    assert second.response["patch"] == first.response["patch"]
    direct = run(admission_review(mig_pod(), uid="2"))
    assert second.body == direct.body


def test_a_new_policy_empties_the_translation_memo() -> None:
    policies = [Policy.default()]
    engine = enabled_engine(lambda: policies[-1])
    engine.review(admission_review(mig_pod()))
    policies.append(Policy.default())  # equal but a new object: a reload happened
    engine.review(admission_review(mig_pod()))
    assert engine.memo.hits == 0 and engine.memo.misses == 2


def test_denials_are_not_remembered() -> None:
    policy = Policy.default()
    engine = enabled_engine(lambda: policy)
    pod = mig_pod(annotations={"gpu-slicer.io/profiles": "9g.1tb"})
    for _ in range(2):
        assert engine.review(admission_review(pod)).outcome == "denied"
    assert engine.memo.hits == 0


# --- translation memo ------------------------------------------------------------------------


def test_identical_pods_are_translated_once_and_get_the_same_answer() -> None:
    memo, policy = TranslationMemo(), Policy.default()
    first = memo.translate(mig_pod("1g.10gb"), namespace="ml", policy=policy)
    second = memo.translate(mig_pod("1g.10gb"), namespace="ml", policy=policy)
    assert (memo.misses, memo.hits) == (1, 1)
    assert second == first == translate_pod(mig_pod("1g.10gb"), namespace="ml", policy=policy)


@pytest.mark.parametrize(
    "values",
    [[1, True, 1.0, "1"], [0, False, 0.0, -0.0, None, "", [], {}], ["a", ["a"], ("a",)]],
    ids=["one", "zero-likes", "containers"],
)
def test_pods_whose_values_differ_only_in_type_have_different_keys(values: list[Any]) -> None:
    keys = set()
    for value in values:
        pod = mig_pod("1g.10gb")
        pod["spec"]["priority"] = value
        keys.add(pod_key(pod))
    assert len(keys) == len(values)


def test_replicas_decoded_from_the_same_review_text_share_one_key() -> None:
    """Keys (marshal format 4) also reflect how a pod's objects are shared; pods decoded from the
    same JSON text are shared alike (repeated keys, small ints, one-letter strings), so every
    replica after the first is answered by the memo."""
    policy = Policy.default()
    engine = enabled_engine(lambda: policy)
    pod = mig_pod("1g.10gb", annotations={"a": "1", "b": "1", "c": "x" * 40, "d": "x" * 40})
    text = json.dumps(admission_review(pod))
    assert len({pod_key(json.loads(text)["request"]["object"]) for _ in range(20)}) == 1
    for uid in range(20):
        body = json.loads(text)
        body["request"]["uid"] = str(uid)
        engine.review(body)
    assert (engine.memo.misses, engine.memo.hits) == (1, 19)


def test_a_key_reads_back_as_the_pod_it_was_made_of() -> None:
    """Equal keys mean equal pods: marshal.loads of a key is one value, the pod itself."""
    pod = json.loads(json.dumps(mig_pod("1g.10gb", annotations={"é": "ü", "n": "1"})))
    pod["spec"]["shared"] = [pod["metadata"]["annotations"]] * 2
    key = pod_key(pod)
    assert isinstance(key, bytes)
    assert marshal.loads(key) == pod


def test_pods_whose_keys_come_in_another_order_are_a_miss() -> None:
    memo, policy = TranslationMemo(), Policy.default()
    pod = mig_pod("1g.10gb")
    reordered = {key: pod[key] for key in reversed(list(pod))}
    memo.translate(pod, namespace="ml", policy=policy)
    memo.translate(reordered, namespace="ml", policy=policy)
    assert (memo.misses, memo.hits) == (2, 0)


def test_a_pod_holding_values_json_cannot_carry_still_gets_an_exact_key() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "Opaque()"

    pod = mig_pod("1g.10gb")
    pod["spec"]["extra"] = Opaque()
    assert pod_key(pod) == repr(pod)
    memo, policy = TranslationMemo(), Policy.default()
    assert memo.translate(pod, namespace="ml", policy=policy).patch


def test_namespace_native_names_and_a_new_policy_are_part_of_what_is_remembered() -> None:
    memo, policy = TranslationMemo(), Policy.default()
    pod = mig_pod("1g.10gb")
    memo.translate(pod, namespace="ml", policy=policy)
    memo.translate(pod, namespace="other", policy=policy)
    memo.translate(pod, namespace="ml", policy=policy, native_extended=frozenset({"x"}))
    memo.translate(pod, namespace="ml", policy=Policy.default())
    memo.translate(pod, namespace="ml", policy=policy)
    assert (memo.misses, memo.hits) == (5, 0)


def test_the_memo_is_bounded_by_bytes_not_entries() -> None:
    """300 distinct 100 KiB pods were 300 entries (30 MB) before; large pods are not kept and
    the stored keys never add up past the byte budget."""
    memo, policy = TranslationMemo(max_bytes=256 * 1024), Policy.default()
    smalls = []
    for index in range(300):
        big = mig_pod("1g.10gb", annotations={"blob": f"{index}-" + "x" * 100_000})
        assert memo.translate(big, namespace="ml", policy=policy).patch
        smalls.append(mig_pod("1g.10gb", annotations={"build": "y" * 2000 + str(index)}))
        memo.translate(smalls[-1], namespace="ml", policy=policy)
        assert memo.bytes <= memo.max_bytes
    assert 0 < len(memo) < 300
    hits = memo.hits
    memo.translate(big, namespace="ml", policy=policy)  # over the entry limit: never kept
    memo.translate(smalls[0], namespace="ml", policy=policy)  # gone to keep the byte budget
    assert memo.hits == hits
    memo.translate(smalls[-1], namespace="ml", policy=policy)  # the latest is kept
    assert memo.hits == hits + 1


# --- the review's bytes as the memo's key ------------------------------------------------------


def _raw(pod: dict[str, Any], uid: str, namespace: str = "ml") -> tuple[Any, bytes]:
    raw = json.dumps(admission_review(pod, uid=uid, namespace=namespace)).encode()
    return json.loads(raw), raw


def test_replicas_sent_as_bytes_are_answered_from_the_memo_with_their_own_uid() -> None:
    policy = Policy.default()
    engine = enabled_engine(lambda: policy)
    answers = [engine.review(*_raw(mig_pod(), f"0f3c-{i}")) for i in range(5)]
    assert (engine.memo.misses, engine.memo.hits) == (1, 4)
    assert [a.response["uid"] for a in answers] == [f"0f3c-{i}" for i in range(5)]
    direct = run(admission_review(mig_pod(), uid="0f3c-4"))
    assert answers[-1].body == direct.body


def test_reviews_that_differ_anywhere_but_the_uid_have_different_keys() -> None:
    body, raw = _raw(mig_pod(), "u-1")
    key = review_key(body, raw)
    assert key is not None and key == review_key(*_raw(mig_pod(), "u-2-longer"))
    for other in (
        _raw(mig_pod("2g.20gb"), "u-1"),
        _raw(mig_pod(), "u-1", namespace="other"),
        _raw(mig_pod(annotations={"note": "u-1"}), "u-1"),
    ):
        assert review_key(*other) != key


def test_a_uid_that_is_also_a_value_in_the_pod_still_keys_exactly() -> None:
    # The first match is the pod's label, not the uid: the cut falls there in both reviews, and
    # the real uids that follow differ, so the keys differ; equal uids give equal reviews.
    first = _raw(mig_pod(labels={"a": "same"}), "same")
    second = _raw(mig_pod(labels={"a": "other"}), "other")
    assert review_key(*first) != review_key(*second)
    assert review_key(*first) == review_key(*_raw(mig_pod(labels={"a": "same"}), "same"))


@pytest.mark.parametrize("uid", ['we"ird', "back\\slash", "é", "", "x" * 200])
def test_a_uid_that_is_not_plain_falls_back_to_the_pod_key(uid: str) -> None:
    body, raw = _raw(mig_pod(), "plain")
    body["request"]["uid"] = uid
    assert review_key(body, raw) is None


@pytest.mark.parametrize(
    "value",
    [
        {"uid": "é-ü\u2028", "allowed": True, "status": {"code": 403, "message": 'a "b"\n\t\\'}},
        ["\x00\x1f\x7f", {"k": [None, False, 0, -1, 2**40]}],
        {"warnings": ["gpu-slicer audit: would convert nvidia.com/gpu in main"], "x": {}},
    ],
)
def test_answers_are_the_bytes_the_standard_library_would_write(value: Any) -> None:
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert compact_json(value) == expected
