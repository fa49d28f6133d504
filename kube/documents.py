"""Reading YAML (and JSON) documents: manifests, policies, layouts, scenarios, settings.

Every file gpu-slicer reads goes through here, so every reader reports the same failures the same
way: in one line that says where (``not valid YAML at line 2, column 5: ...``), whether the file is
unreadable, not UTF-8, or nested deeper than the parser can follow. Callers wrap
:class:`DocumentError` in their own typed error, prefixed with what the document was for.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml


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
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text ({exc})") from exc
    except OSError as exc:
        raise DocumentError(f"cannot read: {exc.strerror or exc}") from exc


def parse(text: str) -> Any:
    """The one document in ``text`` (None when empty)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DocumentError(_describe(exc)) from exc
    except RecursionError as exc:
        raise DocumentError("the YAML is nested too deeply to read") from exc


def parse_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML (or JSON) stream."""
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise DocumentError(_describe(exc)) from exc
    except RecursionError as exc:
        raise DocumentError("the YAML is nested too deeply to read") from exc


def _describe(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without the source excerpt PyYAML appends."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML{where}: {problem}"
