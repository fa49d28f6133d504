"""How a stopping webhook worker treats the apiserver's kept-alive connections (webhook/worker.py),
on a real gunicorn over TLS.

The apiserver pools its connections to the webhook by the Service's name and keeps sending on
one to a replica that is being replaced until the replica closes it. A request written on a
connection as the server closes it is lost, and ``failurePolicy: Ignore`` then admits the pod
unconverted: the upgrade test saw exactly that at a replaced replica's SIGTERM. So a stopping
worker answers the next request on each kept-alive connection, with ``Connection: close``, and
closes only what stays idle for ``DRAIN_S``.
"""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpu_slicer.webhook.server import make_dev_certificate
from gpu_slicer.webhook.worker import DRAIN_S
from tests.support.server_fixtures import Server, admission_review, gunicorn_server, mig_pod

BODY = json.dumps(admission_review(mig_pod()))
STOPPING_S = 1.5
"""After SIGTERM, when the worker has begun to stop: it looks at its flag every second."""


@contextmanager
def _server(tmp_path: Path) -> Iterator[tuple[Server, ssl.SSLContext]]:
    cert, key = make_dev_certificate(tmp_path, ["127.0.0.1"])
    with gunicorn_server(tmp_path, cert=cert, key=key, workers=1) as server:
        yield server, ssl.create_default_context(cafile=str(cert))


def _review(conn: http.client.HTTPSConnection) -> http.client.HTTPResponse:
    conn.request("POST", "/mutate-pods", body=BODY, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    reply.read()
    return reply


def test_a_stopping_worker_answers_the_next_request_on_a_kept_alive_connection_then_closes_it(
    tmp_path: Path,
) -> None:
    with _server(tmp_path) as (server, context):
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        first = _review(conn)
        assert first.status == 200 and first.getheader("Connection") != "close"

        server.process.send_signal(signal.SIGTERM)
        time.sleep(STOPPING_S)  # idle on the kept-alive connection while the worker stops
        try:
            last = _review(conn)
        except OSError as exc:  # reset, EOF, TLS EOF: the request was lost
            raise AssertionError(
                f"the stopping worker dropped a request on a kept-alive connection: {exc!r}"
            ) from exc
        # Not a new connection: the master closed the listener at SIGTERM.
        assert last.status == 200
        assert last.getheader("Connection") == "close"
        assert conn.sock is None  # http.client closed it, as told
        assert server.process.wait(timeout=30) == 0
        conn.close()


def test_a_stopping_worker_closes_a_connection_that_stays_idle_after_the_drain(
    tmp_path: Path,
) -> None:
    """The drain does not hold a stop for the whole graceful timeout (20 s) because a client
    keeps an idle connection open."""
    with _server(tmp_path) as (server, context):
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
        assert _review(conn).status == 200
        assert conn.sock is not None
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert conn.sock.recv(1) == b""  # closed by the server, not by the client's timeout
        closed_after = time.monotonic() - signalled
        assert DRAIN_S <= closed_after < 20, closed_after
        assert server.process.wait(timeout=30) == 0
        conn.close()
