"""A stub apiserver over real HTTP on 127.0.0.1, backed by an InMemoryKubeApi.

It lets the tests drive ``RealKubeApi`` through the official client's real HTTP stack and check
what goes over the wire (method, path, query, content type, body), while the answers come from
the in-memory apiserver, so the same contract tests can run against both implementations.
``respond_next`` replaces the next answer with a canned one (status + body), for error mapping.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from gpu_slicer.kube.api import RESOURCES, Resource
from gpu_slicer.kube.errors import ApiError, KubeError, Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


@dataclass
class _Canned:
    status: int
    body: Any
    stream: Iterable[str] | None = None


class _Server(ThreadingHTTPServer):
    """Serves each connection on a thread of its own. A client that drops its connection (a
    watch it stopped reading, a pooled connection closed) is no error, as for a real apiserver;
    any other failure of a handler is kept in ``errors`` rather than printed from the handler's
    thread, where no test would see it."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.errors: list[str] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        self.errors.append(traceback.format_exc())


@dataclass
class StubApiServer:
    backend: InMemoryKubeApi = field(default_factory=InMemoryKubeApi)
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._canned: list[_Canned] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(_Handler):
            server_stub = stub

        self._httpd = _Server(Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def respond_next(self, status: int, body: Any, *, stream: Iterable[str] | None = None) -> None:
        """Answer the next request with ``status`` and JSON ``body`` (or these watch lines, sent as
        the iterable gives them)."""
        with self._lock:
            self._canned.append(_Canned(status, body, stream))

    def last(self) -> Recorded:
        return self.requests[-1]

    @property
    def errors(self) -> list[str]:
        """The tracebacks of the handlers that failed (a bug in the stub or in what a test sent)."""
        return list(self._httpd.errors)

    def close(self) -> None:
        self.backend.close()
        self._httpd.shutdown()
        self._httpd.server_close()

    def _take_canned(self) -> _Canned | None:
        with self._lock:
            return self._canned.pop(0) if self._canned else None


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure" if code >= 300 else "Success",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _status_of(exc: KubeError) -> dict[str, Any]:
    if isinstance(exc, ApiError):
        return status_body(exc.status, exc.reason, str(exc))
    if isinstance(exc, Unavailable):
        return status_body(503, "ServiceUnavailable", str(exc))
    return status_body(500, "InternalError", str(exc))


def _resource(api_version: str, plural: str) -> Resource:
    for res in RESOURCES.values():
        if res.api_version == api_version and res.plural == plural:
            return res
    raise KeyError(f"{api_version} {plural}")


_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
}


