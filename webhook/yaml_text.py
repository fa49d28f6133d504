"""Manifest text edited in place: documents split as written, unchanged ones kept byte for
byte, changed ones edited where the conversion changed them and nowhere else.

Reviewers of a GitOps repository read diffs: converting a Deployment must change the lines that
ask for GPUs and add the claim, not re-flow every file. A stream is split at its ``---`` lines;
a document that conversion did not change is written back exactly as it was read. In one that
changed, the old and the new value are compared node by node and each difference becomes a
text edit at the position the YAML node marks give (:func:`edit`): a removed key's lines are
deleted (comment lines among them kept), an added key or item is inserted after its last kept
sibling's content (so before a trailing comment block), indented as its siblings and with the
document's line ending, a flow mapping gains or loses ``, key: value`` on its line, a changed
scalar is replaced where it stands. The edited text must read back as the conversion (read
with libyaml, as kubectl reads it), or the document is re-written whole with ruamel.yaml's
round trip (:func:`rewrite`) and the caller says so; a part that cannot be edited (a key
written twice) is re-written alone and named. Only documents that may ask for GPUs are read
at all (:func:`may_ask_for_gpus`); the others are kept as text.
"""

from __future__ import annotations

import base64
import difflib
import functools
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import ScalarNode as RuamelScalar
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpu_slicer.kube import documents
from gpu_slicer.webhook.errors import YamlTextError

_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?$")


@dataclass
class Chunk:
    """One document as written: its text (with its ``---`` line, if any) and its value."""

    text: str
    values: list[Any]
    """What the document holds (empty for comments only, or when not ``read``; more than one
    only when a document starts on its ``---`` line, which is then not split)."""
    nodes: list[Node] | None = field(default=None, repr=False)
    """The node tree of a document with GPU text, read with its values for :func:`edit`."""
    read: bool = True
    """Whether ``values`` were read. A document without GPU text (:func:`may_ask_for_gpus`) is
    not: ``convert`` lets it go unread where it would only check it (:func:`says_nothing`),
    checks it with ``kube.documents.parse_all_fast`` otherwise, and keeps its text."""


GPU_TEXT = ("nvidia.com/", "gpu-slicer.io/")
"""What every legacy GPU resource and every gpu-slicer annotation and label starts with (the
webhook's ``matchConditions`` send it only pods that mention one of them)."""
TREE_KINDS = ("CustomResourceDefinition", "ResourceQuota", "DeviceClass")
"""Kinds whose objects decide for others in the same tree (webhook.convert.tree_crds,
tree_quotas, tree_extended): always read."""
_ESCAPE = re.compile(
    r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([/\\])"
    r"|(?:\r\n|[\r\n\x85\u2028\u2029])[ \t]*)"
)
r"""The escapes of a double-quoted scalar that can make a letter, ``.``, ``/`` or ``-`` that is
not in the text (``\x2e``, ``\u002e``, ``\U0000002e``, ``\/``), or join two lines into one
word (``\`` at a line's end); ``\\`` first, so that ``\\x2e`` stays a backslash and ``x2e``.
Every other escape makes a control character, a quote or a space, none of them in a name."""


def _unescaped(match: re.Match[str]) -> str:
    code = match.group(1) or match.group(2) or match.group(3)
    if code is not None:
        number = int(code, 16)
        return chr(number) if number <= 0x10FFFF else ""
    return match.group(4) or ""


def may_ask_for_gpus(text: str) -> bool:
    r"""Whether a document's text may hold a GPU request, a gpu-slicer annotation or label, or
    an object that decides for others: it holds ``nvidia.com/``, ``gpu-slicer.io/`` or one of
    :data:`TREE_KINDS`, as written or once the escapes of double-quoted scalars are read
    (``"nvidia\x2ecom/gpu"``, ``"nvidia.com\/gpu"``, a name broken by ``\`` at a line's end).
    Without any, it cannot: YAML spells a key or a value only in its text (plain, quoted,
    block, or an anchor that its aliases repeat, in the same document), folding a line break
    makes a space, and a comment only makes a false positive (the document is read in full).
    Such a document is kept byte for byte, never converted."""
    return _mentions(text, (*GPU_TEXT, *TREE_KINDS))


def _mentions(text: str, needles: tuple[str, ...]) -> bool:
    """Whether ``text`` holds one of ``needles``, as written or once its escapes are read."""
    if any(needle in text for needle in needles):
        return True
    if "\\" not in text:
        return False
    unescaped = _ESCAPE.sub(_unescaped, text)
    return any(needle in unescaped for needle in needles)


