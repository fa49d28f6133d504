"""RealKubeApi on the wire: paths, verbs, content types, query parameters and error mapping.

Each request goes through the official client's real HTTP stack to a stub apiserver on
127.0.0.1 that records what arrived.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import real_api_for
from kubernetes.client.exceptions import ApiException

from gpu_slicer.kube import errors
from gpu_slicer.kube.api import resource_for
from gpu_slicer.kube.client import (
    RealKubeApi,
    collection_path,
    error_from_api_exception,
    object_path,
)
from tests.support.kube_stub_apiserver import StubApiServer, status_body

RES = "resource.k8s.io/v1"
CLAIM = {
    "apiVersion": RES,
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "ml"},
    "spec": {},
}
SLICE = {
    "apiVersion": RES,
    "kind": "ResourceSlice",
    "metadata": {"name": "s"},
    "spec": {"nodeName": "n"},
}
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}
EVENT = {
    "apiVersion": "events.k8s.io/v1",
    "kind": "Event",
    "metadata": {"name": "e", "namespace": "ml"},
    "note": "x",
}

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODES = "/api/v1/nodes"
EVENTS = "/apis/events.k8s.io/v1/namespaces/ml/events"

Call = Callable[[RealKubeApi], Any]

# (what the caller does, method, path, content type) for every verb on four kinds.
WIRE_CASES: list[tuple[str, Call, str, str, str | None]] = []
KINDS: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("claim", CLAIM, CLAIMS, "ml"),
    ("slice", SLICE, SLICES, None),
    ("node", NODE, NODES, None),
    ("event", EVENT, EVENTS, "ml"),
]
for label, obj, collection, namespace in KINDS:
    api_version, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
    item = f"{collection}/{name}"

    def bind(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
        return lambda api: fn(api, *args, **kwargs)

    WIRE_CASES += [
        (
            f"{label}-get",
            bind(RealKubeApi.get, api_version, kind, name, namespace),
            "GET",
            item,
            None,
        ),
        (
            f"{label}-list",
            bind(RealKubeApi.list, api_version, kind, namespace),
            "GET",
            collection,
            None,
        ),
        (f"{label}-create", bind(RealKubeApi.create, obj), "POST", collection, "application/json"),
        (f"{label}-update", bind(RealKubeApi.update, obj), "PUT", item, "application/json"),
        (
            f"{label}-apply",
            bind(RealKubeApi.apply, obj, field_manager="gpu-slicer"),
            "PATCH",
            item,
            "application/apply-patch+yaml",
        ),
        (
            f"{label}-merge",
            bind(RealKubeApi.patch, api_version, kind, name, {"x": 1}, namespace=namespace),
            "PATCH",
            item,
            "application/merge-patch+json",
        ),
        (
            f"{label}-strategic",
            bind(
                RealKubeApi.patch,
                api_version,
                kind,
                name,
                {"x": 1},
                namespace=namespace,
                patch_type="strategic",
            ),
            "PATCH",
            item,
            "application/strategic-merge-patch+json",
        ),
        (
            f"{label}-json",
            bind(
                RealKubeApi.patch,
                api_version,
                kind,
                name,
                [{"op": "add", "path": "/x", "value": 1}],
                namespace=namespace,
                patch_type="json",
            ),
            "PATCH",
            item,
            "application/json-patch+json",
        ),
        (
            f"{label}-delete",
            bind(RealKubeApi.delete, api_version, kind, name, namespace),
            "DELETE",
            item,
            None,
        ),
    ]


@pytest.mark.parametrize(
    ("call", "method", "path", "content_type"),
    [case[1:] for case in WIRE_CASES],
    ids=[case[0] for case in WIRE_CASES],
)
def test_each_verb_uses_the_right_method_path_and_content_type(
    stub: StubApiServer,
    real: RealKubeApi,
    call: Call,
    method: str,
    path: str,
    content_type: str | None,
) -> None:
    stub.respond_next(200, {"metadata": {"name": "x"}, "items": []})  # fits every verb
    call(real)
    sent = stub.last()
    assert (sent.method, sent.path, sent.content_type) == (method, path, content_type)


def test_apply_sends_the_field_manager_and_force_only_when_asked(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    real.apply(SLICE, field_manager="gpu-slicer-agent")
    plain = stub.last()
    real.apply(SLICE, field_manager="gpu-slicer-agent", force=True)
    forced = stub.last()
    assert plain.query == {"fieldManager": ["gpu-slicer-agent"]}
    assert forced.query == {"fieldManager": ["gpu-slicer-agent"], "force": ["true"]}
    assert forced.body == SLICE


def test_dry_run_create_asks_the_apiserver_for_dry_run_all(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    real.create(CLAIM, dry_run=True)
    assert stub.last().query == {"dryRun": ["All"]}
    assert stub.backend.objects(RES, "ResourceClaim") == []


def test_delete_with_a_version_sends_a_precondition(stub: StubApiServer, real: RealKubeApi) -> None:
    stub.respond_next(200, status_body(200, "", "ok"))
    real.delete(RES, "ResourceSlice", "s", resource_version="42")
    assert stub.last().body == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"resourceVersion": "42"},
    }


def test_list_sends_selectors_as_query_parameters(stub: StubApiServer, real: RealKubeApi) -> None:
    real.list(
        RES, "ResourceSlice", label_selector="tier in (a,b),!x", field_selector="spec.nodeName=n"
    )
    assert stub.last().query == {
        "labelSelector": ["tier in (a,b),!x"],
        "fieldSelector": ["spec.nodeName=n"],
    }


def test_a_namespaced_kind_listed_without_namespace_spans_all_namespaces(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    real.list(RES, "ResourceClaim")
    assert stub.last().path == "/apis/resource.k8s.io/v1/resourceclaims"


def test_names_are_escaped_in_paths() -> None:
    res = resource_for("v1", "ConfigMap")
    assert object_path(res, "a/b", "ns") == "/api/v1/namespaces/ns/configmaps/a%2Fb"
    assert collection_path(resource_for("v1", "Namespace"), None) == "/api/v1/namespaces"


def test_a_json_patch_that_is_not_a_list_fails_before_any_request(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    with pytest.raises(errors.Invalid, match="list of operations"):
        real.patch(RES, "ResourceSlice", "s", {"op": "add"}, patch_type="json")
    assert stub.requests == []


# ---------------------------------------------------------------- watch
def test_watch_sends_its_parameters(stub: StubApiServer, real: RealKubeApi) -> None:
    stub.respond_next(200, None, stream=[])
    events = real.watch(
        RES, "ResourceClaim", "ml", resource_version="12", label_selector="a=b", timeout_s=30
    )
    assert list(events) == []
    assert stub.last().path == CLAIMS
    assert stub.last().query == {
        "watch": ["true"],
        "labelSelector": ["a=b"],
        "resourceVersion": ["12"],
        "timeoutSeconds": ["30"],
    }


def test_watch_streams_events_line_by_line(stub: StubApiServer, real: RealKubeApi) -> None:
    lines = [
        json.dumps({"type": "ADDED", "object": SLICE}),
        json.dumps({"type": "MODIFIED", "object": SLICE}),
        json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}),
        json.dumps({"type": "DELETED", "object": SLICE}),
    ]
    stub.respond_next(200, None, stream=lines)
    events = list(real.watch(RES, "ResourceSlice", timeout_s=5))
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "BOOKMARK", "DELETED"]
    assert events[0].object == SLICE


def test_an_error_event_in_the_stream_raises_the_mapped_error(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    expired = status_body(410, "Expired", "too old resource version: 1 (5)")
    stub.respond_next(
        200,
        None,
        stream=[
            json.dumps({"type": "ADDED", "object": SLICE}),
            json.dumps({"type": "ERROR", "object": expired}),
        ],
    )
    events = real.watch(RES, "ResourceSlice", resource_version="1", timeout_s=5)
    assert next(events).type == "ADDED"
    with pytest.raises(errors.ApiError) as caught:
        next(events)
    assert (caught.value.status, caught.value.reason) == (410, "Expired")


def test_a_watch_left_early_leaves_the_client_usable(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    stopped = threading.Event()

    def events_without_end() -> Iterator[str]:
        try:
            while True:
                yield json.dumps({"type": "MODIFIED", "object": SLICE})
        finally:
            stopped.set()

    stub.respond_next(200, None, stream=events_without_end())
    events = real.watch(RES, "ResourceSlice", timeout_s=5)
    assert next(events).type == "MODIFIED"
    events.close()  # the caller leaves while the server is still sending
    assert stopped.wait(5), "the server went on streaming to a watch its caller had left"
    stub.backend.create(SLICE)
    assert [item["metadata"]["name"] for item in real.list(RES, "ResourceSlice").items] == ["s"]
    assert stub.errors == []  # a client that goes away is no error of the server's


def test_a_watch_refused_outright_raises_when_called(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    stub.respond_next(403, status_body(403, "Forbidden", "cannot watch resourceclaims"))
    with pytest.raises(errors.Forbidden, match="cannot watch"):
        real.watch(RES, "ResourceClaim", timeout_s=5)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (404, "NotFound", errors.NotFound),
        (409, "AlreadyExists", errors.AlreadyExists),
        (409, "Conflict", errors.Conflict),
        (422, "Invalid", errors.Invalid),
        (403, "Forbidden", errors.Forbidden),
        (500, "InternalError", errors.Unavailable),
        (503, "ServiceUnavailable", errors.Unavailable),
        (429, "TooManyRequests", errors.Unavailable),
    ],
    ids=lambda value: str(value),
)
def test_http_failures_map_onto_kube_errors(
    stub: StubApiServer, real: RealKubeApi, status: int, reason: str, expected: type[Exception]
) -> None:
    stub.respond_next(status, status_body(status, reason, f"the server said {reason}"))
    with pytest.raises(expected, match=f"the server said {reason}"):
        real.get(RES, "ResourceSlice", "s")


def test_409_without_already_exists_is_a_conflict_not_already_exists(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    stub.respond_next(409, status_body(409, "Conflict", "modified"))
    with pytest.raises(errors.Conflict) as caught:
        real.update(SLICE)
    assert not isinstance(caught.value, errors.AlreadyExists)


def test_other_client_errors_keep_status_and_reason(stub: StubApiServer, real: RealKubeApi) -> None:
    stub.respond_next(400, status_body(400, "BadRequest", "unable to parse selector"))
    with pytest.raises(errors.ApiError) as caught:
        real.list(RES, "ResourceSlice", label_selector="((")
    assert (caught.value.status, caught.value.reason) == (400, "BadRequest")


def test_a_failure_without_a_status_body_still_maps_by_code(
    stub: StubApiServer, real: RealKubeApi
) -> None:
    stub.respond_next(404, "page not found")
    with pytest.raises(errors.NotFound, match="page not found"):
        real.get("v1", "Node", "n")


def test_connection_refused_is_unavailable_and_keeps_the_cause() -> None:
    with socket.socket() as sock:  # a port that nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = real_api_for(f"http://127.0.0.1:{port}")
    with pytest.raises(errors.Unavailable) as caught:
        api.get("v1", "Node", "n")
    assert caught.value.__cause__ is not None


def test_an_api_exception_without_a_status_is_unavailable() -> None:
    mapped = error_from_api_exception(ApiException(status=0, reason="SSLError: bad cert"))
    assert isinstance(mapped, errors.Unavailable)


# ---------------------------------------------------------------- version and config
def test_server_version_reads_a_minor_with_a_plus(stub: StubApiServer, real: RealKubeApi) -> None:
    stub.respond_next(200, {"major": "1", "minor": "35+", "gitVersion": "v1.35.2-gke.1"})
    assert real.server_version() == (1, 35)
    assert stub.last().path == "/version"


def test_from_config_reads_a_kubeconfig_and_sends_its_token(
    stub: StubApiServer, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "stub",
                "clusters": [{"name": "stub", "cluster": {"server": stub.url}}],
                "users": [{"name": "agent", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "agent"}}],
            }
        )
    )
    api = RealKubeApi.from_config(str(kubeconfig))
    assert api.server_version() == (1, 36)
    assert stub.last().headers.get("authorization") == "Bearer secret-token"


def test_from_config_with_a_missing_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(errors.KubeError, match="nope"):
        RealKubeApi.from_config(str(missing))
