"""The admission engine: an AdmissionReview (admission.k8s.io/v1) in, the response out.

No HTTP here: the Flask layer only checks the content type and decodes JSON, then hands the
decoded body to :meth:`AdmissionEngine.review`. The engine

- refuses a malformed review with :class:`BadReview` (the server answers HTTP 400);
- admits unchanged anything that is not a Pod CREATE, mirror pods, and pods in namespaces whose
  mode (from the namespace cache) is ``disabled``: the webhook configuration's selectors are the
  first line of defence, this is the second;
- translates the pod (``webhook.translate``, pure); a :class:`Denied` becomes
  ``allowed: false`` with status code 403 and the message;
- in ``audit`` mode returns only warnings (one per conversion it would have made);
- in ``enabled`` mode makes sure the claim templates exist (never on dryRun; a
  :class:`TemplateError` propagates and the server answers HTTP 500 so failurePolicy decides)
  and returns the JSON Patch, base64-encoded, with ``patchType: JSONPatch``, only when non-empty;
- echoes the request's uid; keeps each warning under 120 characters and all of them under 4096
  (the apiserver's limits for ``Warning`` headers); adds audit annotations.

Reinvocation adds nothing because translation of an already-converted pod is an empty patch.
"""

from __future__ import annotations

import base64
import functools
import marshal
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from gpu_slicer.core.identity import NamespaceMode
from gpu_slicer.webhook.errors import BadReview, Denied
from gpu_slicer.webhook.locks import memory_lock
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.quota import NO_QUOTA, NamespaceQuota, conversion_escape
from gpu_slicer.webhook.remembered import Remembered
from gpu_slicer.webhook.templates import TemplateEnsurer
from gpu_slicer.webhook.translate import (
    WARNING_MAX_BYTES,
    Conversion,
    audit_warnings,
    translate_pod,
)

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
WARNINGS_TOTAL_MAX_BYTES = 4095
AUDIT_VALUE_MAX = 1024
DENIAL_MAX_BYTES = 1024
"""A denial's ``status.message`` (it may quote pod fields of any size) stays under 1 KiB."""

Outcome = Literal["patched", "unchanged", "audited", "would-deny", "denied", "skipped"]


