"""Reading YAML (and JSON) documents: manifests, policies, layouts, scenarios, settings.

Every file gpu-slicer reads goes through here, so every reader reports the same failures the same
way: in one line that says where (``not valid YAML at line 2, column 5: ...``), whether the file is
unreadable, not UTF-8, or nested deeper than the parser can follow. Callers wrap
:class:`DocumentError` in their own typed error, prefixed with what the document was for.

The reader is bounded, so that no input can hang or exhaust the machine: a document may nest at
most :data:`MAX_DEPTH` levels, its aliases may add at most :data:`MAX_ALIAS_NODES` nodes to it
once expanded (a 700-byte "billion laughs" would otherwise expand to billions), and an alias may
not refer to a node that contains it. Values are what Kubernetes' own YAML reader makes of them:
timestamps and ``!!binary`` stay text (so every document can be written as JSON), and an integer
too long for Python to convert is refused with its line rather than crashing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_DEPTH = 100
"""Deepest nesting of collections a document may have (Kubernetes objects, CRD schemas
included, stay far below; Python's own recursion limit is about 330 levels of YAML)."""
MAX_ALIAS_NODES = 100_000
"""Most nodes a document's aliases (and merge keys) may add to it once expanded."""


class DocumentError(ValueError):
    """A document that cannot be read or parsed; ``str()`` is one line for a person."""


def file_problem(flag: str, path: str | os.PathLike[str] | None) -> str | None:
    """What is wrong with a file flag before anything reads it (None: fine, or not given)."""
    if not path or Path(path).is_file():
        return None
    return f"{flag} {path} {'is not a file' if Path(path).exists() else 'does not exist'}"


def read_text(path: str | os.PathLike[str]) -> str:
    """The file as UTF-8 text (``-`` reads standard input, strictly UTF-8 as well)."""
    try:
        if str(path) == "-":
            raw = getattr(sys.stdin, "buffer", None)
            return raw.read().decode("utf-8") if raw is not None else sys.stdin.read()
        return Path(path).read_bytes().decode("utf-8")  # line endings kept as written
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text ({exc})") from exc
    except OSError as exc:
        raise DocumentError(f"cannot read: {exc.strerror or exc}") from exc


class _Refused(yaml.MarkedYAMLError):
    """YAML that is well formed but beyond what gpu-slicer's reader accepts."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded in depth and alias expansion (module docstring)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _Refused(
                    problem=f"nested too deeply: more than {MAX_DEPTH} levels",
                    problem_mark=mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node: Node | None = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root: Node) -> None:
    """Raise _Refused when aliases make ``root`` a cycle, or expand it beyond the bound."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _Refused(
                problem="an alias refers to a node that contains it (a recursive structure)",
                problem_mark=node.start_mark,
            )
        active.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = total
        return total

    if size(root) - len(sizes) > MAX_ALIAS_NODES:
        raise _Refused(
            problem=f"its aliases expand it by more than {MAX_ALIAS_NODES:,} nodes "
            "(an alias bomb?)",
            problem_mark=root.start_mark,
        )


def _as_text(loader: _Loader, node: Node) -> str:
    """A timestamp or ``!!binary`` kept as its text, as Kubernetes reads it."""
    value = loader.construct_scalar(node)  # type: ignore[arg-type]
    return "".join(str(value).split()) if node.tag.endswith(":binary") else str(value)


def _int(loader: _Loader, node: Node) -> int:
    try:
        return loader.construct_yaml_int(node)  # type: ignore[arg-type]
    except ValueError as exc:  # more digits than Python converts (sys.get_int_max_str_digits)
        raise _Refused(
            problem=f"an integer of {len(str(node.value))} characters is too long to read",
            problem_mark=node.start_mark,
        ) from exc


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _as_text)
_Loader.add_constructor("tag:yaml.org,2002:binary", _as_text)
_Loader.add_constructor("tag:yaml.org,2002:int", _int)


def parse(text: str) -> Any:
    """The one document in ``text`` (None when empty)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise DocumentError(_describe(exc)) from exc
    except RecursionError as exc:
        raise DocumentError("the YAML is nested too deeply to read") from exc


def compose_all(text: str) -> list[Node]:
    """The node tree of every non-empty document of ``text``, with the positions (marks) where
    each node starts and ends: what an editor that keeps the text needs. Bounded as
    :func:`parse_all`; an alias is the node it names (the same object, found twice)."""
    try:
        return [node for node in yaml.compose_all(text, Loader=_Loader) if node is not None]
    except yaml.YAMLError as exc:
        raise DocumentError(_describe(exc)) from exc
    except RecursionError as exc:
        raise DocumentError("the YAML is nested too deeply to read") from exc


def parse_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML (or JSON) stream."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
    except yaml.YAMLError as exc:
        raise DocumentError(_describe(exc)) from exc
    except RecursionError as exc:
        raise DocumentError("the YAML is nested too deeply to read") from exc


def _describe(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without the source excerpt PyYAML appends."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if isinstance(exc, _Refused):
        return f"refused{where}: {problem}"
    return f"not valid YAML{where}: {problem}"
