"""Builders and checks the webhook tests share (fixtures are in conftest.py)."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any
from unittest import mock

import jsonpatch
import kubernetes_validate
import kubernetes_validate.utils

from gpu_slicer.webhook.translate import Conversion

KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")

Pod = dict[str, Any]


def build_pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    name: str | None = "pod",
    namespace: str | None = None,
    **spec: Any,
) -> Pod:
    """A Pod as the apiserver would send it (apiVersion, kind, metadata, spec)."""
    metadata: dict[str, Any] = {}
    if name is None:
        metadata["generateName"] = "pod-"
    else:
        metadata["name"] = name
    if namespace is not None:
        metadata["namespace"] = namespace
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if labels is not None:
        metadata["labels"] = dict(labels)
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init is not None:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def container(
    name: str = "main",
    *,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "registry.example/app:1", **fields}
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    if resources:
        body["resources"] = resources
    return body


def apply(pod: Pod, conversion: Conversion) -> Pod:
    """The pod after the conversion's patch, applied by the ``jsonpatch`` library."""
    return jsonpatch.apply_patch(copy.deepcopy(pod), conversion.patch)  # type: ignore[no-any-return]


_VALID: set[str] = set()
"""Objects (as canonical JSON) that already passed: the same object passes again anyway."""

_schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)
"""kubernetes_validate reads and parses its (large) schema files on every call, several ms
each; the files do not change while the tests run, so each is read once."""


def validate(obj: dict[str, Any]) -> None:
    """Strict OpenAPI validation against every supported Kubernetes version."""
    key = json.dumps(obj, sort_keys=True)
    if key in _VALID:
        return
    with mock.patch.object(kubernetes_validate.utils, "schema_contents", _schema_contents):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    _VALID.add(key)
