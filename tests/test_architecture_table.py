"""docs/architecture.md names every module once, in its ownership table, and no module that
is gone: the table is where a maintainer looks first, so it must stay true to the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "cli", "kube", "slicer", "webhook", "certs", "sim", "sandbox", "status", "plan")
"""The package folders linked into ``gpu_slicer``; rows name modules relative to it."""
_ROW = re.compile(r"^\| `([a-z_]+\.[a-z_.]+)` \|", re.M)


GENERATED = {"slicer/proto"}  # generated gRPC code, described by the row of its user


def _modules() -> set[str]:
    """Every module of the packages, and of their subpackages (a subpackage's ``__init__`` is a
    row of its own: it says how to walk the package)."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            folder = path.parent.relative_to(ROOT)
            if str(folder) in GENERATED or "__pycache__" in folder.parts:
                continue
            if path.name == "__init__.py":
                if folder.parts != (package,):
                    found.add(".".join(folder.parts))
                continue
            found.add(".".join((*folder.parts, path.name[: -len(".py")])))
    return found


def _rows() -> list[str]:
    return _ROW.findall((ROOT / "docs" / "architecture.md").read_text())


def test_every_module_has_one_row() -> None:
    rows = _rows()
    assert sorted(_modules() - set(rows)) == []
    assert sorted({r for r in rows if rows.count(r) > 1}) == []


def test_every_row_names_a_module_that_exists() -> None:
    assert sorted(set(_rows()) - _modules()) == []
