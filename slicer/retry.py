"""Riding out a busy or briefly absent apiserver: one API call, tried again with a capped
exponential wait (the slice publisher's writes, reads and deletes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from gpu_slicer.kube import errors as kerr
from gpu_slicer.slicer.errors import PublishError

T = TypeVar("T")


@dataclass(frozen=True)
class RetrySettings:
    """How patiently slice writes, reads and deletes ride out Conflicts and an absent apiserver."""

    max_attempts: int = 6
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0

    @property
    def attempts(self) -> int:
        """At least one try, whatever was configured."""
        return max(1, self.max_attempts)

    def delay_s(self, attempt: int) -> float:
        """Exponential, capped: a busy apiserver gets room, a long outage no minute-long sleeps."""
        delay: float = self.base_delay_s * (2**attempt)
        return min(self.max_delay_s, delay)


def retrying(
    call: Callable[[], T],
    settings: RetrySettings,
    *,
    sleep: Callable[[float], None],
    on_backoff: Callable[[], None],
    doing: str,
    backoff_on: tuple[type[kerr.KubeError], ...],
    gave_up: Callable[[kerr.KubeError | None], PublishError],
    again_on: tuple[type[kerr.KubeError], ...] = (),
    on_again: Callable[[kerr.KubeError], None] = lambda _exc: None,
) -> T:
    """One API call, retried so a busy or briefly absent apiserver does not fail a publish.

    ``backoff_on`` errors are counted (``on_backoff``) and wait before the next try,
    ``again_on`` errors do not; after either ``on_again`` (still handling the error) may adjust
    the next try. Other API errors are final; ``gave_up`` words the error once the tries run
    out.
    """
    last: kerr.KubeError | None = None
    for attempt in range(settings.attempts):
        try:
            return call()
        except backoff_on as exc:
            last = exc
            on_backoff()
            sleep(settings.delay_s(attempt))
            on_again(exc)
        except again_on as exc:
            last = exc
            on_again(exc)
        except kerr.KubeError as exc:
            raise PublishError(f"cannot {doing}: {exc}") from exc
    raise gave_up(last)
