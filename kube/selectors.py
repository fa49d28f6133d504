"""Label and field selectors, parsed once and matched against plain-dict objects.

The in-memory apiserver needs the same filtering the real one does, so that code tested against
it (a watch on ``spec.nodeName=node-a``, a list by ``app.kubernetes.io/managed-by``) sees the
same objects. Supported label syntax is the common subset of the apiserver's:
``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, comma-joined (AND).
Field selectors are ``path=v``, ``path==v``, ``path!=v`` over dotted paths (``spec.nodeName``);
a missing field compares as the empty string, as the apiserver does for ``spec.nodeName=``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpu_slicer.kube.errors import ApiError

LabelOp = Literal["exists", "!exists", "=", "!=", "in", "notin"]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_KEY_RE = re.compile(rf"^{_KEY}$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")
_SET_RE = re.compile(rf"^({_KEY})\s+(in|notin)\s*\((.*)\)$")
_EQ_RE = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*(.*)$")


class SelectorError(ApiError):
    """The selector string is malformed (the apiserver answers 400 BadRequest)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=400, reason="BadRequest")


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: LabelOp
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, as in Kubernetes.
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class FieldRequirement:
    path: tuple[str, ...]
    equal: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.path) == self.value) == self.equal


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in selector {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SelectorError(f"unbalanced '(' in selector {text!r}")
    parts.append("".join(current))
    return [part.strip() for part in parts]


def _check_value(value: str, selector: str) -> str:
    if not _VALUE_RE.match(value) or len(value) > 63:
        raise SelectorError(f"invalid label value {value!r} in selector {selector!r}")
    return value


def parse_label_selector(selector: str | None) -> tuple[LabelRequirement, ...]:
    """Parse a label selector; the empty selector (or None) matches everything."""
    if selector is None or not selector.strip():
        return ()
    requirements: list[LabelRequirement] = []
    for part in _split_top_level(selector):
        if not part:
            raise SelectorError(f"empty requirement in label selector {selector!r}")
        if set_match := _SET_RE.match(part):
            key, op, inner = set_match.group(1), set_match.group(3), set_match.group(4)
            values = [value.strip() for value in inner.split(",")]
            if not values or values == [""]:
                raise SelectorError(f"'{op}' needs at least one value in {selector!r}")
            checked = frozenset(_check_value(value, selector) for value in values)
            requirements.append(LabelRequirement(key, "in" if op == "in" else "notin", checked))
        elif eq_match := _EQ_RE.match(part):
            key, op, value = eq_match.group(1), eq_match.group(3), eq_match.group(4).strip()
            checked_value = frozenset({_check_value(value, selector)})
            requirements.append(LabelRequirement(key, "!=" if op == "!=" else "=", checked_value))
        elif part.startswith("!") and _KEY_RE.match(part[1:].strip()):
            requirements.append(LabelRequirement(part[1:].strip(), "!exists"))
        elif _KEY_RE.match(part):
            requirements.append(LabelRequirement(part, "exists"))
        else:
            raise SelectorError(
                f"cannot parse {part!r} in label selector {selector!r}; use k, !k, k=v, k!=v, "
                "k in (a,b) or k notin (a,b)"
            )
    return tuple(requirements)


def parse_field_selector(selector: str | None) -> tuple[FieldRequirement, ...]:
    """Parse a field selector (``a.b=v,c!=w``); the empty selector matches everything."""
    if selector is None or not selector.strip():
        return ()
    requirements: list[FieldRequirement] = []
    for part in selector.split(","):
        part = part.strip()
        for op in ("!=", "==", "="):
            path, sep, value = part.partition(op)
            if sep:
                break
        if not sep or not path.strip():
            raise SelectorError(
                f"cannot parse {part!r} in field selector {selector!r}; use path=value or "
                "path!=value"
            )
        requirements.append(
            FieldRequirement(tuple(path.strip().split(".")), op != "!=", value.strip())
        )
    return tuple(requirements)


def field_value(obj: Mapping[str, Any], path: tuple[str, ...]) -> str:
    """The field at ``path`` as the apiserver compares it: a string, "" when absent."""
    current: Any = obj
    for step in path:
        if not isinstance(current, Mapping) or step not in current:
            return ""
        current = current[step]
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


@dataclass(frozen=True)
class Selector:
    """A parsed label + field selector pair."""

    labels: tuple[LabelRequirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, label_selector: str | None, field_selector: str | None) -> Selector:
        return cls(parse_label_selector(label_selector), parse_field_selector(field_selector))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        if self.labels:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if not all(req.matches(labels) for req in self.labels):
                return False
        return all(req.matches(obj) for req in self.fields)
