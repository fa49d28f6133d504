"""Builders and helpers of the admission-server tests (engine, app, TLS, fuzz, templates).

Kept out of conftest.py (the translation tests own that); test modules import from here.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
from cryptography.hazmat.primitives.serialization import Encoding

from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.kube.api import Obj
from gpu_slicer.sandbox.process import free_port
from gpu_slicer.webhook.config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
GUNICORN_CONF = ROOT / "webhook" / "gunicorn.conf.py"


def admission_review(
    pod: Obj | Any,
    *,
    uid: str = "0f9e5a4c-1111-2222-3333-444455556666",
    namespace: str | None = "ml",
    operation: str = "CREATE",
    dry_run: bool = False,
    kind: str = "Pod",
    sub_resource: str | None = None,
) -> dict[str, Any]:
    """An AdmissionReview v1 as the apiserver sends it for ``pod``."""
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "requestResource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "name": "",
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": pod,
        "oldObject": None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if namespace is not None:
        request["namespace"] = namespace
    if sub_resource is not None:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def mig_pod(profile: str = "1g.10gb", count: int = 1, **meta: Any) -> Obj:
    """A pod of a Deployment asking for ``count`` MIG slices through the legacy resource."""
    metadata: dict[str, Any] = {"generateName": "trainer-7d9c-", "labels": {"app": "trainer"}}
    metadata.update(meta)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": {f"nvidia.com/mig-{profile}": str(count)}},
                }
            ]
        },
    }


def plain_pod() -> Obj:
    """A pod with nothing for the webhook to convert."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-", "labels": {"app": "web"}},
        "spec": {
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example/web:1",
                    "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                }
            ]
        },
    }


def decoded_patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    assert response.get("patchType") == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert isinstance(ops, list) and ops
    return ops


def patched(pod: Obj, response: Mapping[str, Any]) -> Obj:
    """``pod`` after the response's patch (unchanged when there is none)."""
    if "patch" not in response:
        return copy.deepcopy(pod)
    return jsonpatch.apply_patch(copy.deepcopy(pod), decoded_patch(response))  # type: ignore[no-any-return]


@dataclass
class RecordingTemplates:
    """A TemplateEnsurer that remembers what it was asked; ``fail`` raises instead."""

    calls: list[tuple[list[str], bool]] = field(default_factory=list)
    fail: Exception | None = None

    def ensure(self, templates: Sequence[Obj], *, dry_run: bool) -> None:
        self.calls.append(([t["metadata"]["name"] for t in templates], dry_run))
        if self.fail is not None:
            raise self.fail

    @property
    def created(self) -> list[str]:
        return [name for names, dry in self.calls if not dry for name in names]


# ----------------------------------------------------------------------------- certificates


@dataclass
class Issued:
    cert_pem: bytes
    key_pem: bytes
    der: bytes


class TestCA:
    """A throwaway CA issuing serving certificates for 127.0.0.1."""

    __test__ = False  # not a test class, despite the name

    def __init__(self) -> None:
        self.ca = certs_issue.new_ca(days=1, common_name="gpu-slicer test CA")
        self.pem = self.ca.cert_pem

    def issue(self, host: str = "127.0.0.1") -> Issued:
        """A new serving certificate (a fresh key each time) for ``host``."""
        leaf = certs_issue.new_leaf(self.ca, [host], days=1)
        return Issued(leaf.cert_pem, leaf.key_pem, leaf.cert.public_bytes(Encoding.DER))


# ----------------------------------------------------------------------------- gunicorn


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def gunicorn_server(
    tmp: Path,
    *,
    cert: Path,
    key: Path,
    env: dict[str, str] | None = None,
    app: str | None = None,
    workers: int = 1,
    connections: int = 1000,
    read_timeout_s: float = 3.0,
    startup_s: float = 30.0,
) -> Iterator[Server]:
    """gunicorn with webhook/gunicorn.conf.py on 127.0.0.1:<random>, in dev mode (no cluster).

    Waits until the port accepts TLS connections; stops the process (and only it) afterwards.
    """
    last_error = ""
    for _attempt in range(3):
        port = free_port()
        runtime_dir = tmp / f"runtime-{port}"
        runtime_dir.mkdir()
        child_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("GPU_SLICER_") and k != "PROMETHEUS_MULTIPROC_DIR"
        }
        settings = ServerConfig(
            dev=True,
            bind=f"127.0.0.1:{port}",
            tls_cert=str(cert),
            tls_key=str(key),
            workers=workers,
            connections=connections,
            read_timeout_s=read_timeout_s,
            runtime_dir=str(runtime_dir),
            log_level="WARNING",
        )
        child_env.update(settings.to_env())
        child_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), child_env.get("PYTHONPATH", "")])
        child_env.update(env or {})
        log_path = tmp / f"gunicorn-{port}.log"
        args = [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF)]
        if app:
            args.append(app)
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                args, cwd=ROOT, env=child_env, stdout=log_file, stderr=subprocess.STDOUT
            )
        server = Server(port, process, log_path)
        try:
            if _wait_listening(server, startup_s):
                yield server
                return
            last_error = server.log()
        finally:
            _stop(process)
    raise RuntimeError(f"gunicorn did not start:\n{last_error}")


def _wait_listening(server: Server, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:  # the master listens before workers boot; the kernel queues the connection
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
