"""Who may watch the devices' health, and who gives way when too many do.

The kubelet keeps one ``NodeWatchResources`` stream open on the DRA socket per driver name the
agent registered, two in all (:mod:`slicer.plugin`, :mod:`slicer.device_health`). Any local
process that can open the socket can open more, and each open stream holds one of the gRPC
server's threads for as long as it lives; a client that never reads also leaves its stream stuck
in a send once HTTP/2 flow control stops it. Before these rules, four such streams made the
kubelet's own watch fail with RESOURCE_EXHAUSTED for as long as they stayed open. Now:

* **A new watcher is always served.** At most ``limit`` streams are open. When all places are
  taken, the *newest* other watcher gives way (its stream ends with RESOURCE_EXHAUSTED and a
  message saying why), and the newcomer gets the device list at once. The kubelet's streams,
  opened when the plugin registered, are older than any a later client opens, so a client that
  opens streams in a loop only ever displaces its own latest one. A kubelet that reconnects
  while the places are full displaces the newest and is served at once; should a client keep
  opening streams after that, the kubelet's stream gives way in its turn and the kubelet dials
  again five seconds later and is served again, well inside the 30 s after which it would show
  its devices as Unknown.
* **A watcher that stopped reading is closed.** A send still pending after ``stall_s`` (flow
  control holds it: the client reads nothing) closes the stream: first when a place is needed,
  else the next time any open stream wakes (every ten seconds at most). A watcher closed in the
  middle of a send gets ``cancel_after_s`` to finish it and then has its RPC cancelled, so that
  its server thread is freed whatever the client does.
* **Each watcher holds one message at most.** A stream sends the current list of every device,
  never a queue of changes (:meth:`slicer.device_health.HealthFeed.stream` coalesces them), and
  the gRPC server sends one message at a time per stream: a slow reader costs one message, never
  a backlog.

A unix socket tells the gRPC server nothing about its peer (no process or user id), so there is
no per-client limit; the limit is on all watchers together, and who gives way is decided by age
and by whether the watcher reads.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAX_WATCHERS = 4
"""Open health streams at most (a kubelet keeps two, one per driver name); each holds a server
thread of its own."""
STALL_S = 30.0
"""A send pending this long means the watcher stopped reading (the kubelet's own timeout before a
device counts as Unknown: a watcher that takes nothing for that long is not being served)."""
CANCEL_AFTER_S = 1.0
"""A watcher closed in the middle of a send is given this long to finish it (and end with the
reason); a send still pending after that is cancelled, so that its server thread is freed."""
REPORT_EVERY_S = 60.0
"""Closed watchers are logged once, then summed up at most this often."""


@dataclass(eq=False)
class Watcher:
    """One open stream: when it opened, whether a send is pending, and why it was closed."""

    number: int
    cancel: Callable[[], None]
    """Ends the RPC at once (a send stuck in flow control included)."""
    wake: threading.Event = field(default_factory=threading.Event)
    sending_since: float | None = None
    closed: str = ""
    """Empty while open; else why the agent closed it (the stream's last status message)."""


class HealthWatchers:
    """The open streams and the rules above; thread-safe."""

    def __init__(
        self,
        *,
        limit: int = MAX_WATCHERS,
        stall_s: float = STALL_S,
        cancel_after_s: float = CANCEL_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError("at least one health watcher must be allowed")
        self.limit = limit
        self.stall_s = stall_s
        self.cancel_after_s = cancel_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open: list[Watcher] = []  # oldest first
        self._closing: list[Watcher] = []  # closed while a send was pending
        self._numbers = itertools.count(1)
        self.admitted = 0
        """Watchers ever admitted (tests and logs)."""
        self.closed = 0
        """Watchers the agent closed (gave way or stalled)."""
        self._unreported = 0
        self._reported_at: float | None = None

    def admit(self, cancel: Callable[[], None]) -> Watcher:
        """A place for a new stream, closing stalled watchers and, when still full, the newest."""
        to_cancel: list[Watcher] = []
        with self._lock:
            to_cancel += self._sweep_locked()
            while len(self._open) >= self.limit:
                newest = self._open[-1]
                self._close(
                    newest,
                    f"closed to make room for a newer health watcher: the agent serves at most "
                    f"{self.limit} at a time, and the newest gives way",
                )
            watcher = Watcher(next(self._numbers), cancel)
            self._open.append(watcher)
            self.admitted += 1
        self._cancel(to_cancel)
        return watcher

    def sending(self, watcher: Watcher) -> bool:
        """About to send: False when the watcher was closed (send nothing more)."""
        to_cancel: list[Watcher] = []
        with self._lock:
            if watcher.closed:
                return False
            to_cancel += self._sweep_locked()
            watcher.sending_since = self._clock()
        self._cancel(to_cancel)
        return True

    def sent(self, watcher: Watcher) -> None:
        """The send completed: the client took the message (or its transport did)."""
        with self._lock:
            watcher.sending_since = None
            if watcher in self._closing:
                self._closing.remove(watcher)  # its thread sees ``closed`` and ends the stream

    def sweep(self) -> None:
        """Close every watcher whose send has been pending for ``stall_s``; cancel the RPC of a
        closed one whose send is still pending after ``cancel_after_s``."""
        with self._lock:
            to_cancel = self._sweep_locked()
        self._cancel(to_cancel)

    def leave(self, watcher: Watcher) -> None:
        """The stream ended, for whatever reason: its place is free."""
        with self._lock:
            for held in (self._open, self._closing):
                if watcher in held:
                    held.remove(watcher)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._open)

    def _sweep_locked(self) -> list[Watcher]:
        now = self._clock()
        stalled = [
            w
            for w in self._open
            if w.sending_since is not None and now - w.sending_since >= self.stall_s
        ]
        for watcher in stalled:
            self._close(
                watcher,
                f"closed: this health watcher took no message for {self.stall_s:g} s "
                "(it stopped reading)",
            )
        stuck = [
            w
            for w in self._closing
            if w.sending_since is not None and now - w.sending_since >= self.cancel_after_s
        ]
        for watcher in stuck:
            self._closing.remove(watcher)
        return stuck

    def _close(self, watcher: Watcher, reason: str) -> None:
        """Close under the lock. A watcher between two sends sees ``closed`` when it wakes; one
        in a send sees it once the send completes, else the next sweep cancels its RPC."""
        watcher.closed = reason
        self._open.remove(watcher)
        if watcher.sending_since is not None:
            self._closing.append(watcher)
        watcher.wake.set()
        self.closed += 1
        self._unreported += 1
        now = self._clock()
        if self._reported_at is None or now - self._reported_at >= REPORT_EVERY_S:
            log.warning(
                "closed health watchers",
                extra={"count": self._unreported, "open": len(self._open), "last": reason},
            )
            self._unreported = 0
            self._reported_at = now

    @staticmethod
    def _cancel(watchers: list[Watcher]) -> None:
        for watcher in watchers:
            watcher.cancel()


__all__ = ["MAX_WATCHERS", "STALL_S", "HealthWatchers", "Watcher"]
