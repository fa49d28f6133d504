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

import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

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


class _Bounded:
    """The bounds of the module docstring, on any composer: depth while composing, alias
    expansion once a document's node tree is whole."""

    _depth = 0
    _aliased = False
    """Whether the document being composed has an alias (without one it cannot expand)."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
            self._aliased = True
            return super().compose_node(parent, index)  # type: ignore[misc,no-any-return]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                raise _Refused(
                    problem=f"nested too deeply: more than {MAX_DEPTH} levels",
                    problem_mark=mark,
                )
            return super().compose_node(parent, index)  # type: ignore[misc,no-any-return]
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        self._aliased = False
        node: Node | None = super().compose_document()  # type: ignore[misc]
        if node is not None and self._aliased:
            _check_expansion(node)
        return node


class _Loader(_Bounded, yaml.SafeLoader):
    """PyYAML's safe loader (all Python), bounded: every reader's values, messages and node
    marks (character positions)."""


class _NoLibyaml:
    """Stands in for libyaml's parser where PyYAML was built without it (FAST is then False)."""


_CParser: Any = getattr(getattr(yaml, "_yaml", None), "CParser", None)


class _FastLoader(_Bounded, Composer, _CParser or _NoLibyaml, SafeConstructor, Resolver):  # type: ignore[misc]
    """The same loader on libyaml's scanner and parser (what makes reading fast: PyYAML's own
    scanner is pure Python): the events come from C; composing, the bounds and constructing
    are the Python code of :class:`_Loader`. Used where libyaml does not bound nesting."""

    def __init__(self, stream: str) -> None:
        _CParser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


class _CLoader(_CParser or _NoLibyaml, SafeConstructor, Resolver):  # type: ignore[misc]
    """libyaml composing too (in C, a third faster again), the bounds checked on the whole
    node tree after (:func:`_within_bounds`): where libyaml itself refuses nesting deeper than
    its own limit (1,000 levels), so that composing in C cannot run out of stack."""

    def __init__(self, stream: str) -> None:
        _CParser.__init__(self, stream)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """Resolver.resolve, remembered per plain scalar's text (libyaml asks for every
        scalar; keys and most values recur from document to document). A quoted scalar is a
        string, as Resolver says when no path resolver is set (none is)."""
        if kind is not ScalarNode or self.yaml_path_resolvers:
            return Resolver.resolve(self, kind, value, implicit)  # type: ignore[no-untyped-call]
        if not implicit[0]:
            return _STR
        tag = _RESOLVED.get(value)
        if tag is None:
            tag = Resolver.resolve(self, kind, value, implicit)  # type: ignore[no-untyped-call]
            if len(_RESOLVED) >= _RESOLVED_MAX:
                _RESOLVED.clear()
            _RESOLVED[value] = tag
        return tag


_RESOLVED: dict[str, str] = {}
_RESOLVED_MAX = 50_000


def _libyaml_bounds_nesting() -> bool:
    """Whether this libyaml refuses deep nesting itself (0.2.5 and later do)."""
    if _CParser is None:
        return False
    try:
        yaml.compose("[" * 2000, Loader=_CLoader)
    except yaml.YAMLError as exc:
        return "nesting" in str(exc)
    return False


