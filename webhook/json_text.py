"""JSON manifests edited in place, as :mod:`webhook.yaml_text` edits YAML ones.

A JSON file in a GitOps repository is reviewed as a diff too, and JSON has no comments to lose
but every other habit of its writer: the indentation step (or none: one line), the space after
``:`` and ``,``, escapes, key order, a byte-order mark, CRLF line endings and a missing last
line break. The file is scanned for the span of every value (Python's own JSON scanner reads
each scalar, so the spans are exactly what ``json`` reads), the old and the new value are
compared node by node, and each difference becomes a text edit: a removed member or item is
cut with its comma, an added one is inserted after its last kept sibling with the separator
its siblings use, a changed scalar is replaced where it stands, and new values are written
with the object's own layout. The templates a file gains are appended to its ``items`` when
it is a ``v1`` List; a single object is wrapped in one, its own lines kept as they were (only
its closing line gains the comma that separates it from the templates). The edited text must
read back as the conversion, or the file is written whole (``Edited.whole`` says why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from json.scanner import make_scanner
from typing import Any

from gpu_slicer.webhook.yaml_text import BOM, Edited, additions, line_ending, runs, same

_WHITESPACE = " \t\r\n"
_SCAN = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: a decoder is what it takes
_LIST_HEADER = '{"apiVersion": "v1", "kind": "List", "items": ['


@dataclass
class _Node:
    """A value's span in the text; members (key, key's offset, value) or items if a collection."""

    start: int
    end: int
    members: list[tuple[str, int, _Node]] | None = None
    items: list[_Node] | None = None
    duplicate_key: bool = field(default=False)


class _CannotEdit(Exception):  # noqa: N818 - control flow, never leaves this module
    """This value cannot be edited in place: its parent writes it anew (the file, at the top)."""


def _skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def _parse(text: str, index: int) -> _Node:
    """The value starting at ``index`` (after whitespace); raises _CannotEdit on bad JSON."""
    index = _skip(text, index)
    opener = text[index : index + 1]
    if opener not in ("{", "["):
        try:
            _, end = _SCAN(text, index)
        except StopIteration:
            raise _CannotEdit(f"it is not JSON at offset {index}") from None
        return _Node(index, end)
    closer = "}" if opener == "{" else "]"
    node = _Node(index, index, members=[] if opener == "{" else None)
    node.items = [] if opener == "[" else None
    at = _skip(text, index + 1)
    if text[at : at + 1] == closer:
        node.end = at + 1
        return node
    seen: set[str] = set()
    while True:
        if node.members is not None:
            try:
                key, after = _SCAN(text, at) if text[at : at + 1] == '"' else (None, at)
            except StopIteration:
                key = None
            if not isinstance(key, str):
                raise _CannotEdit(f"it is not JSON at offset {at}")
            colon = _skip(text, after)
            if text[colon : colon + 1] != ":":
                raise _CannotEdit(f"it is not JSON at offset {colon}")
            value = _parse(text, colon + 1)
            node.duplicate_key |= key in seen
            seen.add(key)
            node.members.append((key, at, value))
        else:
            value = _parse(text, at)
            assert node.items is not None
            node.items.append(value)
        at = _skip(text, value.end)
        if text[at : at + 1] == closer:
            node.end = at + 1
            return node
        if text[at : at + 1] != ",":
            raise _CannotEdit(f"it is not JSON at offset {at}")
        at = _skip(text, at + 1)


def edit(text: str, old: Any, new: Any, templates: list[Any]) -> Edited:
    """``text`` (a JSON file whose value is ``old``) edited in place to hold ``new``, and
    ``templates`` after it; everything the conversion did not change is kept byte for byte.
    Written whole (indent 2, its line endings and byte-order mark kept) where it cannot be."""
    try:
        return Edited(_edit(text, old, new, templates))
    except _CannotEdit as exc:
        return Edited(rewrite(text, [new, *templates]), str(exc))


def rewrite(text: str, objects: list[Any]) -> str:
    """``objects`` written whole in place of ``text`` (one object, or a ``v1`` List of them),
    indented by 2, with ``text``'s line endings and byte-order mark."""
    value = objects[0] if len(objects) == 1 else _as_list(objects)
    whole = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    whole = whole.replace("\n", line_ending(text)) if line_ending(text) != "\n" else whole
    return (BOM if text.startswith(BOM) else "") + whole


