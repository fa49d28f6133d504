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


# Writing into a map or a list that may be missing is two steps: where the document stands
# (``map_state``/``list_state``, a small int: all that the operations depend on besides the
# path and the value) and the operation for that state (``map_entry_op``/``list_ops``, pure).
# Callers that see many documents of one shape can remember the operations per state.

IS_LIST = -1
"""``list_state``: the list exists."""
NOT_LIST = -2
"""``list_state``: something other than a list (or null) is there: it is replaced."""


def map_state(doc: Any, parent: Sequence[Token]) -> int:
    """How many leading tokens of ``parent`` (map keys) reach a map that exists: ``len(parent)``
    when ``parent`` itself is a map, 0 when only the document is."""
    depth = len(parent)
    while depth > 0 and not isinstance(lookup(doc, parent[:depth]), dict):
        depth -= 1
    return depth


def list_state(doc: Any, parent: Sequence[Token]) -> int:
    """IS_LIST, NOT_LIST, or (nothing there) the ``map_state`` of the list's parent map."""
    existing = lookup(doc, parent)
    if isinstance(existing, list):
        return IS_LIST
    if existing is not None:
        return NOT_LIST
    return map_state(doc, parent[:-1])


def _nested_add(parent: Sequence[Token], depth: int, tail: Any, at: Sequence[Token]) -> Op:
    """An ``add`` of ``tail`` at ``parent``, wrapped in every map missing below ``depth``:
    the deepest existing map receives one ``add`` whose value builds the rest, so the patch
    never refers to a path that is not there."""
    value = tail
    for token in reversed(parent[depth + 1 :]):
        value = {str(token): value}
    return {"op": "add", "path": pointer([*at, *parent[: depth + 1]]), "value": value}


def map_entry_op(state: int, parent: Sequence[Token], key: str, value: Any) -> Op:
    """Set ``parent[key] = value`` in a document whose ``map_state(doc, parent)`` is ``state``:
    an ``add`` into the map, or one that creates the missing maps around the entry. ``parent``
    is a path of map keys; an existing key is replaced (``add`` on a member replaces it)."""
    if state == len(parent):
        return {"op": "add", "path": pointer([*parent, key]), "value": value}
    return _nested_add(parent, state, {key: value}, ())


def list_ops(
    state: int, parent: Sequence[Token], values: Sequence[Any], *, at: Sequence[Token] = ()
) -> list[Op]:
    """Append ``values`` to the list at ``parent`` in a document whose ``list_state(doc,
    parent)`` is ``state``: one ``add`` per value to an existing list, else a single operation
    that creates (or replaces) the list with all of them, and the maps it needs (a second
    ``add`` of a list that was missing would replace the first).

    ``at``: where the document inspected lies in the one being patched (the operations' paths
    start there), so that a caller holding a deep node need not walk down to it again."""
    if state == IS_LIST:
        path = pointer([*at, *parent, "-"])
        return [{"op": "add", "path": path, "value": v} for v in values]
    if not values:
        return []
    items = list(values)
    if state == NOT_LIST:
        return [{"op": "replace", "path": pointer([*at, *parent]), "value": items}]
    if state == len(parent) - 1:
        return [{"op": "add", "path": pointer([*at, *parent]), "value": items}]
    return [_nested_add(parent[:-1], state, {str(parent[-1]): items}, at)]


def remove(tokens: Sequence[Token]) -> Op:
    return {"op": "remove", "path": pointer(tokens)}
