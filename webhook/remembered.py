"""What the webhook remembers of its own computations between admissions, in one place: what
each store keys on, how big it may grow and why an answer from it is exactly what computing
again would give. (What it keeps of the cluster's state, kept current by watches, is in
``webhook.caches`` and ``webhook.templates``.)

Every store below holds the results of a pure function (same arguments, same result; results
are immutable or handed out as fresh copies), so remembering changes cost, never an answer.

Each entry: the store; what it keys on; how big it may grow; why a hit is exact.

* **engine memo** (``webhook.engine.TranslationMemo``): the namespace, the native extended
  resource names and the review's bytes but for its uid (or the pod's own key); 256 entries,
  8 MiB of keys, no key over 64 KiB; translation is a pure function of those, the memo empties
  when the policy object changes, and denials are not kept.
* **derived claims** (``webhook.translate.claim``): the pod's GPU shape (the containers' facts
  and the gpu-slicer annotations), the namespace's rules, the target; 1,024 shapes, and a shape
  whose names and annotation values exceed 4,096 characters, or whose annotation values are not
  text, is never kept; the claim, its template name, record and warnings follow from these.
* **patches** (``webhook.translate.writing``): a remembered derived claim (by identity: the key
  holds the object, so it cannot be mistaken for a later one) and where the pod's maps and lists
  stand; 4,096; the operations follow from those alone, and each pod decodes its own copy.
* **memory chains**, **larger profiles** (``webhook.translate.chains``): bytes asked or a
  catalog profile name, and the GPU model set; 256 and 1,024; the static catalog.
* **gpu chains** (``webhook.translate.chains``): the NVLink mode, whether the target publishes
  NVLink, the spanning profiles, the count and whether several devices are wanted; 1,024;
  built from the arguments alone.
* **profile selectors**, **profiles selectors** (``webhook.cel``): the target, the profile (or
  profiles) and the minimum memory; 1,024 and 256; the CEL text is built from those alone.
* **dns labels** (``webhook.claims``): a name of at most 253 characters (longer ones are never
  kept), the fallback and the length limit; 4,096; the label is built from those alone.

What each is worth, measured (``python bench/bench_translate.py --without NAMES``, microseconds
per pod of each kind, a pod of a known shape: mig-1g.10gb, gpu x2, gpu-memory 12Gi, profiles
chain, right-sized; 2026-12-05): with every store 74 / 87 / 105 / 68 / 87; without **derived
claims** 200 / 250 / 364 / 236 / 246; without **patches** 98 / 114 / 122 / 91 / 114; without
**profiles selectors** the memory chain 199 and gpu x2 106; without **profile selectors** or
**dns labels** 2-11 more. The chain stores serve only a shape's first pod (derived claims
answer the rest); for that pod, with derived claims off too, **memory chains** save the memory
chain 196, **larger profiles** 20-46 and **gpu chains** 52-57. Three stores measured within
the noise even there and were dropped: the GPU model set of a policy's model list, chains of
fixed entries, and one ``Alternative`` object per value.

``BoundedCache`` is the object each of these (but the memo, which bounds bytes too) is: a name,
a bound and the function, least recently used first out. Lookups go through ``call``, the
standard library's C-implemented LRU wrapper, so keeping them explicit costs nothing per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Generic, ParamSpec, TypeVar, cast

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
