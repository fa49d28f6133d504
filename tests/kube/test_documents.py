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
