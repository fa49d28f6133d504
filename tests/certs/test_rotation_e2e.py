"""End to end: `gpu-slicer webhook serve` keeps answering while `certs` files rotate to a new CA.

This is the self-managed rotation as the apiserver sees it: the client trusts old and new CA
(the caBundle during a rotation), the files are replaced the way ``certs issue`` and the kubelet
do it (one atomic ``..data`` swap), and no request fails; new connections get the new leaf.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.sandbox.process import free_port
from tests.support.certs_cases import NAMESPACE, SERVICE

ROOT = Path(__file__).resolve().parents[2]
HOST = f"{SERVICE}.{NAMESPACE}.svc"


def _client(*cas: certs_issue.Issued) -> ssl.SSLContext:
    return ssl.create_default_context(cadata="".join(c.ca.cert_pem.decode() for c in cas))


def _get(port: int, context: ssl.SSLContext, path: str = "/healthz") -> tuple[int, bytes]:
    """One request on a new connection to 127.0.0.1, checking the certificate against the
    Service's name as the apiserver does; returns the status and the leaf presented (DER)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=HOST) as tls:
            leaf = tls.getpeercert(binary_form=True) or b""
            tls.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode()
            )
            response = http.client.HTTPResponse(tls)  # type: ignore[arg-type]
            response.begin()
            response.read()
            return response.status, leaf


@contextmanager
def _serve(folder: Path, log: Path) -> Iterator[int]:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPU_SLICER_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env["GPU_SLICER_TLS_CHECK_S"] = "0.2"
    env["GPU_SLICER_RUNTIME_DIR"] = str(log.parent / "runtime")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_slicer.cli.main",
                "webhook",
                "serve",
                "--dev",
                f"--bind=127.0.0.1:{port}",
                f"--tls-cert={folder / 'tls.crt'}",
                f"--tls-key={folder / 'tls.key'}",
                "--workers=1",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"webhook serve did not start:\n{log.read_text()[-3000:]}")
                    time.sleep(0.2)
            yield port
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _der(issued: certs_issue.Issued) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return issued.serving.cert.public_bytes(Encoding.DER)


def test_a_ca_rotation_on_disk_fails_no_request_and_new_connections_get_the_new_leaf(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "tls"
    old = certs_issue.issue(service=SERVICE, namespace=NAMESPACE, days=2, ca_days=2)
    new = certs_issue.issue(service=SERVICE, namespace=NAMESPACE, days=2, ca_days=2)
    certs_issue.write_files(old, folder)
    both = _client(old, new)  # the caBundle while a rotation is in flight
    failures: list[str] = []
    served: list[bytes] = []
    stop = threading.Event()

    def sender(port: int) -> None:
        while not stop.is_set():
            try:
                status, leaf = _get(port, both)
            except (OSError, http.client.HTTPException) as exc:
                failures.append(repr(exc))
                continue
            if status != 200:
                failures.append(f"status {status}")
            served.append(leaf)

    with _serve(folder, tmp_path / "serve.log") as port:
        assert _get(port, _client(old)) == (200, _der(old))
        thread = threading.Thread(target=sender, args=(port,))
        thread.start()
        try:
            time.sleep(0.5)
            certs_issue.write_files(new, folder)
            deadline = time.monotonic() + 20
            while _der(new) not in served[-3:]:
                assert time.monotonic() < deadline, "the new certificate was never served"
                time.sleep(0.1)
            time.sleep(0.3)
        finally:
            stop.set()
            thread.join(30)
        assert failures == []
        assert served.count(_der(old)) > 0 and served[-1] == _der(new)
        # After the swap only the new CA verifies it: why caBundle must hold both meanwhile.
        assert _get(port, _client(new)) == (200, _der(new))
        with pytest.raises(ssl.SSLCertVerificationError):
            _get(port, _client(old))
