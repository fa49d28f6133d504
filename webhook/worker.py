"""The webhook's gunicorn worker: gevent greenlets, and a read deadline on every connection.

Why not gunicorn's ``gthread``: there every connection holds a thread while it is read, so eight
clients that open a TLS connection and then stall take all eight threads of two workers, and
real reviews (and the liveness probe) get no answer until the apiserver gives up. Here:

- a connection costs a greenlet, not a thread: clients that stall take no capacity from others
  (up to ``worker_connections`` connections per worker);
- a connection must complete its TLS handshake and deliver a whole request (headers and body)
  within ``read_timeout_s`` of being accepted, and a later request on a kept-alive connection
  within ``read_timeout_s`` of its first byte; otherwise it is closed. Waiting for that first
  byte is bounded by gunicorn's ``keepalive``. Writing a reply to a client that does not read
  is bounded by ``read_timeout_s`` too;
- a stopping worker neither drops a request nor waits long for idle clients: a kept-alive
  connection carries one more request, answered with ``Connection: close``, and one that stays
  idle for :data:`DRAIN_S` is closed then (see :meth:`DeadlineGeventWorker.run`).

Everything else (the HTTP parser, keep-alive, the WSGI call, the ``ssl_context`` hook asked for a
context on every connection, so that rotated certificates are served) is gunicorn's own
``gevent`` worker, which this class extends.
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import gevent
from gevent.pool import Pool
from gevent.server import StreamServer
from gunicorn import util
from gunicorn.sock import ssl_context
from gunicorn.workers.ggevent import GeventWorker

log = logging.getLogger(__name__)

DRAIN_S = 5.0
"""How long a stopping worker keeps an idle kept-alive connection open for one more request.

The apiserver pools its connections to a webhook by the Service's name, not by endpoint, so it
keeps sending on a connection to a replica whose endpoint is gone until that replica closes it.
Closing an idle connection races with a request being written on it, which is then lost and
admitted unconverted under ``failurePolicy: Ignore`` (the apiserver retries only what it had
not started writing). Answering one more request with ``Connection: close`` moves the client
to a new connection, hence to a replica still serving; only a connection idle this long is
closed, when a request on it is unlikely. Well within gunicorn's ``graceful_timeout`` (20 s).
"""


class _Expired(Exception):
    """A connection's deadline passed while it was waited on."""


class DeadlineSocket:
    """A connected socket whose reads end at the current request's deadline.

    A read past the deadline shuts the connection down and returns ``b""``: to gunicorn's parser
    that is a client that went away, which closes the connection without an error log. Anything
    not overridden here is the wrapped socket's.
    """

    def __init__(self, sock: Any, *, read_timeout_s: float, idle_timeout_s: float) -> None:
        self._sock = sock
        self._read_timeout_s = read_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._deadline = time.monotonic() + read_timeout_s
        self._between_requests = False
        self.expired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    @property
    def idle(self) -> bool:
        """Whether the connection is waiting for the next request (a reply was written)."""
        return self._between_requests

    def start_tls(self, context: Any) -> bool:
        """Wraps the socket in TLS and completes the handshake before the deadline."""
        self._sock = context.wrap_socket(
            self._sock, server_side=True, do_handshake_on_connect=False
        )
        try:
            self._within(self._deadline - time.monotonic(), self._sock.do_handshake)
        except (_Expired, OSError):  # ssl.SSLError is an OSError
            self.expire()
            return False
        return True

    def recv(self, size: int) -> bytes:
        if self.expired:
            return b""
        if self._between_requests:  # a kept-alive connection: its next request may take a while
            data = self._read(self._idle_timeout_s, size)
            self._between_requests = False
            self._deadline = time.monotonic() + self._read_timeout_s
            return data
        return self._read(self._deadline - time.monotonic(), size)

    def sendall(self, data: bytes) -> None:
        self._between_requests = True  # a reply is being written: the request was read
        try:
            self._within(self._read_timeout_s, self._sock.sendall, data)
        except _Expired:
            self.expire()
            raise BrokenPipeError(errno.EPIPE, "the client did not read the reply") from None

    def expire(self) -> None:
        """Ends the connection: the next read returns ``b""`` and writes fail."""
        self.expired = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _read(self, seconds: float, size: int) -> bytes:
        try:
            data: bytes = self._within(seconds, self._sock.recv, size)
        except _Expired:
            log.debug("closing a connection that missed its read deadline")
            self.expire()
            return b""
        return data

    @staticmethod
    def _within(seconds: float, call: Any, *args: Any) -> Any:
        if seconds <= 0:
            raise _Expired()
        with gevent.Timeout(seconds, _Expired):
            return call(*args)


class DeadlineGeventWorker(GeventWorker):  # type: ignore[misc]
    """gunicorn's gevent worker with per-connection read deadlines (see the module docstring).

    ``worker_class = "gpu_slicer.webhook.worker.DeadlineGeventWorker"``; the deadline comes from
    ``GPU_SLICER_READ_TIMEOUT_S`` through :class:`webhook.config.ServerConfig`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from gpu_slicer.webhook.config import ServerConfig

        self.read_timeout_s = ServerConfig.from_env().read_timeout_s
        self.connections: set[DeadlineSocket] = set()

    def run(self) -> None:
        servers = []
        for listener in self.sockets:
            listener.setblocking(1)
            server = StreamServer(
                listener,
                handle=functools.partial(self.handle, listener),
                spawn=Pool(self.worker_connections),
            )
            if self.cfg.workers > 1:
                server.max_accept = 1  # spread connections over the workers
            server.start()
            servers.append(server)
        while self.alive:
            self.notify()
            gevent.sleep(1.0)
        for server in servers:
            server.close()  # stop accepting
        # Stopping: gunicorn answers every request from now on with Connection: close, so a
        # kept-alive connection ends after its next reply. One that stays idle is closed later.
        stopped = time.monotonic()
        self._wait_while(lambda: any(conn.idle for conn in self.connections), stopped + DRAIN_S)
        for conn in list(self.connections):
            if conn.idle:
                conn.expire()
        self._wait_while(
            lambda: any(server.pool.free_count() != server.pool.size for server in servers),
            stopped + self.cfg.graceful_timeout,
        )
        for server in servers:
            server.stop(timeout=1)

    def _wait_while(self, busy: Callable[[], bool], deadline: float) -> None:
        """Until ``busy()`` is false or ``deadline`` (monotonic) passes, telling the arbiter
        that this worker is alive."""
        while time.monotonic() < deadline and busy():
            self.notify()
            gevent.sleep(0.1)

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        client.setblocking(1)
        conn = DeadlineSocket(
            client, read_timeout_s=self.read_timeout_s, idle_timeout_s=self.cfg.keepalive
        )
        if self.cfg.is_ssl and not conn.start_tls(ssl_context(self.cfg)):
            util.close(conn)  # the TLS socket owns the descriptor now
            return
        self.connections.add(conn)
        try:
            super().handle(listener, conn, addr)
        finally:
            self.connections.discard(conn)
