"""``read_with_nodes`` composes with libyaml where the text holds nothing the two readers are
known to read differently (kube.documents._read_alike): what it returns, or the error it
raises, must be the Python reader's, node marks included (the editor of webhook.yaml_text
edits at them). Compared on the project's manifests and on thousands of mutations of them;
none of these tests measures time."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from gpu_slicer.kube import documents

ROOT = Path(__file__).resolve().parents[2]


def _python_reading(text: str) -> tuple[list[Node], list[Any]] | str:
    """What the Python reader alone makes of ``text``, document by document (its composer
    and its constructor): nodes and values, or the error, as read_with_nodes gave them before
    libyaml stood in."""
    loader = documents._Loader(text)
    nodes: list[Node] = []
    values: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            nodes.append(node)
            value = loader.construct_document(node)
            if value is not None:
                values.append(value)
    except yaml.YAMLError as exc:
        return documents._describe(exc)
    except RecursionError:
        return "the YAML is nested too deeply to read"
    finally:
        loader.dispose()
    return nodes, values


def _reading(text: str) -> tuple[list[Node], list[Any]] | str:
    try:
        return documents.read_with_nodes(text)
    except documents.DocumentError as exc:
        return str(exc)


def _shape(node: Node) -> Any:
    """What the editor reads of a node: kind, tag, style, flow style, marks, value."""
    marks = tuple((m.index, m.line, m.column) for m in (node.start_mark, node.end_mark))
    if isinstance(node, ScalarNode):
        return ("scalar", node.tag, node.style or None, marks, node.value)
    if isinstance(node, MappingNode):
        inner: Any = tuple((_shape(k), _shape(v)) for k, v in node.value)
    else:
        inner = tuple(_shape(item) for item in node.value)
    return (type(node).__name__, node.tag, bool(node.flow_style), marks, inner)


def _same(text: str) -> None:
    expected = _python_reading(text)
    got = _reading(text)
    if isinstance(expected, str) or isinstance(got, str):
        assert got == expected, text
        return
    assert [_shape(n) for n in got[0]] == [_shape(n) for n in expected[0]], text
    assert got[1] == expected[1], text


def _manifests() -> list[str]:
    texts = []
    for path in sorted([*ROOT.glob("tests/**/*.yaml"), *ROOT.glob("deploy/**/*.yaml")]):
        text = path.read_text(encoding="utf-8")
        texts += [t + "\n" for t in text.split("\n---\n") if t.strip()]
    return texts


def test_libyaml_stands_in_on_the_projects_manifests_and_reads_them_alike() -> None:
    texts = _manifests()
    alike = [t for t in texts if documents._read_alike(t)]
    assert len(alike) > 100
    for text in texts:
        _same(text)


PIECES = [
    *" :-#[]{},\"'|>&*!%@`\n\\=~0a",
    "- ",
    ": ",
    "\n  ",
    "\n- ",
    "...",
    "---",
    "|#",
    "|-",
    ">+",
    "|2",
    "!!str ",
    "!a ",
    "&a ",
    "*a",
    " #x",
    "{}",
    "[]",
    "\n#",
    "- - ",
    "<<: ",
    "\n...\n",
    "\n---\n",
    "--- ",
    "\n\n",
    "\t",
    "?",
    "? ",
    "\r\n",
    "\ufeff",
    "é",
]


@pytest.mark.parametrize("seed", range(4))
def test_mutated_manifests_read_alike_or_fail_alike(seed: int) -> None:
    """Characters that matter to YAML inserted, deleted and replaced at random: where libyaml
    stands in, the nodes, values and errors are the Python reader's."""
    chooser = random.Random(seed)
    seeds = [t for t in _manifests() if len(t) < 4000]
    stood_in = 0
    for _ in range(600):
        text = chooser.choice(seeds)
        for _ in range(chooser.randint(1, 4)):
            at = chooser.randrange(len(text) + 1)
            roll = chooser.random()
            if roll < 0.5:
                text = text[:at] + chooser.choice(PIECES) + text[at:]
            elif roll < 0.8:
                text = text[:at] + text[at + chooser.randint(1, 3) :]
            else:
                text = text[:at] + chooser.choice(PIECES) + text[at + 1 :]
        stood_in += documents._read_alike(text)
        _same(text)
    assert stood_in > 200


@pytest.mark.parametrize(
    "text",
    [
        "a: b\t\nc: nvidia.com/gpu\n",  # a tab after a plain value: libyaml reads it
        "a: |#\n  x\n",  # a block scalar's header without a space before its comment
        "a: {b? c: d}\n",  # '?' inside a flow mapping
        "a: {b: }\n",  # an empty value in a flow mapping (its mark)
        "\ufeffa: b\n",  # a byte-order mark (the marks)
        "a: b",  # no line break at the end (the last mark)
        "%YAML 1.1\n---\na: b\n",
        "a: b\r\nc: d\r\n",
    ],
)
def test_what_the_readers_read_differently_is_left_to_the_python_reader(text: str) -> None:
    assert not documents._read_alike(text)
    _same(text)