def _within_bounds(root: Node) -> bool:
    """Raise _Refused when ``root`` (composed by libyaml) nests deeper than :data:`MAX_DEPTH`
    or its aliases break :func:`_check_expansion`; whether it has aliases. Walked in document
    order, each node once: a node is first met where it is written (an anchor comes before its
    aliases), so depth is counted as :class:`_Bounded` counts it while composing."""
    seen: set[int] = set()
    shared = False
    stack: list[tuple[Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            shared = True
            continue
        seen.add(id(node))
        if depth > MAX_DEPTH:
            raise _Refused(
                problem=f"nested too deeply: more than {MAX_DEPTH} levels",
                problem_mark=node.start_mark,
            )
        if isinstance(node, SequenceNode):
            stack += [(item, depth + 1) for item in reversed(node.value)]
        elif isinstance(node, MappingNode):
            stack += [(n, depth + 1) for pair in reversed(node.value) for n in reversed(pair)]
    if shared:
        _check_expansion(root)
    return shared


_LINE_HEAD = re.compile(r"^ *(?:(?:[-?:]|[&!]\S*)(?: +|$))*", re.MULTILINE)
"""A line's indentation and the indicators (``- ``, ``? ``, ``: ``) and node properties
(``&anchor``, ``!tag``) after it, where a compact collection may start on the same line."""
_HEAD_PART = re.compile(r"\S+ *")
_MARKER_WITH_CONTENT = re.compile(r"^(?:---|\.\.\.)[ \t]*[^\s#]", re.MULTILINE)


@functools.lru_cache(maxsize=8)
def depth_bound(text: str) -> int | None:
    """A depth that ``text``'s documents cannot exceed, told from its characters alone; None
    when they may hold aliases (a ``*``) or where the count below does not hold.

    A block collection nested in another starts further right, but for a list right under a
    key (at the key's column): at most two levels a column, and a block collection starts
    where a line's content does or right after its ``- ``/``? ``/``: `` indicators and node
    properties. A flow collection starts at a bracket (a list item ``a: b`` is a mapping of its
    own). So: twice the columns where a collection may start, plus two a ``[``, one a ``{``,
    plus the scalar at the bottom. Lines must break at ``\n`` only (no tab, no other line
    break), and no document may start on a line with content. Remembered for the last few
    texts: ``convert`` asks for a document's twice (whether it says nothing, how to read it)."""
    if "*" in text or "\t" in text:
        return None
    if "\r" in text and text.count("\r") != text.count("\r\n"):
        return None
    if not text.isascii() and any(c in text for c in "\x85\u2028\u2029"):
        return None
    if _MARKER_WITH_CONTENT.search(text):
        return None
    columns = set()
    for head in set(_LINE_HEAD.findall(text)):
        rest = head.lstrip(" ")
        column = len(head) - len(rest)
        columns.add(column)
        for part in _HEAD_PART.findall(rest):
            column += len(part)
            columns.add(column)
    return 2 * len(columns) + 2 * text.count("[") + text.count("{") + 1


def _plain(text: str) -> bool:
    """Whether ``text`` can neither nest beyond :data:`MAX_DEPTH` nor hold an alias
    (:func:`depth_bound`): then libyaml composes it in C even where it does not bound nesting
    itself (:data:`C_COMPOSES` False: some wheels' libyaml), and nothing needs walking after."""
    bound = depth_bound(text)
    return bound is not None and bound <= MAX_DEPTH


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


for _class in (_Loader, _FastLoader, _CLoader):
    _class.add_constructor("tag:yaml.org,2002:timestamp", _as_text)
    _class.add_constructor("tag:yaml.org,2002:binary", _as_text)
    _class.add_constructor("tag:yaml.org,2002:int", _int)

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = tuple(
    f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "timestamp", "binary")
)


class _Unusual(Exception):  # noqa: N818 - control flow, never leaves this module
    """A node :func:`_values` leaves to the loader's own constructor."""


def _values(loader: Any, root: Node) -> Any:
    """The value of ``root``, a document without aliases, exactly as ``loader``'s constructor
    makes it (the same scalar constructors), without its bookkeeping per node (a generator, a
    recursion guard, an identity cache: a third of reading a document with libyaml). Raises
    _Unusual where the constructor does more: a merge key, a tag other than YAML's own
    scalars, maps and lists, a collection as a key."""
    constructors = loader.yaml_constructors
    scalars = {tag: constructors[tag] for tag in _SCALAR_TAGS}

    def value(node: Node) -> Any:
        kind = type(node)
        tag = node.tag
        if kind is ScalarNode:
            if tag == _STR:
                return node.value
            constructor = scalars.get(tag)
            if constructor is None:
                raise _Unusual
            return constructor(loader, node)
        if kind is MappingNode and tag == _MAP:
            out = {}
            for key, item in node.value:
                if type(key) is not ScalarNode or key.tag not in _KEY_TAGS:
                    raise _Unusual
                name = value(key)  # the key first, as the constructor does
                out[name] = value(item)
            return out
        if kind is SequenceNode and tag == _SEQ:
            return [value(item) for item in node.value]
        raise _Unusual

    return value(root)


_KEY_TAGS = frozenset((_STR, *_SCALAR_TAGS))


FAST = _CParser is not None
"""Whether PyYAML has libyaml (its wheels do): :func:`parse_all_fast` then reads with it."""
C_COMPOSES = _libyaml_bounds_nesting()
"""Whether :func:`parse_all_fast` composes in C (:class:`_CLoader`) whatever the text, or, where
libyaml would recurse without a bound, only text whose depth is bounded by its characters
(:func:`_plain`) and the rest in Python (:class:`_FastLoader`)."""


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


def read_with_nodes(text: str) -> tuple[list[Node], list[Any]]:
    """:func:`compose_all` and :func:`parse_all` of ``text`` in one reading: the values are
    constructed from the very nodes (what an editor that also needs the values reads).

    Composed by libyaml where the text holds nothing the two readers are known to read
    differently (:func:`_read_alike`): the same nodes, marks and values, five times faster;
    anything libyaml refuses is read again by the Python reader, for its verdict and message."""
    if FAST and _read_alike(text) and (C_COMPOSES or _plain(text)):
        try:
            return _read_with_nodes_c(text)
        except (yaml.YAMLError, RecursionError):
            pass
    try:
        loader = _Loader(text)
        try:
            return _nodes_and_values(loader, lambda _node: bool(loader._aliased))
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise DocumentError(_describe(exc)) from exc
    except RecursionError as exc:
        raise DocumentError("the YAML is nested too deeply to read") from exc


_NOT_ALIKE = re.compile(r"[^\x20-\x7e\n]|\?|^%|[|>][-+0-9]*#|:\s*[,}\]]", re.MULTILINE)
"""What PyYAML's own scanner and libyaml are known to read differently, or whose marks they
place differently: anything but printable ASCII and ``\n`` (tabs, a byte-order mark, ``\r``),
``?`` (in a flow collection), a directive, ``|#``, an empty value in a flow collection."""


def _read_alike(text: str) -> bool:
    """Whether libyaml may stand in for the Python reader on ``text``: it ends with a line
    break (else the last mark's line differs) and holds nothing of :data:`_NOT_ALIKE`."""
    return text.endswith("\n") and _NOT_ALIKE.search(text) is None


def _read_with_nodes_c(text: str) -> tuple[list[Node], list[Any]]:
    """:func:`read_with_nodes` on libyaml, with the same bounds (:func:`parse_all_fast`)."""
    plain = _plain(text)
    loader = _CLoader(text)
    try:
        return _nodes_and_values(loader, lambda node: not plain and _within_bounds(node))
    finally:
        loader.dispose()


def _nodes_and_values(loader: Any, aliased: Callable[[Node], bool]) -> tuple[list[Node], list[Any]]:
    """Every document's node and, where it has one, its value; ``aliased(node)``: whether the
    document may share nodes (an alias), which only the constructor reads right."""
    nodes: list[Node] = []
    values: list[Any] = []
    while loader.check_node():
        node = loader.get_node()
        if node is None:
            continue
        nodes.append(node)
        value = _constructed(loader, node, aliased(node))
        if value is not None:
            values.append(value)
    return nodes, values


def _constructed(loader: Any, node: Node, aliased: bool) -> Any:
    """The value of the document ``node``: :func:`_values` where it can (no alias), else the
    loader's constructor."""
    if not aliased:
        try:
            return _values(loader, node)
        except _Unusual:
            pass
    return loader.construct_document(node)


def parse_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML (or JSON) stream."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
    except yaml.YAMLError as exc:
        raise DocumentError(_describe(exc)) from exc
    except RecursionError as exc:
        raise DocumentError("the YAML is nested too deeply to read") from exc


def parse_all_fast(text: str) -> list[Any]:
    """:func:`parse_all` on libyaml's parser (:class:`_FastLoader`), ten times faster, with the
    same bounds; where it refuses, :func:`parse_all` reads the text again, so a refusal has the
    message (and the verdict) of the Python reader. Not quite the same reader: libyaml accepts
    a few things PyYAML's own scanner refuses (a tab after a plain value, ``|#``) and reads a
    few oddities differently (a lone ``!`` is ``''``, not null). ``convert`` uses it only for
    the documents that hold no GPU text (webhook.yaml_text.may_ask_for_gpus)."""
    if not FAST:
        return parse_all(text)
    try:
        plain = _plain(text)  # no walk needed, no alias
        if not (plain or C_COMPOSES):
            return [d for d in yaml.load_all(text, Loader=_FastLoader) if d is not None]  # noqa: S506
        loader = _CLoader(text)
        try:
            values = []
            while loader.check_node():
                node = loader.get_node()
                if node is not None:
                    shared = not plain and _within_bounds(node)
                    value = _constructed(loader, node, shared)
                    if value is not None:
                        values.append(value)
            return values
        finally:
            loader.dispose()
    except (yaml.YAMLError, RecursionError):
        return parse_all(text)


def well_formed(text: str) -> bool:
    """Whether libyaml parses ``text`` without error, all in C (no node, no value is made):
    the syntax alone, not the bounds, anchors or values."""
    if not FAST:
        return False
    parser = _CParser(text)
    try:
        parser.raw_parse()
    except yaml.YAMLError:
        return False
    finally:
        parser.dispose()
    return True


def _describe(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without the source excerpt PyYAML appends."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if isinstance(exc, _Refused):
        return f"refused{where}: {problem}"
    return f"not valid YAML{where}: {problem}"
