"""The policy in force, reloaded when its file changes; a bad new version is refused.

The policy file is mounted from a ConfigMap, which the kubelet updates by swapping a symlink, so
the file's identity (inode, size, mtime, following links) is polled every ``check_interval_s``
by a daemon thread, off the admission hot path. A new version that fails validation is logged
with every problem and refused: the previous policy stays in force, and the refusal is counted.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from gpu_slicer.webhook.errors import PolicyError
from gpu_slicer.webhook.policy import Policy, load_policy_file

log = logging.getLogger(__name__)


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class PolicyStore:
    """Holds the current :class:`Policy`; ``current()`` is a plain attribute read."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        check_interval_s: float = 5.0,
        on_reload: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.check_interval_s = check_interval_s
        self._on_reload = on_reload
        self._policy: Policy | None = None if self.path else Policy.default()
        self._seen: tuple[int, int, int, int] | None = None
        self.last_error: PolicyError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._policy is not None

    def current(self) -> Policy:
        """The policy in force; PolicyError before any version has loaded (not ready)."""
        policy = self._policy
        if policy is None:
            problems = self.last_error.problems if self.last_error else ["not read yet"]
            raise PolicyError(problems, source=f"no valid policy loaded from {self.path}")
        return policy

    def check(self) -> bool:
        """Loads the file if it changed since the last check; True when a new policy is in force."""
        if self.path is None:
            return False
        with self._lock:
            seen = _identity(self.path)
            if seen is not None and seen == self._seen:
                return False
            self._seen = seen
            try:
                policy = load_policy_file(self.path)
            except PolicyError as exc:
                self.last_error = exc
                self._on_reload("refused")
                log.error(
                    "policy refused; the previous policy stays in force"
                    if self._policy is not None
                    else "policy refused; no policy in force, the server is not ready",
                    extra={"policy": str(self.path), "problems": exc.problems},
                )
                return False
            changed = policy != self._policy
            self._policy = policy
            self.last_error = None
            if changed:
                self._on_reload("loaded")
                log.info(
                    "policy loaded", extra={"policy": str(self.path), "summary": policy.describe()}
                )
            return changed

    def start(self) -> None:
        """Loads now, then polls in a daemon thread."""
        self.check()
        if self.path is not None and self.check_interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="policy-reload", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.check_interval_s):
            try:
                self.check()
            except Exception:  # never let the poller die: the policy would freeze silently
                log.exception("policy check failed")
