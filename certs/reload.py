"""A TLS server context that is built once and rebuilt only when the certificate files change.

gunicorn's default context factory loads the certificate and key for every accepted connection:
rotated files are picked up, but every handshake pays for parsing PEM. Caching one context is
fast but never sees a rotation. :class:`ReloadingSSLContext` does both: it hands out a cached
``ssl.SSLContext`` and, at most every ``check_interval_s``, compares the files' identity
(inode, size, mtime) with the ones it loaded. When they differ it builds a new context; if that
fails (a pair caught half-written, a key that does not match yet) it keeps serving the previous
context and tries again at the next check, so a rotation never produces a failed handshake.

Connections already established keep the context they were accepted with; new connections get
the new certificate.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FileIdentity = tuple[int, int, int, int]  # (device, inode, size, mtime in ns)
Signature = tuple[FileIdentity | None, ...]

AEAD_CIPHERS_TLS12 = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""TLS 1.2 suites offered: forward-secret key exchange with an AEAD cipher only (no CBC, no RSA
key exchange). TLS 1.3 suites are all AEAD and unaffected. Go's TLS client (the apiserver)
offers these for both ECDSA and RSA certificates."""


def _identity(path: Path) -> FileIdentity | None:
    try:
        st = os.stat(path)  # follows symlinks: Secret volumes swap a `..data` link
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def server_context(
    cert_path: str | os.PathLike[str],
    key_path: str | os.PathLike[str],
    *,
    client_ca: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A TLS server context for the webhook: TLS 1.2 (AEAD suites only) or newer, HTTP/1.1 over
    ALPN; with ``client_ca``, a client must present a certificate that CA signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(AEAD_CIPHERS_TLS12)
    context.load_cert_chain(certfile=os.fspath(cert_path), keyfile=os.fspath(key_path))
    context.set_alpn_protocols(["http/1.1"])
    if client_ca is not None:
        context.load_verify_locations(cafile=os.fspath(client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ReloadingSSLContext:
    """Cached server ``SSLContext`` for ``cert_path``/``key_path``, rebuilt when the files change.

    With ``client_ca`` the contexts require client certificates signed by that bundle, which is
    watched for changes like the pair. Thread-safe. ``context()`` raises
    ``ssl.SSLError``/``OSError`` only when no context has ever been built (the very first load
    failed); afterwards a failed rebuild keeps the old context.
    """

    def __init__(
        self,
        cert_path: str | os.PathLike[str],
        key_path: str | os.PathLike[str],
        *,
        check_interval_s: float = 5.0,
        factory: Callable[[Path, Path], ssl.SSLContext] | None = None,
        clock: Callable[[], float] = time.monotonic,
        client_ca: str | os.PathLike[str] | None = None,
    ) -> None:
        self.cert_path = Path(cert_path)
        self.key_path = Path(key_path)
        self.client_ca = Path(client_ca) if client_ca is not None else None
        self.check_interval_s = check_interval_s
        self._factory = factory or self._server_context
        self._clock = clock
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._signature: Signature | None = None
        self._next_check = 0.0
        self.reloads = 0  # contexts built after the first one
        self.failures = 0  # rebuild attempts that kept the previous context

    def _server_context(self, cert_path: Path, key_path: Path) -> ssl.SSLContext:
        return server_context(cert_path, key_path, client_ca=self.client_ca)

    def _signature_now(self) -> Signature:
        paths = [self.cert_path, self.key_path] + ([self.client_ca] if self.client_ca else [])
        return tuple(_identity(path) for path in paths)

    def context(self) -> ssl.SSLContext:
        """The current context; checks the files if ``check_interval_s`` has passed."""
        now = self._clock()
        current = self._context
        if current is not None and now < self._next_check:
            return current
        with self._lock:
            if self._context is not None and now < self._next_check:
                return self._context
            self._next_check = now + self.check_interval_s
            signature = self._signature_now()
            if self._context is not None and signature == self._signature:
                return self._context
            return self._rebuild(signature)

    def _rebuild(self, signature: Signature) -> ssl.SSLContext:
        try:
            context = self._factory(self.cert_path, self.key_path)
        except (OSError, ssl.SSLError, ValueError) as exc:
            if self._context is None:
                raise
            self.failures += 1
            log.warning(
                "keeping the previous TLS certificate: the new files do not load yet",
                extra={"cert": str(self.cert_path), "key": str(self.key_path), "error": str(exc)},
            )
            return self._context
        if self._context is not None:
            self.reloads += 1
            log.info("TLS certificate reloaded", extra={"cert": str(self.cert_path)})
        # The files may have changed again while loading: record what was seen *before*
        # loading, so a later change is still noticed at the next check.
        self._context = context
        self._signature = signature
        return context
