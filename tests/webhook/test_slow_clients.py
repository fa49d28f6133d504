"""Slow and stalled clients against a real gunicorn over TLS: they must not block admission, and
the server closes them after its read deadline (webhook/worker.py)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from gpu_slicer.webhook.server import make_dev_certificate
from tests.support.server_fixtures import Server, admission_review, gunicorn_server, mig_pod

STALLED_PER_KIND = 24  # x 3 kinds = 72 connections, far more than gthread's 2 x 4 threads
READ_TIMEOUT_S = 1.0


@contextmanager
def _server(tmp_path: Path) -> Iterator[tuple[Server, ssl.SSLContext]]:
    cert, key = make_dev_certificate(tmp_path, ["127.0.0.1"])
    with gunicorn_server(
        tmp_path, cert=cert, key=key, workers=2, read_timeout_s=READ_TIMEOUT_S
    ) as server:
        yield server, ssl.create_default_context(cafile=str(cert))


def _tcp_idle(port: int, _context: ssl.SSLContext) -> socket.socket:
    """Connected, but never starts the TLS handshake."""
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def _tls_idle(port: int, context: ssl.SSLContext) -> socket.socket:
    """Handshake done, then silence."""
    return context.wrap_socket(_tcp_idle(port, context), server_hostname="127.0.0.1")


def _partial_body(port: int, context: ssl.SSLContext) -> socket.socket:
    """Headers announcing 10,000 bytes, then 10 of them."""
    sock = _tls_idle(port, context)
    sock.sendall(
        b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 10000\r\n\r\n{"apiVersi'
    )
    return sock


def _review(port: int, context: ssl.SSLContext) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request(
            "POST",
            "/mutate-pods",
            body=json.dumps(admission_review(mig_pod())),
            headers={"Content-Type": "application/json"},
        )
        reply = conn.getresponse()
        reply.read()
        conn.request("GET", "/healthz")
        probe = conn.getresponse()
        probe.read()
        return reply.status if probe.status == 200 else probe.status
    finally:
        conn.close()


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset within 10 s)."""
    sock.settimeout(10)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except (ssl.SSLError, ConnectionError):
        return True
    except TimeoutError:
        return False


def test_stalled_connections_neither_block_reviews_nor_stay_open(tmp_path: Path) -> None:
    with _server(tmp_path) as (server, context), ExitStack() as stack:
        stalled = [
            stack.enter_context(opener(server.port, context))
            for opener in (_tcp_idle, _tls_idle, _partial_body)
            for _ in range(STALLED_PER_KIND)
        ]
        statuses = [_review(server.port, context) for _ in range(20)]
        assert statuses == [200] * 20
        open_after = [sock for sock in stalled if not _closed_by_server(sock)]
        assert open_after == []
        assert _review(server.port, context) == 200


def test_a_kept_alive_connection_serves_several_requests_then_idles_without_a_deadline(
    tmp_path: Path,
) -> None:
    """The deadline covers reading a request, not the wait between two on one connection."""
    import time

    with _server(tmp_path) as (server, context):
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        body = json.dumps(admission_review(mig_pod()))
        statuses, sockets = [], []
        for pause in (0.0, READ_TIMEOUT_S * 1.5, 0.0):
            time.sleep(pause)
            conn.request(
                "POST", "/mutate-pods", body=body, headers={"Content-Type": "application/json"}
            )
            reply = conn.getresponse()
            reply.read()
            statuses.append(reply.status)
            sockets.append(conn.sock)
        conn.close()
        assert statuses == [200, 200, 200]
        assert all(sock is sockets[0] for sock in sockets)  # one connection served all three
