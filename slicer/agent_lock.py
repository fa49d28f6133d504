"""One agent per node: an exclusive lock on the checkpoint folder, held for the agent's life.

Why: two agents on the same folders unlink each other's sockets and overwrite each other's
checkpoint, and instances one of them created are then called foreign forever. The lock is a
``flock`` on ``<checkpoint dir>/agent.lock``: the kernel releases it when the holder dies, however
it dies, so a stale lock never needs cleaning up. The holder writes its pid, host name and start
time into the file, so that a refused agent can name it.

During a rolling update of the DaemonSet the new pod may start while the old one is still
stopping; it waits up to ``wait_s`` for the lock (``--lock-wait``) instead of failing at once.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from gpu_slicer.kube.atomic_files import ensure_dir
from gpu_slicer.slicer.checkpoint import DIR_MODE
from gpu_slicer.slicer.errors import SlicerError

LOCK_FILE = "agent.lock"
LOCK_MODE = 0o644
"""Anyone on the node may read who holds the lock; only its owner writes (whatever the umask)."""


class AgentLockHeld(SlicerError):
    """Another agent holds the node's lock; ``holder`` is what it wrote (pid, host, start)."""

    def __init__(self, path: Path, holder: str, waited_s: float) -> None:
        self.path = path
        self.holder = holder
        waited = f" after waiting {waited_s:g} s" if waited_s > 0 else ""
        super().__init__(
            f"another agent holds {path} ({holder or 'holder unknown'}){waited}; one agent per "
            "node: stop it first, or give --lock-wait SECONDS to wait for it to exit"
        )


class AgentLock:
    """The held lock; :meth:`release` (or the process's exit) lets the next agent in."""

    def __init__(self, path: Path, file: IO[str]) -> None:
        self.path = path
        self._file: IO[str] | None = file

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor releases the flock
            self._file = None


def holder_of(path: Path) -> str:
    """What the lock's holder wrote into it ('' when unreadable)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()[:200]
    except OSError:
        return ""


def acquire(
    folder: Path,
    *,
    wait_s: float = 0.0,
    poll_s: float = 0.2,
    on_wait: Callable[[str], None] = lambda holder: None,
    clock: Callable[[], float] = time.monotonic,
) -> AgentLock:
    """The node's agent lock in ``folder`` (created if missing), waiting up to ``wait_s``.

    Raises :class:`AgentLockHeld` naming the holder when it is still held after ``wait_s``;
    ``on_wait`` is called once, with the holder, when the first try fails and waiting begins.
    Nothing but the lock file is created or changed.
    """
    ensure_dir(folder, DIR_MODE, own=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, LOCK_MODE)
    os.fchmod(fd, LOCK_MODE)  # open's mode is filtered through the umask; an old file too
    file = open(fd, "a+", encoding="utf-8")  # noqa: SIM115 - held open while the agent runs
    deadline = clock() + wait_s
    told = False
    while True:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = holder_of(path)
            if clock() >= deadline:
                file.close()
                raise AgentLockHeld(path, holder, wait_s) from None
            if not told:
                on_wait(holder)
                told = True
            time.sleep(min(poll_s, max(0.0, deadline - clock())))
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    file.seek(0)
    file.truncate()
    file.write(f"pid {os.getpid()} on {socket.gethostname()} since {started}\n")
    file.flush()
    return AgentLock(path, file)
