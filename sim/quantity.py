"""Kubernetes resource quantities (``80Gi``, ``132``, ``500m``) as exact numbers.

Counters and capacities in ResourceSlices are quantities; the allocator model compares sums of
them, so they are parsed exactly (``Fraction``) rather than as floats, and kept as ``int`` when
whole, which they almost always are.
"""

from __future__ import annotations

import re
from fractions import Fraction

from sim.errors import ScenarioError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, int | Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_RE = re.compile(r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suf>[A-Za-z]*))$")

Number = int | Fraction

_CACHE: dict[str, Number] = {}


def parse_quantity(value: object) -> Number:
    """``"80Gi"`` -> ``85899345920``; ints pass through; raises ScenarioError when malformed."""
    if isinstance(value, bool):
        raise ScenarioError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _whole(Fraction(value))
    text = str(value).strip()
    cached = _CACHE.get(text)
    if cached is not None:
        return cached
    match = _RE.match(text)
    if not match:
        raise ScenarioError(f"{text!r} is not a Kubernetes quantity (e.g. 10Gi, 132, 500m)")
    number = Fraction(match["num"])
    if match["exp"]:
        number *= Fraction(10) ** int(match["exp"][1:])
    else:
        suffix = match["suf"] or ""
        if suffix in _BINARY:
            number *= _BINARY[suffix]
        elif suffix in _DECIMAL:
            number *= _DECIMAL[suffix]
        else:
            raise ScenarioError(f"{text!r}: unknown quantity suffix {suffix!r}")
    result = _whole(number)
    _CACHE[text] = result
    return result


def _whole(number: Fraction) -> Number:
    return int(number) if number.denominator == 1 else number
