"""What every test gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from cli.logs import JsonFormatter


@pytest.fixture(autouse=True)
def _root_logger_left_as_found() -> Iterator[None]:
    """A command run in-process (``main([...])``) points the root logger at the stderr pytest
    captured for that test, which is closed afterwards: every later record, from any test's
    thread, would then fail to print. Its handler comes off again, and the level is restored."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if isinstance(h.formatter, JsonFormatter)]:
        root.removeHandler(handler)
    root.setLevel(level)
