"""Building the mock NVML library: what goes into the build, the stubs generated for the rest of
NVML, and the cache that spares a rebuild (the build itself runs in the tests/nvml tier)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpu_slicer.sandbox import nvml_mock
from gpu_slicer.sandbox.errors import BuildError

HEADER = """
nvmlReturn_t DECLDIR nvmlInit_v2(void);
DEPRECATED(13.0) nvmlReturn_t DECLDIR nvmlDeviceGetApplicationsClock(nvmlDevice_t device,
                                                  unsigned int *clockMHz);
nvmlReturn_t DECLDIR nvmlInit_v2(void);
#define DECLDIR
"""


def test_every_declared_function_gets_one_weak_stub_answering_not_found() -> None:
    stubs = nvml_mock.weak_stubs(HEADER)
    defined = re.findall(r"__attribute__\(\(weak\)\) int (\w+)\(void\) \{ return 13; \}", stubs)
    assert defined == ["nvmlDeviceGetApplicationsClock", "nvmlInit_v2"]


def test_the_digest_follows_the_module_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("go.mod", "go.sum", "exports.go", "wrappers.c"):
        (tmp_path / name).write_text(name)
    (tmp_path / "notes.txt").write_text("not built")
    monkeypatch.setattr(nvml_mock, "MODULE", tmp_path)
    before = nvml_mock.sources_digest()
    (tmp_path / "notes.txt").write_text("still not built")
    assert nvml_mock.sources_digest() == before
    (tmp_path / "wrappers.c").write_text("changed")
    assert nvml_mock.sources_digest() != before


def test_a_completed_build_in_the_cache_is_used_without_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "nvmlmock" / nvml_mock.sources_digest()
    folder.mkdir(parents=True)
    (folder / nvml_mock.LIBRARY).write_bytes(b"\x7fELF")
    (folder / "build.json").write_text("{}")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nvml_mock.ensure(cache=tmp_path, progress=print) == folder / nvml_mock.LIBRARY


def test_without_go_the_build_fails_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BuildError, match="Go .* is not on the PATH"):
        nvml_mock.ensure(cache=tmp_path, progress=print)
    assert not (tmp_path / "nvmlmock" / nvml_mock.sources_digest()).exists()


def test_the_module_ships_its_sources() -> None:
    names = {p.name for p in nvml_mock.MODULE.iterdir()}
    assert {"go.mod", "go.sum", "exports.go", "const_wrappers.c"} <= names
    assert not any(n.startswith("zz_") for n in names), "generated stubs stay in the cache"
