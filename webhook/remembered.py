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
* **memory chains**, **larger profiles**, **gpu models** (``webhook.translate.chains``): bytes
  asked or a catalog profile name, and the GPU model set; 256, 1,024 and 64; the static catalog.
* **fixed chains**, **gpu chains** (``webhook.translate.chains``): the chain's entries (or the
  NVLink mode, whether the target publishes NVLink and the spanning profiles), the count and
  whether several devices are wanted; 1,024 each; built from the arguments alone.
* **alternatives** (``webhook.translate.chains``): every field of the alternative; 2,048;
  alternatives are immutable, and one object per value keeps its computed label and name.
* **profile selectors**, **profiles selectors** (``webhook.cel``): the target, the profile (or
  profiles) and the minimum memory; 1,024 and 256; the CEL text is built from those alone.
* **dns labels** (``webhook.claims``): a name of at most 253 characters (longer ones are never
  kept), the fallback and the length limit; 4,096; the label is built from those alone.

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
