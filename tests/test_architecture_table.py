"""docs/architecture.md names every module once, in its ownership table, and no module that
is gone: the table is where a maintainer looks first, so it must stay true to the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "kube", "slicer", "webhook", "certs", "sim", "sandbox", "status")
_ROW = re.compile(r"^\| `([a-z_]+\.[a-z_.]+)` \|", re.M)
GENERATED = {"slicer.proto"}
"""Generated code, described with the module that uses it (``slicer.plugin``)."""


def _modules() -> set[str]:
    """Every module of the packages: a subpackage is a module (its ``__init__``) and so is each
    of its modules."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).glob("*.py"):
            if path.name != "__init__.py":
                found.add(f"{package}.{path.name[: -len('.py')]}")
        for init in (ROOT / package).glob("*/__init__.py"):
            sub = f"{package}.{init.parent.name}"
            if sub in GENERATED:
                continue
            found.add(sub)
            for path in init.parent.glob("*.py"):
                if path.name != "__init__.py":
                    found.add(f"{sub}.{path.name[: -len('.py')]}")
    return found


def _rows() -> list[str]:
    return _ROW.findall((ROOT / "docs" / "architecture.md").read_text())


def test_every_module_has_one_row() -> None:
    rows = _rows()
    assert sorted(_modules() - set(rows)) == []
    assert sorted({r for r in rows if rows.count(r) > 1}) == []


def test_every_row_names_a_module_that_exists() -> None:
    assert sorted(set(_rows()) - _modules()) == []