_QUIET_HEAD = re.compile(
    r"(?:---[ ]*(?:#[^\n]*)?\n)?(?:[ ]*(?:#[^\n]*)?\n)*"
    r"apiVersion:[ ]+(?:[a-z0-9][a-z0-9.-]*/)?v[0-9][a-z0-9]*[ ]*(?:#[^\n]*)?\n"
)
"""A document that starts (after its ``---`` line, comments and blank lines) with a block
mapping's ``apiVersion: group/version`` key: a mapping, with an apiVersion that is text."""
_QUIET_BREAKERS = re.compile(r"[*&!?\\\t\r\x85\u2028\u2029]")
_FLOW_KEY = re.compile(r"[\]}] *:")
_REFUSED_NUMBER = re.compile(r"(?:0[bx]|\.)_")
_LONG_LINE = 4000
"""A line this long may hold an integer too long to read (4,300 digits)."""


def says_nothing(text: str, kinds: frozenset[tuple[str, str]]) -> bool:
    """Whether ``convert`` would read the document ``text``, which holds no GPU text
    (:func:`may_ask_for_gpus`), only to say nothing and keep it: one mapping whose apiVersion
    is text (:data:`_QUIET_HEAD`, the key once), whose kind is neither ``List`` nor one of
    ``kinds`` (group, kind) that convert reads pod templates of (spelled in none of its text,
    it is none of them), well-formed YAML (libyaml's parser, in C) that no bound of the reader
    refuses (``kube.documents.depth_bound``) and whose values can all be read: no alias,
    anchor, tag, complex key, escape, tab or other line break (:data:`_QUIET_BREAKERS`), no
    merge key, no flow collection as a key, no ``0x_``, ``0b_`` or ``._`` (read as numbers,
    then refused), no line of :data:`_LONG_LINE`, no other document. Such a document is
    counted and let go without being read; any other is read as before, so that every problem
    is named as before."""
    if not _QUIET_HEAD.match(text) or "List" in text:
        return False
    if any(kind in text and (not group or group in text) for group, kind in kinds):
        return False
    if text.count("apiVersion") != 1 or _QUIET_BREAKERS.search(text):
        return False
    if "<<" in text or "\n---" in text or "\n..." in text:
        return False
    if _FLOW_KEY.search(text) or _REFUSED_NUMBER.search(text):
        return False
    if len(text) >= _LONG_LINE and max(map(len, text.split("\n"))) >= _LONG_LINE:
        return False
    bound = documents.depth_bound(text)
    return bound is not None and bound <= documents.MAX_DEPTH and documents.well_formed(text)


def split(text: str, *, read_all: bool = True) -> list[Chunk]:
    """The documents of a YAML stream, in order; raises DocumentError for invalid YAML (in a
    document it reads).

    A document with GPU text is read with the Python reader, its node tree kept for
    :func:`edit`. With ``read_all`` False, one without GPU text is read only when it is one of
    :data:`TREE_KINDS`, with libyaml (``kube.documents.parse_all_fast``: it is never edited),
    and otherwise not at all: its ``values`` stay empty and ``read`` False (the caller checks
    it later)."""
    chunks = []
    for body in _documents_as_written(text):
        if _mentions(body, GPU_TEXT):
            nodes, values = documents.read_with_nodes(body)
            chunks.append(Chunk(body, values, nodes))
        elif read_all:
            chunks.append(Chunk(body, documents.parse_all(body)))
        elif _mentions(body, TREE_KINDS):
            chunks.append(Chunk(body, documents.parse_all_fast(body)))
        else:
            chunks.append(Chunk(body, [], read=False))
    return chunks


_OTHER_BREAKS = re.compile("\r(?!\n)|[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
"""What ``str.splitlines`` breaks lines at, besides ``\n`` and ``\r\n``."""
_SEPARATOR_LINES = re.compile(r"^---[ \t]*(?:#[^\r\n]*)?(?=\r?\n|\Z)", re.MULTILINE)


def _documents_as_written(text: str) -> list[str]:
    """``text`` cut before each ``---`` line but a first one (:data:`_SEPARATOR`, a line as
    ``str.splitlines`` breaks them), every character kept. Found with one search of the text
    where lines break at ``\n`` or ``\r\n`` only, line by line otherwise."""
    if _OTHER_BREAKS.search(text) is None:
        starts = [m.start() for m in _SEPARATOR_LINES.finditer(text) if m.start() > 0]
        return [text[a:b] for a, b in zip([0, *starts], [*starts, len(text)], strict=True)]
    return _documents_line_by_line(text)


def _documents_line_by_line(text: str) -> list[str]:
    pieces: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _SEPARATOR.match(line.rstrip("\r\n")) and pieces[-1]:
            pieces.append([])
        pieces[-1].append(line)
    return ["".join(lines) for lines in pieces]


def _header(text: str) -> tuple[str, str]:
    """(the ``---`` line, the rest)."""
    first, _, rest = text.partition("\n")
    if _SEPARATOR.match(first.rstrip("\r")):
        return first + "\n", rest
    return "", text


def rewrite(chunk: Chunk, value: Any) -> str:
    """``chunk``'s text re-emitted whole to hold ``value`` (ruamel.yaml's round trip): comments
    and styles kept where the nodes did not change, but lists re-indented, flow mappings and
    booleans normalized. :func:`edit` uses it only where an edit in place is impossible."""
    header, body = _header(chunk.text)
    yaml = _round_trip(body)
    try:
        node = yaml.load(body)
    except YAMLError as exc:
        raise YamlTextError(f"cannot load the document for editing: {exc}") from exc
    node = sync(node, value)
    out = io.StringIO()
    yaml.dump(node, out)
    return header + out.getvalue()


def dump(value: Any, *, start: bool = True, like: str = "") -> str:
    """A new document (a template), in block style, its lists indented as in ``like`` (the
    file it goes into)."""
    mapping, offset = _indentation(like)
    return ("---\n" if start else "") + written(value, mapping, offset)


# --- writing new values: ruamel.yaml once per shape ---------------------------------------------

_WRITTEN_MAX = 512
"""Shapes remembered by :func:`written` (a tree's templates and claim entries take a few)."""
_written: dict[tuple[Any, int, int], tuple[str, ...] | None] = {}
_PLAIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,250}[A-Za-z0-9])?\Z")
_SLOT = "gpuslicerslot{}x"
"""A stand-in for a slotted string while its shape is written (plain, and a string, in
every YAML version)."""
_TAG_STR = "tag:yaml.org,2002:str"
_PYYAML_RESOLVER = yaml.resolver.Resolver()


