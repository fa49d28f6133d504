"""Every document reader reports unreadable, non-UTF-8, malformed and too-deep input in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube import documents


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