def _target(path: str) -> tuple[Resource, str | None, str | None] | None:
    """``/api/v1/namespaces/ns/pods/name`` -> (resource, namespace, name); None: no such route."""
    segments = [s for s in path.split("/") if s]
    if segments[:1] == ["api"] and len(segments) >= 3:
        api_version, rest = segments[1], segments[2:]
    elif segments[:1] == ["apis"] and len(segments) >= 4:
        api_version, rest = f"{segments[1]}/{segments[2]}", segments[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    try:
        res = _resource(api_version, rest[0])
    except KeyError:
        return None
    return res, namespace, rest[1] if len(rest) > 1 else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # otherwise delayed ACKs add ~40 ms to every request
    server_stub: StubApiServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ------------------------------------------------------------------
    def _handle(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        content_type = self.headers.get("Content-Type")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = None
        if raw and content_type and "yaml" in content_type:
            body = yaml.safe_load(raw)
        elif raw:
            body = json.loads(raw)
        recorded = Recorded(method, parts.path, query, content_type, body, dict(self.headers))
        stub = self.server_stub
        stub.requests.append(recorded)
        canned = stub._take_canned()
        if canned is not None:
            if canned.stream is not None:
                self._stream_lines(iter(canned.stream))
            else:
                self._send_json(canned.status, canned.body)
            return
        try:
            if parts.path == "/version":
                major, minor = stub.backend.server_version()
                self._send_json(200, {"major": str(major), "minor": f"{minor}+"})
                return
            self._route(method, unquote(parts.path), recorded)
        except KubeError as exc:
            status = _status_of(exc)
            self._send_json(int(status["code"]), status)

    def _route(self, method: str, path: str, req: Recorded) -> None:
        target = _target(path)
        if target is None:
            self._send_json(404, status_body(404, "NotFound", f"no resource {path}"))
            return
        res, namespace, name = target
        if name is None:
            handler = {"GET": self._watch_or_list, "POST": self._create}.get(method)
        else:
            handler = {
                "GET": self._get,
                "PUT": self._put,
                "PATCH": self._patch,
                "DELETE": self._delete,
            }.get(method)
        if handler is None:
            self._send_json(405, status_body(405, "MethodNotAllowed", f"{method} {path}"))
            return
        handler(res, namespace, name or "", req)

    def _watch_or_list(self, res: Resource, namespace: str | None, _: str, req: Recorded) -> None:
        api = self.server_stub.backend
        if req.param("watch") == "true":
            timeout = req.param("timeoutSeconds")
            try:
                events = api.watch(
                    res.api_version,
                    res.kind,
                    namespace,
                    resource_version=req.param("resourceVersion"),
                    label_selector=req.param("labelSelector"),
                    field_selector=req.param("fieldSelector"),
                    timeout_s=float(timeout) if timeout else None,
                )
            except ApiError as exc:  # the apiserver reports a stale watch as an ERROR event
                line = json.dumps({"type": "ERROR", "object": _status_of(exc)})
                self._stream_lines(iter([line]))
                return
            self._stream_lines(json.dumps({"type": e.type, "object": e.object}) for e in events)
            return
        listed = api.list(
            res.api_version,
            res.kind,
            namespace,
            label_selector=req.param("labelSelector"),
            field_selector=req.param("fieldSelector"),
        )
        items = [
            {k: v for k, v in item.items() if k not in ("apiVersion", "kind")}
            for item in listed.items
        ]
        self._send_json(
            200,
            {
                "apiVersion": res.api_version,
                "kind": f"{res.kind}List",
                "metadata": {"resourceVersion": listed.resource_version},
                "items": items,
            },
        )

    def _create(self, res: Resource, namespace: str | None, _: str, req: Recorded) -> None:
        api = self.server_stub.backend
        self._send_json(201, api.create(req.body, dry_run=req.param("dryRun") == "All"))

    def _get(self, res: Resource, namespace: str | None, name: str, req: Recorded) -> None:
        api = self.server_stub.backend
        self._send_json(200, api.get(res.api_version, res.kind, name, namespace))

    def _put(self, res: Resource, namespace: str | None, name: str, req: Recorded) -> None:
        self._send_json(200, self.server_stub.backend.update(req.body))

    def _patch(self, res: Resource, namespace: str | None, name: str, req: Recorded) -> None:
        api = self.server_stub.backend
        ctype = req.content_type or ""
        if ctype == "application/apply-patch+yaml":
            applied = api.apply(
                req.body,
                field_manager=req.param("fieldManager") or "",
                force=req.param("force") == "true",
            )
            self._send_json(200, applied)
            return
        patch_type = _PATCH_TYPES.get(ctype)
        if patch_type is None:
            self._send_json(415, status_body(415, "UnsupportedMediaType", ctype))
            return
        patched = api.patch(
            res.api_version,
            res.kind,
            name,
            req.body,
            namespace=namespace,
            patch_type=patch_type,  # type: ignore[arg-type]
        )
        self._send_json(200, patched)

    def _delete(self, res: Resource, namespace: str | None, name: str, req: Recorded) -> None:
        preconditions = (req.body or {}).get("preconditions") or {}
        self.server_stub.backend.delete(
            res.api_version,
            res.kind,
            name,
            namespace,
            resource_version=preconditions.get("resourceVersion"),
        )
        self._send_json(200, status_body(200, "", "deleted"))

    def _send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream_lines(self, lines: Any) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for line in lines:
                self._chunk(line)
        except KubeError as exc:  # e.g. the reader fell out of the kept history
            self._chunk(json.dumps({"type": "ERROR", "object": _status_of(exc)}))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, line: str) -> None:
        data = (line + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
