"""``convert`` as a kustomize KRM function: a ResourceList in, the converted ResourceList out.

kustomize runs an exec function with ``kubectl kustomize --enable-alpha-plugins --enable-exec``
and names it in a transformer's ``config.kubernetes.io/function`` annotation; it writes a
``config.kubernetes.io/v1`` ResourceList on the function's standard input and builds from the
one the function writes back. ``gpu-slicer-krm`` (or ``gpu-slicer convert -`` fed a ResourceList)
converts the items, appends the templates they need, and reports notes and documents it could
not convert as ``results``. The function's config may set ``spec.mode``, ``spec.namespace`` and
``spec.policy`` (a policy, inline).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from gpu_slicer.core.identity import NamespaceMode
from gpu_slicer.kube import documents
from gpu_slicer.kube.names import DNS_LABEL_MAX, is_dns_label
from gpu_slicer.webhook.convert import convert_objects, yaml_type
from gpu_slicer.webhook.errors import FunctionConfigError, ManifestError, PolicyError
from gpu_slicer.webhook.policy import Policy, load_policy

API_VERSION = "config.kubernetes.io/v1"
KIND = "ResourceList"
_SPEC_KEYS = ("mode", "namespace", "policy")


def is_resource_list(text: str) -> bool:
    """Whether ``text`` is one ResourceList (what kustomize sends a KRM function)."""
    if KIND not in text:
        return False
    try:
        docs = documents.parse_all(text)
    except documents.DocumentError:
        return False
    return len(docs) == 1 and _is_list(docs[0])


def _is_list(doc: Any) -> bool:
    return (
        isinstance(doc, dict) and doc.get("kind") == KIND and doc.get("apiVersion") == API_VERSION
    )


def run(
    text: str, *, policy: Policy | None = None, native_extended: frozenset[str] = frozenset()
) -> str:
    """The ResourceList ``text`` converted; the function config's policy wins over ``policy``.
    Raises FunctionConfigError for a bad config, ManifestError for a ResourceList that is not
    one (or not valid YAML)."""
    try:
        docs = documents.parse_all(text)
    except documents.DocumentError as exc:
        raise ManifestError([str(exc)]) from exc
    if len(docs) != 1 or not _is_list(docs[0]):
        raise ManifestError([f"not one {API_VERSION} {KIND}"])
    resource_list = docs[0]
    config = resource_list.get("functionConfig") or {}
    mode, namespace, configured = _settings(config)
    items = resource_list.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ManifestError([f"items: must be a list of objects, not {yaml_type(items)}"])
    result = convert_objects(
        items,
        policy=configured or policy or Policy.default(),
        mode=mode,
        namespace=namespace,
        native_extended=native_extended,
    )
    results = [{"message": p, "severity": "error"} for p in result.problems]
    results += [{"message": n, "severity": "info"} for n in [*result.summaries, *result.warnings]]
    out: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "items": result.items,
    }
    if config:
        out["functionConfig"] = config
    if results:
        out["results"] = results
    return yaml.safe_dump(out, sort_keys=False, width=4096)


def _settings(config: Any) -> tuple[NamespaceMode, str | None, Policy | None]:
    spec = config.get("spec") if isinstance(config, dict) else None
    if spec is None:
        return "enabled", None, None
    if not isinstance(spec, dict):
        raise FunctionConfigError("functionConfig.spec must be a mapping")
    unknown = [k for k in spec if k not in _SPEC_KEYS]
    if unknown:
        raise FunctionConfigError(
            f"functionConfig.spec.{unknown[0]}: unknown key; valid keys: {', '.join(_SPEC_KEYS)}"
        )
    mode = spec.get("mode", "enabled")
    if mode not in ("enabled", "audit"):
        raise FunctionConfigError(f"functionConfig.spec.mode: enabled or audit, not {mode!r}")
    namespace = spec.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and is_dns_label(namespace)):
        raise FunctionConfigError(
            f"functionConfig.spec.namespace: {namespace!r} is not a namespace name: at most "
            f"{DNS_LABEL_MAX} lower-case letters, digits and '-', starting and ending with a "
            "letter or digit"
        )
    policy = None
    if "policy" in spec:
        try:
            policy = load_policy(
                yaml.safe_dump(spec["policy"]), source="functionConfig.spec.policy"
            )
        except PolicyError as exc:
            raise FunctionConfigError(str(exc)) from exc
    return mode, namespace, policy


def main() -> int:
    """``gpu-slicer-krm``: the KRM function's entry point (exit 1 with a message on bad input)."""
    try:
        text = documents.read_text("-")
        if KIND not in text:
            raise ManifestError([f"not a {API_VERSION} {KIND}"])
        sys.stdout.write(run(text))
    except documents.DocumentError as exc:
        print(f"gpu-slicer-krm: standard input: {exc}", file=sys.stderr)
        return 1
    except ManifestError as exc:
        hint = " (run me as a kustomize exec function)" if str(exc).startswith("not ") else ""
        print(f"gpu-slicer-krm: standard input: {exc}{hint}", file=sys.stderr)
        return 1
    except FunctionConfigError as exc:
        print(f"gpu-slicer-krm: {exc}", file=sys.stderr)
        return 1
    return 0
