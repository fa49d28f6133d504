"""The real KubeApi: raw JSON over the official client's HTTP layer.

Only the transport of the ``kubernetes`` package is used (``ApiClient.param_serialize`` and
``ApiClient.call_api``: authentication, TLS, proxies, the kubeconfig), never its generated model
classes. Objects go out and come back as plain dicts, so no field is lost in a model round trip
and the confusing v1 ResourceClaim model names do not matter. REST paths come from
:data:`kube.api.RESOURCES`; every failure leaves this module as a ``kube.errors`` exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gpu_slicer.kube.api import (
    JsonPatch,
    Obj,
    ObjectList,
    PatchType,
    Resource,
    WatchEvent,
    resource_for,
)
from gpu_slicer.kube.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    Unavailable,
)

_JSON = "application/json"
PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"  # JSON is YAML; the apiserver accepts it
_WATCH_READ_SLACK_S = 10.0
_WATCH_MAX_READ_S = 3700.0
# Module-level aliases: inside the class the method named `list` shadows the builtin.
_Query = list[tuple[str, str]]


def collection_path(res: Resource, namespace: str | None) -> str:
    """``/api/v1[/namespaces/<ns>]/<plural>`` or ``/apis/<group>/<version>[/namespaces/<ns>]/...``.

    A namespaced kind without a namespace addresses every namespace (list and watch only).
    """
    base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
    if res.namespaced and namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    return f"{base}/{res.plural}"


def object_path(res: Resource, name: str, namespace: str | None) -> str:
    if not name:
        raise Invalid(f"{res.kind}: a name is required (metadata.name)")
    if res.namespaced and not namespace:
        raise Invalid(f"{res.kind} {name} is namespaced: pass the namespace")
    return f"{collection_path(res, namespace)}/{quote(name, safe='')}"


def error_from_status(status: int, reason: str, body: str | bytes | None) -> KubeError:
    """Map an HTTP failure (and its ``Status`` body, if any) onto ``kube.errors``."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    message, status_reason = text.strip()[:500] or reason or f"HTTP {status}", ""
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        message = str(parsed.get("message") or message)
        status_reason = str(parsed.get("reason") or "")
    if status == 404:
        return NotFound(message)
    if status == 409:
        return AlreadyExists(message) if status_reason == "AlreadyExists" else Conflict(message)
    if status == 422:
        return Invalid(message)
    if status == 403:
        return Forbidden(message)
    if status == 429 or status >= 500 or status == 0:
        return Unavailable(f"apiserver unavailable (HTTP {status}): {message}")
    return ApiError(message, status=status, reason=status_reason or reason)


def error_from_api_exception(exc: ApiException) -> KubeError:
    """Map the client's ``ApiException`` (status 0 means no HTTP answer, e.g. a TLS failure)."""
    return error_from_status(int(exc.status or 0), str(exc.reason or ""), exc.body)


def _parse_minor(minor: str) -> int:
    match = re.match(r"\d+", minor)
    if match is None:
        raise ApiError(f"cannot read the apiserver's minor version {minor!r}", status=200)
    return int(match.group())