def written(value: Any, mapping: int, offset: int) -> str:
    """``value`` in block style, as ruamel.yaml's round-trip dumper writes it with that
    mapping indent and sequence dash offset (width 4096).

    Written once per shape: the strings that ruamel.yaml writes plain whatever they say
    (:func:`_slotted`: names, namespaces) are stand-ins, and a value of the same shape, the
    same keys and the same other scalars gets the remembered text with its own strings put in.
    Every template of a tree (a name, a namespace and a container's name apart) and every
    claim entry added to a pod is then written for the price of the first (ruamel.yaml's
    emitter takes milliseconds a document). A value that holds anything else than mappings
    with text keys, lists, text, integers, booleans and nulls is written directly."""
    strings: list[str] = []
    shape = _shape(value, strings)
    if shape is None:
        return _ruamel_written(value, mapping, offset)
    key = (shape, mapping, offset)
    if key not in _written:
        if len(_written) >= _WRITTEN_MAX:
            _written.clear()
        _written[key] = _written_shape(value, len(strings), mapping, offset)
    parts = _written[key]
    if parts is None:
        return _ruamel_written(value, mapping, offset)
    out = [parts[0]]
    for string, part in zip(strings, parts[1:], strict=True):
        out += [string, part]
    return "".join(out)


def _ruamel_written(value: Any, mapping: int, offset: int) -> str:
    yaml = YAML(typ="rt")
    yaml.width = 4096
    yaml.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    out = io.StringIO()
    yaml.dump(value, out)
    return out.getvalue()


def _shape(value: Any, strings: list[str]) -> Any:
    """``value`` with each slotted string left out (appended to ``strings``, in the order
    the dumper writes them) and every other scalar typed; None for what :func:`written`
    does not remember."""
    kind = type(value)
    if kind is dict:
        pairs = []
        for key, item in value.items():
            if type(key) is not str:
                return None
            inner = _shape(item, strings)
            if inner is None:
                return None
            pairs.append((key, inner))
        return ("map", tuple(pairs))
    if kind is list:
        items = []
        for item in value:
            inner = _shape(item, strings)
            if inner is None:
                return None
            items.append(inner)
        return ("seq", tuple(items))
    if kind is str:
        if _slotted(value):
            strings.append(value)
            return ("slot",)
        return ("str", value)
    if kind is int or kind is bool or value is None:
        return (kind.__name__, value)
    return None


@functools.lru_cache(maxsize=4096)
def _slotted(text: str) -> bool:
    """Whether ruamel.yaml writes ``text`` plain and as it is wherever a value stands: letters,
    digits and ``._/-`` (no space to fold at, no indicator, far from the 4096 width) that no
    YAML version reads as anything but a string (``true``, ``1e3``, ``2024-01-01`` are not)."""
    return (
        _PLAIN.match(text) is not None
        and _ruamel_resolver().resolve(RuamelScalar, text, (True, False)) == _TAG_STR
        and _PYYAML_RESOLVER.resolve(ScalarNode, text, (True, False)) == _TAG_STR  # type: ignore[no-untyped-call]
    )


@functools.lru_cache(maxsize=1)
def _ruamel_resolver() -> Any:
    return YAML(typ="rt").resolver


def _written_shape(value: Any, count: int, mapping: int, offset: int) -> tuple[str, ...] | None:
    """The text of ``value``'s shape, cut where its ``count`` slotted strings go; None when
    the stand-ins cannot be found once each, in order (never seen: then nothing is
    remembered)."""
    numbers = iter(range(count))
    text = _ruamel_written(_stand_ins(value, numbers), mapping, offset)
    parts = []
    position = 0
    for number in range(count):
        slot = _SLOT.format(number)
        found = text.find(slot, position)
        if found < 0 or text.count(slot) != 1:
            return None
        parts.append(text[position:found])
        position = found + len(slot)
    parts.append(text[position:])
    return tuple(parts)


