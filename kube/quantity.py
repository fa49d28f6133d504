"""Kubernetes resource quantities (``12Gi``, ``1``, ``500M``, ``1e3``) parsed exactly.

Quantities are an API concept shared by both halves: the webhook reads device counts
(``nvidia.com/gpu: "2"``), which must be whole positive numbers, and the
``gpu-slicer.io/gpu-memory`` annotation, a byte size; the agent writes byte sizes into
ResourceSlices in the apiserver's canonical form. Fractions are kept exact so that ``0.5Gi`` is
536870912 bytes and ``1500m`` is not a count.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<dec>[numkMGTPE])|[eE](?P<exp>[+-]?\d+))?$"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or not the kind of quantity expected."""


def _not_text(value: object) -> str:
    if value is None:
        return "no value (null) where a quantity is expected; examples: 1, 12Gi"
    return f"{value!r} is not a quantity"


def parse_quantity(value: object) -> Fraction:
    """The exact value of a quantity given as a string or a number (YAML gives either)."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # JSON NaN, Infinity, or a number like 1e400
            raise QuantityError(
                f"{value!r} is not a quantity: a number too large to represent, or NaN; "
                "examples: 1, 12Gi, 16G, 10240Mi"
            )
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(_not_text(value))
    text = value.strip()
    match = _QUANTITY.match(text)
    if not match or len(text) > 64:
        raise QuantityError(f"{value!r} is not a quantity; examples: 1, 12Gi, 16G, 10240Mi")
    number = Fraction(match["num"])
    if match["sign"] == "-":
        number = -number
    if match["bin"]:
        return number * _power(1024, _BINARY[match["bin"]])
    if match["dec"]:
        return _scaled(number, _DECIMAL[match["dec"]])
    if match["exp"]:
        exponent = int(match["exp"])
        if abs(exponent) > 30:
            raise QuantityError(f"{value!r}: exponent out of range")
        return _scaled(number, exponent)
    return number


def _power(base: int, exponent: int) -> int:
    result = 1
    for _ in range(exponent):
        result *= base
    return result


def _scaled(number: Fraction, power: int) -> Fraction:
    return number * _power(10, power) if power >= 0 else number / _power(10, -power)


def parse_count(value: object) -> int:
    """A device count: a whole number >= 0 (``"2"``, ``2``); anything else is a QuantityError."""
    # Fast path for what pods almost always carry: plain ASCII digits or a non-negative int.
    # Both give exactly what the general parser would (the parser caps quantities at 64 chars).
    if type(value) is str and value.isascii() and value.isdigit() and len(value) <= 64:
        return int(value)
    if type(value) is int and value >= 0:
        return value
    amount = parse_quantity(value)
    if amount.denominator != 1 or amount < 0:
        raise QuantityError(f"{value!r} is not a whole, non-negative number of devices")
    return int(amount)


def parse_bytes(value: object) -> int:
    """A memory size in bytes, rounded up (``12Gi`` -> 12884901888); must be positive."""
    amount = parse_quantity(value)
    if amount <= 0:
        raise QuantityError(f"{value!r} is not a positive memory size")
    return -(-amount.numerator // amount.denominator)


def format_bytes(value: int) -> str:
    """The shortest exact binary-suffixed form: 12884901888 -> ``12Gi``."""
    for suffix, power in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        unit = 1024**power
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


@functools.lru_cache(maxsize=4096)
def exact_value(value: str | int) -> int | Fraction:
    """A quantity's exact value, as an ``int`` when whole (the usual case).

    For hot paths that sum and compare the same few quantities many times (the simulator's
    allocator reads every counter of every device): cached, and ints are cheaper than Fractions.
    """
    amount = parse_quantity(value)
    return int(amount) if amount.denominator == 1 else amount
