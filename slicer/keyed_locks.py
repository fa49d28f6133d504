"""Locks by key: one per GPU index or claim uid, so that different keys proceed in parallel."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

_Key = TypeVar("_Key", bound=Hashable)


@dataclass
class _KeyedLock:
    """A lock and how many callers hold or wait for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class KeyedLocks(Generic[_Key]):
    """One lock per key, made on first use and dropped when no caller holds or waits for it
    (every pod brings a new claim uid: kept locks would only grow)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[_Key, _KeyedLock] = {}

    def __len__(self) -> int:
        """How many keys some caller holds or waits for now."""
        with self._guard:
            return len(self._locks)

    @contextmanager
    def held(self, key: _Key) -> Iterator[None]:
        """Holds the lock of ``key``."""
        with self._guard:
            keyed = self._locks.setdefault(key, _KeyedLock())
            keyed.users += 1
        try:
            with keyed.lock:
                yield
        finally:
            with self._guard:
                keyed.users -= 1
                if keyed.users == 0:
                    del self._locks[key]


__all__ = ["KeyedLocks"]
