"""What the webhook remembers is described in one place, and each store keeps its bound."""

from __future__ import annotations

import importlib
import pkgutil
import re

from gpu_slicer import webhook
from gpu_slicer.webhook import remembered, translate
from gpu_slicer.webhook.remembered import BoundedCache


def _declared() -> set[str]:
    """The names of the stores the webhook's modules declare."""
    found = set()
    for package in (webhook, translate):
        for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            if "." in info.name[len(package.__name__) + 1 :]:
                continue  # gunicorn.conf: a configuration file, not an importable module
            module = importlib.import_module(info.name)
            found |= {v.name for v in vars(module).values() if isinstance(v, BoundedCache)}
    return found


def test_every_store_is_described_in_the_one_place() -> None:
    described = set(re.findall(r"\* \*\*([a-z -]+)\*\*", remembered.__doc__ or ""))
    described |= set(re.findall(r"\*\*([a-z -]+)\*\* \(", remembered.__doc__ or ""))
    described |= set(re.findall(r", \*\*([a-z -]+)\*\*", remembered.__doc__ or ""))
    declared = _declared()
    assert declared - described == set()
    assert described - declared == {"engine memo"}


def test_a_store_answers_as_the_function_and_never_holds_more_than_its_bound() -> None:
    squares = BoundedCache("squares", lambda n: n * n, maxsize=8)
    assert [squares.call(n) for n in range(20)] == [n * n for n in range(20)]
    assert len(squares) == 8
    assert [squares.call(n) for n in range(20)] == [n * n for n in range(20)]
    squares.clear()
    assert len(squares) == 0