def _stand_ins(value: Any, numbers: Any) -> Any:
    """``value`` with each slotted string replaced by its numbered stand-in."""
    if type(value) is dict:
        return {key: _stand_ins(item, numbers) for key, item in value.items()}
    if type(value) is list:
        return [_stand_ins(item, numbers) for item in value]
    if type(value) is str and _slotted(value):
        return _SLOT.format(next(numbers))
    return value


def sync(node: Any, value: Any) -> Any:
    """``node`` (loaded for round trip) changed in place to equal ``value``; what is equal is
    kept as it was (with its comments and style)."""
    if isinstance(node, dict) and isinstance(value, dict):
        for key in [k for k in node if k not in value]:
            del node[key]
        for key, item in value.items():
            node[key] = sync(node[key], item) if key in node else item
        return node
    if isinstance(node, list) and isinstance(value, list):
        for i, item in enumerate(value[: len(node)]):
            node[i] = sync(node[i], item)
        if len(value) > len(node):
            node.extend(value[len(node) :])
        else:
            del node[len(value) :]
        return node
    if isinstance(value, str) and isinstance(node, (date, bytes)) and _same_scalar(node, value):
        return node  # a timestamp or !!binary, which gpu-slicer reads as its text
    if type(node) is type(value) or (
        isinstance(node, str) and isinstance(value, str) and str(node) == value
    ):
        return node if node == value else value
    return value


def _same_scalar(node: date | bytes, text: str) -> bool:
    """Whether ``text`` is how the reader (kube.documents) gave the timestamp or binary
    ``node`` that ruamel.yaml loaded."""
    if isinstance(node, bytes):
        return base64.b64encode(node).decode("ascii") == text
    try:
        return bool(yaml.safe_load(text) == node)
    except yaml.YAMLError:
        return False


_DASH = re.compile(r"^( *)- ")
_KEY_LINE = re.compile(r"^( *)[^\s#-][^:]*:\s*(?:#.*)?$")


def _round_trip(body: str) -> YAML:
    """A round-trip loader and dumper set to the indentation ``body`` uses."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    mapping, offset = _indentation(body)
    yaml.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    return yaml


# --- edits in place ----------------------------------------------------------------------------

BOM = "\ufeff"


@dataclass
class Edited:
    """A changed document's new text, and why it was re-emitted whole (None: edited in place,
    every line that did not change kept byte for byte)."""

    text: str
    whole: str | None = None
    reemitted: list[str] = field(default_factory=list)
    """Nodes of an edited document re-emitted whole (``spec.x rewritten, not edited in place
    (why)``): their lines may change."""


def line_ending(text: str) -> str:
    """The line ending ``text`` uses (that of its first line; ``\\n`` when it has none)."""
    first = text.find("\n")
    return "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"


def with_line_ending(text: str, eol: str) -> str:
    """``text`` (written with ``\\n``) with ``eol`` instead."""
    return text.replace("\n", eol) if eol != "\n" else text


def edit(chunk: Chunk, values: list[Any]) -> Edited:
    """``chunk``'s text changed to hold ``values`` (one per value it holds) by editing it in
    place: the lines of what the conversion removed are deleted, what it added is inserted
    beside its siblings, indented as they are and with the document's line ending, a changed
    scalar is replaced where it stands, and every other byte (indentation, quoting, flow style,
    comments, trailing whitespace, a byte-order mark) is kept. Where that is impossible (the
    document shares its ``---`` line with another, uses aliases, or the edit would not read
    back as the conversion) the document is re-emitted whole, and ``whole`` says why."""
    try:
        if len(chunk.values) != 1 or len(values) != 1:
            raise _CannotEdit("it shares its --- line with another document")
        text, reemitted = edit_text(chunk.text, chunk.values[0], values[0], chunk.nodes)
        return Edited(text, None, reemitted)
    except _CannotEdit as exc:
        reason = str(exc)
    start = chunk.text.lstrip(BOM).startswith("---")
    text = ""
    if len(values) == 1:
        try:
            text = rewrite(chunk, values[0])
        except YamlTextError:  # e.g. a duplicate key, which only ruamel.yaml refuses
            pass
    if not text:
        text = "".join(dump(v, start=start or i > 0) for i, v in enumerate(values))
    text = with_line_ending(text.replace("\r\n", "\n"), line_ending(chunk.text))
    if chunk.text.startswith(BOM) and not text.startswith(BOM):
        text = BOM + text
    return Edited(text, reason)


class _CannotEdit(Exception):  # noqa: N818 - control flow, never leaves this module
    """This node cannot be edited in place: its parent re-emits it (the document, at the top)."""


def edit_text(
    text: str, old: Any, new: Any, nodes: list[Node] | None = None
) -> tuple[str, list[str]]:
    """``text`` (one document whose value is ``old``, whose node tree is ``nodes`` if read
    already) edited in place to hold ``new``, and the nodes that had to be re-emitted (path
    and why); raises _CannotEdit."""
    unterminated = bool(text) and not text.endswith("\n")
    if unterminated:  # a last line without a line break: edited as if it had one
        text += line_ending(text)
        nodes = None
    try:
        nodes = nodes if nodes is not None else documents.compose_all(text)
    except documents.DocumentError as exc:
        raise _CannotEdit(f"it cannot be read for editing: {exc}") from exc
    if len(nodes) != 1:
        raise _CannotEdit("it holds more than one document")
    editor = _Editor(text, nodes[0])
    if editor.shared:
        raise _CannotEdit("it uses YAML anchors and aliases")
    editor.value(nodes[0], old, new)
    out = editor.apply()
    try:
        again = documents.parse_all_fast(out)  # libyaml, as kubectl reads it
    except documents.DocumentError as exc:
        raise _CannotEdit(f"the edited text would not read back: {exc}") from exc
    if len(again) != 1 or not same(again[0], new):
        raise _CannotEdit("the edited text would not read back as the conversion")
    if unterminated:
        out = out.removesuffix(editor.eol)
    return out, editor.reemitted


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (``True`` is not ``1``).

    Told in C where it can be: unequal values are never the same, and equal ones are when
    their JSON (keys sorted) is the same too, JSON telling ``true`` from ``1`` from ``1.0``
    (and a key ``1`` from ``"1"``, which ``==`` tells apart). Walked in Python
    (:func:`_same_walk`) otherwise: types JSON does not write, NaN, infinities, and equal
    values whose JSON differs (``-0.0``, keys ``1`` and ``True``)."""
    if a != b:
        return False
    try:
        if json.dumps(a, sort_keys=True, allow_nan=False) == json.dumps(
            b, sort_keys=True, allow_nan=False
        ):
            return True
    except (TypeError, ValueError):
        pass
    return _same_walk(a, b)


