"""Manifest text edited in place: documents split as written, changed ones rewritten with their
comments, block text and quoting kept (ruamel.yaml's round trip), the others kept byte for byte.

Reviewers of a GitOps repository read diffs: converting a Deployment must change the lines that
ask for GPUs and add the claim, not re-flow every file. A stream is split at its ``---`` lines;
a document that conversion did not change is written back exactly as it was read, and one that
changed is loaded with ruamel.yaml, brought to the converted value key by key (so every node
that did not change keeps its comments and style) and dumped with the indentation the
document used.
"""

from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass
from datetime import date
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from kube import documents
from webhook.errors import YamlTextError

_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?$")


@dataclass
class Chunk:
    """One document as written: its text (with its ``---`` line, if any) and its value."""

    text: str
    values: list[Any]
    """What the document holds (empty for comments only; more than one only when a document
    starts on its ``---`` line, which is then not split)."""


def split(text: str) -> list[Chunk]:
    """The documents of a YAML stream, in order; raises DocumentError for invalid YAML."""
    pieces: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _SEPARATOR.match(line.rstrip("\r\n")) and pieces[-1]:
            pieces.append([])
        pieces[-1].append(line)
    chunks = []
    for lines in pieces:
        body = "".join(lines)
        chunks.append(Chunk(body, documents.parse_all(body)))
    return chunks


def _header(text: str) -> tuple[str, str]:
    """(the ``---`` line, the rest)."""
    first, _, rest = text.partition("\n")
    if _SEPARATOR.match(first.rstrip("\r")):
        return first + "\n", rest
    return "", text


def rewrite(chunk: Chunk, value: Any) -> str:
    """``chunk``'s text changed to hold ``value``, comments and styles kept where the nodes did
    not change."""
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


def dump(value: Any, *, start: bool = True) -> str:
    """A new document (a template), in the block style kubectl writes."""
    yaml = _round_trip("")
    out = io.StringIO()
    yaml.dump(value, out)
    return ("---\n" if start else "") + out.getvalue()


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
    yaml.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    return yaml
