"""A real gunicorn over TLS on 127.0.0.1: handshakes, a patch, multi-worker metrics, and a
certificate rotated on disk while clients keep sending requests."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import (
    TestCA,
    admission_review,
    gunicorn_server,
    mig_pod,
    patched,
    write_atomically,
)

from webhook.server import make_dev_certificate


def _client_context(cafile: Path | None = None, cadata: bytes | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=str(cafile) if cafile else None,
        cadata=cadata.decode() if cadata else None,
    )
    return context


def _post(conn: http.client.HTTPSConnection, body: dict[str, Any]) -> tuple[int, Any]:
    conn.request("POST", "/mutate-pods", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
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
    with gunicorn_server(tmp_path, cert=cert, key=key, workers=2, threads=2) as server:
        for index in range(12):  # a new connection each time: the kernel spreads them
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context,
                                               timeout=10)
            status, _ = _post(conn, admission_review(mig_pod(), uid=f"m-{index}"))
            assert status == 200
            conn.close()
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    totals = [line for line in text.splitlines()
              if line.startswith('gpu_slicer_webhook_requests_total{mode="enabled",'
                                 'outcome="patched"}')]
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
    first, second = ca.issue("webhook-1"), ca.issue("webhook-2")
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

    with gunicorn_server(tmp_path, cert=cert, key=key, threads=4,
                         env={"GPU_SLICER_TLS_CHECK_S": "0.2"}) as server:
        assert _served_certificate(server.port, context) == first.der
        senders = [threading.Thread(target=keep_alive_sender, args=(server.port,)),
                   threading.Thread(target=fresh_sender, args=(server.port,))]
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
