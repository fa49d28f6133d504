"""Which release the sandbox builds, and how a release's go.mod gives the staging replaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.sandbox import binaries
from gpu_slicer.sandbox.errors import UsageError

RELEASE_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/dynamic-resource-allocation v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/cri-streaming => ./staging/src/k8s.io/cri-streaming
\tk8s.io/dynamic-resource-allocation => ./staging/src/k8s.io/dynamic-resource-allocation
)
"""


@pytest.mark.parametrize(
    ("given", "release"),
    [
        ("1.36", binaries.RELEASES["1.36"]),
        ("v1.35", binaries.RELEASES["1.35"]),
        ("1.37.2", "v1.37.2"),
        ("v1.36.1", "v1.36.1"),
        ("1.38", "v1.38.0-beta.0"),
        ("v1.38.0-beta.0", "v1.38.0-beta.0"),
    ],
)
def test_a_minor_version_names_its_pinned_patch_release(given: str, release: str) -> None:
    assert binaries.release_for(given) == release


@pytest.mark.parametrize("given", ["1.33", "2.0", "latest", "1.36.x", ""])
def test_an_unsupported_version_is_a_usage_error_naming_the_choices(given: str) -> None:
    with pytest.raises(UsageError, match="1.35, 1.36, 1.37, 1.38"):
        binaries.release_for(given)


def test_a_pre_release_keeps_its_minor_and_its_whole_version_in_the_binaries() -> None:
    assert binaries.minor_of("v1.38.0-beta.0") == 38
    flags = binaries._version_ldflags("v1.38.0-beta.0")
    assert "gitVersion=v1.38.0-beta.0" in flags and "gitMinor=38" in flags


def test_a_release_needing_a_newer_go_gets_the_pinned_toolchain() -> None:
    refused = "k8s.io/kubernetes@v1.38.0-beta.0 requires go >= 1.27.0 (running go 1.26.8)"
    assert binaries.toolchain_env(refused) == {"GOTOOLCHAIN": "go1.27.3"}
    assert binaries.toolchain_env("") == {}
    assert binaries.toolchain_env("not found: 404") == {}


def test_a_release_needing_an_unknown_go_says_what_to_install() -> None:
    with pytest.raises(binaries.BuildError, match=r"needs Go 1\.99 or newer.*running go 1\.26\.8"):
        binaries.toolchain_env("requires go >= 1.99.0 (running go 1.26.8)")


def test_the_staging_modules_come_from_the_release_go_mod() -> None:
    assert binaries.staging_modules(RELEASE_GO_MOD) == [
        "k8s.io/api",
        "k8s.io/cri-streaming",
        "k8s.io/dynamic-resource-allocation",
    ]


def test_the_committed_module_replaces_every_staging_module_of_the_pinned_release() -> None:
    go_mod = (binaries.KUBE_MODULE / "go.mod").read_text()
    assert (
        f"require k8s.io/kubernetes {binaries.PINNED}" in go_mod
        or f"k8s.io/kubernetes {binaries.PINNED}" in go_mod
    )
    staged = "v0." + binaries.PINNED.removeprefix("v1.")
    replaced = [
        line.split("=>")[0].replace("replace", "").strip()
        for line in go_mod.splitlines()
        if "=>" in line
    ]
    assert replaced, "no replace directives"
    for module in replaced:
        assert f"{module} => {module} {staged}" in go_mod


def test_user_binaries_must_include_the_three_commands(tmp_path: Path) -> None:
    (tmp_path / "kube-apiserver").write_text("#!/bin/sh\n")
    (tmp_path / "kube-apiserver").chmod(0o755)
    with pytest.raises(UsageError, match="kube-controller-manager, kube-scheduler"):
        binaries.ensure(kube_bin=tmp_path, cache=tmp_path / "cache", progress=lambda _m: None)


def test_without_go_the_build_error_says_how_to_do_without(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(binaries.BuildError, match="--kube-bin"):
        binaries.ensure(cache=tmp_path / "cache", progress=lambda _m: None)


def test_a_complete_cached_build_is_reused_without_go(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    for folder in (cache / "kube" / binaries.PINNED, cache / "tools" / binaries._sources_digest()):
        folder.mkdir(parents=True)
        (folder / "build.json").write_text("{}")
    monkeypatch.setenv("PATH", str(tmp_path))
    found = binaries.ensure(cache=cache, progress=lambda _m: None)
    assert found.path("kube-apiserver") == cache / "kube" / binaries.PINNED / "kube-apiserver"
    assert found.path("etcd").parent.parent == cache / "tools"
