"""Every document reader reports unreadable, non-UTF-8, malformed and too-deep input in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.kube import documents


def test_a_malformed_document_names_the_line_and_column() -> None:
    with pytest.raises(documents.DocumentError) as info:
        documents.parse("a: 1\nb: [\n")
    message = str(info.value)
    assert message.startswith("not valid YAML at line 3, column 1:")
    assert "\n" not in message


def test_input_nested_deeper_than_the_parser_follows_is_a_document_error() -> None:
    for parse in (documents.parse, documents.parse_all):
        with pytest.raises(documents.DocumentError, match="nested too deeply"):
            parse("[" * 20000 + "]" * 20000)


def test_a_stream_keeps_its_non_empty_documents_in_order() -> None:
    assert documents.parse_all("---\na: 1\n---\n---\n[2]\n") == [{"a": 1}, [2]]


def test_unreadable_and_non_utf8_files_are_document_errors(tmp_path: Path) -> None:
    with pytest.raises(documents.DocumentError, match="^cannot read: No such file"):
        documents.read_text(tmp_path / "missing.yaml")
    with pytest.raises(documents.DocumentError, match="^cannot read: Is a directory"):
        documents.read_text(tmp_path)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(documents.DocumentError, match="^not UTF-8 text"):
        documents.read_text(latin1)


BOMB = "\n".join(
    [
        'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


def test_an_alias_bomb_is_refused_quickly_with_its_line() -> None:
    for parse in (documents.parse, documents.parse_all):
        with pytest.raises(documents.DocumentError) as info:
            parse(BOMB)
        assert str(info.value).startswith("refused at line 1, column 1:")
        assert "alias" in str(info.value)


def test_aliases_within_the_bound_are_expanded_as_written() -> None:
    text = "base: &base {image: x, env: [1, 2]}\nthe: {<<: *base, name: a}\nother: *base\n"
    assert documents.parse(text) == {
        "base": {"image": "x", "env": [1, 2]},
        "the": {"image": "x", "env": [1, 2], "name": "a"},
        "other": {"image": "x", "env": [1, 2]},
    }


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(documents.DocumentError, match="refers to a node that contains it"):
        documents.parse("a: &a [1, *a]\n")


def test_nesting_beyond_the_bound_is_refused_with_its_line() -> None:
    deep = "a:\n  b: " + "[" * documents.MAX_DEPTH + "]" * documents.MAX_DEPTH + "\n"
    with pytest.raises(documents.DocumentError) as info:
        documents.parse(deep)
    assert str(info.value).startswith("refused at line 2, column")
    assert f"more than {documents.MAX_DEPTH} levels" in str(info.value)
    fits = "[" * (documents.MAX_DEPTH - 1) + "]" * (documents.MAX_DEPTH - 1)
    assert documents.parse(f"a: {fits}") is not None


def test_timestamps_and_binary_are_text_as_kubernetes_reads_them() -> None:
    text = "day: 2024-01-01\nat: 2024-01-01T10:00:00Z\nblob: !!binary |\n  aGVs\n  bG8=\n"
    assert documents.parse(text) == {
        "day": "2024-01-01",
        "at": "2024-01-01T10:00:00Z",
        "blob": "aGVsbG8=",
    }


def test_an_integer_too_long_to_convert_is_refused_with_its_line() -> None:
    with pytest.raises(documents.DocumentError) as info:
        documents.parse_all("a: 1\nb: " + "9" * 5000 + "\n")
    assert str(info.value).startswith("refused at line 2, column 4: an integer of 5000")
    assert documents.parse("a: 0x1F\nb: 1_000\n") == {"a": 31, "b": 1000}


# --- the fast reader (libyaml's parser, the same bounds): convert's check of documents that
# hold no GPU text


@pytest.mark.parametrize("c_composes", [True, False])
def test_the_fast_reader_keeps_the_bounds_and_gives_the_python_readers_messages(
    c_composes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(documents, "C_COMPOSES", c_composes and documents.C_COMPOSES)
    deep = "a:\n  b: " + "[" * documents.MAX_DEPTH + "]" * documents.MAX_DEPTH + "\n"
    for text in (BOMB, "a: &a [1, *a]\n", deep, "a: 1\nb: [\n", "[" * 20000 + "]" * 20000):
        with pytest.raises(documents.DocumentError) as python:
            documents.parse_all(text)
        with pytest.raises(documents.DocumentError) as fast:
            documents.parse_all_fast(text)
        assert str(fast.value) == str(python.value)
    fits = "[" * (documents.MAX_DEPTH - 1) + "]" * (documents.MAX_DEPTH - 1)
    shared = "a: &a {b: [1, 2]}\nc: [*a, *a]\n"
    nested = "a: &a [1, 2, 3]\nb: &b [*a, *a, *a]\nc: [*b, *b]\n"
    for text in (fits, shared, nested):
        assert documents.parse_all_fast(text) == documents.parse_all(text)


def test_the_fast_reader_reads_values_as_kubernetes_does() -> None:
    text = (
        "a: &base {image: x, when: 2024-01-01T00:00:00Z, data: !!binary aGk=}\n"
        "b: {<<: *base, name: a, n: 0x10, ok: yes, none: ~}\n"
        "---\n"
        "---\n"
        "- 1\n"
    )
    assert documents.parse_all_fast(text) == documents.parse_all(text)
    assert documents.parse_all_fast(text)[0]["a"]["when"] == "2024-01-01T00:00:00Z"


def test_the_fast_reader_agrees_with_the_python_reader_on_the_projects_manifests() -> None:
    root = Path(__file__).resolve().parents[2]
    checked = 0
    for path in sorted([*root.glob("tests/**/*.yaml"), *root.glob("deploy/**/*.yaml")]):
        text = path.read_text(encoding="utf-8")
        try:
            expected = documents.parse_all(text)
        except documents.DocumentError:
            continue
        assert documents.parse_all_fast(text) == expected, path
        checked += 1
    assert checked > 20


# --- the fast reader's shortcuts: no walk of the node tree where the text's characters bound
# its depth, values built without the constructor's bookkeeping where nothing is unusual


def _depth(node: Any) -> int:
    """The depth :func:`documents._within_bounds` counts (the root 1, keys included)."""
    children = node.value if isinstance(node.value, list) else []
    flat = [n for child in children for n in (child if isinstance(child, tuple) else (child,))]
    return 1 + max((_depth(child) for child in flat), default=0)


ADVERSARIAL = [
    "a:\n- b:\n  - c:\n    - d\n",  # two levels a column: a list right under each key
    "- - - - - a\n",
    "- - - a:\n      - - b\n",
    "- a:\n  - b: {c: [d: [e: f]]}\n",
    "? - a\n  - b\n: - c\n",
    "? a\n: ? b\n  : ? c\n    : d\n",
    "- &x a: b\n  c:\n  - d\n",
    "- !!map\n  a: !!seq\n  - b\n",
    "- ? &a\n    - x\n  : y\n",
    "[a: [b: [c: [d]]]]\n",
    "{a: {b: {c: [d, {e: [f]}]}}}\n",
    "a:\r\n  b:\r\n    - c:\r\n      - d\r\n",
    "a: |\n  - - - text\n  [[[\nb:\n  - c\n",
]


def _random_documents(count: int) -> list[str]:
    """Nested values written by PyYAML and ruamel.yaml in their block, compact and flow
    styles, at several indentations."""
    import io
    import random

    import yaml
    from ruamel.yaml import YAML

    chooser = random.Random(33)
    budget = [0]

    def value(depth: int) -> Any:
        budget[0] -= 1
        if depth <= 0 or budget[0] <= 0 or chooser.random() < 0.1:
            return chooser.choice(["x", 1, None, "a b", True])
        width = chooser.randint(1, 3) if chooser.random() < 0.3 else 1
        if chooser.random() < 0.5:
            return [value(depth - 1) for _ in range(width)]
        return {f"k{i}": value(depth - 1) for i in range(width)}

    texts = []
    for _ in range(count):
        budget[0] = 300
        data = value(chooser.randint(1, 60))
        flow = chooser.choice([False, None, True])
        texts.append(yaml.safe_dump(data, default_flow_style=flow, indent=chooser.randint(2, 5)))
        writer = YAML(typ="rt")
        offset = chooser.randint(0, 3)
        writer.indent(mapping=chooser.randint(2, 5), sequence=offset + 2, offset=offset)
        out = io.StringIO()
        writer.dump(data, out)
        texts.append(out.getvalue())
    return texts


def test_the_depth_told_from_the_text_is_never_below_the_documents_depth() -> None:
    checked = 0
    for text in [*ADVERSARIAL, *_random_documents(150)]:
        bound = documents.depth_bound(text)
        assert bound is not None, text
        for node in documents.compose_all(text):
            assert _depth(node) <= bound, text
            checked += 1
    assert checked > 300


@pytest.mark.parametrize(
    "text",
    ["a: &x 1\nb: *x\n", "a:\tb\n", "a:\r  b:\r    c: d\n", "a:\x85 b: c\n", "--- - a\n- b\n"],
)
def test_no_depth_is_told_from_the_text_of_aliases_tabs_or_other_line_breaks(text: str) -> None:
    assert documents.depth_bound(text) is None


def test_nesting_beyond_the_bound_is_refused_by_the_fast_reader_in_every_style() -> None:
    block = "".join(f"{'  ' * i}a:\n" for i in range(documents.MAX_DEPTH)) + "  " * 100 + "b\n"
    compact = "- " * documents.MAX_DEPTH + "a\n"
    under_keys = "a:\n" + "".join(f"{'  ' * i}- a:\n" for i in range(50)) + "  " * 50 + "- b\n"
    for text in (block, compact, under_keys):
        with pytest.raises(documents.DocumentError, match="nested too deeply"):
            documents.parse_all(text)
        with pytest.raises(documents.DocumentError, match="nested too deeply"):
            documents.parse_all_fast(text)


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: [1, 2.5, .inf, ~, yes, No, 0o17, 0x1f, 1_000, 1:20, 2024-01-01]\na: 3\n",
        "a: {<<: {b: 1}, c: 2}\n",  # a merge key: the constructor's
        "a: {=: 1}\n",  # a value key
        "? [a, b]\n: c\n",  # a list as a key: refused by the constructor
        "a: !!set {b, c}\nd: !!omap [e: 1]\n",
        "a: !!str 1\n!!int '2': !!float '3'\nb: !!binary aGk=\nc: !custom x\n",
        "1: a\ntrue: b\n~: c\n2024-01-01: d\n",
        "a: " + "9" * 5000 + "\n",
        "a: !!bool maybe\n",
    ],
)
def test_values_are_built_as_the_constructor_builds_them(text: str) -> None:
    try:
        expected: Any = documents.parse_all(text)
    except documents.DocumentError as exc:
        expected = str(exc)
    except KeyError as exc:
        expected = repr(exc)
    for read in (documents.parse_all_fast, lambda t: documents.read_with_nodes(t)[1]):
        try:
            got: Any = read(text)
        except documents.DocumentError as exc:
            got = str(exc)
        except KeyError as exc:
            got = repr(exc)
        assert got == expected
        if isinstance(got, list):
            assert [list(v) for v in got if isinstance(v, dict)] == [
                list(v) for v in expected if isinstance(v, dict)
            ]  # keys in the same order
