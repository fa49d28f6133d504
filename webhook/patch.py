"""JSON Patch (RFC 6902) operations built against the raw pod, never a re-serialised model.

Patching the raw JSON keeps every field the webhook does not know about. Two classic bugs are
designed out here: keys with ``/`` or ``~`` (``nvidia.com/gpu``) are escaped as ``~1`` / ``~0``,
and an ``add`` into a map or list that does not exist creates the parent instead of failing with
"doc is missing path".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Op = dict[str, Any]
Token = str | int


def escape(token: Token) -> str:
    """One JSON Pointer reference token: ``~`` -> ``~0`` first, then ``/`` -> ``~1``."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(tokens: Sequence[Token]) -> str:
    """The JSON Pointer of a path given as tokens; ``[]`` is the whole document."""
    if not tokens:
        return ""
    # Most tokens hold neither "~" nor "/": only those are escaped (checked in C, per token).
    return "/" + "/".join(
        [t if type(t) is str and "/" not in t and "~" not in t else escape(t) for t in tokens]
    )


def lookup(doc: Any, tokens: Sequence[Token]) -> Any:
    """The value at ``tokens``, or None when any step is missing or of the wrong type."""
    node = doc
    for token in tokens:
        if isinstance(node, dict) and isinstance(token, str):
            node = node.get(token)
        elif isinstance(node, list) and isinstance(token, int) and 0 <= token < len(node):
            node = node[token]
        else:
            return None
    return node


def _creating(doc: Any, parent: Sequence[Token], tail: Any, *, at: Sequence[Token] = ()) -> Op:
    """An ``add`` of ``tail`` wrapped in every map that is missing along ``parent``.

    ``parent`` names nested map keys; the deepest existing map receives a single ``add`` whose
    value builds the rest, so the patch never refers to a path that is not there.
    """
    depth = len(parent)
    while depth > 0 and not isinstance(lookup(doc, parent[:depth]), dict):
        depth -= 1
    value = tail
    for token in reversed(parent[depth + 1 :]):
        value = {str(token): value}
    if depth == len(parent):
        raise AssertionError("unreachable: caller handles existing parents")
    return {"op": "add", "path": pointer([*at, *parent[: depth + 1]]), "value": value}


def set_map_entry(doc: Any, parent: Sequence[Token], key: str, value: Any) -> Op:
    """Set ``parent[key] = value``, creating ``parent`` (and its missing ancestors) when needed.

    ``parent`` must be a path of map keys below something that exists (at least the document).
    An existing key is replaced (``add`` on an existing member replaces it).
    """
    if isinstance(lookup(doc, parent), dict):
        return {"op": "add", "path": pointer([*parent, key]), "value": value}
    return _creating(doc, parent, {key: value})


def append(doc: Any, parent: Sequence[Token], value: Any) -> Op:
    """Append ``value`` to the list at ``parent``, creating the list (and its maps) when missing."""
    existing = lookup(doc, parent)
    if isinstance(existing, list):
        return {"op": "add", "path": pointer([*parent, "-"]), "value": value}
    return _new_list(doc, parent, existing, [value])


def extend(
    doc: Any, parent: Sequence[Token], values: Sequence[Any], *, at: Sequence[Token] = ()
) -> list[Op]:
    """Append every one of ``values`` to the list at ``parent``: one ``add`` per value to an
    existing list, else a single operation creating the list with all of them (a second
    ``add`` of a list that was missing would replace the first).

    ``at``: where ``doc`` lies in the document being patched (the operations' paths start
    there), so that a caller holding a deep node need not walk down to it again."""
    existing = lookup(doc, parent)
    if isinstance(existing, list):
        path = pointer([*at, *parent, "-"])
        return [{"op": "add", "path": path, "value": v} for v in values]
    return [_new_list(doc, parent, existing, list(values), at=at)] if values else []


def _new_list(
    doc: Any, parent: Sequence[Token], existing: Any, items: list[Any], *, at: Sequence[Token] = ()
) -> Op:
    if existing is not None:
        # Present but not a list (null is handled as missing above): replace it with a list.
        return {"op": "replace", "path": pointer([*at, *parent]), "value": items}
    if isinstance(lookup(doc, parent[:-1]), dict):
        return {"op": "add", "path": pointer([*at, *parent]), "value": items}
    return _creating(doc, parent[:-1], {str(parent[-1]): items}, at=at)


def remove(tokens: Sequence[Token]) -> Op:
    return {"op": "remove", "path": pointer(tokens)}