class Status(TypedDict):
    status: str
    code: int
    message: str
    reason: NotRequired[str]


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    patchType: NotRequired[str]
    patch: NotRequired[str]
    status: NotRequired[Status]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReviewOut(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponse


@dataclass(frozen=True)
class ReviewResult:
    """The response body plus what the server counts in its metrics."""

    body: AdmissionReviewOut
    outcome: Outcome
    mode: NamespaceMode | Literal["n/a"]
    changes: tuple[tuple[str, str], ...] = ()
    deferred: tuple[tuple[str, str], ...] = ()
    """(container, resource) a DeviceClass serves, left to the scheduler (nativeExtendedResources
    defer); counted in metrics, since such pods are otherwise admitted without a trace."""

    @property
    def response(self) -> AdmissionResponse:
        return self.body["response"]


@dataclass(frozen=True)
class PodRequest:
    """The parts of an AdmissionRequest the engine uses, checked."""

    uid: str
    namespace: str
    pod: dict[str, Any]
    dry_run: bool


# ----------------------------------------------------------------------------- parsing


def _expect_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReview(f"{where}: expected a JSON object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def request_of(body: Any) -> dict[str, Any]:
    """The ``request`` of a v1 AdmissionReview; BadReview when the envelope is wrong."""
    review = _expect_dict(body, "body")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != KIND:
        raise BadReview(
            f"expected apiVersion {API_VERSION} and kind {KIND}, got "
            f"{review.get('apiVersion')!r} and {review.get('kind')!r}; set "
            "admissionReviewVersions: [v1] in the webhook configuration"
        )
    request = _expect_dict(review.get("request"), "request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid: expected a non-empty string")
    return request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind")
    resource = request.get("resource")
    is_pod = (
        isinstance(kind, dict)
        and kind.get("group", "") == ""
        and kind.get("kind") == "Pod"
        and kind.get("version") == "v1"
    ) or (
        isinstance(resource, dict)
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
    )
    return bool(is_pod and not request.get("subResource") and request.get("operation") == "CREATE")


def _check_string_map(value: Any, where: str) -> None:
    if value is None:
        return
    mapping = _expect_dict(value, where)
    for key, item in mapping.items():
        if not isinstance(item, str):
            raise BadReview(f"{where}[{key!r}]: expected a string, got {_kind(item)}")


def _check_containers(spec: Mapping[str, Any], field: str, *, required: bool) -> None:
    items = spec.get(field)
    if items is None and not required:
        return
    if not isinstance(items, list):
        raise BadReview(f"request.object.spec.{field}: expected a list, got {_kind(items)}")
    for index, container in enumerate(items):
        # Every review passes here: the paths in messages are only spelled out for a failure.
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            where = f"request.object.spec.{field}[{index}]"
            _expect_dict(container, where)
            raise BadReview(f"{where}.name: expected a string")
        resources = container.get("resources")
        problem = None if resources is None else _resources_problem(resources)
        if problem:
            raise BadReview(f"request.object.spec.{field}[{index}].resources{problem}")


_QUANTITY_TYPES = (str, int, float)
"""A tuple, not ``str | int | float``: the union would be built again at every check, and every
quantity of every container is checked on every review."""


def _resources_problem(resources: Any) -> str | None:
    """What is wrong with a container's ``resources``, as the path below it and the problem
    (``.limits['x']: expected a quantity, got a list``); None when the API would take it."""
    if not isinstance(resources, dict):
        return f": expected a JSON object, got {_kind(resources)}"
    for section in ("requests", "limits"):
        values = resources.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            return f".{section}: expected a JSON object, got {_kind(values)}"
        for key, quantity in values.items():
            if not isinstance(quantity, _QUANTITY_TYPES) or isinstance(quantity, bool):
                return f".{section}[{key!r}]: expected a quantity, got {_kind(quantity)}"
    claims = resources.get("claims")
    if claims is not None and not (
        isinstance(claims, list) and all(isinstance(c, dict) for c in claims)
    ):
        return ".claims: expected a list of objects"
    return None


def pod_request(request: Mapping[str, Any]) -> PodRequest:
    """Checks a Pod CREATE request's object the way the apiserver would have shaped it."""
    pod = _expect_dict(request.get("object"), "request.object")
    meta = _expect_dict(pod.get("metadata", {}), "request.object.metadata")
    _check_string_map(meta.get("labels"), "request.object.metadata.labels")
    _check_string_map(meta.get("annotations"), "request.object.metadata.annotations")
    spec = _expect_dict(pod.get("spec"), "request.object.spec")
    _check_containers(spec, "containers", required=True)
    _check_containers(spec, "initContainers", required=False)
    claims = spec.get("resourceClaims")
    if claims is not None and not (
        isinstance(claims, list) and all(isinstance(c, dict) for c in claims)
    ):
        raise BadReview("request.object.spec.resourceClaims: expected a list of objects")
    namespace = request.get("namespace") or meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise BadReview("request.namespace: a Pod CREATE must name its namespace")
    dry_run = request.get("dryRun", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise BadReview(f"request.dryRun: expected a boolean, got {_kind(dry_run)}")
    return PodRequest(uid=str(request["uid"]), namespace=namespace, pod=pod, dry_run=dry_run)


# ----------------------------------------------------------------------------- limits


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0, DEL and C1: Go's unicode.IsControl, which the apiserver refuses in warnings."""


def _clean(text: str) -> str:
    """One header-safe line: control characters become spaces."""
    if text.isascii() and text.isprintable():
        return text.strip()
    return _CONTROL.sub(" ", text).strip()


def _cut(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    # errors="ignore" drops a multi-byte character split by the cut
    return data[: max_bytes - 3].decode("utf-8", errors="ignore").rstrip() + "..."


def limit_warnings(
    warnings: Sequence[str],
    *,
    each: int = WARNING_MAX_BYTES,
    total: int = WARNINGS_TOTAL_MAX_BYTES,
) -> list[str]:
    """Warnings the apiserver passes on whole: each under 120, together under 4096 (bytes)."""
    if not warnings:
        return []
    out: list[str] = []
    used = 0
    cleaned = [_cut(_clean(str(w)), each) for w in warnings]
    cleaned = [w for w in cleaned if w]
    for index, warning in enumerate(cleaned):
        size = len(warning.encode("utf-8"))
        if used + size > total:
            note = f"... {len(cleaned) - index} more warnings not shown"
            while out and used + len(note) > total:
                used -= len(out.pop().encode("utf-8"))
                note = f"... {len(cleaned) - len(out)} more warnings not shown"
            out.append(note)
            break
        out.append(warning)
        used += size
    return out


# ----------------------------------------------------------------------------- responses


def _envelope(response: AdmissionResponse) -> AdmissionReviewOut:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def compact_json(value: Any) -> bytes:
    """UTF-8 JSON without spaces, keys in insertion order: the bytes of
    ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)`` for the values answers hold
    (text, booleans, small integers, lists and maps with text keys). orjson writes them about
    eight times faster than the standard library, which matters on every admission: the patch
    and the HTTP layer's answers both use it."""
    return orjson.dumps(value)


def encode_patch(ops: Sequence[Mapping[str, Any]]) -> str:
    return base64.b64encode(compact_json(list(ops))).decode("ascii")


def allowed(uid: str) -> AdmissionReviewOut:
    """The plain "admit unchanged" answer."""
    return _envelope({"uid": uid, "allowed": True})


def denied(uid: str, message: str) -> AdmissionReviewOut:
    """Refusal with ``message`` cleaned and cut to DENIAL_MAX_BYTES: it may quote the pod."""
    return _envelope(
        {
            "uid": uid,
            "allowed": False,
            "status": {
                "status": "Failure",
                "code": 403,
                "reason": "Forbidden",
                "message": _cut(_clean(message), DENIAL_MAX_BYTES),
            },
        }
    )


def _audit(values: Mapping[str, str]) -> dict[str, str]:
    return {key: _cut(_clean(value), AUDIT_VALUE_MAX) for key, value in values.items() if value}


# ----------------------------------------------------------------------------- engine


Translator = Callable[..., Conversion]


def answer_review(
    body: Any,
    *,
    policy: Policy,
    mode_for_namespace: Callable[[str], NamespaceMode],
    native_extended: frozenset[str],
    ensure_templates: TemplateEnsurer,
    translate: Translator = translate_pod,
    quota_for_namespace: Callable[[str], NamespaceQuota] = lambda namespace: NO_QUOTA,
) -> ReviewResult:
    """Answers one AdmissionReview. Raises BadReview (HTTP 400) or TemplateError (HTTP 500)."""
    request = request_of(body)
    uid = str(request["uid"])
    if not _is_pod_create(request):
        return ReviewResult(allowed(uid), "skipped", "n/a")
    pod_req = pod_request(request)
    meta = pod_req.pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return ReviewResult(allowed(uid), "skipped", "n/a")  # static pods cannot use claims
    mode = mode_for_namespace(pod_req.namespace)
    if mode == "disabled":
        return ReviewResult(allowed(uid), "skipped", mode)
    try:
        conversion = translate(
            pod_req.pod,
            namespace=pod_req.namespace,
            policy=policy,
            native_extended=native_extended,
        )
    except Denied as exc:
        if mode == "audit":
            return _audit_denial(uid, exc.message)
        return ReviewResult(denied(uid, exc.message), "denied", mode)
    escaped = conversion_escape(conversion, quota_for_namespace(pod_req.namespace))
    if escaped is not None:
        deny = policy.quota_without_device_limit == "deny"
        if mode == "audit":
            if deny:
                return _audit_denial(uid, escaped)
            return _left_unconverted(uid, f"gpu-slicer audit: would not convert: {escaped}", mode)
        if deny:
            return ReviewResult(denied(uid, escaped), "denied", mode)
        return _left_unconverted(uid, f"not converted: {escaped}", mode)
    if mode == "audit":
        result = _audit_result(uid, conversion)
    else:
        result = _enabled_result(uid, pod_req, conversion, ensure_templates)
    if conversion.deferred:
        result = replace(result, deferred=conversion.deferred)
    return result


def _left_unconverted(uid: str, message: str, mode: NamespaceMode) -> ReviewResult:
    """Admitted as it is, with the reason as a warning."""
    response: AdmissionResponse = {
        "uid": uid,
        "allowed": True,
        "warnings": limit_warnings([message]),
    }
    return ReviewResult(_envelope(response), "unchanged", mode)


def _audit_result(uid: str, conversion: Conversion) -> ReviewResult:
    response: AdmissionResponse = {"uid": uid, "allowed": True}
    warnings = limit_warnings(audit_warnings(conversion))
    if warnings:
        response["warnings"] = warnings
    if conversion.changes:
        response["auditAnnotations"] = _audit({"mode": "audit", "would": conversion.summary})
    outcome: Outcome = "audited" if conversion.changes else "unchanged"
    return ReviewResult(_envelope(response), outcome, "audit", tuple(conversion.changes))


def _audit_denial(uid: str, message: str) -> ReviewResult:
    """Audit mode never refuses a pod: it says what ``enabled`` would have refused, and why."""
    response: AdmissionResponse = {
        "uid": uid,
        "allowed": True,
        "warnings": limit_warnings([f"gpu-slicer audit: would deny: {message}"]),
        "auditAnnotations": _audit({"mode": "audit", "would-deny": message}),
    }
    return ReviewResult(_envelope(response), "would-deny", "audit")


def _enabled_result(
    uid: str, req: PodRequest, conversion: Conversion, ensure_templates: TemplateEnsurer
) -> ReviewResult:
    response: AdmissionResponse = {"uid": uid, "allowed": True}
    if conversion.patch:
        ensure_templates.ensure(conversion.templates, dry_run=req.dry_run)
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(conversion.patch)
        response["auditAnnotations"] = _audit(
            {
                "mode": "enabled",
                "converted": conversion.summary,
                "dry-run": "templates not created" if req.dry_run else "",
            }
        )
    warnings = limit_warnings(conversion.warnings)
    if warnings:
        response["warnings"] = warnings
    outcome: Outcome = "patched" if conversion.patch else "unchanged"
    changes = tuple(conversion.changes) if conversion.patch else ()
    return ReviewResult(_envelope(response), outcome, "enabled", changes)


def pod_key(pod: dict[str, Any]) -> bytes | str:
    """An exact key for a decoded JSON pod: equal keys mean equal values of equal types.

    ``marshal`` writes every value with its type and can be read back, so two pods with the same
    bytes are the same JSON (``marshal.loads`` of one byte string gives one value). Format 4,
    because every review pays for the key: it writes ASCII text as it is (format 2 encodes each
    string to a new UTF-8 bytes object first), which makes the key about 40% faster to build and
    a quarter shorter to hash and keep. Format 4 also marks objects that have other references
    and writes repeats as back-references, so the bytes depend on how the pod's objects are
    shared as well as on its value. That can only turn an equal pod into a miss, never a
    different pod into a hit, and pods decoded from the same JSON text in the same place (every
    replica of a review) are shared alike, so replicas still get equal keys (tested). A pod
    holding other types (never one decoded from JSON) falls back to ``repr``; a str key never
    equals a bytes key.
    """
    try:
        return marshal.dumps(pod, 4)
    except ValueError:
        return repr(pod)


_PLAIN_UID = re.compile(r"[A-Za-z0-9-]{1,128}")


def review_key(body: Any, raw: bytes) -> bytes | None:
    """An exact key for the review ``raw`` (its bytes, decoded as ``body``) but for its uid,
    which the apiserver makes new for every request: the bytes with the uid's JSON string cut
    out and a NUL byte (which JSON text never holds) where it was. None when the uid is not a
    plain one (letters, digits, dashes: the apiserver's are UUIDs) or is not found as is.

    Equal keys mean equal reviews but for that one string: with the same bytes before the cut
    the cut starts in the same place of the same JSON, so it is the same token in both (or, if
    the first match is not the uid's own string, the uid's string lies after it and is equal in
    both). The pod, the namespace and everything else translation reads are then equal. Cheaper
    than :func:`pod_key` (finding and copying bytes against encoding every value), so replicas
    are answered from the memo for less, and a pod seen for the first time pays less for the
    look-up."""
    request = body.get("request") if isinstance(body, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    if not isinstance(uid, str) or not _PLAIN_UID.fullmatch(uid):
        return None
    token = b'"' + uid.encode("ascii") + b'"'
    start = raw.find(token)
    if start < 0:
        return None
    return raw[:start] + b"\0" + raw[start + len(token) :]


MEMO_ENTRY_MAX_BYTES = 64 * 1024
"""Pods whose key is larger are translated every time, never remembered: replicas of real
workloads are a few KiB, and a 3 MiB pod would pin 3 MiB per entry."""
MEMO_MAX_BYTES = 8 * 1024 * 1024
"""All remembered keys together stay under this (with MEMO_ENTRY_MAX_BYTES added for each
entry's translation, which is derived from and smaller than its pod)."""


class TranslationMemo:
    """Remembers recent translations: the replicas of a Deployment arrive as identical pods.

    Translation is a pure function of (pod, namespace, policy, native names), so a hit is
    exactly what translating again would give. The pod is keyed by the bytes of its review but
    for the uid (:func:`review_key`, when the HTTP layer passes them) or by its own
    :func:`pod_key`; a pod that differs in any value or type (or only in key order) is a miss.
    Denials are not remembered (they are cheap and carry user-facing messages). The memo empties
    itself when the policy object changes.

    Bounded by bytes as well as entries: a key over ``entry_max_bytes`` is not stored, and the
    least recently used entries go once the keys add up to more than ``max_bytes``.
    """

    def __init__(
        self,
        maxsize: int = 256,
        *,
        max_bytes: int = MEMO_MAX_BYTES,
        entry_max_bytes: int = MEMO_ENTRY_MAX_BYTES,
    ) -> None:
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.entry_max_bytes = entry_max_bytes
        self._entries: OrderedDict[tuple[str, frozenset[str], str, bytes | str], Conversion] = (
            OrderedDict()
        )
        self._policy: Policy | None = None
        self._lock = memory_lock()
        self.remembered = Remembered()
        """Claims per pod shape and patches, for the pods the memo itself has not seen."""
        self.bytes = 0  # sum of the stored keys' sizes
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """How many translations are remembered now."""
        return len(self._entries)

    def translate(
        self,
        pod: dict[str, Any],
        *,
        namespace: str,
        policy: Policy,
        native_extended: frozenset[str] = frozenset(),
        review_bytes: bytes | None = None,
    ) -> Conversion:
        """``translate_pod``, remembered. ``review_bytes``: the :func:`review_key` of the review the
        pod came in, used as the key instead of the pod's own (the two kinds never match)."""
        kind, exact = ("pod", pod_key(pod)) if review_bytes is None else ("review", review_bytes)
        key = (namespace, native_extended, kind, exact)
        with self._lock:
            if policy is not self._policy:
                self._entries.clear()
                self.bytes = 0
                self._policy = policy
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
        conversion = translate_pod(
            pod,
            namespace=namespace,
            policy=policy,
            native_extended=native_extended,
            remembered=self.remembered,
        )
        size = len(key[3])
        if size > self.entry_max_bytes:
            return conversion
        with self._lock:
            if policy is self._policy and key not in self._entries:
                self._entries[key] = conversion
                self.bytes += size
                while self._entries and (
                    len(self._entries) > self.maxsize or self.bytes > self.max_bytes
                ):
                    evicted, _ = self._entries.popitem(last=False)
                    self.bytes -= len(evicted[3])
        return conversion


class AdmissionEngine:
    """:func:`answer_review` bound to live sources (reloading policy, caches, template ensurer)."""

    def __init__(
        self,
        *,
        policy: Callable[[], Policy],
        mode_for_namespace: Callable[[str], NamespaceMode],
        native_extended: Callable[[], frozenset[str]],
        templates: TemplateEnsurer,
        quota_for_namespace: Callable[[str], NamespaceQuota] = lambda namespace: NO_QUOTA,
    ) -> None:
        self._quota = quota_for_namespace
        self._policy = policy
        self._mode = mode_for_namespace
        self._native = native_extended
        self._templates = templates
        self.memo = TranslationMemo()

    def review(self, body: Any, raw: bytes | None = None) -> ReviewResult:
        """``raw``: the bytes ``body`` was decoded from, when the caller has them (the HTTP
        layer does): the memo then keys on them (:func:`review_key`)."""
        key = None if raw is None else review_key(body, raw)
        translate = (
            self.memo.translate
            if key is None
            else functools.partial(self.memo.translate, review_bytes=key)
        )
        return answer_review(
            body,
            policy=self._policy(),
            mode_for_namespace=self._mode,
            native_extended=self._native(),
            ensure_templates=self._templates,
            translate=translate,
            quota_for_namespace=self._quota,
        )
