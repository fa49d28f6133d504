"""A real gunicorn over TLS on 127.0.0.1: handshakes, a patch, multi-worker metrics, and a
certificate rotated on disk while clients keep sending requests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.kube.atomic_files import write_atomically
from gpu_slicer.webhook.server import make_dev_certificate
from tests.support.server_fixtures import (
    ROOT,
    TestCA,
    admission_review,
    free_port,
    gunicorn_server,
    mig_pod,
    patched,
)


def _client_context(cafile: Path | None = None, cadata: bytes | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=str(cafile) if cafile else None,
        cadata=cadata.decode() if cadata else None,
    )
    return context


def _post(conn: http.client.HTTPSConnection, body: dict[str, Any]) -> tuple[int, Any]:
    conn.request(
        "POST", "/mutate-pods", body=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    reply = conn.getresponse()
    data = reply.read()
    return reply.status, json.loads(data)


def test_a_client_trusting_only_the_certificate_gets_a_patch_over_tls(tmp_path: Path) -> None:
    cert, key = make_dev_certificate(tmp_path, ["127.0.0.1"])
    with gunicorn_server(tmp_path, cert=cert, key=key) as server:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=_client_context(cafile=cert), timeout=10
        )
        pod = mig_pod()
        status, body = _post(conn, admission_review(pod, uid="tls-1"))
        assert conn.sock is not None
        assert conn.sock.version() in ("TLSv1.2", "TLSv1.3")
        conn.close()

        untrusting = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=_client_context(cadata=TestCA().pem), timeout=10
        )
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusting.request("GET", "/healthz")
        untrusting.close()
    assert status == 200
    assert body["response"]["uid"] == "tls-1"
    assert patched(pod, body["response"])["spec"]["resourceClaims"]


def test_metrics_are_summed_over_several_workers(tmp_path: Path) -> None:
    cert, key = make_dev_certificate(tmp_path, ["127.0.0.1"])
    context = _client_context(cafile=cert)
    with gunicorn_server(tmp_path, cert=cert, key=key, workers=2) as server:
        for index in range(12):  # a new connection each time: the kernel spreads them
            conn = http.client.HTTPSConnection(
                "127.0.0.1", server.port, context=context, timeout=10
            )
            status, _ = _post(conn, admission_review(mig_pod(), uid=f"m-{index}"))
            assert status == 200
            conn.close()
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    totals = [
        line
        for line in text.splitlines()
        if line.startswith('gpu_slicer_webhook_requests_total{mode="enabled",outcome="patched"}')
    ]
    assert totals and float(totals[0].rsplit(" ", 1)[1]) == 12


def _served_certificate(port: int, context: ssl.SSLContext) -> bytes:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        assert conn.sock is not None
        der = conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return der
    finally:
        conn.close()


def test_a_certificate_swap_on_disk_fails_no_request_and_new_connections_get_the_new_one(
    tmp_path: Path,
) -> None:
    ca = TestCA()
    first, second = ca.issue(), ca.issue()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_atomically(cert, first.cert_pem)
    write_atomically(key, first.key_pem)
    context = _client_context(cadata=ca.pem)
    failures: list[str] = []
    counts = {"keepalive": 0, "fresh": 0}
    stop = threading.Event()

    def keep_alive_sender(port: int) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        while not stop.is_set():
            try:
                status, _ = _post(conn, admission_review(mig_pod()))
                if status != 200:
                    failures.append(f"keep-alive status {status}")
                counts["keepalive"] += 1
            except (OSError, http.client.HTTPException) as exc:
                failures.append(f"keep-alive: {exc!r}")
                conn.close()
        conn.close()

    def fresh_sender(port: int) -> None:
        while not stop.is_set():
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
            try:
                status, _ = _post(conn, admission_review(mig_pod()))
                if status != 200:
                    failures.append(f"new connection status {status}")
                counts["fresh"] += 1
            except (OSError, http.client.HTTPException) as exc:
                failures.append(f"new connection: {exc!r}")
            finally:
                conn.close()

    with gunicorn_server(
        tmp_path, cert=cert, key=key, env={"GPU_SLICER_TLS_CHECK_S": "0.2"}
    ) as server:
        assert _served_certificate(server.port, context) == first.der
        senders = [
            threading.Thread(target=keep_alive_sender, args=(server.port,)),
            threading.Thread(target=fresh_sender, args=(server.port,)),
        ]
        for sender in senders:
            sender.start()
        try:
            time.sleep(0.5)
            write_atomically(cert, second.cert_pem)  # for a moment cert and key do not match
            time.sleep(0.3)
            write_atomically(key, second.key_pem)
            deadline = time.monotonic() + 15
            while _served_certificate(server.port, context) != second.der:
                assert time.monotonic() < deadline, "the new certificate was never served"
                time.sleep(0.1)
            before = dict(counts)
            time.sleep(0.5)
        finally:
            stop.set()
            for sender in senders:
                sender.join(20)
        log = server.log()
    assert failures == [], failures
    assert counts["keepalive"] > before["keepalive"] > 0
    assert counts["fresh"] > before["fresh"] > 0
    assert "Traceback" not in log


def _worker_pids(master: int) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                pids.add(int(entry.name))
    return pids


def test_metrics_survive_a_worker_killed_and_replaced(tmp_path: Path) -> None:
    cert, key = make_dev_certificate(tmp_path, ["127.0.0.1"])
    context = _client_context(cafile=cert)
    with gunicorn_server(tmp_path, cert=cert, key=key, workers=2) as server:
        for index in range(6):
            conn = http.client.HTTPSConnection(
                "127.0.0.1", server.port, context=context, timeout=10
            )
            assert _post(conn, admission_review(mig_pod(), uid=f"k-{index}"))[0] == 200
            conn.close()
        deadline = time.monotonic() + 15
        while len(workers := _worker_pids(server.process.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        victim = sorted(workers)[0]
        os.kill(victim, signal.SIGKILL)
        while victim in (now := _worker_pids(server.process.pid)) or len(now) < 2:
            assert time.monotonic() < deadline, "gunicorn did not replace the worker"
            time.sleep(0.05)
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        log = server.log()
    patched_total = [
        line
        for line in text.splitlines()
        if line.startswith('gpu_slicer_webhook_requests_total{mode="enabled",outcome="patched"}')
    ]
    assert float(patched_total[0].rsplit(" ", 1)[1]) == 6  # the dead worker's counts remain
    assert "Traceback" not in log


def test_webhook_serve_dev_makes_a_certificate_and_answers(tmp_path: Path) -> None:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPU_SLICER_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env["GPU_SLICER_RUNTIME_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_slicer.cli.main",
                "webhook",
                "serve",
                "--dev",
                "--workers",
                "1",
                "--bind",
                f"127.0.0.1:{port}",
                "--namespace-mode",
                "audit",
            ],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        cert = tmp_path / "dev-tls.crt"
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            if cert.exists():
                try:
                    conn = http.client.HTTPSConnection(
                        "127.0.0.1", port, context=_client_context(cafile=cert), timeout=10
                    )
                    status, body = _post(conn, admission_review(mig_pod()))
                    conn.close()
                    break
                except OSError:
                    pass
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert status == 200
    assert "patch" not in body["response"] and body["response"]["warnings"]  # audit mode
    assert '"dev mode: self-signed certificate' in log_path.read_text()


def test_with_a_client_ca_the_server_answers_only_clients_with_its_certificates(
    tmp_path: Path,
) -> None:
    from gpu_slicer.certs.issue import new_ca, new_leaf

    cert, key = make_dev_certificate(tmp_path, ["127.0.0.1"])
    client_ca = new_ca(days=1, common_name="apiserver client CA")
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem)
    leaf = new_leaf(client_ca, ["kube-apiserver"], days=1, client_auth=True)
    (tmp_path / "apiserver.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "apiserver.key").write_bytes(leaf.key_pem)
    with gunicorn_server(
        tmp_path, cert=cert, key=key, env={"GPU_SLICER_CLIENT_CA": str(tmp_path / "client-ca.crt")}
    ) as server:
        anonymous = http.client.HTTPSConnection(
            "127.0.0.1", server.port, timeout=10, context=_client_context(cert)
        )
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _post(anonymous, admission_review(mig_pod()))
        anonymous.close()
        context = _client_context(cert)
        context.load_cert_chain(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
        apiserver = http.client.HTTPSConnection(
            "127.0.0.1", server.port, timeout=10, context=context
        )
        status, _body = _post(apiserver, admission_review(mig_pod()))
        apiserver.close()
    assert status == 200
