"""What translation remembers is one object its owner passes in, described in one place, and
each store keeps its bound; no module translation runs holds a store of its own."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re

from gpu_slicer import webhook
from gpu_slicer.webhook import cel, claims, remembered, translate
from gpu_slicer.webhook.remembered import BoundedCache, Remembered


def test_translation_keeps_no_store_of_its_own() -> None:
    # The modules translate_pod runs: the translate package, the claim writer, the selectors
    # (what the policy derives from the static catalog once per model list is the policy's).
    modules = [
        importlib.import_module(info.name)
        for info in pkgutil.iter_modules(translate.__path__, f"{translate.__name__}.")
    ]
    found = [
        f"{module.__name__}.{name}"
        for module in [translate, claims, cel, *modules]
        for name, value in vars(module).items()
        if isinstance(value, BoundedCache)
        or (
            isinstance(value, functools._lru_cache_wrapper)
            and value.__wrapped__.__module__ == module.__name__  # type: ignore[attr-defined]
        )
    ]
    assert found == []


def test_every_store_is_described_in_the_one_place() -> None:
    described = set(re.findall(r"^\* \*\*([a-z -]+)\*\*", remembered.__doc__ or "", re.M))
    assert described == {store.name for store in Remembered().stores()}


def test_a_store_answers_as_the_function_and_never_holds_more_than_its_bound() -> None:
    squares = BoundedCache("squares", lambda n: n * n, maxsize=8)
    assert [squares.call(n) for n in range(20)] == [n * n for n in range(20)]
    assert len(squares) == 8
    assert [squares.call(n) for n in range(20)] == [n * n for n in range(20)]
    squares.clear()
    assert len(squares) == 0


def test_a_store_of_size_zero_keeps_nothing() -> None:
    off = Remembered(derived_claims=0, patches=0)
    pod = {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    policy = webhook.policy.Policy.default()
    first = translate.translate_pod(pod, namespace="ml", policy=policy, remembered=off)
    again = translate.translate_pod(pod, namespace="ml", policy=policy, remembered=off)
    assert first.patch == again.patch and first.patch
    assert [len(s) for s in off.stores()] == [0, 0]
