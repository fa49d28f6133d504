"""What translation remembers between admissions: one object, :class:`Remembered`, that its
owner makes and passes in (``translate_pod(..., remembered=...)``); the webhook's engine keeps
one, ``convert`` one per run. Translation itself holds no state: without the object every call
computes afresh, and with it the answers are the same (each store holds the results of a pure
function, and each pod gets its own copy). What the webhook keeps of the cluster's state, kept
current by watches, is in ``webhook.caches`` and ``webhook.templates``; the engine's memo of
whole reviews is ``webhook.engine.TranslationMemo``.

Each store: what it keys on; how big it may grow; why a hit is exact.

* **derived claims** (:func:`webhook.translate.claim.derive`): the pod's GPU shape (the
  containers' facts and the gpu-slicer annotations), the namespace's rules, the target; 1,024
  shapes, and a shape whose names and annotation values exceed 4,096 characters, or whose
  annotation values are not text, is never kept. The claim, its template (as JSON, decoded per
  pod), name, record and warnings follow from these.
* **patches** (:func:`webhook.translate.writing.patch_json`): a remembered derived claim (by
  identity: the key holds the object, so it cannot be mistaken for a later one) and where the
  pod's maps and lists stand; 4,096; the operations follow from those alone, and each pod decodes
  its own copy.

What each is worth, measured (``python bench/bench_translate.py --without NAMES``, microseconds
per pod of a known shape, pods of each kind: mig-1g.10gb, gpu x2, gpu-memory 12Gi, profiles
chain, right-sized; best of 5 passes, 2026-12-05, while another job ran): with both stores
17.7 / 18.9 / 18.4 / 17.5 / 21.8; without **derived claims** 79.6 / 104.6 / 257.8 / 91.5 / 94.0;
without **patches** 28.3 / 30.2 / 26.7 / 24.2 / 31.8; without either 111.9 / 106.4 / 224.5 /
88.1 / 93.5. (Before the stores became this object, with eight module-level stores, the same
pods took 19.0 / 27.1 / 28.7 / 18.4 / 24.1: the claim template, now decoded from the derived
claim's JSON, was built again for every pod from remembered selectors.)

Everything else translation once remembered is computed again for each new shape only (a
known shape's claim and template come from **derived claims**): CEL selector strings, memory
chains per byte size, ``larger`` fallbacks, GPU chains and DNS labels. A shape's first pod pays
for them; no later pod of the shape does. Measured on pods that are each a new shape, against
the eight stores: 73.8 / 109.4 / 235.0 / 94.9 / 106.2 against 70.1 / 86.2 / 148.2 / 89.8 /
98.5 us: a new memory-sized shape costs 87 us more once, a new shape of several whole GPUs 23.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")


class BoundedCache(Generic[P, R]):
    """A pure function's results for its ``maxsize`` most recently used arguments."""

    def __init__(self, name: str, function: Callable[P, R], *, maxsize: int) -> None:
        self.name = name
        self.maxsize = maxsize
        self._wrapper = functools.lru_cache(maxsize=maxsize)(function)
        self.call = cast(Callable[P, R], self._wrapper)

    def __len__(self) -> int:
        """How many results are kept now (never more than ``maxsize``)."""
        return self._wrapper.cache_info().currsize

    def clear(self) -> None:
        """Forget every result (the next call of each computes afresh)."""
        self._wrapper.cache_clear()


class Remembered:
    """The stores translation keeps its results in, owned by whoever calls it many times.

    ``derived_claims`` and ``patches`` bound each store (0: the store is off and its function
    runs every time, as the benchmark's ``--without`` measures)."""

    def __init__(self, *, derived_claims: int = 1024, patches: int = 4096) -> None:
        from gpu_slicer.webhook.translate.claim import derive
        from gpu_slicer.webhook.translate.writing import patch_json

        self.derived_claims = BoundedCache("derived claims", derive, maxsize=derived_claims)
        self.patches = BoundedCache("patches", patch_json, maxsize=patches)

    def stores(self) -> tuple[BoundedCache[..., Any], ...]:
        return (self.derived_claims, self.patches)

    def clear(self) -> None:
        """Forget every result (each store computes afresh)."""
        for store in self.stores():
            store.clear()