class RealKubeApi:
    """:class:`kube.api.KubeApi` on a ``kubernetes.client.ApiClient``.

    ``request_timeout_s`` bounds every call except watches, whose read timeout follows their
    ``timeout_s`` (the apiserver ends the stream itself after ``timeoutSeconds``).
    """

    def __init__(
        self, api_client: k8s_client.ApiClient, *, request_timeout_s: float = 30.0
    ) -> None:
        self._client = api_client
        self._timeout = request_timeout_s

    @classmethod
    def from_config(cls, kubeconfig: str | None = None) -> RealKubeApi:
        """Load credentials: the kubeconfig if given, else in-cluster, else ~/.kube/config."""
        configuration = k8s_client.Configuration()
        try:
            if kubeconfig:
                k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, client_configuration=configuration
                )
            else:
                try:
                    k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                        client_configuration=configuration
                    )
                except ConfigException:
                    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                        client_configuration=configuration
                    )
        except (ConfigException, OSError) as exc:
            where = kubeconfig or "the in-cluster service account or the default kubeconfig"
            raise KubeError(f"cannot load Kubernetes credentials from {where}: {exc}") from exc
        except Exception as exc:  # a kubeconfig the client library cannot parse (not YAML, a list)
            where = kubeconfig or "the default kubeconfig"
            raise KubeError(
                f"cannot load Kubernetes credentials from {where}: {type(exc).__name__}: {exc}"
            ) from exc
        return cls(k8s_client.ApiClient(configuration))

    # ----------------------------------------------------------------- KubeApi
    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj:
        res = resource_for(api_version, kind)
        return self._json("GET", object_path(res, name, namespace))

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        res = resource_for(api_version, kind)
        query = self._selectors(label_selector, field_selector)
        body = self._json("GET", collection_path(res, namespace), query=query)
        items: list[Obj] = body.get("items") or []
        for item in items:  # list items come without apiVersion and kind
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return ObjectList(
            items=items, resource_version=str(body.get("metadata", {}).get("resourceVersion", ""))
        )

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[WatchEvent]:
        """Open the stream now (HTTP errors raise here); ERROR events raise during iteration."""
        res = resource_for(api_version, kind)
        query = [("watch", "true"), *self._selectors(label_selector, field_selector)]
        if resource_version is not None:
            query.append(("resourceVersion", resource_version))
        # The apiserver closes a watch without timeoutSeconds after at most an hour; reading
        # longer than that means the connection died silently, which ends the watch too.
        read_timeout: float | None = _WATCH_MAX_READ_S
        if timeout_s is not None:
            query.append(("timeoutSeconds", str(max(1, int(timeout_s)))))
            read_timeout = timeout_s + _WATCH_READ_SLACK_S
        response = self._call(
            "GET",
            collection_path(res, namespace),
            query=query,
            timeout=(self._timeout, read_timeout),
        )
        if not 200 <= response.status <= 299:
            raise error_from_status(response.status, response.reason or "", response.read())
        return self._stream(response)

    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        res, namespace, _ = self._identify(obj)
        query = [("dryRun", "All")] if dry_run else []
        return self._json("POST", collection_path(res, namespace), query=query, body=obj)

    def update(self, obj: Obj) -> Obj:
        res, namespace, name = self._identify(obj)
        return self._json("PUT", object_path(res, name, namespace), body=obj)

    def apply(self, obj: Obj, *, field_manager: str, force: bool = False) -> Obj:
        res, namespace, name = self._identify(obj)
        query = [("fieldManager", field_manager)]
        if force:
            query.append(("force", "true"))
        return self._json(
            "PATCH",
            object_path(res, name, namespace),
            query=query,
            body=obj,
            content_type=APPLY_CONTENT_TYPE,
        )

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Obj | JsonPatch,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
    ) -> Obj:
        res = resource_for(api_version, kind)
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(
                f"unknown patch_type {patch_type!r}; use merge, json or strategic"
            ) from None
        if patch_type == "json" and not isinstance(patch, list):
            # The client would silently turn a dict sent as json-patch into a strategic merge.
            raise Invalid(f"a json patch must be a list of operations, not {patch!r}")
        return self._json(
            "PATCH", object_path(res, name, namespace), body=patch, content_type=content_type
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
    ) -> None:
        res = resource_for(api_version, kind)
        body: Obj | None = None
        if resource_version is not None:
            body = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"resourceVersion": resource_version},
            }
        self._json("DELETE", object_path(res, name, namespace), body=body)

    def server_version(self) -> tuple[int, int]:
        info = self._json("GET", "/version")
        try:
            return int(str(info["major"]).rstrip("+")), _parse_minor(str(info["minor"]))
        except (KeyError, ValueError) as exc:
            raise ApiError(f"unexpected /version answer {info!r}", status=200) from exc

    # ----------------------------------------------------------------- internals
    @staticmethod
    def _identify(obj: Obj) -> tuple[Resource, str | None, str]:
        if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
            raise Invalid("the object needs apiVersion and kind")
        res = resource_for(obj["apiVersion"], obj["kind"])
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") if res.namespaced else None
        if res.namespaced and not namespace:
            raise Invalid(f"{res.kind} {meta.get('name', '')}: metadata.namespace is required")
        return res, namespace, str(meta.get("name") or "")

    @staticmethod
    def _selectors(label_selector: str | None, field_selector: str | None) -> _Query:
        query = []
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        return query

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: _Query | None = None,
        body: Any = None,
        content_type: str = _JSON,
        timeout: Any = None,
    ) -> Any:
        """Send one request; the answer is a ``RESTResponse`` whose body is not yet read."""
        headers = {"Accept": _JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            request = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query or []),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            return self._client.call_api(
                *request, _request_timeout=timeout if timeout is not None else self._timeout
            )
        except ApiException as exc:
            raise error_from_api_exception(exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"cannot reach the apiserver for {method} {path}: {exc}") from exc

    def _json(
        self,
        method: str,
        path: str,
        *,
        query: _Query | None = None,
        body: Any = None,
        content_type: str = _JSON,
    ) -> Obj:
        response = self._call(method, path, query=query, body=body, content_type=content_type)
        try:
            data = response.read()
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"lost the apiserver while reading {method} {path}: {exc}") from exc
        if not 200 <= response.status <= 299:
            raise error_from_status(response.status, response.reason or "", data)
        if not data:
            return {}
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise ApiError(
                f"{method} {path} answered with something that is not JSON: {data[:200]!r}",
                status=response.status,
            ) from exc
        if not isinstance(parsed, dict):
            raise ApiError(f"{method} {path} answered {parsed!r}", status=response.status)
        return parsed

    def _stream(self, response: Any) -> Iterator[WatchEvent]:
        raw = response.response  # the urllib3 response, streamed (preload_content=False)
        buffer = b""
        finished = False
        try:
            for chunk in raw.stream(amt=None, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield self._event(line)
            finished = True
            if buffer.strip():
                yield self._event(buffer)
        except urllib3.exceptions.ReadTimeoutError:
            return  # the apiserver ends a watch at timeoutSeconds; a silent end is the same
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"the watch stream broke: {exc}") from exc
        finally:
            if finished:
                raw.release_conn()
            else:  # the caller stopped early: drop the connection rather than reuse a live stream
                raw.close()

    @staticmethod
    def _event(line: bytes) -> WatchEvent:
        try:
            decoded = json.loads(line)
            type_, obj = decoded["type"], decoded["object"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ApiError(f"unreadable watch event {line[:200]!r}", status=200) from exc
        if type_ == "ERROR":
            status = obj.get("code", 500) if isinstance(obj, dict) else 500
            raise error_from_status(int(status), "", json.dumps(obj))
        if type_ not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            raise ApiError(f"unknown watch event type {type_!r}", status=200)
        return WatchEvent(type_, obj)
