"""The agent's one clock: every time source a part reads, in one object.

Pacing (intervals, deadlines, rate limits) reads ``monotonic``; what outlives the process or is
shown to people (checkpoint stamps, Events) reads ``time``; retries wait with ``sleep``. A test
or the simulator replaces the sources it controls and keeps the others, and every part built
from one :class:`Clock` sees the same time.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Clock:
    monotonic: Callable[[], float] = _time.monotonic
    """Seconds that only go forward: intervals and deadlines."""
    time: Callable[[], float] = _time.time
    """Wall-clock seconds since the epoch: stamps that outlive the process."""
    sleep: Callable[[float], None] = _time.sleep
    """Waiting between retries."""

    def wall(self) -> datetime:
        """``time`` as an aware UTC datetime (Events' timestamps)."""
        return datetime.fromtimestamp(self.time(), UTC)


SYSTEM_CLOCK = Clock()
"""The real time sources."""
