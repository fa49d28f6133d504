"""CEL device selectors, evaluated with cel-python the way the scheduler evaluates them.

The environment follows the DRA one: a variable ``device`` with ``driver``, ``attributes``
(domain -> id -> value), ``capacity`` (domain -> id -> quantity) and ``allowMultipleAllocations``;
``quantity("10Gi")`` with ``compareTo``/``isGreaterThan``/``isLessThan`` (exact, like
Kubernetes: ``1500m`` is more than ``1``); ``semver("1.2.3")``
for version attributes with the same methods. An unknown attribute domain is an empty map; an
unknown attribute is an evaluation error (the scheduler reports the claim as unallocatable).

cel-python is slow (hundreds of microseconds per evaluation), and the simulator evaluates the same
few selectors against hundreds of thousands of devices. So:

* every expression is compiled once (:func:`program`);
* results are cached per *relevant part* of the device: when every use of ``attributes`` and
  ``capacity`` in the expression has the literal form ``device.attributes["dom"].id`` (the form
  every generated selector uses), the result depends only on the driver and those values, and
  the cache key is exactly them. Any other form falls back to a per-device cache owned by the
  caller (see ``sim.pools.Device``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes

from gpu_slicer.kube.quantity import exact_value

_REF = re.compile(
    r"""device\s*\.\s*(?P<map>attributes|capacity)\s*\[\s*"(?P<dom>[^"\\]*)"\s*\]"""
    r"""\s*\.\s*(?P<id>[A-Za-z_][A-Za-z0-9_]*)"""
)
_IN_REF = re.compile(
    r""""(?P<id>[A-Za-z_][A-Za-z0-9_]*)"\s+in\s+device\s*\.\s*(?P<map>attributes|capacity)"""
    r"""\s*\[\s*"(?P<dom>[^"\\]*)"\s*\](?!\s*\.)"""
)


class SelectorError(ValueError):
    """A device selector that does not compile, fails at run time or returns no bool: the
    scheduler reports such a claim as unallocatable rather than skipping the device."""


_MAP_USE = re.compile(r"\b(attributes|capacity)\b")
Capacities = dict[str, dict[str, int | Fraction]]
"""Capacity by domain and id, exact (``int`` when whole)."""
_DOMAIN = re.compile(r"""(?:attributes|capacity)\s*\[\s*"(?P<dom>[^"\\]*)"\s*\]""")


class QuantityValue(celtypes.IntType):
    """A Kubernetes quantity inside CEL. Whole numbers (bytes, counts: the usual case) are the int
    itself; a fractional one (``1500m``) also keeps its exact value, because Kubernetes compares
    quantities exactly: ``quantity("1500m")`` is greater than a capacity of ``1``, not equal."""

    exact: Fraction | None = None

    def amount(self) -> int | Fraction:
        """The exact value."""
        return int(self) if self.exact is None else self.exact

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, QuantityValue):
            return self.amount() == other.amount()
        return NotImplemented if self.exact is not None else super().__eq__(other)

    def __ne__(self, other: Any) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.amount())


def quantity_value(amount: int | Fraction) -> QuantityValue:
    """An exact quantity (``kube.quantity.exact_value``) as a CEL value."""
    if isinstance(amount, int):
        return QuantityValue(amount)
    value = QuantityValue(math.floor(amount))
    value.exact = amount
    return value


class SemverValue(celtypes.StringType):
    """A version attribute inside CEL, ordered by semantic-version rules."""

    @property
    def key(self) -> tuple[int, int, int, str]:
        core, _, pre = str(self).partition("-")
        parts = [int(p) if p.isdigit() else 0 for p in core.split("+")[0].split(".")]
        parts += [0] * (3 - len(parts))
        # A pre-release sorts before its release: "" (release) must compare greater.
        return (parts[0], parts[1], parts[2], pre or "\uffff")


def _quantity(text: celtypes.StringType) -> QuantityValue:
    return quantity_value(exact_value(str(text)))


def _semver(text: celtypes.StringType) -> SemverValue:
    return SemverValue(str(text))