def _edit(text: str, old: Any, new: Any, templates: list[Any]) -> str:
    start = 1 if text.startswith(BOM) else 0
    root = _parse(text, start)
    if _skip(text, root.end) != len(text):
        raise _CannotEdit("it holds more than one JSON value")
    if not same(_loaded(text[start:], "it is not JSON"), old):
        raise _CannotEdit("JSON reads it differently from YAML")
    editor = _Editor(text, root)
    listed = _is_list(old) and _is_list(new) and root.members is not None
    if templates and listed:
        new = {**new, "items": [*new["items"], *templates]}
    editor.value(root, old, new)
    out = editor.apply()
    expected = new
    if templates and not listed:
        eol, end = editor.eol, root.end + len(out) - len(text)
        added = ("," + eol).join(
            editor.written(t, "", compact=editor.unit is None) for t in templates
        )
        wrapped = f"{_LIST_HEADER}{eol}{out[root.start : end]},{eol}{added}{eol}]}}"
        out = out[: root.start] + wrapped + out[end:]
        expected = _as_list([new, *templates])
    if not same(_loaded(out[start:], "the edited text would not read back"), expected):
        raise _CannotEdit("the edited text would not read back as the conversion")
    return out


def _loaded(text: str, problem: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _CannotEdit(f"{problem}: {exc}") from exc


def _is_list(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("kind") == "List"
        and isinstance(value.get("items"), list)
    )


def _as_list(items: list[Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


class _Editor:
    """Edits collected as ``(start, end, text)`` and applied from the end of the text."""

    def __init__(self, text: str, root: _Node) -> None:
        self.text = text
        self.edits: list[tuple[int, int, str]] = []
        self.eol = line_ending(text)
        self.unit: str | None = None
        """The file's indentation step; None for a file on one line."""
        self.key_sep = ": "
        self.item_sep = ", "
        if root.members:
            _, key_at, value = root.members[0]
            self.key_sep = text[_SCAN(text, key_at)[1] : value.start]
            if self._multiline(root):
                self.unit = self.indent(key_at)[len(self.indent(root.start)) :] or "  "
        self.item_sep = self._compact_separator(root) or ", "
        """What separates the elements of a collection on one line (``, `` or ``,``)."""

    def _compact_separator(self, node: _Node) -> str | None:
        """The separator of the first collection written on one line with two elements."""
        children = [m[2] for m in node.members or []] + list(node.items or [])
        if len(children) > 1 and not self._multiline(node):
            between = self.separator(node)
            return between if between in (",", ", ") else None
        for child in children:
            if child.members or child.items:
                found = self._compact_separator(child)
                if found:
                    return found
        return None

    # -- where things are

    def indent(self, index: int) -> str:
        """The whitespace that starts the line ``index`` is on."""
        line = self.text.rfind("\n", 0, index) + 1
        end = line
        while end < index and self.text[end] in " \t":
            end += 1
        return self.text[line:end]

    def _multiline(self, node: _Node) -> bool:
        """Whether the collection's first element is on a line of its own."""
        first = node.members[0][1] if node.members else node.items[0].start if node.items else None
        return first is not None and "\n" in self.text[node.start : first]

    def separator(self, node: _Node) -> str:
        """What separates this collection's elements: its own, or a comma and the whitespace
        before its first element."""
        starts = (
            [m[1] for m in node.members]
            if node.members is not None
            else [i.start for i in node.items or []]
        )
        ends = (
            [m[2].end for m in node.members]
            if node.members is not None
            else [i.end for i in node.items or []]
        )
        if len(starts) > 1:
            return self.text[ends[0] : starts[1]]
        if self._multiline(node):
            return "," + self.text[node.start + 1 : starts[0]]
        return self.item_sep

    def written(self, value: Any, base: str, *, compact: bool) -> str:
        """``value`` as JSON in this file's layout, its later lines indented from ``base``."""
        if compact or self.unit is None:
            return json.dumps(value, ensure_ascii=False, separators=(self.item_sep, self.key_sep))
        text = json.dumps(
            value, ensure_ascii=False, indent=self.unit, separators=(",", self.key_sep)
        )
        return text.replace("\n", self.eol + base)

    # -- the edits

    def replace(self, start: int, end: int, text: str) -> None:
        self.edits.append((start, end, text))

    def apply(self) -> str:
        out = self.text
        for start, end, text in sorted(self.edits, key=lambda e: (e[0], e[1]), reverse=True):
            out = out[:start] + text + out[end:]
        return out

    def value(self, node: _Node, old: Any, new: Any) -> None:
        if same(old, new):
            return
        if node.members is not None and isinstance(old, dict) and isinstance(new, dict):
            self.mapping(node, old, new)
        elif node.items is not None and isinstance(old, list) and isinstance(new, list):
            self.sequence(node, old, new)
        else:
            raise _CannotEdit("a value replaced")

    def child(self, node: _Node, old: Any, new: Any, parent: _Node) -> None:
        """``node`` edited, or written anew where it stands."""
        mark = len(self.edits)
        try:
            self.value(node, old, new)
        except _CannotEdit:
            del self.edits[mark:]
            compact = not self._multiline(parent)
            self.replace(
                node.start, node.end, self.written(new, self.indent(node.start), compact=compact)
            )

    def mapping(self, node: _Node, old: dict[Any, Any], new: dict[Any, Any]) -> None:
        members = node.members or []
        if node.duplicate_key or len(members) != len(old):
            raise _CannotEdit("an object whose keys appear twice")
        order = [key for key, _, _ in members]
        kept = [k for k in order if k in new]
        if not kept:
            raise _CannotEdit("every key replaced")
        sep = self.separator(node)
        self._cut(
            [i for i, k in enumerate(order) if k not in new],
            [m[1] for m in members],
            [m[2].end for m in members],
        )
        spans = {key: (at, value) for key, at, value in members}
        for key in kept:
            if not same(old[key], new[key]):
                self.child(spans[key][1], old[key], new[key], node)
        compact = not self._multiline(node)
        for after, added in additions(old, new):
            at = spans[kept[0]][0] if after is None else spans[after][1].end
            base = self.indent(spans[kept[0]][0])
            text = sep.join(
                json.dumps(k, ensure_ascii=False)
                + self.key_sep
                + self.written(v, base, compact=compact)
                for k, v in added.items()
            )
            self.replace(at, at, text + sep if after is None else sep + text)

    def sequence(self, node: _Node, old: list[Any], new: list[Any]) -> None:
        items = node.items or []
        if not items:
            raise _CannotEdit("an empty list filled")
        if len(new) == len(old):
            for item, before, after in zip(items, old, new, strict=True):
                if not same(before, after):
                    self.child(item, before, after, node)
            return
        if len(new) > len(old) and all(same(a, b) for a, b in zip(old, new, strict=False)):
            base = self.indent(items[0].start)
            compact = not self._multiline(node)
            sep = self.separator(node)
            self.replace(
                items[-1].end,
                items[-1].end,
                "".join(sep + self.written(v, base, compact=compact) for v in new[len(old) :]),
            )
            return
        raise _CannotEdit("a list changed")

    def _cut(self, removed: list[int], starts: list[int], ends: list[int]) -> None:
        """Removes the elements at ``removed`` (some kept) with their commas: a run up to the
        next kept element, or from the end of the previous one when it is the last."""
        for run in runs(removed):
            first, last = run[0], run[-1]
            if last + 1 < len(starts):
                self.replace(starts[first], starts[last + 1], "")
            else:
                self.replace(ends[first - 1], ends[last], "")
