"""Child processes of the sandbox: started with a log file, checked for readiness, stopped.

Every child runs in its own process group, so stopping it also stops what it started (gunicorn
workers, for example), and nothing outlives the sandbox.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from gpu_slicer.sandbox.errors import StartupError, UsageError


class Component:
    """One child process: a control-plane binary, the webhook or an agent."""

    def __init__(
        self, name: str, argv: Sequence[str], *, log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- starting {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        """SIGTERM to the process group; :meth:`stop` then waits (so many stop at once)."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the process group, then SIGKILL after ``timeout_s``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # Whatever the leader left behind in its group (a worker mid-restart) goes too.
        _signal_group(self.process.pid, signal.SIGKILL)

    def wait_ready(self, check: Callable[[], bool], *, timeout_s: float, what: str) -> None:
        """Polls ``check`` until it holds; fails at once if the process exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise StartupError(
                    f"{self.name} exited with code {self.exit_code()} before {what}; "
                    f"see {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise StartupError(
            f"{self.name}: no {what} after {timeout_s:.0f} s; see {self.log_path}"
            f":\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def stop_all(components: list[Component], timeout_s: float = 15.0) -> None:
    """Stops ``components`` together: all are signalled before any is waited for."""
    for component in components:
        component.terminate()
    deadline = time.monotonic() + timeout_s
    for component in components:
        component.stop(max(0.1, deadline - time.monotonic()))


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def https_ok(url: str, *, ca: Path | None, client_cert: tuple[Path, Path] | None = None) -> bool:
    """True when ``url`` answers 200 (``ca=None`` skips verification: self-signed endpoints)."""
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    if ca is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert:
        context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, TimeoutError, ConnectionError, ssl.SSLError):
        return False


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED = 10000
"""Ports are picked at or above this (below it lie well-known and registered services)."""


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel takes outgoing connections' source ports from (Linux's file; the
    IANA range where there is none)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 49152, 65535
    return low, high


def free_port() -> int:
    """A port free on 127.0.0.1 now, outside the ephemeral range where there is room.

    A component listens seconds after its port is chosen, and meanwhile every outgoing
    connection (the apiserver to etcd, each client to the apiserver) takes a source port from
    the ephemeral range: a port the kernel handed out there (``bind(0)``) can be some
    connection's by the time the component binds it (seen: the webhook refused to start with
    "port already in use"). Ports below the range are never handed out that way.
    """
    low, _high = ephemeral_ports()
    if low - LOWEST_PICKED >= 1000:
        for _attempt in range(100):
            port = random.randrange(LOWEST_PICKED, low)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def check_port_free(port: int, flag: str) -> int:
    """``port`` if it can be bound on 127.0.0.1 (0: any free port); a usage error otherwise."""
    if not 0 <= port <= 65535:
        raise UsageError(f"{flag} {port} is not a port number (0-65535)")
    if port == 0:
        return free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise UsageError(
                f"{flag} {port}: 127.0.0.1:{port} is not free ({exc.strerror})"
            ) from None
    return port