def _compare(left: Any, right: Any) -> celtypes.IntType:
    if isinstance(left, SemverValue) and isinstance(right, SemverValue):
        a: Any = left.key
        b: Any = right.key
    else:
        a, b = _amount(left), _amount(right)
    return celtypes.IntType((a > b) - (a < b))


def _amount(value: Any) -> int | Fraction:
    return value.amount() if isinstance(value, QuantityValue) else int(value)


def _greater(left: Any, right: Any) -> celtypes.BoolType:
    return celtypes.BoolType(int(_compare(left, right)) > 0)


def _less(left: Any, right: Any) -> celtypes.BoolType:
    return celtypes.BoolType(int(_compare(left, right)) < 0)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "semver": _semver,
    "compareTo": _compare,
    "isGreaterThan": _greater,
    "isLessThan": _less,
}


@dataclass(frozen=True)
class CompiledSelector:
    """A compiled expression and what it reads of a device."""

    expression: str
    runner: Any
    refs: tuple[tuple[str, str, str], ...] | None
    """(map, domain, id) for every reference, or None when the expression reads a map freely."""
    domains: frozenset[str]


@functools.cache
def _environment() -> celpy.Environment:
    """The CEL environment, built on first use: building its parser takes a quarter of a
    second, which every ``gpu-slicer`` command would otherwise pay at import."""
    return celpy.Environment()


_SELECTORS: dict[str, CompiledSelector] = {}
_RESULTS: dict[tuple[Any, ...], bool] = {}


def program(expression: str) -> CompiledSelector:
    """Compile once; raises SelectorError when the expression does not parse."""
    found = _SELECTORS.get(expression)
    if found is not None:
        return found
    try:
        env = _environment()
        runner = env.program(env.compile(expression), functions=_FUNCTIONS)
    except Exception as exc:  # celpy raises CELParseError and lark errors
        raise SelectorError(f"CEL selector {expression!r} does not compile: {exc}") from exc
    refs_found = [(m["map"], m["dom"], m["id"]) for m in _REF.finditer(expression)]
    refs_found += [(m["map"], m["dom"], m["id"]) for m in _IN_REF.finditer(expression)]
    uses = len(_MAP_USE.findall(expression))
    refs = tuple(sorted(set(refs_found))) if uses == len(refs_found) else None
    domains = frozenset(m["dom"] for m in _DOMAIN.finditer(expression))
    selector = CompiledSelector(expression, runner, refs, domains)
    _SELECTORS[expression] = selector
    return selector


class DeviceView:
    """What a selector can see of a device (its ResourceSlice entry), parsed only as far as
    needed: single values for cached selectors, the full maps when cel-python must run."""

    __slots__ = ("driver", "raw", "results", "_maps", "_activation")

    def __init__(self, driver: str, raw: Mapping[str, Any]) -> None:
        self.driver = driver
        self.raw = raw
        self.results: dict[str, bool] = {}
        self._maps: tuple[dict[str, dict[str, Any]], Capacities] | None = None
        self._activation: dict[str, Any] | None = None

    @property
    def attributes(self) -> dict[str, dict[str, Any]]:
        return self._parsed()[0]

    @property
    def capacity(self) -> Capacities:
        return self._parsed()[1]

    def _parsed(self) -> tuple[dict[str, dict[str, Any]], Capacities]:
        if self._maps is None:
            self._maps = device_maps(self.raw, self.driver)
        return self._maps

    def activation(self, domains: frozenset[str]) -> dict[str, Any]:
        if self._activation is None:
            self._activation = {
                "device": celtypes.MapType(
                    {
                        celtypes.StringType("driver"): celtypes.StringType(self.driver),
                        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                            bool(self.raw.get("allowMultipleAllocations"))
                        ),
                        celtypes.StringType("attributes"): _domain_map(self.attributes, _cel),
                        celtypes.StringType("capacity"): _domain_map(self.capacity, quantity_value),
                    }
                )
            }
        device = self._activation["device"]
        for key in ("attributes", "capacity"):
            maps = device[celtypes.StringType(key)]
            for domain in domains:
                maps.setdefault(celtypes.StringType(domain), celtypes.MapType({}))
        return self._activation

    def value(self, kind: str, domain: str, ident: str) -> Any:
        if self._maps is not None:
            source: Mapping[str, Mapping[str, Any]] = (
                self._maps[0] if kind == "attributes" else self._maps[1]
            )
            return source.get(domain, {}).get(ident, _MISSING)
        entries = self.raw.get(kind) or {}
        entry = entries.get(f"{domain}/{ident}")
        if entry is None and domain == self.driver:
            entry = entries.get(ident)
        if entry is None:
            return _MISSING
        if kind == "attributes":
            return attribute_value(entry)
        return exact_value(entry.get("value") if isinstance(entry, Mapping) else entry)