def _same_walk(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_walk(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_walk(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_WHITESPACE = " \t\r\n"


_SINGLE_QUOTED = re.compile(r"[!-~](?:[ -~]*[!-~])?")
"""Printable ASCII, no space at either end, with a flow indicator in it: PyYAML writes it in
single quotes in a flow sequence (not plain, because of the indicator; nothing for double
quotes to escape), as the JSON of the ``gpu-slicer.io/converted`` record every pod gets."""


def _flow_scalar(value: Any) -> str:
    """``value`` (a scalar) written on one line, valid in flow and block context alike."""
    if type(value) is str and _SINGLE_QUOTED.fullmatch(value) and _FLOW_INDICATOR.search(value):
        return "'" + value.replace("'", "''") + "'"
    if value is None or type(value) in (str, int, bool):
        return _flow_scalar_remembered(value)
    return _flow_scalar_written(value)


_FLOW_INDICATOR = re.compile(r"[,\[\]{}]")


@functools.lru_cache(maxsize=4096, typed=True)
def _flow_scalar_remembered(value: str | int | bool | None) -> str:
    """:func:`_flow_scalar_written` of text, integers, booleans and null, remembered: the same
    keys and names are written into every converted pod (floats are not: ``-0.0 == 0.0``)."""
    return _flow_scalar_written(value)


def _flow_scalar_written(value: Any) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        out = yaml.safe_dump(
            [value], default_flow_style=True, width=1 << 30, allow_unicode=True
        ).strip()
        if out.startswith("[") and out.endswith("]") and "\n" not in out:
            return out[1:-1]
    return json.dumps(value, ensure_ascii=False)


def _flow(value: Any) -> str:
    """``value`` in flow style, on one line."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flow_scalar(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _flow_scalar(value)


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


class _Editor:
    """Text edits (start, end, replacement) on one document, from the node tree's marks."""

    def __init__(self, text: str, root: Node) -> None:
        self.text = text
        self.edits: list[tuple[int, int, str]] = []
        self.eol = line_ending(text)
        self.shared = _shared(root) if "*" in text else set()  # an alias is written *name
        self.mapping_indent, self.sequence_offset = _indentation(text)
        self.path: list[str] = []
        self.reemitted: list[str] = []
        """The nodes re-emitted whole (path and why): their layout and comments not kept."""

    # -- reading positions

    def end(self, node: Node) -> int:
        """Just after the last character of ``node``'s content (comments after it excluded)."""
        if isinstance(node, MappingNode) and not node.flow_style and node.value:
            key, value = node.value[-1]
            return max(self.end(key), self.end(value))
        if isinstance(node, SequenceNode) and not node.flow_style and node.value:
            return self.end(node.value[-1])
        index = node.end_mark.index
        if isinstance(node, ScalarNode) and node.style in ("|", ">"):
            header = self.text[node.start_mark.index : self.line_end(node.start_mark.index + 1)]
            if "+" in header.split("#", 1)[0]:
                return index  # kept trailing lines are part of the text
        while index > node.start_mark.index and self.text[index - 1] in _WHITESPACE:
            index -= 1
        return index

    def line_start(self, index: int) -> int:
        return self.text.rfind("\n", 0, index) + 1

    def line_end(self, index: int) -> int:
        """Just after the line break of the line holding ``index - 1``."""
        found = self.text.find("\n", max(index - 1, 0))
        return len(self.text) if found < 0 else found + 1

    def own_line(self, index: int) -> int:
        """The start of ``index``'s line, when only spaces come before it there."""
        start = self.line_start(index)
        if self.text[start:index].strip(" "):
            raise _CannotEdit("a key shares its line with what comes before it")
        return start

    def dash(self, item: Node) -> int:
        """Where the ``-`` of a block sequence's item is (on the item's line, or alone on a
        line above it, maybe with a comment)."""
        index = item.start_mark.index
        start = self.line_start(index)
        before = self.text[start:index]
        if before.strip(" "):
            found = before.rstrip(" ")
            if not found.endswith("-") or found[:-1].strip(" "):
                raise _CannotEdit("a list item that shares its line with another")
            return start + len(found) - 1
        while start > 0:
            start = self.line_start(start - 1)
            line = self.text[start : self.line_end(start + 1)].strip(_WHITESPACE)
            if line.startswith("-") and (line == "-" or line[1:].lstrip(" ").startswith("#")):
                return start + self.text[start:].index("-")
            if line and not line.startswith("#"):
                break
        raise _CannotEdit("a list item whose dash cannot be found")

    # -- recording edits

    def replace(self, start: int, end: int, text: str) -> None:
        self.edits.append((start, end, text))

    def insert_lines(self, index: int, text: str) -> None:
        """``text`` (whole lines, ending with a line break) inserted at ``index``, a line
        start."""
        self.replace(index, index, text)

    def delete_lines(self, start: int, end: int, inner: list[Node]) -> None:
        """The lines from ``start`` to ``end`` deleted, except comment lines outside the
        scalars of ``inner``: a comment is never lost with the lines it stood among."""
        scalars = [(n.start_mark.index, n.end_mark.index) for n in _scalars(inner)]
        kept = []
        position = start
        for line in self.text[start:end].splitlines(keepends=True):
            inside = any(a < position + len(line) and position < b for a, b in scalars)
            if line.lstrip(" \t").startswith("#") and not inside:
                kept.append(line if line.endswith("\n") else line + self.eol)
            position += len(line)
        self.replace(start, end, "".join(kept))

    def apply(self) -> str:
        edits = sorted(enumerate(self.edits), key=lambda e: (e[1][0], e[1][1], e[0]))
        parts, position = [], 0
        for _, (start, end, text) in edits:
            if start < position:
                raise _CannotEdit("two edits overlap")
            parts += [self.text[position:start], text]
            position = end
        parts.append(self.text[position:])
        return "".join(parts)

    # -- rendering new text

    def block_pairs(self, pairs: dict[Any, Any], column: int, sequence_offset: int) -> str:
        """``key: value`` lines in block style, at ``column``."""
        lines = []
        for key, value in pairs.items():
            if _is_scalar(value) or not value:
                lines.append(f"{_flow_scalar(key)}: {_flow(value)}\n")
                continue
            text = written({key: value}, self.mapping_indent, sequence_offset)
            lines += text.splitlines(keepends=True)
        return "".join(" " * column + line.replace("\n", self.eol) for line in lines)

    def block_items(self, values: list[Any], column: int) -> str:
        """``- value`` lines in block style, their dashes at ``column``."""
        text = self.block_pairs({"x": values}, 0, 0)
        lines = text.splitlines(keepends=True)[1:]
        return "".join(" " * column + line for line in lines)

    # -- the edits

    def value(self, node: Node, old: Any, new: Any) -> None:
        """``node`` edited from ``old`` to ``new`` in place; raises _CannotEdit when it must be
        re-emitted by its parent."""
        if same(old, new):
            return
        if isinstance(node, MappingNode) and isinstance(old, dict) and isinstance(new, dict):
            if node.flow_style:
                self.flow_mapping(node, old, new)
            else:
                self.block_mapping(node, old, new)
            return
        if isinstance(node, SequenceNode) and isinstance(old, list) and isinstance(new, list):
            if node.flow_style:
                self.flow_sequence(node, old, new)
            else:
                self.block_sequence(node, old, new)
            return
        raise _CannotEdit("a value replaced")

    def child(self, node: Node, old: Any, new: Any, fallback: Any, label: str) -> None:
        """``node`` edited, or (when it cannot be) re-emitted by ``fallback()``: a collection
        or anything holding a comment re-emitted is named in ``reemitted``."""
        mark = len(self.edits)
        self.path.append(label)
        try:
            self.value(node, old, new)
            return
        except _CannotEdit as exc:
            del self.edits[mark:]
            where = "".join(p if p.startswith("[") else f".{p}" for p in self.path).lstrip(".")
            reason = str(exc)
        finally:
            self.path.pop()
        if (
            isinstance(node, ScalarNode)
            and node.style not in ("|", ">")
            and _is_scalar(new)
            and node.start_mark.index < node.end_mark.index
            and node.start_mark.line == node.end_mark.line
        ):
            self.replace(node.start_mark.index, node.end_mark.index, _flow_scalar(new))
            return
        fallback()
        start, end, _ = self.edits[-1]
        if not isinstance(node, ScalarNode) or "#" in self.text[start:end]:
            self.reemitted.append(f"{where} rewritten, not edited in place ({reason})")

    def keys(self, node: MappingNode, old: dict[Any, Any]) -> dict[Any, tuple[Node, Node]]:
        """The pairs of ``node`` by key; raises _CannotEdit when they cannot be told apart."""
        found: dict[Any, tuple[Node, Node]] = {}
        for key, value in node.value:
            if key.tag == _MERGE:
                raise _CannotEdit("a merge key (<<)")
            if not isinstance(key, ScalarNode) or key.tag != _STR:
                continue
            if key.value in found:
                raise _CannotEdit(f"the key {key.value!r} appears twice")
            found[key.value] = (key, value)
        if any(k not in found for k in old):
            raise _CannotEdit("a key that is not text")
        return found

    def pair_lines(self, key: Node, value: Node) -> tuple[int, int]:
        """The whole lines of a block mapping's pair."""
        return self.own_line(key.start_mark.index), self.line_end(
            max(self.end(key), self.end(value))
        )

    def block_mapping(self, node: MappingNode, old: dict[Any, Any], new: dict[Any, Any]) -> None:
        pairs = self.keys(node, old)
        column = node.value[0][0].start_mark.column
        offset = self.local_offset(node)
        for key in old:
            key_node, value_node = pairs[key]
            if key not in new:
                start, end = self.pair_lines(key_node, value_node)
                self.delete_lines(start, end, [key_node, value_node])
            elif not same(old[key], new[key]):

                def whole(
                    key: Any = key, key_node: Node = key_node, value: Node = value_node
                ) -> None:
                    start, end = self.pair_lines(key_node, value)
                    self.replace(start, end, self.block_pairs({key: new[key]}, column, offset))

                self.child(value_node, old[key], new[key], whole, str(key))
        for after, added in additions(old, new):
            text = self.block_pairs(added, column, offset)
            if after is None:
                self.insert_lines(self.own_line(node.value[0][0].start_mark.index), text)
            else:
                self.insert_lines(self.pair_lines(*pairs[after])[1], text)

    def local_offset(self, node: MappingNode) -> int:
        """How far the dashes of this mapping's lists sit right of its keys (the document's
        habit when none of its values is a block list)."""
        for key, value in node.value:
            if isinstance(value, SequenceNode) and not value.flow_style and value.value:
                try:
                    dash = self.dash(value.value[0])
                except _CannotEdit:
                    continue
                column: int = key.start_mark.column
                return max(0, dash - self.line_start(dash) - column)
        return self.sequence_offset

    def block_sequence(self, node: SequenceNode, old: list[Any], new: list[Any]) -> None:
        items = node.value
        if len(items) != len(old):
            raise _CannotEdit("a list whose items cannot be told apart")
        dash = self.dash(items[0])
        column = dash - self.line_start(dash)

        def lines(i: int) -> tuple[int, int]:
            return self.own_line(self.dash(items[i])), self.line_end(self.end(items[i]))

        for tag, i1, i2, j1, j2 in _opcodes(old, new):
            if tag == "equal":
                continue
            if tag == "replace" and i2 - i1 == j2 - j1:
                for i, j in zip(range(i1, i2), range(j1, j2), strict=True):

                    def whole(i: int = i, j: int = j) -> None:
                        start, end = lines(i)
                        self.replace(start, end, self.block_items([new[j]], column))

                    self.child(items[i], old[i], new[j], whole, f"[{i}]")
                continue
            for i in range(i1, i2):
                start, end = lines(i)
                self.delete_lines(start, end, [items[i]])
            if j2 > j1:
                text = self.block_items(new[j1:j2], column)
                at = lines(i1 - 1)[1] if i1 > 0 else lines(0)[0]
                self.insert_lines(at, text)

    def flow_mapping(self, node: MappingNode, old: dict[Any, Any], new: dict[Any, Any]) -> None:
        pairs = self.keys(node, old)
        order = [k.value for k, _ in node.value if isinstance(k, ScalarNode)]
        if len(order) != len(node.value) or len(set(order)) != len(order):
            raise _CannotEdit("a flow mapping whose keys cannot be told apart")
        kept = [k for k in order if k in new]
        if not kept:
            if node.value:
                start = node.value[0][0].start_mark.index
                end = self.end(node.value[-1][1])
            else:
                start = end = self.open_bracket(node, "{")
            self.replace(
                start, end, ", ".join(f"{_flow_scalar(k)}: {_flow(v)}" for k, v in new.items())
            )
            return
        for run in runs([i for i, k in enumerate(order) if k not in new]):
            first, last = run[0], run[-1]
            if last + 1 < len(order):  # "k: v, " up to the next key
                self.replace(
                    node.value[first][0].start_mark.index,
                    node.value[last + 1][0].start_mark.index,
                    "",
                )
            else:  # ", k: v" from the end of the previous value
                self.replace(self.end(node.value[first - 1][1]), self.end(node.value[last][1]), "")
        for key in kept:
            if not same(old[key], new[key]):
                value_node = pairs[key][1]

                def whole(key: Any = key, value: Node = value_node) -> None:
                    self.replace(value.start_mark.index, self.end(value), _flow(new[key]))

                self.child(value_node, old[key], new[key], whole, str(key))
        for after, added in additions(old, new):
            text = ", ".join(f"{_flow_scalar(k)}: {_flow(v)}" for k, v in added.items())
            if after is None:
                at = pairs[kept[0]][0].start_mark.index
                self.replace(at, at, text + ", ")
            else:
                at = self.end(pairs[after][1])
                self.replace(at, at, ", " + text)

    def flow_sequence(self, node: SequenceNode, old: list[Any], new: list[Any]) -> None:
        items = node.value
        if len(items) != len(old):
            raise _CannotEdit("a flow list whose items cannot be told apart")
        if len(new) >= len(old) and all(same(a, b) for a, b in zip(old, new, strict=False)):
            added = ", ".join(_flow(v) for v in new[len(old) :])
            if items:
                at = self.end(items[-1])
                self.replace(at, at, ", " + added)
            else:
                at = self.open_bracket(node, "[")
                self.replace(at, at, added)
            return
        if len(new) != len(old):
            raise _CannotEdit("a flow list changed")
        for item, before, after in zip(items, old, new, strict=True):

            def whole(item: Node = item, after: Any = after) -> None:
                self.replace(item.start_mark.index, self.end(item), _flow(after))

            self.child(item, before, after, whole, f"[{items.index(item)}]")

    def open_bracket(self, node: Node, bracket: str) -> int:
        """Just after the opening bracket of an empty flow collection."""
        index = node.start_mark.index
        if self.text[index : index + 1] != bracket:
            raise _CannotEdit("a flow collection whose bracket cannot be found")
        return index + 1


def additions(old: dict[Any, Any], new: dict[Any, Any]) -> list[tuple[Any, dict[Any, Any]]]:
    """The keys ``new`` adds, grouped by the kept key they follow (None: before the first)."""
    groups: list[tuple[Any, dict[Any, Any]]] = []
    after: Any = None
    for key, value in new.items():
        if key in old:
            after = key
        elif groups and groups[-1][0] == after and key not in old:
            groups[-1][1][key] = value
        else:
            groups.append((after, {key: value}))
    return groups


def runs(indexes: list[int]) -> list[list[int]]:
    """``[1, 2, 4]`` -> ``[[1, 2], [4]]``."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _opcodes(old: list[Any], new: list[Any]) -> Sequence[tuple[str, int, int, int, int]]:
    """How ``old``'s items become ``new``'s (difflib's opcodes over each item's JSON)."""
    if len(old) == len(new):
        return [("replace", 0, len(old), 0, len(new))]
    a = [json.dumps(v, sort_keys=True, default=str) for v in old]
    b = [json.dumps(v, sort_keys=True, default=str) for v in new]
    return list(difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes())


def _scalars(nodes: list[Node]) -> list[ScalarNode]:
    found: list[ScalarNode] = []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ScalarNode):
            found.append(node)
        elif isinstance(node, SequenceNode):
            stack += node.value
        elif isinstance(node, MappingNode):
            stack += [n for pair in node.value for n in pair]
    return found


def _shared(root: Node) -> set[int]:
    """The nodes found more than once (an anchor and its aliases)."""
    seen: set[int] = set()
    shared: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            shared.add(id(node))
            continue
        seen.add(id(node))
        if isinstance(node, SequenceNode):
            stack += node.value
        elif isinstance(node, MappingNode):
            stack += [n for pair in node.value for n in pair]
    return shared


@functools.lru_cache(maxsize=4)
def _indentation(body: str) -> tuple[int, int]:
    """(mapping indent, sequence dash offset) the document uses most visibly; remembered for
    the last few texts, since every template written into a file asks for the file's (its text
    is hashed once, then found again by identity)."""
    mapping, offset = 2, 0
    lines = body.splitlines()
    for before, line in zip(lines, lines[1:], strict=False):
        key, dash = _KEY_LINE.match(before), _DASH.match(line)
        if key and dash:
            offset = max(0, len(dash.group(1)) - len(key.group(1)))
            break
    for line in lines:
        indented = re.match(r"^( +)\S", line)
        if indented and not line.lstrip().startswith(("-", "#")):
            mapping = len(indented.group(1)) if len(indented.group(1)) <= 8 else 2
            break
    return mapping, offset
