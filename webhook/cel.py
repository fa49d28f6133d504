"""CEL selector expressions for device requests, with string literals that cannot break out.

Profile names come from the catalog, but they end up next to user input in the same expression
builder, so every string is emitted as a double-quoted CEL literal with backslashes, quotes and
control characters escaped. A name such as ``x" || true || "`` stays one string.
"""

from __future__ import annotations

from gpu_slicer.core.identity import MEMORY_CAPACITY, PROFILE_ATTRIBUTE
from gpu_slicer.kube.quantity import format_bytes
from gpu_slicer.webhook.targets import TargetDriver

_SIMPLE_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\v": "\\v",
}


def quote(text: str) -> str:
    """``text`` as a double-quoted CEL string literal."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        # Printable ASCII other than quote and backslash stands for itself (the common case).
        return f'"{text}"'
    out = ['"']
    for char in text:
        if char in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[char])
        elif ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 or not char.isprintable():
            code = ord(char)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def attributes(target: TargetDriver) -> str:
    return f"device.attributes[{quote(target.domain)}]"


def _has_profile(attrs: str) -> str:
    return f'"{PROFILE_ATTRIBUTE}" in {attrs}'


def profile_selector(
    target: TargetDriver, profile: str, *, min_memory_bytes: int | None = None
) -> str:
    """Select MIG devices of ``profile``; with ``min_memory_bytes`` also require that capacity.

    The memory guard is only needed when the same profile name exists with less memory on another
    GPU model than the pod asked for (profile names round the memory size).
    """
    return _profile_selector(target, profile, min_memory_bytes)


def _profile_selector(target: TargetDriver, profile: str, min_memory_bytes: int | None) -> str:
    attrs = attributes(target)
    expression = f"{_has_profile(attrs)} && {attrs}.{PROFILE_ATTRIBUTE} == {quote(profile)}"
    return expression + _memory_guard(target, min_memory_bytes)


def _memory_guard(target: TargetDriver, min_memory_bytes: int | None) -> str:
    """`` && <the device has at least min_memory_bytes>``; empty without a minimum."""
    if min_memory_bytes is None:
        return ""
    capacity = f"device.capacity[{quote(target.domain)}]"
    size = quote(format_bytes(min_memory_bytes))
    memory = f"{capacity}.{MEMORY_CAPACITY}"
    return f' && "{MEMORY_CAPACITY}" in {capacity} && {memory}.compareTo(quantity({size})) >= 0'


def profiles_selector(
    target: TargetDriver, profiles: tuple[str, ...], min_memory_bytes: int | None
) -> str:
    if len(profiles) == 1:
        return _profile_selector(target, profiles[0], min_memory_bytes)
    attrs = attributes(target)
    names = ", ".join(quote(p) for p in profiles)
    return f"{_has_profile(attrs)} && {attrs}.{PROFILE_ATTRIBUTE} in [{names}]" + _memory_guard(
        target, min_memory_bytes
    )