def split_name(name: str, driver: str) -> tuple[str, str]:
    """``dom/id`` -> (dom, id); an unqualified name belongs to the driver's domain."""
    domain, slash, ident = name.rpartition("/")
    return (domain, ident) if slash else (driver, name)


def attribute_value(raw: Mapping[str, Any]) -> Any:
    """A ResourceSlice attribute value (``{"string": ...}``, int, bool, version) as Python."""
    if "string" in raw:
        return str(raw["string"])
    if "bool" in raw:
        return bool(raw["bool"])
    if "int" in raw:
        return int(raw["int"])
    if "version" in raw:
        return Version(str(raw["version"]))
    raise SelectorError(f"attribute value {dict(raw)!r} has none of string/int/bool/version")


def device_maps(
    raw: Mapping[str, Any], driver: str
) -> tuple[dict[str, dict[str, Any]], Capacities]:
    """A device's attributes and capacities by domain, parsed."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (raw.get("attributes") or {}).items():
        domain, ident = split_name(name, driver)
        attributes.setdefault(domain, {})[ident] = attribute_value(value)
    capacity: Capacities = {}
    for name, value in (raw.get("capacity") or {}).items():
        domain, ident = split_name(name, driver)
        amount = exact_value(value.get("value") if isinstance(value, Mapping) else value)
        capacity.setdefault(domain, {})[ident] = amount
    return attributes, capacity


_MISSING = ("<missing>",)


def _cel(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, Version):
        return SemverValue(value.text)
    return celtypes.StringType(str(value))


def _domain_map(
    source: Mapping[str, Mapping[str, Any]], convert: Callable[[Any], Any]
) -> celtypes.MapType:
    return celtypes.MapType(
        {
            celtypes.StringType(domain): celtypes.MapType(
                {celtypes.StringType(k): convert(v) for k, v in values.items()}
            )
            for domain, values in source.items()
        }
    )


@dataclass(frozen=True)
class Version:
    """A ``version`` attribute value (kept apart from strings so CEL sees a semver)."""

    text: str


def matches(expression: str, device: DeviceView) -> bool:
    """Whether ``device`` satisfies ``expression``; raises SelectorError on a runtime error."""
    cached = device.results.get(expression)
    if cached is not None:
        return cached
    selector = program(expression)
    if selector.refs is not None:
        key = (expression, device.driver) + tuple(
            device.value(kind, dom, ident) for kind, dom, ident in selector.refs
        )
        result = _RESULTS.get(key)
        if result is None:
            result = _evaluate(selector, device)
            _RESULTS[key] = result
    else:
        result = _evaluate(selector, device)
    device.results[expression] = result
    return result


def _evaluate(selector: CompiledSelector, device: DeviceView) -> bool:
    try:
        outcome = selector.runner.evaluate(device.activation(selector.domains))
    except Exception as exc:  # celpy raises CELEvalError (and, rarely, Python errors)
        outcome = exc
    if isinstance(outcome, Exception):
        detail = outcome.args[0] if outcome.args else outcome
        raise SelectorError(f"CEL runtime error in selector {selector.expression!r}: {detail}")
    if not isinstance(outcome, celtypes.BoolType | bool):
        raise SelectorError(
            f"CEL selector {selector.expression!r} returned {type(outcome).__name__}, not a bool"
        )
    return bool(outcome)
