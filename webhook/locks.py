"""Locks for critical sections that only touch memory, on the admission path.

Under the gevent worker (webhook.worker) ``threading.Lock`` is gevent's lock: an acquire and
release costs about four times the operating system's in a tight loop (some 250 against 60 ns),
more inside a busy worker, and an admission takes several (the translation memo, the template
cache, the namespace cache). A section that only reads or updates in-memory state never yields
to another greenlet while it holds its lock, so no other greenlet can find it taken, and the
operating system's lock is as correct there (tested: it is the OS lock under gevent). With real
threads (the gthread worker, tests, watchers outside gevent) the operating system's lock is
exactly what ``threading.Lock`` would have been.

Never hold one of these across I/O or anything else that can switch greenlets: a greenlet that
then waited for it would block the whole worker.
"""

from __future__ import annotations

import _thread
import sys


def memory_lock() -> _thread.LockType:
    """The operating system's lock, whether or not gevent has patched ``threading``. Nothing
    imports gevent here: where ``gevent.monkey`` was never imported, nothing is patched (and
    ``convert`` starts without gevent's import time)."""
    monkey = sys.modules.get("gevent.monkey")
    allocate = (
        _thread.allocate_lock if monkey is None else monkey.get_original("_thread", "allocate_lock")
    )
    lock: _thread.LockType = allocate()
    return lock
